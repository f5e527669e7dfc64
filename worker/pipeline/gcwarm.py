"""Keep the worker's long-lived objects out of Python's full garbage collections.

A worker process holds some 200,000 objects that live as long as it does: the modules of Celery,
botocore, polars and pydantic, the S3 client's service model, compiled patterns. CPython's
oldest generation is collected whenever enough new objects have survived two collections, and
each such collection walks every one of them (0.12-0.19 s on this project's 2-core machine), about
once per capture of a 1 GB log. `gc.freeze` moves the objects alive at that moment to a permanent
generation that no collection walks; objects made afterwards are collected as before, so garbage
cycles of a task are still freed.

Two moments, each once per process: a pool child's start (what it inherited from the parent's
imports), and the end of its first task (what the first task loaded for good: lazily imported
modules, the S3 client). Both collect first, so no garbage of the moment is frozen with them.
"""

from __future__ import annotations

import gc
from typing import Any

from celery.signals import task_postrun, worker_process_init

__all__ = ["FREEZES", "freeze_survivors"]

# The moments frozen so far in this process (a child's start, the end of its first task).
FREEZES: list[str] = []
_AFTER_FIRST_TASK = "after its first task"


def freeze_survivors(moment: str) -> int:
    """Collect the garbage, then freeze every object still alive; the objects frozen in all."""
    gc.collect()
    gc.freeze()
    FREEZES.append(moment)
    return gc.get_freeze_count()


def _child_started(**_: Any) -> None:
    freeze_survivors("at the child's start")


def _task_finished(**_: Any) -> None:
    if _AFTER_FIRST_TASK not in FREEZES:
        freeze_survivors(_AFTER_FIRST_TASK)


worker_process_init.connect(_child_started, weak=False)
task_postrun.connect(_task_finished, weak=False)
