"""The steps of one diagnosis in the pipeline, each safe to run twice; the Celery tasks call these.

capture  event → evidence frozen under S3 `evidence/<event_id>/` (a replay reuses the original's)
gate     frozen evidence → one gate's result (never raises: broken evidence is an ERROR result)
verdict  gate results → the report, written once to S3 `reports/...` → the verdict entry
publish  verdict entry → the verdict stream and channel, with every event id it answers

Only references travel between steps: event ids, the evidence id (whose frozen evidence to judge)
and the job key; results are small JSON documents.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections import OrderedDict
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from reports.html import store_html
from reports.sinks import S3ReportSink, VerdictStreamSink
from shared.models import (
    Event,
    GateName,
    GateResult,
    GateStatus,
    Mode,
    Report,
    RestartsResult,
    VerdictEntry,
)
from shared.settings import Settings, load_thresholds
from shared.streams import StreamNames
from worker.diagnosis import GATE_NAMES, collect_evidence, run_gate
from worker.evidence.frozen import MARKER, freeze, thaw
from worker.evidence.model import BundleInfo, Evidence, ModeDecision
from worker.pipeline.coalesce import Coalescer
from worker.pipeline.failures import describe, is_infrastructure
from worker.pipeline.store import ObjectMissingError, ObjectStore, download_prefix
from worker.verdict import decide

__all__ = [
    "GATE_NAMES",
    "CaptureBusyError",
    "Pipeline",
    "event_key",
    "evidence_prefix",
    "frozen_now",
]

_THAWED_KEPT: Final = 4
_CACHE_MAX_AGE_S: Final = 3600


def event_key(event_id: str) -> str:
    return f"events/{event_id}.json"


def evidence_prefix(evidence_id: str) -> str:
    return f"evidence/{evidence_id}/"


def _failed_capture(event: Event, label: str, reason: str) -> Evidence:
    """Evidence that says only why it could not be read, so the gates answer ERROR and quote it."""
    note = f"capture failed: {reason}"
    return Evidence(
        job_dir=label,
        now=event.now or datetime.now(UTC),
        thresholds=load_thresholds(),
        mode=ModeDecision(mode=event.mode or Mode.UNDECLARED, reason=note),
        bundle=BundleInfo(job_dir=Path(event.job_dir), manifest=None, manifest_error=note),
        discrepancies=(note,),
    )


def _unreadable_result(name: str, reason: str) -> GateResult | RestartsResult:
    summary = f"the frozen evidence could not be read: {reason}"
    if name == "restarts":
        return RestartsResult(count=None, same_failure=None, interpretation=summary)
    return GateResult(status=GateStatus.ERROR, summary=summary, missing=(summary,))


class Pipeline:
    """The adapters one worker process needs, and the four steps."""

    def __init__(self, settings: Settings, store: ObjectStore, redis: Any) -> None:
        self.settings = settings
        self.store = store
        self.redis = redis
        self.names = StreamNames(settings.stream_prefix)
        root = settings.cache_dir or Path(tempfile.gettempdir()) / "rlhealth-cache"
        self.cache_root = root / "evidence"
        self._thawed: OrderedDict[str, Evidence] = OrderedDict()

    @cached_property
    def coalescer(self) -> Coalescer:
        return Coalescer(self.redis, self.names, coalesce_s=self.settings.coalesce_s)

    # --- events -----------------------------------------------------------------------------

    def archive(self, event: Event) -> bool:
        """Store the event at `events/<event_id>.json` once."""
        body = event.model_dump_json(exclude_none=True).encode()
        return self.store.put_once(event_key(event.event_id), body, "application/json")

    def load_event(self, event_id: str) -> Event:
        return Event.model_validate_json(self.store.get(event_key(event_id)))

    # --- capture ----------------------------------------------------------------------------

    def capture(self, event_id: str, evidence_id: str, claim: str) -> str:
        """Freeze the event's evidence to S3 (once); returns the evidence id.

        `claim` (the task id) makes a re-delivered task finish its own capture, while a second
        workflow for the same event waits for the first one's instead of mixing files with it.
        """
        prefix = evidence_prefix(evidence_id)
        if self.store.exists(prefix + MARKER):
            return evidence_id
        if evidence_id != event_id:
            raise ObjectMissingError(f"no frozen evidence at {prefix} to replay")
        if not self._claimed(prefix, claim):
            raise CaptureBusyError(f"another capture of {event_id} is under way")
        self._capture_fresh(self.load_event(event_id), prefix)
        return evidence_id

    def _claimed(self, prefix: str, claim: str) -> bool:
        key = prefix + ".claim"
        return self.store.put_once(key, claim.encode()) or self.store.get(key).decode() == claim

    def _collect(self, event: Event, label: str) -> Evidence:
        root = self.settings.bundle_root
        probes = root / event.probes if event.probes else None
        try:
            return collect_evidence(
                root / event.job_dir,
                now=event.now,
                mode=event.mode,
                probes_dir=probes,
                evidence_label=label,
            )
        except Exception as exc:
            if is_infrastructure(exc):
                raise
            return _failed_capture(event, label, describe(exc))

    def _capture_fresh(self, event: Event, prefix: str) -> None:
        evidence = self._collect(event, self.store.uri(prefix))
        with tempfile.TemporaryDirectory(prefix="rlhealth-freeze-") as tmp:
            directory = Path(tmp)
            for path in freeze(evidence, directory):  # the marker comes last
                key = prefix + path.relative_to(directory).as_posix()
                self.store.put_once(key, path.read_bytes())

    # --- gates ------------------------------------------------------------------------------

    def evidence(self, evidence_id: str) -> Evidence:
        """The frozen evidence, thawed once per process and kept for the next gate."""
        if evidence_id in self._thawed:
            self._thawed.move_to_end(evidence_id)
            return self._thawed[evidence_id]
        evidence = thaw(self._local_copy(evidence_id))
        self._thawed[evidence_id] = evidence
        while len(self._thawed) > _THAWED_KEPT:
            self._thawed.popitem(last=False)
        return evidence

    def _local_copy(self, evidence_id: str) -> Path:
        target = self.cache_root / evidence_id
        if (target / MARKER).is_file():
            return target
        self._prune_cache()
        self.cache_root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=self.cache_root))
        download_prefix(self.store, evidence_prefix(evidence_id), staging)
        try:
            staging.rename(target)  # atomic: other processes see all of it or none
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)  # another process got there first
        return target

    def _prune_cache(self) -> None:
        if not self.cache_root.is_dir():
            return
        cutoff = time.time() - _CACHE_MAX_AGE_S
        for entry in self.cache_root.iterdir():
            if entry.stat().st_mtime < cutoff:
                shutil.rmtree(entry, ignore_errors=True)

    def gate(self, evidence_id: str, name: str) -> dict[str, Any]:
        """One gate on the frozen evidence, as `{"name", "result"}`; never raises but for infra."""
        try:
            result = run_gate(name, self.evidence(evidence_id))
        except Exception as exc:
            if is_infrastructure(exc):
                raise
            result = _unreadable_result(name, describe(exc))
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
        report = self.report(results, event_id, evidence_id)
        bundle = self.evidence(evidence_id).bundle
        stored = S3ReportSink(self.store)(
            report, cluster=bundle.cluster, user=bundle.user, job=bundle.job_name
        )
        store_html(self.store, stored.json_key, report, self.evidence(evidence_id))
        entry = VerdictStreamSink.entry(report, stored)
        return entry.model_dump(mode="json")

    def publish(self, entry: dict[str, Any], job: str) -> dict[str, Any]:
        """Announce the verdict (once); returns the entry with every event id it answers."""
        published = VerdictStreamSink(self.coalescer)(VerdictEntry.model_validate(entry), job=job)
        return published.model_dump(mode="json")


class CaptureBusyError(RuntimeError):
    """Another workflow is capturing the same event; retry later."""


def frozen_now(store: ObjectStore, evidence_id: str) -> datetime:
    """The time a frozen evidence was judged as of (its `now`)."""
    try:
        document = json.loads(store.get(evidence_prefix(evidence_id) + MARKER))
    except (ObjectMissingError, ValidationError) as exc:
        raise ObjectMissingError(f"no frozen evidence for {evidence_id}") from exc
    return datetime.fromisoformat(document["now"])
