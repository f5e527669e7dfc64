"""Against real services: a dependency that cannot be used is one line on stderr naming it and
exit 2, within 15 s, for every command that needs it — Redis down, a malformed Redis URL, S3
down, no AWS credentials — and `ingest --once` with Redis down exits."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.keys import TEST_KEY
from testkit.services import RL_HEALTH, free_port, start_moto, start_redis, stop

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LIMIT_S = 15.0
JOB = "jobs/cw-rno2a/ops/rl-gsm8k-stalled"


@pytest.fixture(scope="module")
def redis_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process, url = start_redis(tmp_path_factory.mktemp("redis"))
    yield url
    stop(process)


@pytest.fixture(scope="module")
def s3_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process, endpoint = start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    yield endpoint
    stop(process)


@pytest.fixture(scope="module")
def redis_down(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The URL of a redis-server that ran and was stopped: nothing answers there now."""
    process, url = start_redis(tmp_path_factory.mktemp("redis-gone"))
    stop(process)
    return url


@pytest.fixture(scope="module")
def s3_down(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The endpoint of a moto server that ran and was stopped."""
    process, endpoint = start_moto(tmp_path_factory.mktemp("moto-gone") / "moto.log")
    stop(process)
    return endpoint


def _env(redis_url: str, s3: str | None, *, credentials: bool = True) -> dict[str, str]:
    keep = ("PATH", "HOME", "PYTHONPATH", "LANG", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env |= {
        "RLHEALTH_REDIS_URL": redis_url,
        "RLHEALTH_S3_BUCKET": "rlhealth-deps",
        "RLHEALTH_BUNDLE_ROOT": str(ROOT / "examples"),
        "RLHEALTH_VERDICT_KEY": TEST_KEY,
        "RLHEALTH_CACHE_DIR": str(Path(env.get("TMPDIR", "/tmp")) / f"rlhealth-deps-{os.getpid()}"),
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/nonexistent/aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    if s3 is not None:
        env["RLHEALTH_S3_ENDPOINT_URL"] = s3
    if credentials:
        env |= {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    return env


def _one_line_exit_2(argv: list[str], env: dict[str, str], *needles: str) -> str:
    """Run `rl-health ARGV`: exit 2 within LIMIT_S, one line on stderr holding every needle."""
    started = time.monotonic()
    done = subprocess.run(
        [RL_HEALTH, *argv], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    took = time.monotonic() - started
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (argv, done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("rl-health: "), (argv, lines)
    for needle in needles:
        assert needle in lines[0], (argv, lines[0])
    assert "Traceback" not in done.stderr and took < LIMIT_S, (argv, took)
    return lines[0]


REDIS_COMMANDS = [
    ["check"],
    ["alert", JOB],
    ["alert", JOB, "--wait", "5"],
    ["verdicts"],
    ["verdicts", "--follow", "--timeout", "5"],
    ["verdicts", "--event", "evt-1"],
    ["replay", "evt-1"],
    ["ingest", "--once"],
    ["ingest"],
    ["worker"],
    ["board", "--port", str(free_port())],
]


@pytest.mark.parametrize("argv", REDIS_COMMANDS, ids=" ".join)
def test_redis_down(argv: list[str], redis_down: str, s3_up: str) -> None:
    """redis-server stopped: every command that needs it names RLHEALTH_REDIS_URL and its
    address; `ingest --once` exits instead of waiting for it."""
    address = redis_down.removeprefix("redis://")
    _one_line_exit_2(argv, _env(redis_down, s3_up), "RLHEALTH_REDIS_URL", address)


@pytest.mark.parametrize(
    "argv", [["alert", JOB], ["verdicts"], ["ingest"], ["replay", "e"], ["board"]], ids=" ".join
)
def test_a_malformed_redis_url(argv: list[str], s3_up: str) -> None:
    """`redis//host` (a missing colon) stops every command before anything runs, naming the
    setting and never echoing the value."""
    env = _env("redis//:hunter2@127.0.0.1:6379/0", s3_up)
    assert "hunter2" not in _one_line_exit_2(argv, env, "unusable setting RLHEALTH_REDIS_URL")


S3_COMMANDS = [
    ["check"],
    ["replay", "evt-1"],
    ["sweep", "--keep", "30d"],
    ["ingest", "--once"],
    ["worker"],
    ["board", "--port", str(free_port())],
]


@pytest.mark.parametrize("argv", S3_COMMANDS, ids=" ".join)
def test_s3_down(argv: list[str], redis_up: str, s3_down: str) -> None:
    """moto stopped: the commands that use S3 name RLHEALTH_S3_ENDPOINT_URL, the endpoint and
    the bucket."""
    _one_line_exit_2(
        argv, _env(redis_up, s3_down), "RLHEALTH_S3_ENDPOINT_URL", s3_down, "rlhealth-deps"
    )


@pytest.mark.parametrize(
    "argv", [["sweep", "--keep", "30d"], ["replay", "evt-1"], ["check"]], ids=" ".join
)
def test_no_aws_credentials(argv: list[str], redis_up: str, s3_up: str) -> None:
    """No AWS credentials anywhere: one line saying so and how to give them."""
    _one_line_exit_2(
        argv,
        _env(redis_up, s3_up, credentials=False),
        "no usable AWS credentials",
        "AWS_ACCESS_KEY_ID",
    )
