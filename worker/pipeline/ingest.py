"""Read the alert stream with a consumer group and start one diagnosis per job in need.

For each alert entry: validate it (a bad one goes to the dead-letter stream with the reason and the
raw payload, then is acknowledged), archive the event in S3 `events/<event_id>.json` (an event id
archived already for another job or question is a bad one), admit it under its coalescing key
(`worker.pipeline.coalesce`: start, attach, re-announce or duplicate), start the workflow when it
leads a new diagnosis, and only then acknowledge. An infrastructure fault leaves the entry pending;
the loop backs off and reads its pending entries again, so nothing is lost and the process does not
crash.

A pending entry read again after a crash is a redelivery: if it leads a diagnosis still in flight
that has no workflow yet, the workflow is started (once, guarded by a dispatch mark).

Between reads the loop ticks the lease watchdog (`worker.pipeline.watchdog`), which sends again,
or answers ERROR, every diagnosis whose workflow was lost.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import ValidationError

from shared.alerts import OutsideBundleRootError, confine
from shared.models import Event
from shared.redact import redact_data, redact_text
from shared.settings import Settings
from shared.streams import ALERT_FIELD, INGEST_GROUP, StreamNames
from worker.pipeline.coalesce import Admission, Coalescer, coalescing_key
from worker.pipeline.failures import BadEventError, describe, is_infrastructure
from worker.pipeline.health import LIVENESS
from worker.pipeline.logsetup import about_event
from worker.pipeline.metrics import alert_handled, dead_lettered
from worker.pipeline.steps import Pipeline
from worker.pipeline.watchdog import Watchdog

__all__ = ["Dispatch", "Ingest", "validate_alert"]

log = logging.getLogger(__name__)

Dispatch = Callable[[str, str], None]  # (lead event id, coalescing key of the job)
_BATCH: Final = 32
_CLAIM_IDLE_MS: Final = 60_000
_CLAIM_EVERY_S: Final = 30.0
_BACKOFF_MAX_S: Final = 30.0
_DISPATCH_MARK_S: Final = 3600
_SAID: Final = {  # each admission outcome in words, for the one line per alert
    "started": "started a diagnosis",
    "attached": "attached to the diagnosis in flight",
    "reannounced": "answered by the job's recent verdict (re-announced)",
    "duplicate": "a duplicate of an alert already taken",
}


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _validation_reason(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "event"
        parts.append(f"{where}: {error['msg']}")
    return "invalid event: " + "; ".join(parts)


def _parse(fields: dict[str, str]) -> Event:
    if ALERT_FIELD not in fields:
        raise BadEventError(f"no '{ALERT_FIELD}' field in the alert entry")
    try:
        data = json.loads(fields[ALERT_FIELD])
    except json.JSONDecodeError as exc:
        raise BadEventError(f"malformed JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadEventError(f"the event is a JSON {type(data).__name__}, not an object")
    try:
        return Event.model_validate(data)
    except ValidationError as exc:
        raise BadEventError(_validation_reason(exc)) from exc


def _confined_dir(settings: Settings, path: str, what: str) -> str:
    try:
        relative = confine(settings.bundle_root, path)
    except OutsideBundleRootError as exc:
        raise BadEventError(f"{what} {path!r} escapes the bundle root") from exc
    if not (settings.bundle_root / relative).is_dir():
        raise BadEventError(f"{what} {path!r} does not exist under the bundle root")
    return relative


def validate_alert(fields: dict[str, str], settings: Settings) -> tuple[Event, str]:
    """The event of an alert entry and its job key; raises `BadEventError` with the reason."""
    event = _parse(fields)
    job = _confined_dir(settings, event.job_dir, "job_dir")
    if event.probes:
        _confined_dir(settings, event.probes, "probes")
    return event, job


@dataclass(frozen=True)
class StreamEntry:
    id: str
    fields: dict[str, str]
    redelivered: bool


class Ingest:
    """One consumer of the alert stream's `ingest` group."""

    def __init__(
        self,
        pipeline: Pipeline,
        dispatch: Dispatch,
        *,
        consumer: str | None = None,
        block_ms: int = 1000,
        watchdog: Watchdog | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.redis = pipeline.redis
        self.names: StreamNames = pipeline.names
        self.coalescer: Coalescer = pipeline.coalescer
        self.dispatch = dispatch
        self.consumer = consumer or socket.gethostname()
        self.block_ms = block_ms
        self.watchdog = watchdog
        self.outcomes: dict[str, int] = {}
        self.fault: Exception | None = None  # the last infrastructure fault met
        self._pending = True  # read our own pending entries first: redeliveries after a crash
        self._grouped = False
        self._next_claim = 0.0

    def ensure_group(self) -> None:
        try:
            self.redis.xgroup_create(self.names.alerts, INGEST_GROUP, id="0", mkstream=True)
        except Exception as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # --- one entry --------------------------------------------------------------------------

    def handle(self, entry: StreamEntry) -> str:
        """Process one alert entry and acknowledge it; returns what happened to it (logged: one
        line per alert taken, one warning per alert dead-lettered)."""
        with about_event(_claimed_event_id(entry.fields)):
            try:
                event, job = validate_alert(entry.fields, self.pipeline.settings)
                outcome = self.admit(event, job, redelivered=entry.redelivered)
                log.info("alert %s for %s: %s", entry.id, job, _SAID.get(outcome, outcome))
            except BadEventError as exc:
                outcome = self.refuse(entry, str(exc))
            except Exception as exc:
                if is_infrastructure(exc):
                    raise
                log.exception("alert %s could not be admitted", entry.id)
                outcome = self.refuse(entry, f"ingest failed: {describe(exc)}")
        self.redis.xack(self.names.alerts, INGEST_GROUP, entry.id)
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        alert_handled(outcome)
        return outcome

    def refuse(self, entry: StreamEntry, reason: str) -> str:
        """Put the entry on the dead-letter stream with the reason and the raw payload, both
        redacted: a credential pasted into an alert is lost, nothing else is."""
        reason = redact_text(reason)
        self.redis.xadd(
            self.names.dead_letter,
            {
                "reason": reason,
                "raw": json.dumps(redact_data(entry.fields), ensure_ascii=False),
                "alert_id": entry.id,
                "refused_at": datetime.now(UTC).isoformat(),
            },
        )
        log.warning("dead-lettered alert %s: %s", entry.id, reason)
        dead_lettered(reason)
        return "dead-letter"

    def admit(self, event: Event, job: str, *, redelivered: bool) -> str:
        """Archive the event (an id archived for another question is refused), admit it under
        its coalescing key, and start the workflow of a new lead (or of an orphaned one)."""
        self.pipeline.events.archive_new(event, job)
        event_json = event.model_dump_json(exclude_none=True)
        key = coalescing_key(job, event)
        admission = self.coalescer.admit(event.event_id, key, event_json=event_json)
        if admission.outcome == "started" or (redelivered and self._orphaned(admission, key)):
            self._start(admission.lead, key)
        return admission.outcome

    def _orphaned(self, admission: Admission, job: str) -> bool:
        """A lead still in flight whose workflow was never sent (ingest died before the ack)."""
        return self.coalescer.in_flight(job) == admission.lead and not self.redis.exists(
            self._dispatch_mark(admission.lead)
        )

    def _dispatch_mark(self, lead: str) -> str:
        return self.names.dispatched(lead)

    def _start(self, lead: str, job: str) -> None:
        self.dispatch(lead, job)
        self.redis.set(self._dispatch_mark(lead), "1", ex=_DISPATCH_MARK_S)

    # --- the loop ---------------------------------------------------------------------------

    def read(self) -> list[StreamEntry]:
        """The next batch: our pending entries first, then entries abandoned by dead consumers,
        then new ones."""
        if time.monotonic() >= self._next_claim:
            self._pending, self._next_claim = True, time.monotonic() + _CLAIM_EVERY_S
        if self._pending:
            entries = self._read_group("0", redelivered=True) or self._claim_abandoned()
            if entries:
                return entries
            self._pending = False
        return self._read_group(">", redelivered=False, block=self.block_ms)

    def _read_group(
        self, start: str, *, redelivered: bool, block: int | None = None
    ) -> list[StreamEntry]:
        reply = self.redis.xreadgroup(
            INGEST_GROUP, self.consumer, {self.names.alerts: start}, count=_BATCH, block=block
        )
        return [
            StreamEntry(_text(entry_id), _decode(fields), redelivered)
            for _stream, items in reply or ()
            for entry_id, fields in items
            if fields is not None  # an entry deleted from the stream while pending
        ]

    def _claim_abandoned(self) -> list[StreamEntry]:
        reply = self.redis.xautoclaim(
            self.names.alerts, INGEST_GROUP, self.consumer, _CLAIM_IDLE_MS, "0-0", count=_BATCH
        )
        items: Iterable[Any] = reply[1] if reply else ()
        return [StreamEntry(_text(i), _decode(f), True) for i, f in items if f is not None]

    def step(self) -> int:
        """Read and handle one batch; on an infrastructure fault leave the rest pending."""
        entries = self.read()
        for done, entry in enumerate(entries):
            try:
                self.handle(entry)
            except Exception as exc:
                if not is_infrastructure(exc):
                    raise
                log.warning("infrastructure fault on alert %s: %s", entry.id, describe(exc))
                self._pending, self.fault = True, exc
                return -1 if done == 0 else done
        return len(entries)

    def run(
        self,
        *,
        stop: Callable[[], bool] = lambda: False,
        max_events: int | None = None,
        until_idle: bool = False,
        stop_on_fault: bool = False,
    ) -> int:
        """Consume until `stop()`, `max_events` entries, or (`until_idle`) an empty read. An
        infrastructure fault is waited out with backoff, or with `stop_on_fault` raised (the
        alerts read stay pending for the next run)."""
        handled, backoff = 0, 0.5
        while not stop() and (max_events is None or handled < max_events):
            LIVENESS.beat()  # the loop went round: /healthz (worker.pipeline.health)
            count = self._step_safely()
            if self.watchdog is not None:
                self.watchdog.maybe_tick()
            if count == 0 and until_idle and not self._pending:
                break
            if count < 0:
                if stop_on_fault and self.fault is not None:
                    raise self.fault
                time.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)
                continue
            backoff = 0.5
            handled += count
        return handled

    def _step_safely(self) -> int:
        """One step; -1 after a fault that a retry can cure (Redis away, the group gone)."""
        try:
            if not self._grouped:
                self.ensure_group()
                self._grouped = True
                LIVENESS.begun()
            return self.step()
        except Exception as exc:
            if "NOGROUP" in str(exc) or "UNBLOCKED" in str(exc):
                self._grouped = False
            elif not is_infrastructure(exc):
                raise
            log.warning("alert stream unavailable: %s", describe(exc))
            self._pending, self.fault = True, exc
            return -1


def _claimed_event_id(fields: dict[str, str]) -> str | None:
    """The event id an alert entry claims, for its log lines (before it is validated: a
    refused alert's lines carry it too); None when it names none."""
    try:
        data = json.loads(fields.get(ALERT_FIELD, ""))
    except (json.JSONDecodeError, TypeError):
        return None
    event_id = data.get("event_id") if isinstance(data, dict) else None
    return redact_text(str(event_id))[:200] if isinstance(event_id, str) else None


def _decode(fields: dict[Any, Any]) -> dict[str, str]:
    return {_text(key): _text(value) for key, value in fields.items()}
