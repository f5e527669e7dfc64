"""docker-compose.yml is valid and names what the code expects."""

from __future__ import annotations

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
}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    binary = shutil.which("docker-compose")
    if binary is None:
        print("docker-compose is not installed (make system-deps installs it); skipping")
        pytest.skip("docker-compose binary absent")
    result = subprocess.run(
        [binary, "-f", str(ROOT / "docker-compose.yml"), "config"],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def test_services_are_all_there_with_health_checks(compose: dict[str, Any]) -> None:
    """redis, minio, worker, ingest and flower exist, each with a health check."""
    services = compose["services"]
    assert set(services) == {"redis", "minio", "worker", "ingest", "flower"}
    assert all("healthcheck" in service for service in services.values())


def test_app_services_get_the_settings_the_code_reads(compose: dict[str, Any]) -> None:
    """worker, ingest and flower carry every connection setting, each a real Settings field."""
    fields = {f"RLHEALTH_{name.upper()}" for name in Settings.model_fields}
    for name in ("worker", "ingest", "flower"):
        env = compose["services"][name]["environment"]
        rlhealth = {key for key in env if key.startswith("RLHEALTH_")}
        assert rlhealth >= CONNECTIONS
        assert rlhealth <= fields, rlhealth - fields
        assert env["RLHEALTH_REDIS_URL"].startswith("redis://redis:6379")
        assert env["RLHEALTH_S3_ENDPOINT_URL"] == "http://minio:9000"


def test_commands_and_ports(compose: dict[str, Any]) -> None:
    """The worker runs prefork `rl-health worker`, ingest runs `rl-health ingest`; ports match."""
    services = compose["services"]
    assert services["worker"]["command"][:2] == ["rl-health", "worker"]
    assert "prefork" in services["worker"]["command"]
    assert services["ingest"]["command"] == ["rl-health", "ingest"]

    def published(name: str) -> set[int]:
        return {
            int(port["target"]) if isinstance(port, dict) else int(str(port).split(":")[-1])
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
