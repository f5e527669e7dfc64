"""Every Redis stream, channel, group and key name of the pipeline, derived from one prefix.

The stream and channel names are the contract (docs/interface.md#the-pipeline); the keys below them
are the pipeline's own coalescing state, written only by the Lua scripts of
`worker.pipeline.coalesce`:

- `<p>:event:<event_id>`     the diagnosis (lead event id) this event was admitted to; set once,
                             which is what makes ingest idempotent on event ids
- `<p>:inflight:<job>`       the lead event id of the diagnosis in flight for a job (one per job)
- `<p>:cooldown:<job>`       hash: the last verdict entry of a job (its stream fields, signed),
                             alive for RLHEALTH_COALESCE_S
- `<p>:answers:<lead>`       list: every event id one diagnosis answers, in arrival order
- `<p>:published:<lead>`     the verdict entry (JSON) once a diagnosis is on the stream
- `<p>:diagnoses`            stream: `started` / `published` marks, to audit concurrency per job
- `<p>:leases`               sorted set: each unpublished lead, scored by when its lease runs out
                             (ms); renewed by every sign of life, watched by ingest's watchdog
- `<p>:lead:<lead>`          hash: what re-sending a diagnosis needs (`job`, `evidence`, `event`)
                             and how often it was re-sent (`redispatches`)
- `<p>:lastlead:<job>`       the job's latest lead, so a new lead can take over the answer list
                             of one that never published
- `<p>:superseded:<lead>`    the lead that took over this one's answer list
- `<p>:entry:<lead>`         the verdict entry decided for a lead (JSON, signed), before it is
                             published
- `<p>:runs:<task>:<n>`      how often one delivery of a task started (a task killed twice stops)
- `<p>:poison:<task>`        why a task's process was stopped (its memory budget exhausted)
- `<p>:capture:<evidence>`   the capture claim: the task id holding it, with a renewed expiry

`<job>` is the job's coalescing key: its directory relative to the bundle root, which is how
events name a job, followed by `#q-<digest>` for an alert that asks its own question
(`worker.pipeline.coalesce.coalescing_key`).

A verdict stream entry is read back only through `read_entry` (or `read_message` for the
channel), which verifies its signature (`shared.signing`) and refuses, with a reason, one that is
malformed or does not verify.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from shared.models import VerdictEntry
from shared.signing import KeyRing, UnverifiedError, verify

__all__ = [
    "ALERT_FIELD",
    "ENTRY_FIELDS",
    "INGEST_GROUP",
    "SUPERVISOR_GROUP",
    "RefusedEntryError",
    "StreamNames",
    "entry_fields",
    "read_entry",
    "read_message",
    "verified_entry",
]

ALERT_FIELD: Final = "event"  # an alert stream entry holds one field: the event as JSON
INGEST_GROUP: Final = "ingest"
SUPERVISOR_GROUP: Final = "supervisor"
ENTRY_FIELDS: Final = (
    "event_id",
    "event_ids",
    "job_id",
    "verdict",
    "confidence",
    "report_uri",
    "captured_at",
    "key_id",
    "signature",
)


@dataclass(frozen=True)
class StreamNames:
    """The names of one pipeline instance; `prefix` is RLHEALTH_STREAM_PREFIX."""

    prefix: str = "rlhealth"

    @property
    def alerts(self) -> str:
        return f"{self.prefix}:alerts"

    @property
    def verdicts(self) -> str:
        return f"{self.prefix}:verdicts"

    @property
    def verdict_channel(self) -> str:
        return f"{self.prefix}:verdicts"

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}:dead-letter"

    @property
    def diagnoses(self) -> str:
        return f"{self.prefix}:diagnoses"

    @property
    def task_queue(self) -> str:
        return f"{self.prefix}.tasks"

    def event(self, event_id: str) -> str:
        return f"{self.prefix}:event:{event_id}"

    def inflight(self, job: str) -> str:
        return f"{self.prefix}:inflight:{job}"

    def cooldown(self, job: str) -> str:
        return f"{self.prefix}:cooldown:{job}"

    def answers(self, lead: str) -> str:
        return f"{self.prefix}:answers:{lead}"

    def published(self, lead: str) -> str:
        return f"{self.prefix}:published:{lead}"

    def dispatched(self, lead: str) -> str:
        return f"{self.prefix}:dispatched:{lead}"

    @property
    def leases(self) -> str:
        return f"{self.prefix}:leases"

    def lead(self, lead: str) -> str:
        return f"{self.prefix}:lead:{lead}"

    def last_lead(self, job: str) -> str:
        return f"{self.prefix}:lastlead:{job}"

    def superseded(self, lead: str) -> str:
        return f"{self.prefix}:superseded:{lead}"

    def entry(self, lead: str) -> str:
        return f"{self.prefix}:entry:{lead}"

    def runs(self, task_id: str, retries: int) -> str:
        return f"{self.prefix}:runs:{task_id}:{retries}"

    def poison(self, task_id: str) -> str:
        return f"{self.prefix}:poison:{task_id}"

    def capture_claim(self, evidence_id: str) -> str:
        return f"{self.prefix}:capture:{evidence_id}"


def entry_fields(entry: VerdictEntry) -> dict[str, str]:
    """A signed verdict entry's stream fields, in contract order: each as text, `event_ids` as
    a JSON array. An unsigned entry has none: it must never reach the stream."""
    if entry.key_id is None or entry.signature is None:
        raise ValueError(f"the verdict entry of {entry.event_id} is not signed")
    data = entry.model_dump(mode="json")
    return {
        name: json.dumps(data[name]) if name == "event_ids" else str(data[name])
        for name in ENTRY_FIELDS
    }


class RefusedEntryError(ValueError):
    """A verdict stream entry (or channel message) that is not shown as a verdict: malformed, or
    its signature missing or wrong. `reason` is one line quoting nothing the entry chose; `kind`
    is a word for a metric (`malformed`, `unsigned`, `unknown_key`, `bad_signature`)."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


def _decoded(value: Any) -> str:
    try:
        return value.decode() if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError:
        raise RefusedEntryError("malformed: a field is not UTF-8", "malformed") from None


def verified_entry(document: Any, ring: KeyRing) -> VerdictEntry:
    """The verdict entry of a decoded document (a channel message, a stream entry's fields with
    `event_ids` parsed) once its signature verifies; raises `RefusedEntryError`."""
    if not isinstance(document, dict):
        raise RefusedEntryError("malformed: not a JSON object", "malformed")
    try:
        verify(document, ring)
    except UnverifiedError as exc:
        raise RefusedEntryError(exc.reason, exc.kind) from None
    try:
        return VerdictEntry.model_validate(document)
    except ValidationError as exc:  # signed, yet not an entry: a signer of another version?
        where = ", ".join(sorted({str(error["loc"][0]) for error in exc.errors() if error["loc"]}))
        raise RefusedEntryError(f"malformed: {where or 'the entry'}", "malformed") from None


def read_entry(fields: Mapping[Any, Any], ring: KeyRing) -> VerdictEntry:
    """The verdict entry of a verdict stream entry (fields as bytes or str), verified; raises
    `RefusedEntryError` for one that is malformed or does not verify."""
    data = {_decoded(key): _decoded(value) for key, value in fields.items()}
    if "event_ids" not in data:
        raise RefusedEntryError("malformed: no event_ids field", "malformed")
    try:
        ids = json.loads(data["event_ids"])
    except json.JSONDecodeError:
        raise RefusedEntryError("malformed: event_ids is not JSON", "malformed") from None
    return verified_entry({**data, "event_ids": ids}, ring)


def read_message(data: Any, ring: KeyRing) -> VerdictEntry:
    """The verdict entry of a verdict channel message (JSON), verified; raises
    `RefusedEntryError`."""
    try:
        document = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError):
        raise RefusedEntryError("malformed: not JSON", "malformed") from None
    return verified_entry(document, ring)
