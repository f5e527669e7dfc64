"""A soft time limit raises only while a task body runs.

Celery's main process sends SIGUSR1 to a pool child when a task's soft time limit passes, by its
own clock. After a broker reconnect it may fire late, for a task whose result the child already
sent (the main loop was busy reconnecting and had not read it): the signal then lands while the
child waits for its next job or writes a result, billiard's handler raises there and cuts the
frame, and the main process dies with `UnicodeDecodeError` in `asynpool._recv_message`
("Unrecoverable error"), taking every task it held. The Redis crash drill (docs/reliability.md)
saw it once in two runs.

Here the child's handler raises `SoftTimeLimitExceeded` only between `task_prerun` and
`task_postrun`; anywhere else the signal is counted and dropped. The hard time limit still stands
behind every task.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any, Final

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import task_postrun, task_prerun

__all__ = ["connect_signals", "dropped", "in_task", "soft_limit_handler"]

_SIGNAL: Final = getattr(signal, "SIGUSR1", None)


class _State:
    running = False
    dropped = 0


def in_task() -> bool:
    return _State.running


def dropped() -> int:
    """Soft-limit signals that arrived outside a task body in this process."""
    return _State.dropped


def soft_limit_handler(signum: int, frame: FrameType | None) -> None:
    """Raise inside a task body; outside one, count the late signal and go on (no logging here:
    a signal handler must not take the logging lock the interrupted code may hold)."""
    if _State.running:
        raise SoftTimeLimitExceeded()
    _State.dropped += 1


def _task_started(**_: Any) -> None:
    # billiard installs its own handler after the process initializer: replace it here, once
    # (only a main thread may; a thread pool has no soft-limit signal to guard)
    main = threading.current_thread() is threading.main_thread()
    if _SIGNAL is not None and main and signal.getsignal(_SIGNAL) is not soft_limit_handler:
        signal.signal(_SIGNAL, soft_limit_handler)
    _State.running = True


def _task_finished(**_: Any) -> None:
    _State.running = False


def connect_signals() -> None:
    """Guard this process's soft time limits from now on (the Celery app's factory calls this:
    `worker.pipeline.app.make_app`). Connecting again adds nothing: Celery keys a receiver by
    its identity."""
    task_prerun.connect(_task_started, weak=False)
    task_postrun.connect(_task_finished, weak=False)
