"""Poison containment: a task that kills its process is not delivered forever.

Tasks are acknowledged late and re-queued when their process dies, so a bundle that crashes or
exhausts the worker would be redelivered without end. Two guards stop that:

- `DeliveryGuard.started` counts the starts of one delivery of a task (its id and retry number).
  The third start means the task was killed twice while running: it raises `PoisonError`
  instead of running, and the workflow's error callback answers the diagnosis ERROR.
- `MemoryCeiling` watches the resident memory of the process running a task. Past the budget it
  records why (so the next delivery fails at once with the reason) and stops the process with
  SIGKILL — before the kernel's OOM killer picks a victim, possibly another service.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from shared.streams import StreamNames
from worker.pipeline.failures import PoisonError

__all__ = ["DeliveryGuard", "MemoryCeiling", "resident_bytes"]

log = logging.getLogger(__name__)

_KILLED_TWICE: Final = 3  # starts of one delivery: the first run and two after kills
_PAGE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """This process's resident set size in bytes (Linux /proc; 0 where unavailable)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class DeliveryGuard:
    """Counts task starts per delivery and remembers why a process had to be stopped."""

    def __init__(self, redis: Any, names: StreamNames, ttl_s: int = 24 * 3600) -> None:
        self.redis = redis
        self.names = names
        self.ttl_s = ttl_s

    def started(self, task_id: str, retries: int, what: str) -> None:
        """Record a start of `what`; raises `PoisonError` when it must not run again."""
        reason = self.redis.get(self.names.poison(task_id))
        if reason is not None:
            raise PoisonError(_text(reason))
        starts = self.count(task_id, retries)
        if starts >= _KILLED_TWICE:
            raise PoisonError(
                f"{what} was killed twice while running (started {starts} times): its worker "
                "process died, out of memory or crashed in native code"
            )

    def count(self, task_id: str, retries: int) -> int:
        """Record one more start of this delivery; how many there have been."""
        key = self.names.runs(task_id, retries)
        starts = int(self.redis.incr(key))
        self.redis.expire(key, self.ttl_s)
        return starts

    def stopped(self, task_id: str, reason: str) -> None:
        """Remember why the process running `task_id` is being stopped."""
        self.redis.set(self.names.poison(task_id), reason, ex=self.ttl_s)


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class MemoryCeiling:
    """Stops this process when its resident memory passes `budget_mb` while a block runs."""

    def __init__(
        self,
        budget_mb: int,
        on_exceeded: Callable[[int], None],
        *,
        interval_s: float = 0.05,
        measure: Callable[[], int] = resident_bytes,
        stop_process: Callable[[], None] = _kill_self,
    ) -> None:
        self.budget = budget_mb * 1024 * 1024
        self.on_exceeded = on_exceeded
        self.interval_s = interval_s
        self.measure = measure
        self.stop_process = stop_process

    @contextmanager
    def watching(self) -> Iterator[None]:
        if self.budget <= 0:
            yield
            return
        done = threading.Event()
        thread = threading.Thread(target=self._watch, args=(done,), daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=5)

    def _watch(self, done: threading.Event) -> None:
        while not done.wait(self.interval_s):
            used = self.measure()
            if used > self.budget:
                self._exceeded(used)
                return

    def _exceeded(self, used: int) -> None:
        try:
            self.on_exceeded(used)
        except Exception as exc:  # the kill must happen anyway; the kill count is the backstop
            log.error("could not record the memory budget overrun: %s", exc)
        self.stop_process()
