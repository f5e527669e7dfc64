"""Where a soft time limit lands decides what it does: raised in a body, failing the stage before
one, recorded after one or with no job in hand — never raised mid-frame outside a body."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import task_postrun, task_prerun

from worker.pipeline import softlimit
from worker.pipeline.failures import StageTimeoutError


@pytest.fixture()
def restore_handler() -> Iterator[None]:
    before = signal.getsignal(signal.SIGUSR1)
    softlimit.connect_signals()  # as the Celery app's factory does
    yield
    signal.signal(signal.SIGUSR1, before)
    task_postrun.send(sender=None)
    softlimit._State.reads_seen = False


def _soft_limit() -> None:
    os.kill(os.getpid(), signal.SIGUSR1)  # handled as the call returns


def test_inside_a_body_the_signal_raises(restore_handler: None) -> None:
    """In a block the soft limit interrupts, the signal raises there."""
    task_prerun.send(sender=None)
    assert signal.getsignal(signal.SIGUSR1) is softlimit.soft_limit_handler
    with pytest.raises(SoftTimeLimitExceeded), softlimit.interruptible():
        _soft_limit()


def test_a_stage_body_turns_it_into_a_stage_timeout(restore_handler: None) -> None:
    """A soft limit in a stage's body fails the stage, never evidence."""
    task_prerun.send(sender=None)
    with (
        pytest.raises(StageTimeoutError, match=r"^capture ran past its soft time limit \(16 s\)$"),
        softlimit.body("capture", 16),
    ):
        _soft_limit()


def test_a_body_that_swallows_the_signal_still_fails(restore_handler: None) -> None:
    """A body that catches the exception (a gate's broad except) still fails the stage."""
    task_prerun.send(sender=None)
    with (
        pytest.raises(StageTimeoutError, match="its result is not used"),
        softlimit.body("gate liveness", 16),
        contextlib.suppress(SoftTimeLimitExceeded),
    ):
        _soft_limit()


def test_with_a_job_in_hand_before_the_body_the_stage_refuses_to_start(
    restore_handler: None,
) -> None:
    """The signal after the job was taken but before its body raises nothing there, and the body
    then refuses to start: the stage fails, naming the limit."""
    task_prerun.send(sender=None)
    _soft_limit()  # no exception here: Celery would swallow it in a prerun receiver
    ran = []
    with (
        pytest.raises(StageTimeoutError, match="before its work began"),
        softlimit.body("capture", 16),
    ):
        ran.append(True)
    assert ran == []


def test_without_the_signal_the_body_runs(restore_handler: None) -> None:
    """The pair of the one above: no signal, the body runs and its result is used."""
    task_prerun.send(sender=None)
    with softlimit.body("capture", 16):
        ran = True
    assert ran


def test_after_the_body_the_signal_is_recorded_and_the_result_stands(
    restore_handler: None, caplog: pytest.LogCaptureFixture
) -> None:
    """After the body returned (Celery hands the result on) the signal raises nothing; the task
    ends with its result and the log says the limit fired."""
    task_prerun.send(sender=None)
    with softlimit.body("publish", 16):
        pass
    before = softlimit.dropped()
    _soft_limit()
    with caplog.at_level(logging.WARNING, logger=softlimit.__name__):
        task_postrun.send(
            sender=None, task_id="t-1", task=SimpleNamespace(name="x"), state="SUCCESS"
        )
    assert softlimit.dropped() == before + 1
    assert "fired after its body returned: its result stands" in caplog.text


def test_with_no_job_in_hand_the_late_signal_is_dropped(restore_handler: None) -> None:
    """A signal after the task ended (the main loop fired late) is counted and dropped."""
    task_prerun.send(sender=None)
    task_postrun.send(sender=None)
    before = softlimit.dropped()
    _soft_limit()
    assert softlimit.dropped() == before + 1
    assert not softlimit.in_task()


def _pool_child(jobs: list[Any]) -> SimpleNamespace:
    """A stand-in for billiard's `Worker`: its `wait_for_job` hands out `jobs`."""
    return SimpleNamespace(wait_for_job=lambda: jobs.pop(0))


def test_a_job_read_takes_the_job(restore_handler: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a pool child the job is in hand from its read: a signal before prerun is its own, and
    the body refuses to start."""
    child = _pool_child([("TASK", ("job",))])
    monkeypatch.setattr(softlimit, "current_process", lambda: SimpleNamespace(_target=child))
    softlimit._wrap_job_reads()
    assert child.wait_for_job() == ("TASK", ("job",))
    _soft_limit()  # stopped between the read and prerun, then let go
    task_prerun.send(sender=None)
    with (
        pytest.raises(StageTimeoutError, match="before its work began"),
        softlimit.body("capture", 16),
    ):
        pass


def test_an_empty_read_takes_no_job(restore_handler: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pair: a read that returns no job (a poll timeout) leaves the child idle, so the
    signal then is a late one and dropped."""
    child = _pool_child([None])
    monkeypatch.setattr(softlimit, "current_process", lambda: SimpleNamespace(_target=child))
    softlimit._wrap_job_reads()
    task_prerun.send(sender=None)  # an earlier task installed the handler
    task_postrun.send(sender=None)
    assert child.wait_for_job() is None
    before = softlimit.dropped()
    _soft_limit()
    assert softlimit.dropped() == before + 1


@pytest.mark.parametrize(("taken_s_ago", "fails"), [(16.5, True), (15.5, False)])
def test_a_body_is_timed_from_the_job_read(
    restore_handler: None, monkeypatch: pytest.MonkeyPatch, taken_s_ago: float, fails: bool
) -> None:
    """A child stalled between the read and the body uses up the stage's time: a body ending
    past the soft limit counted from the read fails (16.5 s), one just short of it does not."""
    child = _pool_child([("TASK", ("job",))])
    monkeypatch.setattr(softlimit, "current_process", lambda: SimpleNamespace(_target=child))
    softlimit._wrap_job_reads()
    child.wait_for_job()
    softlimit._State.taken_at = time.monotonic() - taken_s_ago
    task_prerun.send(sender=None)
    if fails:
        with (
            pytest.raises(StageTimeoutError, match="its result is not used"),
            softlimit.body("capture", 16),
        ):
            pass
    else:
        with softlimit.body("capture", 16):
            pass


def test_billiards_handler_is_replaced_at_each_start(restore_handler: None) -> None:
    """billiard installs its own handler after the process initializer; the first task start
    puts ours back."""
    signal.signal(signal.SIGUSR1, lambda *_: None)
    task_prerun.send(sender=None)
    assert signal.getsignal(signal.SIGUSR1) is softlimit.soft_limit_handler


def test_a_task_started_in_a_thread_runs(restore_handler: None) -> None:
    """A thread pool runs tasks off the main thread, where no signal handler may be set."""
    import threading

    failures: list[BaseException] = []

    def start() -> None:
        try:  # the receiver itself: Celery's signal dispatch would log and swallow the error
            softlimit._task_started()
        except BaseException as exc:  # pragma: no cover - the failure this test catches
            failures.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    assert failures == []
