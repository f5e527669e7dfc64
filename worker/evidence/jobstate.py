"""Job and task states as one enum, with the groups every reader agrees on.

Iris numbers job states 0-8 and adds task states 9-12 (docs/domain.md#iris-job-and-task-states); the
controller, the attempt history and the manifest write them as lower-case names, sometimes with a
`job_state_` or `task_state_` prefix or as the number. `JobState.parse` reads every form; the
groups below replace the separate `TERMINAL` sets the gates used to keep (which disagreed about
`unschedulable`).

- terminal: the job will not run again by itself — succeeded, failed, killed, worker_failed and
  unschedulable (Iris gives up scheduling it; no step will ever be reached).
- waiting: admitted but not running yet — pending, building, assigned.
- failure: an attempt ended by a failure — failed, worker_failed, cosched_failed.
- transient: an attempt lost to the platform, not the program — worker_failed, preempted.
- alive: may still produce or has produced a good end — running, succeeded and the waiting states.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["JobState"]


class JobState(StrEnum):
    UNSPECIFIED = "unspecified"
    PENDING = "pending"
    BUILDING = "building"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    WORKER_FAILED = "worker_failed"
    UNSCHEDULABLE = "unschedulable"
    ASSIGNED = "assigned"
    PREEMPTED = "preempted"
    COSCHED_FAILED = "cosched_failed"
    MISSING = "missing"

    @classmethod
    def parse(cls, raw: str | int | None) -> JobState | None:
        """The state named by `raw` (a name, a prefixed name or an Iris number); None if unknown."""
        if raw is None:
            return None
        name = str(raw).strip().lower()
        if name.isdigit():
            return _BY_NUMBER.get(int(name))
        for prefix in ("task_state_", "job_state_", "attempt_state_"):
            name = name.removeprefix(prefix)
        try:
            return cls(name)
        except ValueError:
            return None

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def waiting(self) -> bool:
        return self in _WAITING

    @property
    def failure(self) -> bool:
        return self in _FAILURE

    @property
    def transient(self) -> bool:
        return self in _TRANSIENT

    @property
    def alive(self) -> bool:
        return self in _ALIVE


_BY_NUMBER: Final = dict(enumerate(JobState))
_TERMINAL: Final = frozenset(
    {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.KILLED,
        JobState.WORKER_FAILED,
        JobState.UNSCHEDULABLE,
    }
)
_WAITING: Final = frozenset({JobState.PENDING, JobState.BUILDING, JobState.ASSIGNED})
_FAILURE: Final = frozenset({JobState.FAILED, JobState.WORKER_FAILED, JobState.COSCHED_FAILED})
_TRANSIENT: Final = frozenset({JobState.WORKER_FAILED, JobState.PREEMPTED})
_ALIVE: Final = frozenset({JobState.RUNNING, JobState.SUCCEEDED, *_WAITING})
