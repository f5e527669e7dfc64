"""The steps of one diagnosis in the pipeline, each safe to run twice; the Celery tasks call these.

capture  event → evidence frozen under S3 `evidence/<event_id>/` (a replay reuses the original's);
         with a live backend (RLHEALTH_BACKEND, or the event's among RLHEALTH_BACKENDS), the
         capture policy probes the job within RLHEALTH_CAPTURE_BUDGET_S and the probes are
         frozen under `probes/` (gates only read; the second look alone probes again)
gate     frozen evidence → one gate's result (broken evidence is an ERROR result; lost evidence
         raises `EvidenceLostError`, so the diagnosis is sent again and captures afresh)
verdict  gate results → the report, its text and JSON written once to S3 `reports/...` → the
         verdict entry (the report itself kept in Redis for `html`)
look     a KILL that rests on stacks → RLHEALTH_REOBSERVE_S later, the job seen again (frozen
         under `evidence/<id>/second_look/`) → the settled report and its entry
publish  verdict entry → the verdict stream and channel, with every event id it answers, once
         its report is confirmed in S3 (written again from Redis's copy if S3 lost it)
html     after publish: a published verdict → its HTML page (plots drawn from the frozen
         evidence) beside the JSON report, same key with `.html`; best effort, for people: the
         verdict never waits for it, and a page that cannot be drawn is stored without plots
fail     a diagnosis that cannot finish → an ERROR report and verdict naming the stage and the
         cause, through the same publish, and a dead-letter entry with the lead's event

Only references travel between steps: event ids, the evidence id (whose frozen evidence to judge)
and the job key; results are small JSON documents. The verdict entry decided for a lead is kept in
Redis (`<p>:entry:<lead>`) before it is published, so a verdict and a failure racing for the same
lead publish one entry, the first one decided.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from reports.html import html_key
from shared.alerts import OutsideBundleRootError, confine
from shared.models import (
    Event,
    GateName,
    GateResult,
    Report,
    RestartsResult,
    VerdictEntry,
)
from shared.redact import redact_data, redact_text
from shared.safefs import Folder, owned_directory, remove_tree
from shared.settings import Settings
from shared.signing import KeyRing, UnverifiedError
from shared.streams import StreamNames
from worker.capture_policy import BackendChoiceError, choose_backend
from worker.diagnosis import GATE_NAMES, collect_evidence, run_gate
from worker.evidence.case import Evidence
from worker.evidence.frozen import (
    MARKER,
    PARTS,
    FrozenEvidenceError,
    PartCache,
    freeze,
    referenced_parts,
    thaw,
)
from worker.pipeline.capture import LiveCapture, LiveProbes
from worker.pipeline.claim import CaptureClaim
from worker.pipeline.coalesce import Coalescer, job_dir_of, question
from worker.pipeline.failed import (
    FAILED_NOTE,
    failure_evidence,
    failure_report,
    unreadable_result,
)
from worker.pipeline.failures import (
    BadEventError,
    EvidenceLostError,
    PipelineError,
    ReportLostError,
    describe,
    is_infrastructure,
    is_time_limit,
)
from worker.pipeline.lease import Leases
from worker.pipeline.logcache import collect_cached, finish_sharing
from worker.pipeline.metrics import dead_lettered, html_drawn, verdict_published
from worker.pipeline.parts import THAW_CACHE_BYTES, SharedParts, StoredLater, job_parts
from worker.pipeline.second_look import (
    LOOK_DIR,
    Live,
    can_probe,
    freeze_look,
    look_prefix,
    observe_again,
    thaw_look,
)
from worker.pipeline.sinks import S3ReportSink, StoredReport, VerdictStreamSink, store_html
from worker.pipeline.store import ObjectMissingError, ObjectStore, download_prefix, key_segment
from worker.second_look import compare, first_look_at, observe, rests_on_stacks, settle
from worker.verdict import decide

__all__ = [
    "GATE_NAMES",
    "CaptureBusyError",
    "Pipeline",
    "event_key",
    "evidence_prefix",
    "frozen_now",
]

log = logging.getLogger(__name__)

_THAWED_KEPT: Final = 4
_UNCHECKED: Final = ".unchecked"  # a local copy the capture left, not yet checked against S3
_CACHE_MAX_AGE_S: Final = 3600
_CLAIM_TTL_S: Final = 60
MIN_LOOK_WAIT_S: Final = 1.0
"""The shortest countdown to a second look, when the first look's dumps are already older than
RLHEALTH_REOBSERVE_S (a slow capture): the look is still taken by its own task."""


def event_key(event_id: str) -> str:
    return f"events/{event_id}.json"


def evidence_prefix(evidence_id: str) -> str:
    return f"evidence/{evidence_id}/"


def _must_propagate(exc: BaseException) -> bool:
    """Failures that are never evidence: infrastructure, time limits, memory, our own."""
    return (
        is_infrastructure(exc)
        or is_time_limit(exc)
        or isinstance(exc, (PipelineError, MemoryError))
    )


def _place(evidence: Evidence) -> dict[str, str]:
    """Where a report of this evidence goes: cluster, user and job as safe key segments."""
    bundle = evidence.bundle
    job = bundle.job_name or Path(evidence.job_id).name
    return {
        "cluster": key_segment(bundle.cluster, "unknown-cluster"),
        "user": key_segment(bundle.user, "unknown-user"),
        "job": key_segment(job, "unknown-job"),
    }


class Pipeline:
    """The adapters one worker process needs, and the steps."""

    def __init__(self, settings: Settings, store: ObjectStore, redis: Any) -> None:
        self.settings = settings
        self.store = store
        self.redis = redis
        self.names = StreamNames(settings.stream_prefix)
        # this process's own (no other user may plant evidence in it), or UnsafeDirectoryError
        root = owned_directory(settings.cache_root())
        self.cache_root = root / "evidence"
        self.parts = SharedParts(store, root / "parts")
        self.part_cache = PartCache(THAW_CACHE_BYTES)
        self._thawed: OrderedDict[str, Evidence] = OrderedDict()
        self.clock: Callable[[], float] = time.time  # epoch seconds: when the look is due

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
            report_there=self.report_stored,
        )

    @cached_property
    def leases(self) -> Leases:
        return Leases(self.redis, self.names, lease_s=self.settings.lease_s)

    # --- events -----------------------------------------------------------------------------

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
            if age_s > self.coalescer.retention_s:
                raise BadEventError(
                    f"event id {event_id} is archived already, {age_s / 86400:.1f} days ago, "
                    "longer than ids are remembered: use a new id"
                )

    def _job_of(self, event: Event) -> str | None:
        try:
            return confine(self.settings.bundle_root, event.job_dir)
        except (OutsideBundleRootError, OSError, ValueError):
            return None

    def load_event(self, event_id: str) -> Event:
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

    # --- capture ----------------------------------------------------------------------------

    def capture(self, event_id: str, evidence_id: str, claim: str) -> str:
        """Freeze the event's evidence to S3 (once); returns the evidence id.

        `claim` (the task id) makes a re-delivered task resume its own capture, while a second
        workflow for the same event waits for the first one's, and takes over once that one's
        process is gone (see `worker.pipeline.claim`).
        """
        prefix = evidence_prefix(evidence_id)
        if self._frozen_whole(prefix):
            return evidence_id
        if evidence_id != event_id:
            raise EvidenceLostError(
                f"the frozen evidence of {evidence_id} is gone from S3: the replay cannot judge "
                "it (rl-health replay --fresh captures the job again)"
            )
        event = self.load_event(event_id)
        key = self.names.capture_claim(evidence_id)
        holder = CaptureClaim(self.redis, key, claim, _CLAIM_TTL_S)
        if not holder.acquire():
            raise CaptureBusyError(f"another capture of {event_id} is under way")
        with holder.kept():
            if not self._frozen_whole(prefix):  # finished while we waited for the claim?
                self._forget(evidence_id)
                self._clear(prefix)
                self._capture_fresh(event, prefix, holder)
        holder.release()
        return evidence_id

    def _frozen_whole(self, prefix: str) -> bool:
        """Whether `prefix` holds a marked freeze whose every referenced table part is in S3 (a
        part gone makes it lost evidence, captured again like a freeze gone whole); the parts
        are looked up in one listing of the place that keeps them, not one request each."""
        try:
            referenced = referenced_parts(self.store.get(prefix + MARKER))
        except ObjectMissingError:
            return False
        except FrozenEvidenceError:
            return True  # not ours to remove (another format?): the gates say what is wrong
        places: dict[str, set[str]] = {}
        for key in referenced:
            places.setdefault(key.rpartition("/")[0] + "/", set()).add(key)
        return all(keys <= set(self.store.keys(place)) for place, keys in sorted(places.items()))

    def _clear(self, prefix: str) -> None:
        """Remove what a capture that died left under `prefix`, or a freeze whose parts are
        gone (its marker first), from one listing."""
        marker = prefix + MARKER
        for key in sorted(self.store.keys(prefix), key=lambda key: key != marker):
            self.store.delete(key)

    def _collect(self, event: Event, label: str, live: LiveProbes | None = None) -> Evidence:
        root = self.settings.bundle_root
        probes = root / event.probes if event.probes else None
        if live is not None:  # the live capture's probe directory, and what it noted
            probes = live.directory
        try:
            return collect_cached(
                self.settings,
                self.store,
                event.job_dir,
                lambda cache: collect_evidence(
                    root / event.job_dir,
                    now=event.now,
                    mode=event.mode,
                    notes=live.notes if live is not None else (),
                    probes_dir=probes,
                    evidence_label=label,
                    log_cache=cache,
                ),
                share_later=True,
            )
        except Exception as exc:
            if _must_propagate(exc):
                raise
            return failure_evidence(event, label, describe(exc))

    def _capture_fresh(self, event: Event, prefix: str, holder: CaptureClaim) -> None:
        """Collect, freeze and store the evidence (the log cache's S3 copy written meanwhile),
        and keep the freeze on this worker's disk for its gates; logs the time of each phase."""
        label, took = self.store.uri(prefix), _Phases()
        with tempfile.TemporaryDirectory(prefix="rlhealth-freeze-") as tmp:
            with _shared_at_end(took):
                directory = Path(tmp)
                live = directory / "live"
                evidence = self._probed(event, label, self._collect(event, label), live)
                took.mark("collect")
                frozen = directory / "frozen"
                parts_at = job_parts(self.settings.bundle_root, event.job_dir)
                with StoredLater(self.store, parts_at) as stored:  # listed while rows hash
                    written = _frozen_files(evidence, live, frozen, parts_at, stored)  # marker last
                took.mark("freeze")
                ours = self._store_freeze(frozen, written, parts_at, prefix, holder)
                took.mark("store")
            if ours:
                self._keep_local(event.event_id, frozen)  # a fresh capture's evidence id
        log.info("captured %s: %s", event.event_id, took)

    def _store_freeze(
        self, frozen: Path, written: list[Path], parts_at: str, prefix: str, holder: CaptureClaim
    ) -> bool:
        """Store the files of a freeze: its new table parts a few at once (content-addressed,
        so their order does not matter), then the others one by one with the claim checked
        before each, the marker last. True when this call wrote every file under `prefix`."""
        new_parts = [path for path in written if path.relative_to(frozen).parts[0] == PARTS]
        _check_held(holder, prefix)
        self.parts.keep_all(parts_at, new_parts)
        ours = True
        for path in written:
            if path.relative_to(frozen).parts[0] != PARTS:
                _check_held(holder, prefix)
                relative = path.relative_to(frozen).as_posix()
                ours = self.store.put_once(prefix + relative, path.read_bytes()) and ours
        return ours

    def _keep_local(self, evidence_id: str, frozen: Path) -> None:
        """Leave the freeze just stored where this worker's gates look for their local copy
        (`_local_copy`), as a download would give it (its new parts are on the disk already,
        `SharedParts`), marked to be checked against S3 once before it is used. A disk that
        fails costs the copy: the gates download it."""
        target = self.cache_root / evidence_id
        staging: Path | None = None
        try:
            made = owned_directory(self.cache_root)
            staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=made))
            shutil.copytree(frozen, staging, dirs_exist_ok=True, ignore=_top_parts(frozen))
            (staging / _UNCHECKED).touch()
            _replace_dir(staging, target)
        except OSError as exc:
            log.warning("the freeze of %s is not kept on this disk: %s", evidence_id, exc)
            if staging is not None:
                remove_tree(staging)

    def _forget(self, evidence_id: str) -> None:
        """Drop what this worker holds of an evidence about to be captured again."""
        self._thawed.pop(evidence_id, None)
        remove_tree(self.cache_root / evidence_id)

    # --- live capture -----------------------------------------------------------------------

    @cached_property
    def live(self) -> LiveCapture:
        """The live capture of this process: settings checked and tools resolved once."""
        return LiveCapture.start(self.settings)

    def _probed(self, event: Event, label: str, first: Evidence, out: Path) -> Evidence:
        """The evidence with live probes when the backend choice and the capture policy call for
        them (read again with the probe directory, as `diagnose --backend` does). A backend the
        event may not choose, or probing that breaks, answers ERROR through the gates."""
        if _unread(first):  # a bundle that could not be read is ERROR already
            return first
        try:
            backend = choose_backend(event.backend, self.settings)
        except BackendChoiceError as exc:
            return failure_evidence(event, label, f"live capture refused: {exc}")
        if backend is None or event.probes:  # no live backend, or recorded probes named
            return first
        try:
            live = self.live.probe(first, backend, out)
        except Exception as exc:
            if _must_propagate(exc):
                raise
            return failure_evidence(event, label, f"live capture failed: {describe(exc)}")
        return self._collect(event, label, live)

    # --- gates ------------------------------------------------------------------------------

    def evidence(self, evidence_id: str) -> Evidence:
        """The frozen evidence, thawed once per process and kept for the next gate; raises
        `EvidenceLostError` when it is gone or cannot be read."""
        if evidence_id in self._thawed:
            self._thawed.move_to_end(evidence_id)
            return self._thawed[evidence_id]
        directory = self._local_copy(evidence_id)
        cache, started = self.part_cache, time.perf_counter()
        hits, misses = cache.hits, cache.misses
        try:
            evidence = thaw(directory, fetch=self.parts.fetch, cache=cache)
        except Exception as exc:
            if _must_propagate(exc):
                raise
            remove_tree(directory)
            raise EvidenceLostError(
                f"the frozen evidence of {evidence_id} cannot be read: {describe(exc)}"
            ) from exc
        log.info(
            "thawed %s in %.2fs: %d parts from this process's cache, %d read",
            evidence_id,
            time.perf_counter() - started,
            cache.hits - hits,
            cache.misses - misses,
        )
        self._thawed[evidence_id] = evidence
        while len(self._thawed) > _THAWED_KEPT:
            self._thawed.popitem(last=False)
        return evidence

    def _local_copy(self, evidence_id: str) -> Path:
        """The frozen evidence on this worker's disk: left by the capture (checked once that
        S3 still holds its marker) or downloaded."""
        target, prefix = self.cache_root / evidence_id, evidence_prefix(evidence_id)
        if (target / MARKER).is_file():
            if (target / _UNCHECKED).exists():
                if not self.store.exists(prefix + MARKER):
                    remove_tree(target)
                    raise EvidenceLostError(f"the frozen evidence of {evidence_id} is gone from S3")
                (target / _UNCHECKED).unlink(missing_ok=True)
            return target
        if not self.store.exists(prefix + MARKER):
            raise EvidenceLostError(f"the frozen evidence of {evidence_id} is gone from S3")
        self._prune_cache()
        staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=owned_directory(self.cache_root)))
        download_prefix(self.store, prefix, staging)
        if not (staging / MARKER).is_file():  # objects vanished while we downloaded them
            remove_tree(staging)
            raise EvidenceLostError(f"the frozen evidence of {evidence_id} is gone from S3")
        try:
            staging.rename(target)  # atomic: other processes see all of it or none
        except OSError:
            remove_tree(staging)  # another process got there first
        return target

    def _prune_cache(self) -> None:
        """Remove local copies unused for `_CACHE_MAX_AGE_S`, through the directory's descriptor
        (a symlink in it is removed, never followed)."""
        self.parts.prune()
        root = Folder.existing(self.cache_root)
        if root is None:
            return
        cutoff = time.time() - _CACHE_MAX_AGE_S
        with root:
            for entry in root.entries():
                if entry.mtime < cutoff:
                    root.remove(entry.name)

    def gate(self, evidence_id: str, name: str) -> dict[str, Any]:
        """One gate on the frozen evidence, as `{"name", "result"}`. A gate that breaks on the
        evidence gives ERROR; infrastructure faults, time limits and lost evidence raise."""
        evidence = self.evidence(evidence_id)
        try:
            result = run_gate(name, evidence)
        except Exception as exc:
            if _must_propagate(exc):
                raise
            result = unreadable_result(name, f"the {name} check failed: {describe(exc)}")
        return {"name": name, "result": result.model_dump(mode="json")}

    # --- verdict and publish ----------------------------------------------------------------

    def report(self, results: list[dict[str, Any]], event_id: str, evidence_id: str) -> Report:
        """Join the gate results into the report of the diagnosis led by `event_id`."""
        by_name = {item["name"]: item["result"] for item in results}
        restarts = RestartsResult.model_validate(by_name["restarts"])
        gates = {name: GateResult.model_validate(by_name[name.value]) for name in GateName}
        answers = self.coalescer.answers(event_id)
        evidence = self.evidence(evidence_id)
        return decide(evidence, restarts, gates, event_id=event_id, event_ids=answers)

    def verdict(
        self, results: list[dict[str, Any]], event_id: str, evidence_id: str
    ) -> dict[str, Any]:
        """Write the report once to S3; returns the verdict entry (as JSON) to publish."""
        known = self.coalescer.published(event_id) or self.decided(event_id)
        if known is not None:
            return known.model_dump(mode="json")
        report = self.report(results, event_id, evidence_id)
        stored = self._store_report(report, self.evidence(evidence_id))
        return self._decide(VerdictStreamSink.entry(report, stored)).model_dump(mode="json")

    def _store_report(self, report: Report, evidence: Evidence) -> StoredReport:
        """The text and JSON renderings, written once under the report's key; the report itself
        is kept in Redis (by its URI) for the HTML page drawn after publish (`html`)."""
        stored = S3ReportSink(self.store, self.keys)(report, **_place(evidence))
        key, fields = self._kept_report(stored.uri), {"json_key": stored.json_key}
        with self.redis.pipeline() as batch:
            batch.hset(key, mapping={**fields, "report": report.model_dump_json()})
            batch.expire(key, self.coalescer.retention_s)
            batch.execute()
        return stored

    def _kept_report(self, report_uri: str) -> str:
        return f"{self.names.prefix}:report:{report_uri}"

    def _report_key(self, report_uri: str) -> str | None:
        """The key of a report URI in this store; None for a URI of another store."""
        base = self.store.uri("")
        return report_uri[len(base) :] if report_uri.startswith(base) else None

    def report_stored(self, report_uri: str) -> bool:
        """Whether the report at `report_uri` is in S3 (one outside this store is not)."""
        key = self._report_key(report_uri)
        return key is not None and self.store.exists(key)

    def _confirm_report(self, entry: VerdictEntry) -> None:
        """The report `entry` points at is in S3 before the entry is announced. A report S3
        lost after it was written (an S3 restarted empty between the verdict and its publish,
        or before a decided verdict is published again by a re-run or the error callback) is
        written again from the copy Redis keeps for the HTML page; when that is gone too, the
        decision is withdrawn and `ReportLostError` raised (the diagnosis is sent again)."""
        if self.report_stored(entry.report_uri):
            return
        stored = self.redis.hgetall(self._kept_report(entry.report_uri))
        kept = {_text(k): v for k, v in stored.items()}
        json_key = _text(kept.get("json_key", ""))
        if "report" in kept and json_key.endswith(".json"):
            report = Report.model_validate_json(kept["report"])
            S3ReportSink(self.store, self.keys).write(report, json_key.removesuffix(".json"))
            log.warning("report %s was gone from S3: written again", entry.report_uri)
            return
        self.redis.delete(self.names.entry(entry.event_id))
        raise ReportLostError(
            f"the report of {entry.event_id} is gone from S3 ({entry.report_uri}) and not kept"
        )

    def html(self, entry: dict[str, Any], evidence_id: str | None) -> str | None:
        """Draw the HTML page of a published verdict beside its JSON report (same key, `.html`),
        its plots from the frozen evidence `evidence_id`; returns the page's key, None when the
        report is no longer kept. Best effort: evidence that cannot be read, or plots that
        cannot be drawn, give the page without plots (logged, counted); faults of Redis or S3
        raise, to be retried."""
        uri = VerdictEntry.model_validate(entry).report_uri
        kept = {_text(k): v for k, v in self.redis.hgetall(self._kept_report(uri)).items()}
        if "json_key" not in kept or "report" not in kept:
            json_key = self._report_key(uri)  # drawn by an earlier run?
            if json_key is not None and self.store.exists(html_key(json_key)):
                return html_key(json_key)
            log.warning("the report %s is no longer kept: its HTML page is not drawn", uri)
            html_drawn("report_gone")
            return None
        json_key = _text(kept["json_key"])
        if not self.store.exists(html_key(json_key)):  # else drawn by an earlier run
            report = Report.model_validate_json(kept["report"])
            evidence = self._plotted(evidence_id) if evidence_id else None
            failed: list[BaseException] = []
            store_html(self.store, json_key, report, evidence, failed=failed.append)
            html_drawn("without_plots" if failed or evidence is None else "drawn")
        self.redis.delete(self._kept_report(uri))
        return html_key(json_key)

    def _plotted(self, evidence_id: str) -> Evidence | None:
        """The frozen evidence to draw plots from; None when it is gone or cannot be read."""
        try:
            return self.evidence(evidence_id)
        except Exception as exc:
            if not isinstance(exc, EvidenceLostError) and _must_propagate(exc):
                raise
            log.warning("HTML page of %s drawn without plots: %s", evidence_id, describe(exc))
            return None

    def decided(self, lead: str) -> VerdictEntry | None:
        """The verdict entry decided for `lead` (signed), before or after it was published;
        one that does not verify (written by another hand) is None, with a warning."""
        raw = self.redis.get(self.names.entry(lead))
        if raw is None:
            return None
        try:
            entry = VerdictEntry.model_validate_json(raw)
            entry.verify(self.keys)
        except ValueError as exc:  # not an entry (ValidationError), or UnverifiedError
            log.warning("the decision kept for %s is refused: %s", lead, exc)
            return None
        return entry

    def _decide(self, entry: VerdictEntry) -> VerdictEntry:
        """Keep `entry`, signed, as the lead's decision unless one was kept first; returns the
        kept one. Signed here, so what travels to `publish` through the broker can be checked."""
        signed = entry.signed(self.keys)
        key, retention = self.names.entry(entry.event_id), self.coalescer.retention_s
        if self.redis.set(key, signed.model_dump_json(), nx=True, ex=retention):
            return signed
        return self.decided(entry.event_id) or signed

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
            self._confirm_report(decided)
        published = VerdictStreamSink(self.coalescer)(decided, job=job)
        if first:
            self._announced(published, alerted)
        return published.model_dump(mode="json")

    def _alerted_at(self, lead: str) -> datetime | None:
        """When the alert that leads the diagnosis was published (the watcher's clock), read
        from the lead's record before publishing releases it; None when it is not there."""
        event = self.leases.record(lead).event or {}
        try:
            return Event.model_validate(event).published_at if event else None
        except ValidationError:
            return None

    def _announced(self, entry: VerdictEntry, alerted: datetime | None) -> None:
        """The one line and the counts of a verdict this process published: what operators
        grep for (`verdict event=... job=...`) and chart (latency from the alert)."""
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

    # --- the second look before a stall KILL (worker.second_look) ----------------------------

    def plan_verdict(
        self, results: list[dict[str, Any]], event_id: str, evidence_id: str
    ) -> dict[str, Any]:
        """The verdict step, second look included: `{"entry": ...}` when the verdict is decided
        now, `{"look_in_s": s}` when a KILL that rests on stacks waits for its second look."""
        known = self.coalescer.published(event_id) or self.decided(event_id)
        if known is not None:
            return {"entry": known.model_dump(mode="json")}
        report = self.report(results, event_id, evidence_id)
        wait = self.look_wait(report, event_id, evidence_id)
        if wait is None:
            return {"entry": self._settled(report, evidence_id)}
        if wait == 0:  # frozen already (a replay, a diagnosis sent again): judged at once
            return {"entry": self.second_look(results, event_id, evidence_id)}
        return {"look_in_s": wait}

    def look_wait(self, report: Report, event_id: str, evidence_id: str) -> float | None:
        """Seconds until the second look of `report` (0: one is frozen already, or no backend
        could take one: judge it now); None when none is due: no KILL on stacks,
        RLHEALTH_REOBSERVE_S=0, an event judged on recorded probes or as of a fixed `now` (as
        `diagnose --probes` judges them), or a replay of a diagnosis that took none (a replay
        never waits or probes)."""
        if not rests_on_stacks(report):
            return None
        if self.store.exists(look_prefix(evidence_prefix(evidence_id)) + MARKER):
            return 0.0
        if evidence_id != event_id or self.settings.reobserve_s == 0:
            return None
        event = self.load_event(event_id)
        if event.probes or event.now is not None:
            return None  # judged on recorded probes or as of a fixed time: not the live job
        if not can_probe(event, self.settings):
            return 0.0  # no backend to look through: waiting would not help, judge it (blind) now
        return self._countdown(report)

    def _countdown(self, report: Report) -> float:
        """RLHEALTH_REOBSERVE_S after the newest dump the proof quotes (what shows a wedge is the
        time between the two looks' stacks, not between the first verdict and the second look),
        never less than MIN_LOOK_WAIT_S from now."""
        first = first_look_at(report)
        reobserve = self.settings.reobserve_s
        if first is None:
            return reobserve
        elapsed = max(0.0, self.clock() - first.timestamp())
        return max(MIN_LOOK_WAIT_S, reobserve - elapsed)

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
        known = self.coalescer.published(event_id) or self.decided(event_id)
        if known is not None:
            return known.model_dump(mode="json")
        report = self.report(results, event_id, evidence_id)
        first = self.evidence(evidence_id)
        since = first_look_at(report) if scheduled_at is not None else None
        if since is not None:  # the look waited from the first look's dumps (`look_wait`)
            scheduled_at = min(scheduled_at or since.timestamp(), since.timestamp())
        look_at = _LookAt(event_id, evidence_id, scheduled_at, claim or uuid.uuid4().hex)
        second, waited_s = self._second_observation(look_at, first)
        look = compare(observe(first), observe(second, prefix=LOOK_DIR), waited_s)
        return self._settled(settle(report, look), evidence_id)

    def _second_observation(self, at: _LookAt, first: Evidence) -> tuple[Evidence, float]:
        """The frozen second look, else one taken now under a claim, frozen, and judged as
        frozen (what a replay will read)."""
        prefix = look_prefix(evidence_prefix(at.evidence_id))
        frozen = thaw_look(self.store, prefix)
        if frozen is not None:
            return frozen
        key = self.names.capture_claim(f"{at.evidence_id}:second-look")
        holder = CaptureClaim(self.redis, key, at.claim, _CLAIM_TTL_S)
        if not holder.acquire():
            raise CaptureBusyError(f"another second look of {at.evidence_id} is under way")
        with holder.kept():
            if not self.store.exists(prefix + MARKER):  # finished while we waited for the claim
                self._clear(prefix)
                self._take_look(at, first, prefix, holder)
        holder.release()
        frozen = thaw_look(self.store, prefix)
        if frozen is None:
            raise EvidenceLostError(f"the second look of {at.evidence_id} is gone from S3")
        return frozen

    def _take_look(self, at: _LookAt, first: Evidence, prefix: str, holder: CaptureClaim) -> None:
        event = self.load_event(at.event_id)
        try:
            live = Live(tools=self.live.tools, budget_s=self.settings.capture_budget_s)
            second = observe_again(event, first, self.settings, live=live, store=self.store)
        except Exception as exc:
            if _must_propagate(exc):
                raise
            second = failure_evidence(event, self.store.uri(prefix), describe(exc))
        if not holder.held():
            raise CaptureBusyError(f"lost the claim on {prefix} (too slow)")
        waited_s = max(0.0, time.time() - at.scheduled_at) if at.scheduled_at else 0.0
        freeze_look(self.store, prefix, second, waited_s)

    def _settled(self, report: Report, evidence_id: str) -> dict[str, Any]:
        """Write the final report once and keep its entry as the lead's decision."""
        stored = self._store_report(report, self.evidence(evidence_id))
        return self._decide(VerdictStreamSink.entry(report, stored)).model_dump(mode="json")

    # --- a diagnosis that cannot finish -----------------------------------------------------

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
                self._announced(entry, alerted)
            return entry
        event = self._event_or_placeholder(lead, job)
        entry = self._decide(self._failure_entry(event, lead, reason, read_frozen))
        if self.coalescer.publish(entry, job, cooldown=False):
            self.dead_letter(event, reason)
            self._announced(entry, alerted)
        log.warning("diagnosis %s answered ERROR: %s", lead, reason)
        return entry

    def _decided_and_stored(self, lead: str) -> VerdictEntry | None:
        """The verdict decided for `lead` with its report confirmed in S3; None when none was
        decided, or its report is lost (the decision withdrawn: the failure answers instead)."""
        entry = self.decided(lead)
        if entry is None:
            return None
        try:
            self._confirm_report(entry)
        except ReportLostError as exc:
            log.warning("the verdict decided for %s is not published: %s", lead, exc)
            return None
        return entry

    def _event_or_placeholder(self, lead: str, job: str) -> Event:
        try:
            return self.load_event(lead)
        except (EvidenceLostError, ValidationError):
            return Event(event_id=lead, job_dir=job_dir_of(job), published_at=datetime.now(UTC))

    def _failure_entry(
        self, event: Event, lead: str, reason: str, read_frozen: bool
    ) -> VerdictEntry:
        """The ERROR report written to S3, with the job's identity from the frozen evidence
        when it is readable and renders, else from the event's job directory."""
        answers = self.coalescer.answers(lead) or [lead]
        label = self.store.uri(evidence_prefix(lead))
        frozen = self._frozen_or_none(lead) if read_frozen else None
        for evidence in (frozen, failure_evidence(event, label, reason)):
            if evidence is None:
                continue
            report = failure_report(evidence, reason, lead=lead, answers=answers)
            try:
                return VerdictStreamSink.entry(report, self._store_report(report, evidence))
            except Exception as exc:
                if is_infrastructure(exc):
                    raise
                log.warning("ERROR report of %s did not render: %s", lead, describe(exc))
        raise PipelineError(f"no ERROR report could be written for {lead}")

    def _frozen_or_none(self, evidence_id: str) -> Evidence | None:
        try:
            return self.evidence(evidence_id)
        except Exception as exc:
            if is_infrastructure(exc):
                raise
            return None

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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _top_parts(top: Path) -> Callable[[str, list[str]], list[str]]:
    """A `copytree` filter leaving out the `parts/` folder at the top of `top`."""
    return lambda folder, names: [PARTS] if Path(folder) == top and PARTS in names else []


def _replace_dir(staging: Path, target: Path) -> None:
    """Put `staging` where `target` is, whole (a process reading the old one keeps its files)."""
    old = target.with_name(f".old-{target.name}-{uuid.uuid4().hex[:8]}")
    with suppress(FileNotFoundError):
        target.rename(old)
    staging.rename(target)
    remove_tree(old)


@dataclass
class _Phases:
    """The seconds each phase of a capture took, for its log line."""

    seconds: dict[str, float] = field(default_factory=dict)
    since: float = field(default_factory=time.perf_counter)

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.since
        self.since = now

    def __str__(self) -> str:
        return ", ".join(f"{phase} {seconds:.2f}s" for phase, seconds in self.seconds.items())


@contextmanager
def _shared_at_end(took: _Phases) -> Iterator[None]:
    """The log cache's S3 copy, written while the capture freezes, is done when it ends (the
    wait for it is the phase `share`)."""
    try:
        yield
    finally:
        finish_sharing()
        took.mark("share")


def _check_held(holder: CaptureClaim, prefix: str) -> None:
    if not holder.held():
        raise CaptureBusyError(f"lost the capture claim on {prefix} (too slow)")


def _unread(evidence: Evidence) -> bool:
    """True for the evidence of a bundle that could not be read at all (`failure_evidence`)."""
    return any(note.startswith(FAILED_NOTE) for note in evidence.discrepancies)


def _frozen_files(
    evidence: Evidence, live: Path, directory: Path, parts_at: str, stored: Mapping[str, str]
) -> list[Path]:
    """Freeze `evidence` under `directory` (its tables' parts kept at `parts_at`, those
    `stored` there already not written again), with the raw outputs the live probes left in
    `live` (the commands' outputs that `probes.json` names) beside the probe files the freeze
    writes from the model, so `probes/` is the whole recorded layout; the marker stays last."""
    written = freeze(evidence, directory, parts_at=parts_at, stored=stored)
    if evidence.probes is None or not live.is_dir():
        return written
    marker, extra = written[-1], []
    for path in sorted(live.rglob("*")):
        target = directory / "probes" / path.relative_to(live)
        if path.is_file() and not path.is_symlink() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            extra.append(target)
    return [*written[:-1], *extra, marker]


@dataclass(frozen=True)
class _LookAt:
    """Which second look a step takes: the lead, its evidence, when it was scheduled, the claim."""

    event_id: str
    evidence_id: str
    scheduled_at: float | None
    claim: str


class CaptureBusyError(RuntimeError):
    """Another workflow is capturing the same event; retry later."""


def frozen_now(store: ObjectStore, evidence_id: str) -> datetime:
    """The time a frozen evidence was judged as of (its `now`)."""
    try:
        document = json.loads(store.get(evidence_prefix(evidence_id) + MARKER))
    except (ObjectMissingError, ValidationError) as exc:
        raise ObjectMissingError(f"no frozen evidence for {evidence_id}") from exc
    return datetime.fromisoformat(document["now"])
