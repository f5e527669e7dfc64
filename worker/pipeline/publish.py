"""A diagnosis's answer: its verdict entry decided once, published once, or its failure answered.

The entry decided for a lead is kept in Redis (`<p>:entry:<lead>`, signed) before it is
published, so a verdict and a failure racing for the same lead publish one entry, the first one
decided. `publish` confirms the entry's report is in S3 (written again from Redis's copy if S3
lost it, `ReportShelf.confirm`) and announces it on the verdict stream and channel with every
event id it answers. `fail` answers a diagnosis that cannot finish with an ERROR report naming
the stage and the cause, through the same publish, and dead-letters the lead's event.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from shared.models import Event, Report, VerdictEntry
from shared.redact import redact_data, redact_text
from shared.signing import KeyRing, UnverifiedError
from shared.streams import StreamNames
from worker.evidence.case import Evidence
from worker.pipeline.coalesce import Coalescer, job_dir_of, kept_entry
from worker.pipeline.evidence_store import EvidenceStore
from worker.pipeline.failed import failure_evidence, failure_report
from worker.pipeline.failures import (
    EvidenceLostError,
    PipelineError,
    ReportLostError,
    describe,
    is_infrastructure,
)
from worker.pipeline.lease import Leases
from worker.pipeline.metrics import dead_lettered, verdict_published
from worker.pipeline.sinks import ReportShelf, VerdictStreamSink

__all__ = ["Publisher"]

log = logging.getLogger(__name__)


class Publisher:
    """Decides, publishes and fails the diagnoses of one worker process."""

    def __init__(
        self,
        redis: Any,
        names: StreamNames,
        keys: KeyRing,
        *,
        coalescer: Coalescer,
        leases: Leases,
        shelf: ReportShelf,
        frozen: EvidenceStore,
        load_event: Callable[[str], Event],
    ) -> None:
        self.redis = redis
        self.names = names
        self.keys = keys
        self.coalescer = coalescer
        self.leases = leases
        self.shelf = shelf
        self.frozen = frozen
        self.load_event = load_event

    def decided(self, lead: str) -> VerdictEntry | None:
        """The verdict entry decided for `lead` (signed), before or after it was published;
        one that does not verify (written by another hand) is None, with a warning."""
        raw = self.redis.get(self.names.entry(lead))
        return kept_entry(raw, self.keys, f"the decision kept for {lead}")

    def known(self, lead: str) -> VerdictEntry | None:
        """The entry published or decided for `lead` already, if any."""
        return self.coalescer.published(lead) or self.decided(lead)

    def _keep(self, entry: VerdictEntry) -> VerdictEntry:
        """Keep `entry`, signed, as the lead's decision unless one was kept first; returns the
        kept one. Signed here, so what travels to `publish` through the broker can be checked."""
        signed = entry.signed(self.keys)
        key, retention = self.names.entry(entry.event_id), self.coalescer.retention_s
        if self.redis.set(key, signed.model_dump_json(), nx=True, ex=retention):
            return signed
        return self.decided(entry.event_id) or signed

    def settle(self, report: Report, evidence_id: str) -> dict[str, Any]:
        """Write the final report once and keep its entry as the lead's decision."""
        stored = self.shelf.put(report, self.frozen.thaw(evidence_id))
        return self._keep(VerdictStreamSink.entry(report, stored)).model_dump(mode="json")

    def publish(self, entry: dict[str, Any], job: str) -> dict[str, Any]:
        """Announce the verdict (once); returns the entry as published. The entry handed over
        (through the broker, which more hands than the pipeline's may write) must verify: the
        worker signs nothing it did not decide."""
        decided = VerdictEntry.model_validate(entry)
        try:
            decided.verify(self.keys)
        except UnverifiedError as exc:
            raise PipelineError(f"the verdict entry to publish is refused: {exc.reason}") from None
        first = self.coalescer.published(decided.event_id) is None
        alerted = self._alerted_at(decided.event_id) if first else None
        if first:
            self.shelf.confirm(decided)
        published = VerdictStreamSink(self.coalescer)(decided, job=job)
        if first:
            _announced(published, alerted)
        return published.model_dump(mode="json")

    def _alerted_at(self, lead: str) -> datetime | None:
        """When the alert that leads the diagnosis was published (the watcher's clock), read
        from the lead's record before publishing releases it; None when it is not there."""
        event = self.leases.record(lead).event or {}
        try:
            return Event.model_validate(event).published_at if event else None
        except ValidationError:
            return None

    def fail(
        self, lead: str, job: str, reason: str, *, read_frozen: bool = True
    ) -> VerdictEntry | None:
        """Answer the diagnosis led by `lead` with an ERROR verdict saying `reason`, through the
        normal publish (every attached id announced, the job released without a cooldown), and
        dead-letter its event. Returns the entry, None when the lead was already answered. A
        verdict decided before the failure (only its publish failed) is published instead."""
        if self.coalescer.published(lead) is not None:
            return None
        alerted = self._alerted_at(lead)
        entry = self._decided_and_stored(lead)
        if entry is not None:
            if self.coalescer.publish(entry, job):
                _announced(entry, alerted)
            return entry
        event = _event_or_placeholder(self.load_event, lead, job)
        entry = self._keep(self._failure_entry(event, lead, reason, read_frozen))
        if self.coalescer.publish(entry, job, cooldown=False):
            self.dead_letter(event, reason)
            _announced(entry, alerted)
        log.warning("diagnosis %s answered ERROR: %s", lead, reason)
        return entry

    def _decided_and_stored(self, lead: str) -> VerdictEntry | None:
        """The verdict decided for `lead` with its report confirmed in S3; None when none was
        decided, or its report is lost (the decision withdrawn: the failure answers instead)."""
        entry = self.decided(lead)
        if entry is None:
            return None
        try:
            self.shelf.confirm(entry)
        except ReportLostError as exc:
            log.warning("the verdict decided for %s is not published: %s", lead, exc)
            return None
        return entry

    def _failure_entry(
        self, event: Event, lead: str, reason: str, read_frozen: bool
    ) -> VerdictEntry:
        """The ERROR report written to S3, with the job's identity from the frozen evidence
        when it is readable and renders, else from the event's job directory."""
        answers = self.coalescer.answers(lead) or [lead]
        label = self.frozen.label(lead)
        frozen = _frozen_or_none(self.frozen, lead) if read_frozen else None
        for evidence in (frozen, failure_evidence(event, label, reason)):
            if evidence is None:
                continue
            report = failure_report(evidence, reason, lead=lead, answers=answers)
            try:
                return VerdictStreamSink.entry(report, self.shelf.put(report, evidence))
            except Exception as exc:
                if is_infrastructure(exc):
                    raise
                log.warning("ERROR report of %s did not render: %s", lead, describe(exc))
        raise PipelineError(f"no ERROR report could be written for {lead}")

    def dead_letter(self, event: Event, reason: str) -> None:
        """Put a diagnosis that failed on the dead-letter stream, with its lead's event (both
        redacted, as every output is)."""
        raw = redact_data(event.model_dump(mode="json", exclude_none=True))
        self.redis.xadd(
            self.names.dead_letter,
            {
                "reason": redact_text(f"diagnosis failed: {reason}"),
                "raw": json.dumps(raw, ensure_ascii=False),
                "alert_id": "",
                "event_id": event.event_id,
                "refused_at": datetime.now(UTC).isoformat(),
            },
        )
        dead_lettered(f"diagnosis failed: {reason}")


def _event_or_placeholder(load_event: Callable[[str], Event], lead: str, job: str) -> Event:
    try:
        return load_event(lead)
    except (EvidenceLostError, ValidationError):
        return Event(event_id=lead, job_dir=job_dir_of(job), published_at=datetime.now(UTC))


def _frozen_or_none(frozen: EvidenceStore, evidence_id: str) -> Evidence | None:
    try:
        return frozen.thaw(evidence_id)
    except Exception as exc:
        if is_infrastructure(exc):
            raise
        return None


def _announced(entry: VerdictEntry, alerted: datetime | None) -> None:
    """The one line and the counts of a verdict this process published: what operators grep
    for (`verdict event=... job=...`) and chart (latency from the alert)."""
    took = (datetime.now(UTC) - alerted).total_seconds() if alerted is not None else None
    verdict_published(entry.verdict.value, entry.confidence.value, took)
    log.info(
        "verdict event=%s job=%s verdict=%s confidence=%s duration=%s report=%s answers=%d",
        entry.event_id,
        entry.job_id,
        entry.verdict.value,
        entry.confidence.value,
        "unknown" if took is None else f"{took:.1f}s",
        entry.report_uri,
        len(entry.event_ids),
    )
