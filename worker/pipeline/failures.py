"""Every failure of the pipeline, classified in one place.

- an **infrastructure fault** (Redis, the broker or S3 unreachable, timing out or throttling) is
  retried with backoff: inside the S3 adapter by tenacity, around tasks by Celery autoretry, and by
  ingest, which leaves the alert unacknowledged and tries again;
- a **bad event** (not JSON, an unknown field, a job directory outside the bundle root or missing)
  is refused to the dead-letter stream with its reason and raw payload, then acknowledged;
- **broken evidence** is not a failure here: a gate returns ERROR quoting why, so the chord joins;
- **lost evidence** (an archived event or a frozen evidence gone from S3) is not final: the event
  is archived again from the alert kept in Redis, the evidence captured again from the bundle;
- a **stage that fails** — past its time limit, killed twice, out of its memory budget, a bug — ends
  the diagnosis: the workflow's error callback answers every attached alert with an ERROR verdict
  naming the stage and the cause, and puts the lead's event on the dead-letter stream. A time limit
  is never evidence: it is a failure of the stage, not a fact about the job.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import botocore.exceptions
import kombu.exceptions
import redis.exceptions
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded

__all__ = [
    "BadEventError",
    "CaptureBusyError",
    "EvidenceLostError",
    "InfrastructureError",
    "PipelineError",
    "PoisonError",
    "ReportLostError",
    "StageTimeoutError",
    "classified",
    "describe",
    "explain",
    "is_infrastructure",
    "is_time_limit",
    "must_propagate",
]

_TRANSIENT_S3_CODES: Final = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "ServiceUnavailable"}
)
_CONNECTION_ERRORS: Final = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    botocore.exceptions.ConnectionError,
    botocore.exceptions.HTTPClientError,
    kombu.exceptions.OperationalError,
    ConnectionError,
    TimeoutError,
)


class PipelineError(Exception):
    """The root of the pipeline's own exceptions."""


class InfrastructureError(PipelineError):
    """A service the pipeline needs is unreachable or refused transiently; retry with backoff."""


class BadEventError(PipelineError):
    """An event that cannot be diagnosed; `str(exc)` is the dead-letter reason."""


class EvidenceLostError(PipelineError):
    """A frozen evidence that is gone or incomplete in S3 and cannot be captured again here."""


class ReportLostError(EvidenceLostError):
    """The report a decided verdict points at is gone from S3 and from the copy Redis keeps: the
    decision is withdrawn and the diagnosis sent again, to write a report of its own."""


class StageTimeoutError(PipelineError):
    """A stage ran past its soft time limit: a failure of the stage, never evidence."""


class CaptureBusyError(RuntimeError):
    """Another workflow is capturing the same event (or taking the same second look); retry
    later."""


class PoisonError(PipelineError):
    """A task that must not run again: killed twice, or out of its memory budget."""


def is_time_limit(exc: BaseException) -> bool:
    """True for Celery's soft and hard time limits (never evidence about the job)."""
    return isinstance(exc, (SoftTimeLimitExceeded, TimeLimitExceeded, StageTimeoutError))


def _transient_s3_error(exc: BaseException) -> bool:
    if not isinstance(exc, botocore.exceptions.ClientError):
        return False
    error = exc.response.get("Error", {})
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return status >= 500 or error.get("Code") in _TRANSIENT_S3_CODES


def is_infrastructure(exc: BaseException) -> bool:
    """True for faults of Redis, the broker or S3 that a retry can cure."""
    return isinstance(exc, (InfrastructureError, *_CONNECTION_ERRORS)) or _transient_s3_error(exc)


def must_propagate(exc: BaseException) -> bool:
    """Failures that are never evidence about the job: infrastructure, time limits, memory, the
    pipeline's own; a step raises them instead of answering with an ERROR result."""
    return (
        is_infrastructure(exc)
        or is_time_limit(exc)
        or isinstance(exc, (PipelineError, MemoryError))
    )


def describe(exc: BaseException) -> str:
    """`Type: message`, for reasons and logs."""
    return f"{type(exc).__name__}: {exc}"


def explain(stage: str, exc: BaseException | None) -> str:
    """Why the diagnosis failed, for its ERROR report: the stage, and how it failed."""
    if exc is None:
        return f"{stage} failed (no error was recorded)"
    if isinstance(exc, (StageTimeoutError, PoisonError)):
        text = str(exc)  # most name their stage already
        return text if text.startswith(stage) else f"{stage} {text}"
    if isinstance(exc, SoftTimeLimitExceeded):
        return f"{stage} ran past its soft time limit"
    if isinstance(exc, TimeLimitExceeded):
        limit = exc.args[0] if exc.args else "?"
        return f"{stage} ran past its hard time limit ({limit} s) and was stopped"
    if isinstance(exc, InfrastructureError):
        return f"{stage}: a service stayed unreachable past the retry deadline: {exc}"
    if isinstance(exc, PipelineError):
        return f"{stage}: {exc}"
    return f"{stage} failed: {describe(exc)}"


@contextmanager
def classified() -> Iterator[None]:
    """Re-raise infrastructure faults as `InfrastructureError`; let everything else through."""
    try:
        yield
    except PipelineError:
        raise
    except MemoryError as exc:  # Celery would re-raise a raw MemoryError in the worker itself
        raise PoisonError(f"ran out of memory ({describe(exc).rstrip(': ')})") from exc
    except Exception as exc:
        if is_infrastructure(exc):
            raise InfrastructureError(describe(exc)) from exc
        raise
