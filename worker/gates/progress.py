"""Shared reads of training progress that several gates need: steps finished, the newest attempt,
whether the newest attempt is still initialising. The facts themselves are derived once in
`worker.evidence.facts` (`evidence.facts`); this module shapes them for the gates.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import polars as pl

from worker.evidence.case import Evidence
from worker.evidence.facts import newest_attempt
from worker.evidence.jobstate import JobState
from worker.evidence.model import LogTables

__all__ = [
    "Initialization",
    "finished_steps",
    "initialization",
    "job_state",
    "minute_utc",
    "newest_attempt",
    "started_at",
]


def minute_utc(value: datetime) -> str:
    """A time as flip signals quote it: ISO-8601 UTC at minute precision, e.g. 2026-07-30T22:05Z."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def finished_steps(logs: LogTables, attempt: int | None = None) -> pl.DataFrame:
    """`Finished: 'step'` timer rows (of one attempt when given), oldest first."""
    rows = logs.timers.filter((pl.col("event") == "finished") & (pl.col("phase") == "step"))
    if attempt is not None:
        rows = rows.filter(pl.col("attempt") == attempt)
    return rows.sort("line")


def started_at(evidence: Evidence) -> datetime | None:
    """When the newest attempt began: its first log timestamp, else the job's submission time."""
    logs = evidence.logs
    if logs is not None:
        attempt = evidence.facts.newest_attempt
        firsts = [
            frame.filter(pl.col("attempt") == attempt)["timestamp"].min()
            for frame in (logs.timers, logs.resumes, logs.errors, logs.metrics)
            if not frame.is_empty()
        ]
        stamps = [t for t in firsts if isinstance(t, datetime)]
        if stamps:
            return min(stamps)
    return evidence.bundle.submitted_at


@dataclass(frozen=True)
class Initialization:
    """The newest attempt has not finished a step yet and is within INIT_GRACE_S of its start."""

    since: datetime
    deadline: datetime


def _has_train_step(logs: LogTables, attempt: int) -> bool:
    if not finished_steps(logs, attempt).is_empty():
        return True
    return not logs.metrics.filter(pl.col("attempt") == attempt).is_empty()


def job_state(evidence: Evidence) -> JobState | None:
    """The controller's state when a probe captured it, else the manifest's."""
    return evidence.facts.state


def initialization(evidence: Evidence) -> Initialization | None:
    """The initialization window when the job is inside it, else None.

    A job in a terminal state is never initialising: it will not reach a first step.
    """
    logs = evidence.logs
    if logs is None or _has_train_step(logs, evidence.facts.newest_attempt):
        return None
    state = job_state(evidence)
    if state is not None and state.terminal:
        return None
    since = started_at(evidence)
    if since is None:
        return None
    deadline = since + timedelta(seconds=evidence.thresholds.init_grace_s)
    return Initialization(since=since, deadline=deadline) if evidence.now <= deadline else None
