"""docker-compose.yml is valid and names what the code expects."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.settings import Settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONNECTIONS = {
    "RLHEALTH_REDIS_URL",
    "RLHEALTH_S3_ENDPOINT_URL",
    "RLHEALTH_S3_BUCKET",
    "RLHEALTH_BUNDLE_ROOT",
    "RLHEALTH_VERDICT_KEY",
}
# what `deploy/new-env` writes to .env: the deployment starts only with these set
SECRETS = {
    "RLHEALTH_REDIS_PASSWORD": "redis-password",
    "RLHEALTH_S3_ACCESS_KEY": "s3-access",
    "RLHEALTH_S3_SECRET_KEY": "s3-secret",
    "RLHEALTH_VERDICT_KEY": "ab" * 32,
}


def _config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    if binary is None:
        print("docker-compose is not installed (make system-deps installs it); skipping")
        pytest.skip("docker-compose binary absent")
    return subprocess.run(
        [binary, "-f", str(ROOT / "docker-compose.yml"), "config"],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )


def _target(port: object) -> int:
    """The container port of a `[ip:]host:container[/proto]` entry."""
    return int(str(port).split(":")[-1].split("/")[0])


def _environment() -> dict[str, str]:
    """This process's environment without any value compose would interpolate."""
    return {k: v for k, v in os.environ.items() if k not in SECRETS and k != "FLOWER_BASIC_AUTH"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    result = _config({**_environment(), **SECRETS})
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def test_services_are_all_there_with_health_checks(compose: dict[str, Any]) -> None:
    """redis, minio, worker, ingest, flower, board and prometheus exist, each health-checked."""
    services = compose["services"]
    assert set(services) == {"redis", "minio", "worker", "ingest", "flower", "board", "prometheus"}
    assert all("healthcheck" in service for service in services.values())


def test_app_services_get_the_settings_the_code_reads(compose: dict[str, Any]) -> None:
    """worker, ingest and flower carry every connection setting, each a real Settings field."""
    fields = {f"RLHEALTH_{name.upper()}" for name in Settings.model_fields}
    for name in ("worker", "ingest", "flower", "board"):
        env = compose["services"][name]["environment"]
        rlhealth = {key for key in env if key.startswith("RLHEALTH_")}
        assert rlhealth >= CONNECTIONS
        assert rlhealth <= fields, rlhealth - fields
        # the password-holding user of the ACL, never the passwordless default one
        url = f"redis://rlhealth:{SECRETS['RLHEALTH_REDIS_PASSWORD']}@redis:6379/0"
        assert env["RLHEALTH_REDIS_URL"] == url
        assert env["RLHEALTH_S3_ENDPOINT_URL"] == "http://minio:9000"
        assert env["AWS_SECRET_ACCESS_KEY"] == SECRETS["RLHEALTH_S3_SECRET_KEY"]


def test_nothing_starts_without_the_operators_secrets() -> None:
    """Without .env (its values unset) `docker-compose config` fails, naming what to create."""
    if (ROOT / ".env").exists():
        pytest.skip("this checkout has a .env: compose would read it")
    result = _config(_environment())
    assert result.returncode != 0 and "deploy/new-env" in result.stderr


def test_commands_and_ports(compose: dict[str, Any]) -> None:
    """The worker runs prefork `rl-health worker`, ingest runs `rl-health ingest`; ports match."""
    services = compose["services"]
    assert services["worker"]["command"][:2] == ["rl-health", "worker"]
    assert "prefork" in services["worker"]["command"]
    assert services["ingest"]["command"][:2] == ["rl-health", "ingest"]

    def published(name: str) -> set[int]:
        return {
            int(port["target"]) if isinstance(port, dict) else _target(port)
            for port in services[name].get("ports", [])
        }

    assert 6379 in published("redis")
    assert 9000 in published("minio")
    assert 5555 in published("flower")


def test_bundles_are_mounted_read_only(compose: dict[str, Any]) -> None:
    """The job bundles reach the app containers read-only, at RLHEALTH_BUNDLE_ROOT."""
    for name in ("worker", "ingest"):
        service = compose["services"][name]
        root = service["environment"]["RLHEALTH_BUNDLE_ROOT"]
        volumes = [
            str(v) if not isinstance(v, dict) else f"{v['source']}:{v['target']}:ro"
            for v in service["volumes"]
        ]
        assert any(v.endswith(f":{root}:ro") for v in volumes), volumes


def test_redis_keeps_its_data_across_a_restart(compose: dict[str, Any]) -> None:
    """Redis runs with the append-only file on a named volume, so a restart loses nothing."""
    redis = compose["services"]["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] in {"everysec", "always"}
    assert any(str(v).endswith(":/data") or "/data" in str(v) for v in redis["volumes"])
    assert "redis-data" in compose["volumes"]


def _metrics_port(command: list[str]) -> int:
    return int(command[command.index("--metrics-port") + 1])


def test_prometheus_scrapes_every_worker_replica_and_ingest(compose: dict[str, Any]) -> None:
    """Prometheus mounts deploy/prometheus.yml read-only; it finds worker replicas and ingest by
    their compose names, on the ports their commands serve /metrics on."""
    services = compose["services"]
    prometheus = services["prometheus"]
    mounts = [
        v if isinstance(v, str) else f"{v['source']}:{v['target']}:ro"
        for v in prometheus["volumes"]
    ]
    assert any(
        m.endswith("/deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro") for m in mounts
    )
    config = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    targets = {
        sd["names"][0]: sd["port"]
        for job in config["scrape_configs"]
        for sd in job.get("dns_sd_configs", [])
    }
    assert targets == {
        "worker": _metrics_port(services["worker"]["command"]),
        "ingest": _metrics_port(services["ingest"]["command"]),
    }
    assert "--metrics-dir" in services["worker"]["command"]  # the prefork pool's shared files


def test_the_board_is_served_read_only_on_its_port(compose: dict[str, Any]) -> None:
    """The board runs `rl-health board` on all interfaces of its container, published on 8080."""
    board = compose["services"]["board"]
    assert board["command"][:2] == ["rl-health", "board"]
    assert board["command"][board["command"].index("--port") + 1] == "8080"
    assert any((p["target"] if isinstance(p, dict) else _target(p)) == 8080 for p in board["ports"])


def _mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    found = []
    for volume in service.get("volumes", ()):
        if isinstance(volume, dict):
            found.append((str(volume.get("source")), str(volume.get("target"))))
        else:
            source, target = str(volume).split(":")[:2]
            found.append((source, target))
    return found


def test_compose_starts_with_what_is_in_the_repository(compose: dict[str, Any]) -> None:
    """Without RLHEALTH_BUNDLE_DIR the bundles mounted are a folder of this repository that holds
    the quick start's job and probes, so `docker-compose up` on a fresh clone has something to
    judge (it used to mount ./examples/bundles, which does not exist)."""
    for name in ("worker", "ingest", "board"):
        service = compose["services"][name]
        root = service["environment"]["RLHEALTH_BUNDLE_ROOT"]
        (source,) = [s for s, target in _mounts(service) if target == root]
        assert Path(source).is_dir(), source
        assert (Path(source) / "jobs/cw-rno2a/ops/rl-gsm8k-stalled/finelog.log").is_file()
        assert (Path(source) / "probes/rl-gsm8k-stalled/probes.json").is_file()


def test_operations_md_agrees_with_compose_about_redis_persistence(compose: dict[str, Any]) -> None:
    """Compose runs Redis with its append-only file; the runbook says so, and never that it
    runs without persistence."""
    command = " ".join(str(part) for part in compose["services"]["redis"]["command"])
    assert "--appendonly yes" in " ".join(command.split())
    runbook = (ROOT / "docs/operations.md").read_text()
    assert "Redis runs with its append-only file" in runbook
    assert "without persistence" not in runbook.split("## Deploy with compose")[1].split("\n## ")[0]
