"""Every failure of the pipeline, classified in one place.

- an **infrastructure fault** (Redis, the broker or S3 unreachable, timing out or throttling) is
  retried with backoff: inside the S3 adapter by tenacity, around tasks by Celery autoretry, and by
  ingest, which leaves the alert unacknowledged and tries again;
- a **bad event** (not JSON, an unknown field, a job directory outside the bundle root or missing)
  is refused to the dead-letter stream with its reason and raw payload, then acknowledged;
- **broken evidence** is not a failure here: a gate returns ERROR quoting why, so the chord joins;
- anything else is a bug: it is raised, logged by Celery, and the job's in-flight mark expires.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import botocore.exceptions
import kombu.exceptions
import redis.exceptions

__all__ = [
    "BadEventError",
    "InfrastructureError",
    "PipelineError",
    "classified",
    "describe",
    "is_infrastructure",
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


def _transient_s3_error(exc: BaseException) -> bool:
    if not isinstance(exc, botocore.exceptions.ClientError):
        return False
    error = exc.response.get("Error", {})
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return status >= 500 or error.get("Code") in _TRANSIENT_S3_CODES


def is_infrastructure(exc: BaseException) -> bool:
    """True for faults of Redis, the broker or S3 that a retry can cure."""
    return isinstance(exc, (InfrastructureError, *_CONNECTION_ERRORS)) or _transient_s3_error(exc)


def describe(exc: BaseException) -> str:
    """`Type: message`, for reasons and logs."""
    return f"{type(exc).__name__}: {exc}"


@contextmanager
def classified() -> Iterator[None]:
    """Re-raise infrastructure faults as `InfrastructureError`; let everything else through."""
    try:
        yield
    except PipelineError:
        raise
    except Exception as exc:
        if is_infrastructure(exc):
            raise InfrastructureError(describe(exc)) from exc
        raise
