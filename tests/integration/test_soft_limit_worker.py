"""A soft time limit in a real prefork worker: wherever it lands in the pool child, the outcome
is decided by where, never by timing (worker/pipeline/softlimit.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.result import AsyncResult

from testkit.services import spawn, stop, wait_for
from tests.integration import softlimit_app
from worker.pipeline.failures import StageTimeoutError

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def worker(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One prefork worker with one child for the test app; yields its log."""
    log = tmp_path_factory.mktemp("softlimit-worker") / "worker.log"
    env = {**os.environ, "SOFTLIMIT_TEST_REDIS": redis_url, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "celery", "-A", "tests.integration.softlimit_app", "worker",
            "--pool", "prefork", "--concurrency", "1", "--loglevel", "INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip
    process = spawn(argv, env, log)
    softlimit_app.app.conf.update(broker_url=redis_url, result_backend=redis_url)
    try:
        wait_for(lambda: b"ready." in log.read_bytes(), 60, "the soft-limit test worker")
        yield log
    finally:
        stop(process)


def _outcome(name: str) -> AsyncResult[Any]:
    result: AsyncResult[Any] = softlimit_app.app.send_task(name)
    result.get(timeout=30, propagate=False)
    return result


def test_a_limit_before_the_body_fails_the_stage(worker: Path) -> None:
    """A soft limit that fires after the child took the job but before its body (here in a
    prerun receiver, where Celery would swallow the exception) fails the stage: the body never
    runs as if nothing had happened."""
    result = _outcome("softlimit.stall_before_body")
    assert result.state == "FAILURE"
    assert isinstance(result.result, StageTimeoutError)
    assert "before its work began" in str(result.result)


def test_a_limit_in_the_body_fails_the_stage(worker: Path) -> None:
    """A soft limit inside the body fails the stage with StageTimeoutError."""
    result = _outcome("softlimit.stall_in_body")
    assert result.state == "FAILURE"
    assert isinstance(result.result, StageTimeoutError)


def test_a_limit_after_the_body_keeps_its_result_and_says_so(worker: Path) -> None:
    """A soft limit that fires after the body returned (Celery handing the result on) raises
    nothing: the result stands, the worker log says so, and the worker goes on."""
    result = _outcome("softlimit.stall_after_body")
    assert (result.state, result.result) == ("SUCCESS", "ran")
    assert _outcome("softlimit.probe").state == "SUCCESS"  # one child: the stalled task is over
    assert b"fired after its body returned: its result stands" in worker.read_bytes()


def test_the_pool_child_notes_each_job_it_reads(worker: Path) -> None:
    """In a real billiard child the guard sees each job read (where Celery starts its soft
    limit's clock), so a stall between the read and the body is the job's."""
    result = _outcome("softlimit.probe")
    assert result.result == {"job_reads_noted": True, "in_task": True}
