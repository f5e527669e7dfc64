"""A Celery app for `test_soft_limit_worker.py`: the pipeline's soft-limit guard in a real prefork
worker, with tasks that stall where a soft limit can land (before the body, in it, after it).

The stalls are the fault under test, not synchronisation: each sleeps `STALL_S`, past the soft
limit `SOFT_S` and well short of the hard limit `HARD_S`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

from celery import Celery, Task
from celery.signals import task_prerun, task_success

from worker.pipeline import softlimit

SOFT_S: Final = 1.0
HARD_S: Final = 8.0
STALL_S: Final = 2.0

app = Celery("softlimit-test", broker=os.environ.get("SOFTLIMIT_TEST_REDIS", "redis://"))
app.conf.update(
    result_backend=os.environ.get("SOFTLIMIT_TEST_REDIS", "redis://"),
    task_soft_time_limit=SOFT_S,
    task_time_limit=HARD_S,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
)
softlimit.connect_signals()
F = TypeVar("F", bound=Callable[..., Any])


def _task(name: str) -> Callable[[F], Any]:
    decorator: Callable[[F], Any] = app.task(name=name)
    return decorator


@_task("softlimit.stall_before_body")
def stall_before_body() -> str:
    """Its prerun receiver stalls past the soft limit (`_stall_in_prerun`)."""
    with softlimit.body("stall_before_body", SOFT_S):
        return "ran"


@_task("softlimit.stall_in_body")
def stall_in_body() -> str:
    with softlimit.body("stall_in_body", SOFT_S):
        time.sleep(STALL_S)
        return "ran"


@_task("softlimit.stall_after_body")
def stall_after_body() -> str:
    """Its success receiver stalls past the soft limit (`_stall_after_success`)."""
    with softlimit.body("stall_after_body", SOFT_S):
        return "ran"


@_task("softlimit.probe")
def probe() -> dict[str, Any]:
    """What the guard knows in this pool child."""
    with softlimit.body("probe", SOFT_S):
        return {"job_reads_noted": softlimit.reads_noted(), "in_task": softlimit.in_task()}


def _stall_in_prerun(task: Task | None = None, **_: Any) -> None:
    if task is not None and task.name == "softlimit.stall_before_body":
        time.sleep(STALL_S)


def _stall_after_success(sender: Task | None = None, **_: Any) -> None:
    if sender is not None and sender.name == "softlimit.stall_after_body":
        time.sleep(STALL_S)


task_prerun.connect(_stall_in_prerun, weak=False)
task_success.connect(_stall_after_success, weak=False)
