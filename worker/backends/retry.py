"""Transient failures of the cluster CLIs (docs/domain.md#iris-job-and-task-states), retried with
backoff; nothing else.

A failed probe is retried only when its output (case folded) holds one of its tool's markers.
Timeouts and every other failure are real failures of the probe and are returned at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_attempt, wait_exponential

from worker.backends.spawn import ProbeResult

__all__ = ["TRANSIENT_MARKERS", "is_transient", "with_retries"]

TRANSIENT_MARKERS: Final[dict[str, tuple[str, ...]]] = {
    "iris": (
        "dns error",
        "no records found for query",
        "temporary failure in name resolution",
        "failed to lookup address information",
        "name or service not known",
        "nodename nor servname provided",
        "finelog.errors.statserror",
    ),
    "kubectl": (
        "error dialing backend",
        "connection reset",
        "unexpected eof",
        "i/o timeout",
        "stream error",
        "<html",
    ),
}


def is_transient(tool: str, result: ProbeResult) -> bool:
    """True when `result` failed with one of `tool`'s transient markers in its output."""
    if result.ok or result.exit_code is None:
        return False
    text = f"{result.stdout}\n{result.stderr}".casefold()
    return any(marker in text for marker in TRANSIENT_MARKERS.get(tool, ()))


def _last_result(state: RetryCallState) -> ProbeResult:
    """When the tries run out, the last (still transient) result is the answer."""
    outcome = state.outcome
    assert outcome is not None
    result: ProbeResult = outcome.result()
    return result


def with_retries(
    tool: str,
    call: Callable[[], ProbeResult],
    *,
    attempts: int = 3,
    wait_s: float = 1.0,
) -> tuple[ProbeResult, int]:
    """`call()` retried with exponential backoff while it fails transiently; (result, tries)."""
    tries = 0

    def counted() -> ProbeResult:
        nonlocal tries
        tries += 1
        return call()

    retrying = Retrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=wait_s, max=wait_s * 8),
        retry=retry_if_result(lambda result: is_transient(tool, result)),
        retry_error_callback=_last_result,
    )
    result: ProbeResult = retrying(counted)
    return result, tries
