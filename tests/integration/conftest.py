"""Real services for the pipeline tests: redis-server, moto's S3 server, Celery workers, ingest.

Started once per session on free loopback ports and torn down after; each test gets a clean
pipeline state (every key under the test prefix but the alert stream and its group is deleted) and
its own job directories, so tests do not see each other's diagnoses.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from shared.settings import Settings
from shared.streams import StreamNames
from testkit.services import (
    PREFIX,
    RL_HEALTH,
    free_port,
    service_env,
    settings_from,
    spawn,
    start_moto,
    start_redis,
    stop,
    wait_for,
)
from worker.pipeline.app import make_app
from worker.pipeline.steps import Pipeline
from worker.pipeline.store import S3Store, store_from_settings

COALESCE_S = 20


@dataclass
class Services:
    env: dict[str, str]
    settings: Settings
    redis: Any
    store: S3Store
    bundle_root: Path
    logs: Path
    metrics: dict[str, str]  # process ("worker", "ingest") -> its /metrics URL

    @property
    def names(self) -> StreamNames:
        return StreamNames(self.settings.stream_prefix)

    def pipeline(self) -> Pipeline:
        return Pipeline(self.settings, self.store, self.redis)

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run `rl-health ARGS` against these services."""
        return subprocess.run(
            [RL_HEALTH, *args],
            check=False,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        process, url = start_redis(tmp_path_factory.mktemp("redis"))
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield url
    stop(process)


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process, endpoint = start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    yield endpoint
    stop(process)


@pytest.fixture(scope="session")
def services(
    redis_url: str, s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Services]:
    """redis-server, moto, two prefork Celery workers and one ingest, all real processes."""
    base = tmp_path_factory.mktemp("pipeline")
    env = service_env(redis_url, s3_endpoint, base / "bundles", base / "cache", COALESCE_S)
    (base / "bundles").mkdir()
    settings = settings_from(env)
    with pytest.MonkeyPatch.context() as patch:  # boto3 reads credentials from the environment
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
            patch.setenv(name, env[name])
        store = store_from_settings(settings)
    store.ensure_bucket()
    logs = base / "logs"
    logs.mkdir()
    ports = {"worker": free_port(), "ingest": free_port()}
    worker = spawn(
        [
            RL_HEALTH,
            "worker",
            "--concurrency",
            "2",
            "--pool",
            "prefork",
            "--loglevel",
            "WARNING",
            "--metrics-port",
            str(ports["worker"]),
            "--metrics-dir",
            str(base / "worker-metrics"),
        ],
        env,
        logs / "worker.log",
    )
    ingest = spawn(
        [RL_HEALTH, "ingest", "--metrics-port", str(ports["ingest"])], env, logs / "ingest.log"
    )
    app = make_app(settings)
    wait_for(lambda: bool(app.control.ping(timeout=0.5)), 60, "the celery worker")
    client = redis.Redis.from_url(redis_url)
    metrics = {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()}
    yield Services(env, settings, client, store, base / "bundles", logs, metrics)
    for process in (ingest, worker):
        stop(process, timeout=20)


@pytest.fixture
def pipeline_services(services: Services, monkeypatch: pytest.MonkeyPatch) -> Services:
    """The session's services with this pipeline's state wiped (the alert stream is kept, since
    the running ingest is blocked reading it), and their settings in this test's environment."""
    for name, value in services.env.items():
        if name.startswith(("RLHEALTH_", "AWS_")):
            monkeypatch.setenv(name, value)
    keep = {services.names.alerts.encode()}
    for key in services.redis.scan_iter(match=f"{PREFIX}:*", count=1000):
        if key not in keep:
            services.redis.delete(key)
    return services
