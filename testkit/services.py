"""Start and stop the real services of the pipeline: redis-server, moto's S3 server, and the
`rl-health worker` / `rl-health ingest` processes; used by the integration tests and the bench."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import SecretStr

from shared.settings import Settings
from testkit.keys import TEST_KEY

PREFIX = "rlhtest"
RL_HEALTH = str(Path(sys.executable).with_name("rl-health"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # not up yet
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not come up within {timeout}s")


def stop(process: subprocess.Popen[bytes], timeout: float = 10) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def service_env(
    redis_url: str, s3_endpoint: str, bundle_root: Path, cache: Path, coalesce_s: float = 20
) -> dict[str, str]:
    return {
        **os.environ,
        "RLHEALTH_REDIS_URL": redis_url,
        "RLHEALTH_S3_ENDPOINT_URL": s3_endpoint,
        "RLHEALTH_S3_BUCKET": "rlhealth-test",
        "RLHEALTH_S3_PREFIX": "ci",
        "RLHEALTH_BUNDLE_ROOT": str(bundle_root),
        "RLHEALTH_STREAM_PREFIX": PREFIX,
        "RLHEALTH_COALESCE_S": str(coalesce_s),
        "RLHEALTH_CACHE_DIR": str(cache),
        "RLHEALTH_VERDICT_KEY": TEST_KEY,  # every pipeline role signs or verifies with it
        # these services judge recorded bundles without a live backend, as `diagnose` does: no
        # second look before a stall KILL (tests/integration/test_second_look.py takes them)
        "RLHEALTH_REOBSERVE_S": "0",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "PYTHONUNBUFFERED": "1",
    }


def settings_from(env: dict[str, str]) -> Settings:
    return Settings(
        redis_url=env["RLHEALTH_REDIS_URL"],
        s3_endpoint_url=env["RLHEALTH_S3_ENDPOINT_URL"],
        s3_bucket=env["RLHEALTH_S3_BUCKET"],
        s3_prefix=env["RLHEALTH_S3_PREFIX"],
        bundle_root=Path(env["RLHEALTH_BUNDLE_ROOT"]),
        stream_prefix=PREFIX,
        coalesce_s=float(env["RLHEALTH_COALESCE_S"]),
        cache_dir=Path(env["RLHEALTH_CACHE_DIR"]),
        verdict_key=SecretStr(env["RLHEALTH_VERDICT_KEY"]),
    )


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    handle = log.open("wb")
    return subprocess.Popen(argv, env=env, stdout=handle, stderr=subprocess.STDOUT)


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """redis-server on a free loopback port, without persistence; returns it and its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (make system-deps installs it)")
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(argv, cwd=workdir, stdout=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    wait_for(lambda: bool(client.ping()), 10, "redis-server")
    return process, f"redis://127.0.0.1:{port}/0"


def start_moto(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """moto's S3 server on a free loopback port; returns it and its endpoint."""
    port = free_port()
    moto = str(Path(sys.executable).with_name("moto_server"))
    handle = log.open("wb")
    process = subprocess.Popen(
        [moto, "-H", "127.0.0.1", "-p", str(port)], stdout=handle, stderr=handle
    )
    wait_for(lambda: socket.create_connection(("127.0.0.1", port), 0.2) is not None, 20, "moto")
    return process, f"http://127.0.0.1:{port}"
