"""The one contract every gate follows: evidence in, a result out, never an exception.

A gate is a pure function `check(evidence: Evidence) -> GateResult` in its own module. A gate that
meets broken or missing evidence returns ERROR quoting why; it never raises (the chord must join).
`guarded` enforces that at the one place gates are called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from shared.models import GateResult, GateStatus
from worker.evidence.case import Evidence

__all__ = ["GateCheck", "error", "guarded", "na", "passed"]

GateCheck: TypeAlias = Callable[[Evidence], GateResult]


def error(summary: str, *, missing: tuple[str, ...] = (), **extra: object) -> GateResult:
    """An ERROR result: the gate could not judge, and says what it lacked."""
    return GateResult(
        status=GateStatus.ERROR, summary=summary, missing=missing or (summary,), **extra
    )


def passed(summary: str, **extra: object) -> GateResult:
    return GateResult(status=GateStatus.PASS, summary=summary, **extra)


def na(summary: str) -> GateResult:
    return GateResult(status=GateStatus.NA, summary=summary)


def guarded(name: str, check: GateCheck, evidence: Evidence) -> GateResult:
    """Run a gate; an unexpected exception becomes ERROR naming the gate and the exception."""
    try:
        return check(evidence)
    except Exception as exc:
        return error(f"{name} gate failed on this evidence: {type(exc).__name__}: {exc}")
