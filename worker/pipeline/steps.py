"""The steps of one diagnosis in the pipeline, each safe to run twice; the Celery tasks call these.

capture  event → evidence frozen under S3 `evidence/<event_id>/` (a replay reuses the original's),
         by the capture service (`worker.pipeline.capture.CaptureService`: the bundle first, live
         probes when the capture policy says so, the log cache, one storage adapter)
gate     frozen evidence → one gate's result (broken evidence is an ERROR result; lost evidence
         raises `EvidenceLostError`, so the diagnosis is sent again and captures afresh)
verdict  gate results → the report, its text and JSON written once to S3 `reports/...` → the
         verdict entry (the report itself kept in Redis for `html`)
look     a KILL that rests on stacks → RLHEALTH_REOBSERVE_S later, the job seen again (frozen
         under `evidence/<id>/second_look/`, `worker.pipeline.second_look.SecondLook`) → the
         settled report and its entry
publish  verdict entry → the verdict stream and channel, with every event id it answers, once
         its report is confirmed in S3 (`worker.pipeline.publish.Publisher`)
html     after publish: a published verdict → its HTML page beside the JSON report
         (`worker.pipeline.sinks.ReportShelf.html`); best effort, the verdict never waits for it
fail     a diagnosis that cannot finish → an ERROR report and verdict naming the stage and the
         cause, through the same publish, and a dead-letter entry with the lead's event

Only references travel between steps: event ids, the evidence id (whose frozen evidence to judge)
and the job key; results are small JSON documents. `Pipeline` holds one worker process's
adapters, each object with one role:

    events     EventArchive      the events archived once in S3, read back
    capturer   CaptureService    event → frozen evidence (its log cache and `frozen` inside)
    frozen     EvidenceStore     frozen evidence written and read back (thawed once per process)
    looks      SecondLook        when a second look is due, and the look itself
    shelf      ReportShelf       reports written once, kept for the HTML page, confirmed
    publisher  Publisher         the decision kept, published once, or the failure answered
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from functools import cached_property, partial
from typing import Any

from pydantic import ValidationError

from shared.alerts import OutsideBundleRootError, confine
from shared.models import Event, GateName, GateResult, Report, RestartsResult
from shared.settings import Settings
from shared.signing import KeyRing
from shared.streams import StreamNames
from worker.diagnosis import GATE_NAMES, run_gate
from worker.evidence.case import Evidence
from worker.pipeline.capture import CaptureService
from worker.pipeline.claim import CLAIM_TTL_S, CaptureClaim
from worker.pipeline.coalesce import Coalescer, question
from worker.pipeline.evidence_store import EvidenceStore, evidence_prefix, frozen_now
from worker.pipeline.failed import unreadable_result
from worker.pipeline.failures import (
    BadEventError,
    CaptureBusyError,
    EvidenceLostError,
    describe,
    must_propagate,
)
from worker.pipeline.lease import Leases
from worker.pipeline.logcache import JobLogCache
from worker.pipeline.publish import Publisher
from worker.pipeline.second_look import LOOK_DIR, LookAt, SecondLook
from worker.pipeline.sinks import ReportShelf, report_stored
from worker.pipeline.store import ObjectMissingError, ObjectStore
from worker.second_look import compare, first_look_at, observe, rests_on_stacks, settle
from worker.verdict import decide

__all__ = [
    "GATE_NAMES",
    "CaptureBusyError",
    "EventArchive",
    "Pipeline",
    "event_key",
    "evidence_prefix",
    "frozen_now",
]

log = logging.getLogger(__name__)


def event_key(event_id: str) -> str:
    return f"events/{event_id}.json"


class EventArchive:
    """The events of the diagnoses: archived once in S3, read back (from the lead's record in
    Redis when S3 lost one)."""

    def __init__(
        self,
        settings: Settings,
        store: ObjectStore,
        leases: Leases,
        remembered_s: Callable[[], int],
    ) -> None:
        self.settings = settings
        self.store = store
        self.leases = leases
        self.remembered_s = remembered_s  # how long Redis remembers an id (the coalescer's)

    def archive(self, event: Event) -> bool:
        """Store the event at `events/<event_id>.json` once."""
        body = event.model_dump_json(exclude_none=True).encode()
        return self.store.put_once(event_key(event.event_id), body, "application/json")

    def archive_new(self, event: Event, job: str) -> None:
        """Archive the event once; raise `BadEventError` when its id is archived already for
        another question: another job (`job`, its directory under the bundle root), or the same
        job asked as of another `now`, on other probes, in another mode or through another
        backend — or archived so long ago that Redis may have forgotten it. Its id names that
        event's frozen evidence and verdict, which must never answer this one (Redis forgets an
        id after its retention; S3 does not). The same event again (a redelivery, a watcher's
        retry) is fine."""
        if self.archive(event):
            return
        try:
            archived = Event.model_validate_json(self.store.get(event_key(event.event_id)))
        except ObjectMissingError:
            return  # deleted meanwhile: the capture archives it again from the lead's record
        except ValidationError:
            raise BadEventError(
                f"event id {event.event_id} is archived already, unreadable: use a new id"
            ) from None
        if self._job_of(archived) != job:
            raise BadEventError(
                f"event id {event.event_id} is archived already for another job: use a new id"
            )
        if (question(archived), archived.replay_of) != (question(event), event.replay_of):
            raise BadEventError(
                f"event id {event.event_id} is archived already with another now, probes, mode "
                "or backend: use a new id"
            )
        self._check_remembered(event.event_id)

    def _check_remembered(self, event_id: str) -> None:
        """An id archived longer ago than Redis keeps ids (the coalescer's retention) is one
        Redis may have forgotten: started afresh it would announce that old diagnosis again, as
        new, and open a cooldown that answers the job's next genuine alert with it (a job
        directory reused by a new run of the same name gets the old run's KILL)."""
        with suppress(ObjectMissingError):
            age_s = time.time() - self.store.modified(event_key(event_id))
            if age_s > self.remembered_s():
                raise BadEventError(
                    f"event id {event_id} is archived already, {age_s / 86400:.1f} days ago, "
                    "longer than ids are remembered: use a new id"
                )

    def _job_of(self, event: Event) -> str | None:
        try:
            return confine(self.settings.bundle_root, event.job_dir)
        except (OutsideBundleRootError, OSError, ValueError):
            return None

    def load(self, event_id: str) -> Event:
        """The archived event; archived again from the copy its lead keeps in Redis if S3 lost
        it. Raises `EvidenceLostError` when neither has it."""
        try:
            return Event.model_validate_json(self.store.get(event_key(event_id)))
        except ObjectMissingError:
            kept = self.leases.record(event_id).get("event")
            if not kept:
                raise EvidenceLostError(f"the event {event_id} is gone from S3 and Redis") from None
            event = Event.model_validate_json(kept)
            self.archive(event)
            log.warning("event %s was gone from S3: archived again from its alert", event_id)
            return event


class Pipeline:
    """One worker process's adapters, each with one role, and the steps the tasks call."""

    def __init__(self, settings: Settings, store: ObjectStore, redis: Any) -> None:
        self.settings = settings
        self.store = store
        self.redis = redis
        self.names = StreamNames(settings.stream_prefix)
        self.leases = Leases(redis, self.names, lease_s=settings.lease_s)
        self.events = EventArchive(settings, store, self.leases, lambda: self.coalescer.retention_s)
        self.frozen = EvidenceStore(settings, store)
        logs = JobLogCache(settings, store)
        self.capturer = CaptureService(settings, logs, self.frozen)
        self.looks = SecondLook(
            settings, store, redis, self.names, load_event=self.events.load, capturer=self.capturer
        )

    @cached_property
    def keys(self) -> KeyRing:
        """The verdict keys (RLHEALTH_VERDICT_KEY or _FILE): the first signs, all verify."""
        return self.settings.verdict_keys()

    @cached_property
    def coalescer(self) -> Coalescer:
        s = self.settings
        return Coalescer(
            self.redis,
            self.names,
            keys=self.keys,
            coalesce_s=s.coalesce_s,
            lease_s=s.lease_s,
            report_there=partial(report_stored, self.store),
        )

    @cached_property
    def shelf(self) -> ReportShelf:
        return ReportShelf(
            self.store,
            self.redis,
            self.names,
            self.keys,
            retention_s=self.coalescer.retention_s,
            thaw=self.frozen.thaw,
        )

    @cached_property
    def publisher(self) -> Publisher:
        return Publisher(
            self.redis,
            self.names,
            self.keys,
            coalescer=self.coalescer,
            leases=self.leases,
            shelf=self.shelf,
            frozen=self.frozen,
            load_event=self.events.load,
        )

    def capture(self, event_id: str, evidence_id: str, claim: str) -> str:
        """Freeze the event's evidence to S3 (once); returns the evidence id.

        `claim` (the task id) makes a re-delivered task resume its own capture, while a second
        workflow for the same event waits for the first one's, and takes over once that one's
        process is gone (see `worker.pipeline.claim`).
        """
        if self.capturer.captured(evidence_id):
            return evidence_id
        if evidence_id != event_id:
            raise EvidenceLostError(
                f"the frozen evidence of {evidence_id} is gone from S3: the replay cannot judge "
                "it (rl-health replay --fresh captures the job again)"
            )
        event = self.events.load(event_id)
        key = self.names.capture_claim(evidence_id)
        holder = CaptureClaim(self.redis, key, claim, CLAIM_TTL_S)
        if not holder.acquire():
            raise CaptureBusyError(f"another capture of {event_id} is under way")
        with holder.kept():
            if not self.capturer.captured(evidence_id):  # finished while we waited for the claim?
                self.capturer.capture(event, holder.held)
        holder.release()
        return evidence_id

    def gate(self, evidence_id: str, name: str) -> dict[str, Any]:
        """One gate on the frozen evidence, as `{"name", "result"}`. A gate that breaks on the
        evidence gives ERROR; infrastructure faults, time limits and lost evidence raise."""
        evidence = self.frozen.thaw(evidence_id)
        try:
            result = run_gate(name, evidence)
        except Exception as exc:
            if must_propagate(exc):
                raise
            result = unreadable_result(name, f"the {name} check failed: {describe(exc)}")
        return {"name": name, "result": result.model_dump(mode="json")}

    def report(self, results: list[dict[str, Any]], event_id: str, evidence_id: str) -> Report:
        """Join the gate results into the report of the diagnosis led by `event_id`."""
        answers = self.coalescer.answers(event_id)
        return _joined(results, self.frozen.thaw(evidence_id), event_id, answers)

    def verdict(
        self, results: list[dict[str, Any]], event_id: str, evidence_id: str
    ) -> dict[str, Any]:
        """Write the report once to S3; returns the verdict entry (as JSON) to publish."""
        known = self.publisher.known(event_id)
        if known is not None:
            return known.model_dump(mode="json")
        return self.publisher.settle(self.report(results, event_id, evidence_id), evidence_id)

    def plan_verdict(
        self, results: list[dict[str, Any]], event_id: str, evidence_id: str
    ) -> dict[str, Any]:
        """The verdict step, second look included: `{"entry": ...}` when the verdict is decided
        now, `{"look_in_s": s}` when a KILL that rests on stacks waits for its second look."""
        known = self.publisher.known(event_id)
        if known is not None:
            return {"entry": known.model_dump(mode="json")}
        report = self.report(results, event_id, evidence_id)
        wait = self.looks.wait(report, event_id, evidence_id) if rests_on_stacks(report) else None
        if wait is None:
            return {"entry": self.publisher.settle(report, evidence_id)}
        if wait == 0:  # frozen already (a replay, a diagnosis sent again): judged at once
            return {"entry": self.second_look(results, event_id, evidence_id)}
        return {"look_in_s": wait}

    def second_look(
        self,
        results: list[dict[str, Any]],
        event_id: str,
        evidence_id: str,
        scheduled_at: float | None = None,
        claim: str | None = None,
    ) -> dict[str, Any]:
        """Look at the job again (or read the frozen second look), settle the first report with
        what it saw, and write the final report once; returns the verdict entry. `claim` (the
        task id) lets one task at a time take the look, as the capture does."""
        known = self.publisher.known(event_id)
        if known is not None:
            return known.model_dump(mode="json")
        report = self.report(results, event_id, evidence_id)
        first = self.frozen.thaw(evidence_id)
        since = first_look_at(report) if scheduled_at is not None else None
        if since is not None:  # the look waited from the first look's dumps (`SecondLook.wait`)
            scheduled_at = min(scheduled_at or since.timestamp(), since.timestamp())
        look_at = LookAt(event_id, evidence_id, scheduled_at, claim or uuid.uuid4().hex)
        second, waited_s = self.looks.observation(look_at, first)
        look = compare(observe(first), observe(second, prefix=LOOK_DIR), waited_s)
        return self.publisher.settle(settle(report, look), evidence_id)


def _joined(
    results: list[dict[str, Any]], evidence: Evidence, event_id: str, answers: list[str]
) -> Report:
    """The report of the gate results on `evidence` (`worker.verdict.decide`)."""
    by_name = {item["name"]: item["result"] for item in results}
    restarts = RestartsResult.model_validate(by_name["restarts"])
    gates = {name: GateResult.model_validate(by_name[name.value]) for name in GateName}
    return decide(evidence, restarts, gates, event_id=event_id, event_ids=answers)
