"""The Celery tasks: thin wrappers over `worker.pipeline.steps`, and the workflow that joins them.

    capture ─┬─ gate restarts ──┐
             ├─ gate liveness ──┤
             ├─ ...             ├─ verdict ── publish
             └─ gate duty_cycle ┘

Each task takes references (event id, evidence id, job key) and calls one pipeline step.
Infrastructure faults retry with backoff; a gate never raises, so the chord always joins; every task
is safe to run twice (write-once S3 objects, a publish script that announces a lead once).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, Final, TypeVar

import redis
from celery import Task, chain, chord, group
from celery.canvas import Signature

from shared.settings import Settings
from worker.pipeline import metrics  # noqa: F401 - connects the Celery signals it counts
from worker.pipeline.app import CAPTURE_LIMITS_S, app
from worker.pipeline.failures import InfrastructureError, classified
from worker.pipeline.steps import GATE_NAMES, CaptureBusyError, Pipeline
from worker.pipeline.store import store_from_settings

__all__ = ["capture", "dispatch", "gate", "pipeline", "publish", "verdict", "workflow"]

_RETRY: Final[dict[str, Any]] = {
    "autoretry_for": (InfrastructureError,),
    "retry_backoff": 1,
    "retry_backoff_max": 60,
    "retry_jitter": True,
    "max_retries": 8,
}
_BUSY_RETRY_S: Final = 2
F = TypeVar("F", bound=Callable[..., Any])


def _task(name: str, **options: Any) -> Callable[[F], Any]:
    """`app.task` with the retry policy for infrastructure faults (typed for mypy)."""
    decorator: Callable[[F], Any] = app.task(name=name, **(_RETRY | options))
    return decorator


@cache
def pipeline() -> Pipeline:
    """This worker process's adapters, made on first use (after the fork)."""
    settings = Settings()
    client = redis.Redis.from_url(settings.redis_url, health_check_interval=30)
    return Pipeline(settings, store_from_settings(settings), client)


@_task(
    "rlhealth.capture",
    bind=True,
    soft_time_limit=CAPTURE_LIMITS_S[0],
    time_limit=CAPTURE_LIMITS_S[1],
)
def capture(self: Task, event_id: str, evidence_id: str) -> str:
    """Freeze the event's evidence to S3; returns the evidence id."""
    with classified():
        try:
            return pipeline().capture(event_id, evidence_id, claim=str(self.request.id))
        except CaptureBusyError as exc:
            raise self.retry(exc=exc, countdown=_BUSY_RETRY_S, max_retries=150) from exc


@_task("rlhealth.gate")
def gate(evidence_id: str, name: str) -> dict[str, Any]:
    """One gate on the frozen evidence; ERROR rather than an exception."""
    with classified():
        return pipeline().gate(evidence_id, name)


@_task("rlhealth.verdict")
def verdict(results: list[dict[str, Any]], event_id: str, evidence_id: str) -> dict[str, Any]:
    """Join the gates into the report, store it once; returns the verdict entry."""
    with classified():
        return pipeline().verdict(results, event_id, evidence_id)


@_task("rlhealth.publish")
def publish(entry: dict[str, Any], job: str) -> dict[str, Any]:
    """Put the verdict on the stream and the channel, once."""
    with classified():
        return pipeline().publish(entry, job)


def workflow(event_id: str, evidence_id: str, job: str) -> Signature:
    """capture → every gate in parallel → verdict → publish."""
    gates = group(gate.si(evidence_id, name) for name in GATE_NAMES)
    return chain(
        capture.si(event_id, evidence_id),
        chord(gates, verdict.s(event_id, evidence_id)),
        publish.s(job),
    )


def dispatch(event_id: str, job: str, *, evidence_id: str | None = None) -> None:
    """Start the workflow of a diagnosis led by `event_id` (on a frozen evidence for a replay)."""
    with classified():
        workflow(event_id, evidence_id or event_id, job).apply_async()
