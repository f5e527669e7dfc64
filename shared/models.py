"""The contract models every role imports: the suspect-job event, quotes, gate results, the report.

Field names and shapes follow docs/interface.md. All models are frozen; validation happens here, at
the boundary, and the rest of the code trusts the types.
"""

from __future__ import annotations

import math
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_serializer,
    field_validator,
    model_validator,
)

from shared.redact import clean_cut
from shared.signing import KEY_ID_FIELD, SIGNATURE_FIELD, KeyRing, sign, verify
from shared.times import as_utc

__all__ = [
    "Confidence",
    "Event",
    "GateName",
    "GateResult",
    "GateStatus",
    "Handoff",
    "KillProof",
    "Mode",
    "Quote",
    "Report",
    "RestartsResult",
    "SecondLook",
    "SecondLookOutcome",
    "Table",
    "UtcDatetime",
    "Verdict",
    "VerdictEntry",
    "iso_utc",
]


UtcDatetime = Annotated[datetime, AfterValidator(as_utc)]


def iso_utc(value: datetime | None) -> str | None:
    """Render a datetime as ISO-8601 UTC with a trailing Z (seconds precision unless sub-second)."""
    if value is None:
        return None
    value = as_utc(value)
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


class KillProof(Frozen):
    """Why a KILL stands: the rule that established the hard failure, the mechanism in a few words,
    when it was established, and the quotes that prove it (docs/interface.md#the-report,
    `kill_proof`)."""

    rule: str = Field(min_length=1)
    mechanism: str = Field(min_length=1)
    established_at: UtcDatetime
    evidence: tuple[Quote, ...] = Field(min_length=1)

    def contract_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "mechanism": self.mechanism,
            "established_at": iso_utc(self.established_at),
            "evidence": [q.model_dump(mode="json") for q in self.evidence],
        }


Cell = float | int | str | None


class Table(Frozen):
    """A table a gate reports as data; `reports/` lays it out (widths, number format, units)."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...] = ()
    units: tuple[str, ...] = ()  # a suffix per column ("" for none), e.g. "×"

    def contract_dict(self) -> dict[str, Any]:
        """Title, columns, units and rows; NaN and infinities as strings (strict JSON)."""
        return {
            "title": self.title,
            "columns": list(self.columns),
            "units": list(self.units),
            "rows": [[_json_cell(c) for c in r] for r in self.rows],
        }


def _json_cell(value: Cell) -> Cell:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


class GateResult(Frozen):
    """What one gate concluded.

    `status`, `summary` and `evidence` are the contract (docs/interface.md#the-report). The
    remaining fields are what the verdict rules need to join gates: whether a hard failure is
    established (with the proof the verdict checks), whether the job is still initialising, which
    required inputs are missing (`missing`, load-bearing: the gate cannot PASS) and which are not
    (`gaps`: they lower the confidence), and the mechanism (`kind` names it for agreement between
    gates), flip signal and handoff a FAIL proposes. `tables` are rendered by `reports/`.

    Invariants: a PASS carries no hard failure and no missing required input; a hard failure is a
    FAIL with a proof; only a FAIL carries a proof.
    """

    status: GateStatus
    summary: str
    evidence: tuple[Quote, ...] = ()
    details: tuple[str, ...] = ()
    tables: tuple[Table, ...] = ()
    hard_failure: bool = False
    learning_quality: bool = False
    initializing: bool = False
    missing: tuple[str, ...] = ()
    gaps: tuple[str, ...] = ()
    mechanism: str | None = None
    kind: str | None = None
    proof: KillProof | None = None
    next_action: str | None = None
    flip_signal: str | None = None
    handoff: Handoff | None = None

    @model_validator(mode="after")
    def _coherent(self) -> GateResult:
        if self.status is GateStatus.PASS and self.hard_failure:
            raise ValueError("a PASS cannot carry a hard failure")
        if self.status is GateStatus.PASS and self.missing:
            raise ValueError(f"a PASS cannot miss required inputs: {', '.join(self.missing)}")
        if self.hard_failure and (self.status is not GateStatus.FAIL or self.proof is None):
            raise ValueError("a hard failure is a FAIL with a proof")
        if self.proof is not None and self.status is not GateStatus.FAIL:
            raise ValueError("only a FAIL carries a proof")
        return self

    def contract_dict(self) -> dict[str, Any]:
        """The JSON shape of docs/interface.md#the-report, plus the detail lines and tables when
        there are any."""
        body: dict[str, Any] = {
            "status": self.status.value,
            "summary": self.summary,
            "evidence": [q.model_dump(mode="json") for q in self.evidence],
        }
        if self.details:
            body["details"] = list(self.details)
        if self.tables:
            body["tables"] = [t.contract_dict() for t in self.tables]
        return body


class RestartsResult(Frozen):
    """The restarts gate, reported on its own as the procedure asks
    (docs/domain.md#the-procedure)."""

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


class SecondLookOutcome(StrEnum):
    """What the second look before a stall KILL saw (`worker.second_look`)."""

    CONFIRMED = "confirmed"  # still wedged: the KILL stands, both observations quoted
    MOVED = "moved"  # the log, the controller or the stacks moved: NO-KILL
    TERMINAL = "terminal"  # the job ended meanwhile: NO-KILL, nothing to kill
    BLIND = "blind"  # the second look could not see: ERROR


class SecondLook(Frozen):
    """The second look taken `waited_s` after a KILL that rested on stacks: when each observation
    was taken, what the second one saw (`summary`), what moved, and its quotes."""

    outcome: SecondLookOutcome
    waited_s: float = Field(ge=0)
    first_at: UtcDatetime
    taken_at: UtcDatetime
    summary: str
    moved: tuple[str, ...] = ()
    evidence: tuple[Quote, ...] = ()

    def contract_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "waited_s": self.waited_s,
            "first_at": iso_utc(self.first_at),
            "taken_at": iso_utc(self.taken_at),
            "summary": self.summary,
            "moved": list(self.moved),
            "evidence": [q.model_dump(mode="json") for q in self.evidence],
        }


class Report(Frozen):
    """The diagnosis of one job: the JSON report of docs/interface.md#the-report."""

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
    kill_proof: KillProof | None = None
    second_look: SecondLook | None = None  # taken before a KILL resting on stacks (pipeline)
    # what each file given was taken to be, what was skipped and why, where the dates of
    # time-only lines came from; empty for a watcher job directory read as it is
    inputs: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _proof_with_kill(self) -> Report:
        if (self.verdict is Verdict.KILL) != (self.kill_proof is not None):
            raise ValueError("kill_proof is present exactly when the verdict is KILL")
        return self

    def contract_dict(self) -> dict[str, Any]:
        """The JSON report, keys in the order docs/interface.md#the-report lists them."""
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
            "kill_proof": self.kill_proof.contract_dict() if self.kill_proof else None,
            "second_look": self.second_look.contract_dict() if self.second_look else None,
            "inputs": list(self.inputs),
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
    # one of the live backends the operator enabled (RLHEALTH_BACKENDS); checked by the worker
    backend: Literal["iris", "kubernetes", "slurm", "local"] | None = None

    @field_validator("event_id", "replay_of")
    @classmethod
    def _names_an_object(cls, value: str | None) -> str | None:
        # ids become S3 key segments (events/<id>.json): `.` and `..` would climb the key path
        if value is not None and not any(ch.isalnum() for ch in value):
            raise ValueError("an event id needs a letter or digit (not only dots or dashes)")
        return value

    @field_validator("job_dir", "probes")
    @classmethod
    def _no_control_characters(cls, value: str | None) -> str | None:
        # a CR/LF in a path would forge lines in logs and reports, and break S3 keys
        if value is not None and any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise ValueError("a path may not hold control characters (CR, LF, ...)")
        return value

    @field_serializer("published_at", "now")
    def _ts(self, value: datetime | None) -> str | None:
        return iso_utc(value)


class VerdictEntry(Frozen):
    """One verdict on the results stream, as supervisors read it.

    `key_id` and `signature` are the HMAC of the other fields (`shared.signing`): None until the
    pipeline signs the entry (`signed`); a reader shows it as a verdict only once `verify` passed.
    """

    event_id: str
    event_ids: tuple[str, ...]
    job_id: str
    verdict: Verdict
    confidence: Confidence
    report_uri: str
    captured_at: UtcDatetime
    key_id: str | None = None
    signature: str | None = None

    @field_serializer("captured_at")
    def _ts(self, value: datetime) -> str | None:
        return iso_utc(value)

    def signed(self, ring: KeyRing) -> VerdictEntry:
        """This entry signed by the ring's signing key (over its fields as they are now)."""
        pair = sign(self.model_dump(mode="json"), ring)
        return self.model_copy(
            update={"key_id": pair[KEY_ID_FIELD], "signature": pair[SIGNATURE_FIELD]}
        )

    def verify(self, ring: KeyRing) -> None:
        """Return when the signature verifies; raise `UnverifiedError` saying why not."""
        verify(self.model_dump(mode="json"), ring)
