"""The ERROR report of a diagnosis that could not finish, made through the normal verdict rules.

A failed diagnosis is answered like any other: a report in S3 and a verdict entry. Its evidence
says only why it failed (`failure_evidence`), every gate is "not judged" with that reason, and the
verdict rules of `worker.verdict` turn that into ERROR — blind is never healthy. When the frozen
evidence was read before the failure, the report keeps the job's identity from it; otherwise the
identity comes from the job directory named by the event.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from shared.models import (
    Event,
    GateName,
    GateResult,
    GateStatus,
    Mode,
    Report,
    RestartsResult,
    Verdict,
)
from shared.settings import load_thresholds
from worker.evidence.case import Evidence
from worker.evidence.model import BundleInfo, ModeDecision
from worker.verdict import decide

__all__ = ["FAILED_NOTE", "failure_evidence", "failure_report", "not_judged", "unreadable_result"]

_LAYOUT_DEPTH: Final = 4  # jobs/<cluster>/<user>/<job>
FAILED_NOTE: Final = "capture failed: "  # how the evidence of a failed capture says why


def _identity(job_dir: str) -> dict[str, str | None]:
    """cluster, user, job name and job id read from a `jobs/<cluster>/<user>/<job>` directory."""
    parts = Path(job_dir).parts
    if len(parts) == _LAYOUT_DEPTH and parts[0] == "jobs":
        _, cluster, user, name = parts
        return {"cluster": cluster, "user": user, "job_name": name, "job_id": f"/{user}/{name}"}
    return {"cluster": None, "user": None, "job_name": Path(job_dir).name, "job_id": job_dir}


def failure_evidence(event: Event, label: str, reason: str) -> Evidence:
    """Evidence that says only why it could not be read, so the gates answer ERROR and quote it."""
    note = f"{FAILED_NOTE}{reason}"
    return Evidence(
        job_dir=label,
        now=event.now or datetime.now(UTC),
        thresholds=load_thresholds(),
        mode=ModeDecision(mode=event.mode or Mode.UNDECLARED, reason=note),
        bundle=BundleInfo(
            job_dir=Path(event.job_dir),
            manifest=None,
            manifest_error=note,
            **_identity(event.job_dir),
        ),
        discrepancies=(note,),
    )


def unreadable_result(name: str, summary: str) -> GateResult | RestartsResult:
    """A gate (or restarts) result of ERROR that quotes `summary` as what is missing."""
    if name == "restarts":
        return RestartsResult(count=None, same_failure=None, interpretation=summary)
    return GateResult(status=GateStatus.ERROR, summary=summary, missing=(summary,))


def not_judged(reason: str) -> tuple[RestartsResult, dict[GateName, GateResult]]:
    """Every gate and the restarts check, not judged because the diagnosis failed."""
    summary = f"not judged: the diagnosis failed: {reason}"
    restarts = unreadable_result("restarts", summary)
    gates = {name: unreadable_result(name.value, summary) for name in GateName}
    assert isinstance(restarts, RestartsResult)
    return restarts, {k: v for k, v in gates.items() if isinstance(v, GateResult)}


def failure_report(evidence: Evidence, reason: str, *, lead: str, answers: list[str]) -> Report:
    """The ERROR report of the diagnosis led by `lead`, which failed for `reason`."""
    note = f"the diagnosis failed: {reason}"
    marked = replace(evidence, discrepancies=(*evidence.discrepancies, note))
    restarts, gates = not_judged(reason)
    report = decide(marked, restarts, gates, event_id=lead, event_ids=answers)
    if report.verdict is not Verdict.ERROR:  # no gate judged: nothing may claim otherwise
        report = report.model_copy(update={"verdict": Verdict.ERROR})
    return report
