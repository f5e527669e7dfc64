"""Where a soft time limit lands in a pool child, and what it does there.

Celery's main process times a task's soft limit from the moment a pool child acknowledges the job
(billiard's ACK, sent as soon as the child reads it), and then sends the child SIGUSR1. billiard's
own handler raises `SoftTimeLimitExceeded` wherever the child happens to be; this module's handler
decides by where that is, so the outcome never depends on timing:

- **in a stage's body** (`body`, `interruptible`): raised there; `body` fails the stage with
  `StageTimeoutError`, never evidence.
- **with a job in hand but before its body** (the child was stopped, swapped out or starved of CPU
  right after taking the job; or the signal landed in a `task_prerun` receiver, where Celery logs
  and swallows any exception, and the body used to run as if no limit had fired): recorded, and
  `body` refuses to start: the stage fails the same way. Its time is gone, and a body started now
  would have only the gap to the hard limit before it is killed mid-write.
- **after the body returned**, while Celery hands its result on (sends the next step, stores the
  result), or with **no job in hand** (after a broker reconnect the main loop can fire the limit of
  a task whose result it had not read yet, and an exception in the child's result write cut the
  frame the main process then read: "Unrecoverable error: UnicodeDecodeError", docs/reliability.md):
  recorded, never raised. The stage's work is complete; raising there would stop the hand-over
  half-way (the next step sent, the result not stored) or kill the worker. A limit after the body
  is logged when the task ends.

A job is "in hand" from the moment the child reads it (`worker_process_init` wraps billiard's
`wait_for_job` in each child) until `task_postrun`; where no wrapper is installed (thread and solo
pools, which get no signal anyway) the job is taken at `task_prerun`. A signal handled after the
read is that job's: with Celery's default fair scheduling the main process writes a child its
next job only after reading the previous job's result, and fires a job's limit only while that
result is unread, so a late signal is pending before the next job exists, and Python runs its
handler before the read that brings the job returns. The hard time limit still stands behind
every task.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Final

from billiard.process import current_process
from celery import states
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import task_postrun, task_prerun, worker_process_init

from worker.pipeline.failures import StageTimeoutError

__all__ = [
    "body",
    "connect_signals",
    "dropped",
    "in_task",
    "interruptible",
    "reads_noted",
    "soft_limit_handler",
]

log = logging.getLogger(__name__)

_SIGNAL: Final = getattr(signal, "SIGUSR1", None)


class _State:
    taken_at: float | None = None  # monotonic time this process took its current job
    in_body = False
    fired = False  # the current job's soft limit arrived (in its body or not)
    reads_seen = False  # this child's job reads are noted: a body is timed from the read
    dropped = 0


def in_task() -> bool:
    """True while this process holds a job (read from the pool, not yet ended)."""
    return _State.taken_at is not None


def reads_noted() -> bool:
    """True in a pool child whose job reads are noted (a body is timed from the read)."""
    return _State.reads_seen


def dropped() -> int:
    """Soft-limit signals in this process that raised nothing: after a body or with no job."""
    return _State.dropped


def soft_limit_handler(signum: int, frame: FrameType | None) -> None:
    """Raise inside a body; elsewhere record the signal and go on (no logging here: a signal
    handler must not take the logging lock the interrupted code may hold)."""
    if _State.taken_at is None:
        _State.dropped += 1
        return
    _State.fired = True  # a body that swallows the exception still fails (`body`)
    if _State.in_body:
        raise SoftTimeLimitExceeded()


def _install_handler() -> None:
    # billiard installs its own handler after the process initializer: put ours back (only a
    # main thread may; a thread pool has no soft-limit signal to guard)
    main = threading.current_thread() is threading.main_thread()
    if _SIGNAL is not None and main and signal.getsignal(_SIGNAL) is not soft_limit_handler:
        signal.signal(_SIGNAL, soft_limit_handler)


def _job_taken() -> None:
    _install_handler()
    _State.in_body = _State.fired = False
    _State.taken_at = time.monotonic()


def _task_started(**_: Any) -> None:
    if _State.taken_at is None:  # no wrapper saw the job read: the job starts here
        _job_taken()
    _install_handler()


def _task_finished(
    task_id: str | None = None, task: Any = None, state: str | None = None, **_: Any
) -> None:
    if _State.fired and state == states.SUCCESS:
        _State.dropped += 1
        log.warning(
            "the soft time limit of %s[%s] fired after its body returned: its result stands",
            getattr(task, "name", "a task"),
            task_id,
        )
    _State.taken_at = None
    _State.in_body = _State.fired = False


def _wrap_job_reads(**_: Any) -> None:
    """In a new pool child: note each job the moment it is read (billiard's `Worker` is the
    child process's target; its `wait_for_job` is made before this initializer runs and read by
    the work loop after it)."""
    worker = getattr(current_process(), "_target", None)
    read: Callable[..., Any] | None = getattr(worker, "wait_for_job", None)
    if worker is None or read is None:
        log.warning("no billiard job reader in this child: soft limits are timed from prerun")
        return

    def wait_for_job(*args: Any, **kwargs: Any) -> Any:
        job = read(*args, **kwargs)
        if job:
            _job_taken()
        return job

    worker.wait_for_job = wait_for_job
    _State.reads_seen = True


@contextmanager
def interruptible() -> Iterator[None]:
    """A block the soft time limit interrupts (raises `SoftTimeLimitExceeded` in)."""
    _State.in_body = True
    try:
        yield
    finally:
        _State.in_body = False


@contextmanager
def body(what: str, soft_s: float) -> Iterator[None]:
    """A stage's body under its soft time limit of `soft_s`, timed from when the job was taken:
    a limit that fired before the body, in it (even if the body swallowed it), or a body that
    ended past the limit, fails the stage with `StageTimeoutError`; a result made past the limit
    is not used."""
    limit = f"{what} ran past its soft time limit ({soft_s:g} s)"
    taken = _State.taken_at if _State.reads_seen else None
    started = taken if taken is not None else time.monotonic()
    if _State.fired:
        raise StageTimeoutError(f"{limit} before its work began")
    _State.in_body = True
    try:
        yield
    except SoftTimeLimitExceeded as exc:
        raise StageTimeoutError(limit) from exc
    finally:
        _State.in_body = False
    if _State.fired or time.monotonic() - started >= soft_s:
        raise StageTimeoutError(f"{limit}; its result is not used")


def connect_signals() -> None:
    """Guard this process's soft time limits from now on (the Celery app's factory calls this:
    `worker.pipeline.app.make_app`). Connecting again adds nothing: Celery keys a receiver by
    its identity."""
    worker_process_init.connect(_wrap_job_reads, weak=False)
    task_prerun.connect(_task_started, weak=False)
    task_postrun.connect(_task_finished, weak=False)
