"""A soft time limit that arrives outside a task body is dropped, never raised mid-frame."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import task_postrun, task_prerun

from worker.pipeline import softlimit


@pytest.fixture()
def restore_handler() -> Iterator[None]:
    before = signal.getsignal(signal.SIGUSR1)
    softlimit.connect_signals()  # as the Celery app's factory does
    yield
    signal.signal(signal.SIGUSR1, before)
    task_postrun.send(sender=None)


def test_inside_a_task_the_signal_raises(restore_handler: None) -> None:
    task_prerun.send(sender=None)
    assert signal.getsignal(signal.SIGUSR1) is softlimit.soft_limit_handler
    with pytest.raises(SoftTimeLimitExceeded):
        os.kill(os.getpid(), signal.SIGUSR1)  # handled as the call returns


def test_after_the_task_the_late_signal_is_dropped(restore_handler: None) -> None:
    task_prerun.send(sender=None)
    task_postrun.send(sender=None)
    before = softlimit.dropped()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert softlimit.dropped() == before + 1
    assert not softlimit.in_task()


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
