"""Issue 28, what the deployment exposes: the compose file publishes nothing beyond loopback and
holds no credential (finding 3), worker and ingest serve /metrics on loopback unless the operator
says otherwise, and `worker --metrics-dir` removes only the files it writes there (low findings).
Each test fails on the code before the fix.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.keys import TEST_KEY
from testkit.services import free_port, start_moto, start_redis, stop

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK_PUBLISH = re.compile(r"^(?:127\.0\.0\.1|\$\{RLHEALTH_PUBLISH_ADDR:-127\.0\.0\.1\}):")
SECRET_SETTING = re.compile(r"\$\{[A-Z0-9_]+:\?[^}]+\}")  # a value the operator must supply


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """docker-compose.yml as written (no engine, no interpolation)."""
    document: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return document


def test_compose_publishes_nothing_beyond_loopback(compose: dict[str, Any]) -> None:
    """Every published port listens on 127.0.0.1 unless RLHEALTH_PUBLISH_ADDR says otherwise."""
    ports = [
        (name, str(port))
        for name, service in compose["services"].items()
        for port in service.get("ports", [])
    ]
    assert ports, "no port is published: the test would prove nothing"
    assert [(name, port) for name, port in ports if not LOOPBACK_PUBLISH.match(port)] == []


def test_compose_holds_no_credential_and_redis_has_no_open_user(compose: dict[str, Any]) -> None:
    """Redis, MinIO and the verdict key take their secrets from the operator's .env (no value
    in the file); Redis's default user is off and its password is never on a command line."""
    services = compose["services"]
    app_env = services["worker"]["environment"]
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "RLHEALTH_VERDICT_KEY"):
        assert SECRET_SETTING.fullmatch(app_env[name]), name
    assert SECRET_SETTING.search(app_env["RLHEALTH_REDIS_URL"])
    for name in ("MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD"):
        assert SECRET_SETTING.fullmatch(services["minio"]["environment"][name]), name
    redis_command = " ".join(services["redis"]["command"])
    assert "user default off" in redis_command and "--aclfile" in redis_command
    assert "--requirepass" not in redis_command and "RLHEALTH_REDIS_PASSWORD}" not in redis_command


def test_flower_is_off_by_default_and_asks_for_a_login(compose: dict[str, Any]) -> None:
    """Flower (it can revoke tasks) starts only with its profile, and refuses to run without
    FLOWER_BASIC_AUTH."""
    flower = compose["services"]["flower"]
    assert flower.get("profiles") == ["flower"]
    assert "--basic-auth" in " ".join(flower["command"])


def test_new_env_writes_fresh_secrets_only_its_owner_reads(tmp_path: Path) -> None:
    """`deploy/new-env` writes every secret compose needs (a verdict key of 32 bytes), mode
    0600, and never overwrites a file."""
    target = tmp_path / "secrets.env"
    subprocess.run([str(ROOT / "deploy/new-env"), str(target)], check=True, capture_output=True)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    values = dict(
        line.split("=", 1) for line in target.read_text().splitlines() if not line.startswith("#")
    )
    needed = set(SECRET_SETTING.findall((ROOT / "docker-compose.yml").read_text()))
    assert {re.sub(r"^\$\{([A-Z0-9_]+):.*$", r"\1", name) for name in needed} <= set(values)
    assert re.fullmatch(r"[0-9a-f]{64}", values["RLHEALTH_VERDICT_KEY"])
    again = subprocess.run(
        [str(ROOT / "deploy/new-env"), str(target)], check=False, capture_output=True
    )
    assert again.returncode == 1 and target.read_text().count("=") == len(values) + 1


# --- /metrics on loopback -------------------------------------------------------------------------


def _listening(port: int) -> list[str]:
    """The local addresses listening on `port` (IPv4 and IPv6), from /proc/net."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with Path(table).open() as handle:
            for line in handle.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.rsplit(":", 1)
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.append(address)
    return found


def _loopback(address: str) -> bool:
    v4 = {"0100007F"}  # 127.0.0.1, little-endian
    v6 = {"00000000000000000000000001000000"}  # ::1
    return address in v4 | v6


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A redis-server and moto's S3 server: worker and ingest reach both before they start (an
    unreachable one stops them with exit 2), so the roles below run against real ones."""
    redis_process, redis_url = start_redis(tmp_path_factory.mktemp("redis"))
    moto_process, endpoint = start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    yield redis_url, endpoint
    stop(moto_process)
    stop(redis_process)


# a Celery worker or ingest process of its own (with a real redis-server and S3): `make test` only
ROLE_PROCESS = pytest.mark.integration


@pytest.fixture
def role(tmp_path: Path, services: tuple[str, str]) -> Iterator[Any]:
    """Start `rl-health ROLE --metrics-port P ...` against the module's Redis and S3 (it runs,
    its metrics up); stopped by its PID."""
    started: list[subprocess.Popen[bytes]] = []
    redis_url, endpoint = services

    def start(argv: list[str], **env: str) -> subprocess.Popen[bytes]:
        run = "import sys; from worker.cli import main; sys.exit(main(prog_name='rl-health'))"
        full = {k: v for k, v in os.environ.items() if not k.startswith("RLHEALTH_")}
        full.update(
            RLHEALTH_REDIS_URL=redis_url,
            RLHEALTH_S3_ENDPOINT_URL=endpoint,
            RLHEALTH_STREAM_PREFIX=f"rlhsec{free_port()}",
            AWS_ACCESS_KEY_ID="test",
            AWS_SECRET_ACCESS_KEY="test",
            AWS_DEFAULT_REGION="us-east-1",
            RLHEALTH_BUNDLE_ROOT=str(tmp_path),
            RLHEALTH_VERDICT_KEY=TEST_KEY,
            RLHEALTH_CACHE_DIR=str(tmp_path / "cache"),
            **env,
        )
        full.pop("PROMETHEUS_MULTIPROC_DIR", None)
        log = (tmp_path / f"{argv[0]}.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-c", run, *argv], env=full, stdout=log, stderr=log, cwd=ROOT
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def _bound(process: subprocess.Popen[bytes], port: int, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        addresses = _listening(port)
        if addresses:
            return addresses
        time.sleep(0.2)  # polling for the listener, not waiting a guessed time
    raise AssertionError(f"nothing listened on {port} (exit {process.poll()})")


@ROLE_PROCESS
@pytest.mark.parametrize("argv", [["ingest"], ["worker", "--pool", "solo"]], ids=lambda a: a[0])
def test_metrics_listen_on_loopback_by_default(role: Any, argv: list[str]) -> None:
    """Worker and ingest serve /metrics on 127.0.0.1 unless RLHEALTH_METRICS_ADDR opens it."""
    port = free_port()
    process = role([*argv, "--metrics-port", str(port)])
    addresses = _bound(process, port)
    assert addresses and all(_loopback(a) for a in addresses), addresses


@ROLE_PROCESS
def test_the_metrics_address_is_a_setting(role: Any) -> None:
    """RLHEALTH_METRICS_ADDR chooses the address (0.0.0.0 in the compose network; here another
    loopback address, 127.0.0.2)."""
    port = free_port()
    process = role(["ingest", "--metrics-port", str(port)], RLHEALTH_METRICS_ADDR="127.0.0.2")
    assert _bound(process, port) == ["0200007F"]


@ROLE_PROCESS
def test_metrics_dir_removes_only_the_files_it_writes(role: Any, tmp_path: Path) -> None:
    """`worker --metrics-dir DIR` removes the metric files of an earlier run and nothing else:
    not another file, not a folder, not what a symlink there points to."""
    directory, outside = tmp_path / "metrics", tmp_path / "outside"
    (directory / "keep").mkdir(parents=True)
    outside.mkdir()
    (outside / "precious").write_text("x")
    (directory / "notes.txt").write_text("mine")
    (directory / "keep" / "a.db").write_text("x")
    (directory / "link").symlink_to(outside)
    (directory / "counter_1.db").write_bytes(b"old run")
    (directory / "histogram_2.db").write_bytes(b"old run")
    port = free_port()
    argv = ["worker", "--pool", "solo", "--metrics-port", str(port), "--metrics-dir"]
    _bound(role([*argv, str(directory)]), port)
    # this run's own metric files (the worker now also keeps histograms from its start)
    own = re.compile(r"^(?:counter|histogram)_\d+\.db$")
    left = sorted(p.name for p in directory.iterdir() if not own.match(p.name))
    assert left == ["keep", "link", "notes.txt"]
    assert not (directory / "counter_1.db").exists() and not (directory / "histogram_2.db").exists()
    assert (directory / "keep" / "a.db").exists() and (outside / "precious").exists()


def test_serve_defaults_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """`metrics.serve(port)` without an address binds 127.0.0.1."""
    from worker.pipeline import metrics

    bound: list[str] = []
    monkeypatch.setattr(metrics, "start_http_server", lambda _p, addr, **_k: bound.append(addr))
    metrics.serve(1)
    assert bound == ["127.0.0.1"]
    assert socket.inet_aton(bound[0])
