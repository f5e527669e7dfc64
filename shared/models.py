"""The contract models every role imports: the suspect-job event, quotes, gate results, the report.

Field names and shapes follow CONTRACT.md. All models are frozen; validation happens here, at the
boundary, and the rest of the code trusts the types.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_serializer

from shared.redact import clean_cut

__all__ = [
    "Confidence",
    "Event",
    "GateName",
    "GateResult",
    "GateStatus",
    "Handoff",
    "Mode",
    "Quote",
    "Report",
    "RestartsResult",
    "UtcDatetime",
    "Verdict",
    "VerdictEntry",
    "iso_utc",
]


def _as_utc(value: datetime) -> datetime:
    """Naive datetimes are taken as UTC; aware ones are converted to UTC."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


UtcDatetime = Annotated[datetime, AfterValidator(_as_utc)]


def iso_utc(value: datetime | None) -> str | None:
    """Render a datetime as ISO-8601 UTC with a trailing Z (seconds precision unless sub-second)."""
    if value is None:
        return None
    value = _as_utc(value)
    text = value.isoformat(timespec="milliseconds" if value.microsecond else "seconds")
    return text.replace("+00:00", "Z")


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Verdict(StrEnum):
    KILL = "KILL"
    NO_KILL = "NO-KILL"
    ERROR = "ERROR"


class Confidence(StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class Mode(StrEnum):
    AGENTIC = "agentic"
    STANDARD = "standard"
    UNDECLARED = "undeclared"


class GateStatus(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    ERROR = "ERROR"
    NA = "N/A"


class GateName(StrEnum):
    LIVENESS = "liveness"
    RESOURCES = "resources"
    ROLLOUTS = "rollouts"
    DYNAMICS = "dynamics"
    DUTY_CYCLE = "duty_cycle"


QUOTE_MAX_BYTES = 1024  # a hard ceiling; `worker.evidence.quotes.quote` cuts shorter
SOURCE_MAX_BYTES = 512


def _quoted_text(value: str) -> str:
    """Every quote is redacted, escaped and cut by bytes wherever it is made (docs/security.md)."""
    return clean_cut(value, QUOTE_MAX_BYTES)


def _quoted_source(value: str) -> str:
    return clean_cut(value, SOURCE_MAX_BYTES)


class Quote(Frozen):
    """One piece of quoted evidence: where it came from and what it said."""

    source: Annotated[str, AfterValidator(_quoted_source)]
    line: int | None = None
    timestamp: UtcDatetime | None = None
    text: Annotated[str, AfterValidator(_quoted_text)]

    @field_serializer("timestamp")
    def _ts(self, value: datetime | None) -> str | None:
        return iso_utc(value)


class Handoff(Frozen):
    """A code or configuration cause, expressed for the people who own the fix."""

    evidence: tuple[Quote, ...] = ()
    likely_cause: str
    component: str
    proposed_behavior: str
    test: str


class GateResult(Frozen):
    """What one gate concluded.

    `status`, `summary` and `evidence` are the contract (CONTRACT.md `G`). The remaining fields are
    what the verdict rules need to join gates: whether a hard failure is established, whether the
    job is still initialising, what evidence is missing, and the mechanism, flip signal and handoff
    a FAIL proposes.
    """

    status: GateStatus
    summary: str
    evidence: tuple[Quote, ...] = ()
    details: tuple[str, ...] = ()
    hard_failure: bool = False
    learning_quality: bool = False
    initializing: bool = False
    missing: tuple[str, ...] = ()
    mechanism: str | None = None
    next_action: str | None = None
    flip_signal: str | None = None
    handoff: Handoff | None = None

    def contract_dict(self) -> dict[str, Any]:
        """The JSON shape of CONTRACT.md, plus the detail lines when there are any."""
        body: dict[str, Any] = {
            "status": self.status.value,
            "summary": self.summary,
            "evidence": [q.model_dump(mode="json") for q in self.evidence],
        }
        if self.details:
            body["details"] = list(self.details)
        return body


class RestartsResult(Frozen):
    """The restarts gate, reported on its own as the seed asks."""

    count: int | None
    same_failure: bool | None
    interpretation: str
    evidence: tuple[Quote, ...] = ()
    attempts: int | None = None
    retries_left: int | None = None
    doomed: bool = False
    recovered: bool = False
    signatures: tuple[str, ...] = ()
    flip_signal: str | None = None

    def contract_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "same_failure": self.same_failure,
            "interpretation": self.interpretation,
            "evidence": [q.model_dump(mode="json") for q in self.evidence],
        }


class Report(Frozen):
    """The diagnosis of one job: the JSON report of CONTRACT.md."""

    job_id: str
    event_id: str | None = None
    event_ids: tuple[str, ...] = ()
    captured_at: UtcDatetime
    evidence_dir: str
    verdict: Verdict
    confidence: Confidence
    mode: Mode
    restarts: RestartsResult
    gates: dict[GateName, GateResult]
    reasoning: str
    next_action: str
    flip_signal: str
    handoff: Handoff | None = None
    discrepancies: tuple[str, ...] = ()

    def contract_dict(self) -> dict[str, Any]:
        """The JSON report, keys in the order CONTRACT.md lists them."""
        return {
            "job_id": self.job_id,
            "event_id": self.event_id,
            "event_ids": list(self.event_ids),
            "captured_at": iso_utc(self.captured_at),
            "evidence_dir": self.evidence_dir,
            "verdict": self.verdict.value,
            "confidence": self.confidence.value,
            "mode": self.mode.value,
            "restarts": self.restarts.contract_dict(),
            "gates": {name.value: self.gates[name].contract_dict() for name in GateName},
            "reasoning": self.reasoning,
            "next_action": self.next_action,
            "flip_signal": self.flip_signal,
            "handoff": self.handoff.model_dump(mode="json") if self.handoff else None,
            "discrepancies": list(self.discrepancies),
        }


class Event(Frozen):
    """A suspect-job event as the watcher publishes it. Unknown fields are refused."""

    event_id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:-]+$")
    job_dir: str = Field(min_length=1)
    reason: str = ""
    published_at: UtcDatetime
    mode: Mode | None = None
    probes: str | None = None
    now: UtcDatetime | None = None
    replay_of: str | None = None

    @field_serializer("published_at", "now")
    def _ts(self, value: datetime | None) -> str | None:
        return iso_utc(value)


class VerdictEntry(Frozen):
    """One verdict on the results stream, as supervisors read it."""

    event_id: str
    event_ids: tuple[str, ...]
    job_id: str
    verdict: Verdict
    confidence: Confidence
    report_uri: str
    captured_at: UtcDatetime

    @field_serializer("captured_at")
    def _ts(self, value: datetime) -> str | None:
        return iso_utc(value)
