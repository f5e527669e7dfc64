"""The second look's adapters: the job seen again (bundle re-read, live probes with stacks), frozen
under S3 `evidence/<id>/second_look/`, and read back, so a replay judges the same two looks.

The comparison itself is pure (`worker.second_look`); here are only I/O and the settings:

- `observe_again` reads the bundle again as of now, and probes the job through the capture
  policy's `capture_live` with the backend the event may choose (`choose_backend`), stacks forced.
  A refused backend, no live backend, or a bundle that cannot be read leaves the evidence without
  probes (or without logs): the comparison then answers "blind".
- `freeze_look` writes `look.json` (how long the look waited), then the frozen evidence, its
  marker `evidence.json` last; `thaw_look` reads both back.
- `SecondLook` is the pipeline's look step: when the look is due (`wait`), and the look taken
  once under a claim, frozen, and read back (`observation`).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from shared.models import Event, Report
from shared.settings import Settings
from shared.streams import StreamNames
from worker.backends import Toolbox
from worker.backends.base import Runner
from worker.capture_policy import BackendChoiceError, choose_backend
from worker.diagnosis import collect_evidence
from worker.evidence.case import Evidence
from worker.evidence.frozen import MARKER, freeze, thaw
from worker.evidence.log_cache import LogCache
from worker.evidence.probes import read_probes
from worker.pipeline.capture import CaptureBudget, CaptureService, capture_live
from worker.pipeline.claim import CLAIM_TTL_S, CaptureClaim
from worker.pipeline.evidence_store import clear_prefix, evidence_prefix
from worker.pipeline.failed import failure_evidence
from worker.pipeline.failures import CaptureBusyError, EvidenceLostError, describe, must_propagate
from worker.pipeline.logcache import JobLogs
from worker.pipeline.store import ObjectStore, download_prefix
from worker.second_look import first_look_at, rests_on_stacks

__all__ = [
    "LOOK_DIR",
    "MIN_LOOK_WAIT_S",
    "Live",
    "LookAt",
    "SecondLook",
    "freeze_look",
    "look_prefix",
    "observe_again",
    "thaw_look",
]

LOOK_DIR: Final = "second_look/"
META: Final = "look.json"
NO_BACKEND: Final = (
    "no live backend enabled (RLHEALTH_BACKEND=none): the second look cannot take stacks"
)
MIN_LOOK_WAIT_S: Final = 1.0
"""The shortest countdown to a second look, when the first look's dumps are already older than
RLHEALTH_REOBSERVE_S (a slow capture): the look is still taken by its own task."""


def look_prefix(evidence_prefix: str) -> str:
    """Where the second look of the evidence at `evidence_prefix` is frozen."""
    return evidence_prefix + LOOK_DIR


def _now() -> datetime:
    return datetime.now(UTC)


@dataclasses.dataclass(frozen=True)
class Live:
    """How the second look probes: the capture's clock, runner, tools, sleep (tests fake them)."""

    clock: Callable[[], datetime] = _now
    runner: Runner | None = None
    tools: Toolbox | None = None
    sleep: Callable[[float], None] = time.sleep
    budget_s: float | None = None  # RLHEALTH_CAPTURE_BUDGET_S, as the capture has


def can_probe(event: Event, settings: Settings) -> bool:
    """Whether a second look could take stacks at all (a backend the event may use)."""
    try:
        return choose_backend(event.backend, settings) is not None
    except BackendChoiceError:
        return False


def _probe(
    bundle: Evidence, event: Event, settings: Settings, out_dir: Path, live: Live
) -> tuple[Path | None, tuple[str, ...]]:
    """The live probes of the second look (stacks forced), or why there are none."""
    try:
        backend = choose_backend(event.backend, settings)
    except BackendChoiceError as exc:
        return None, (f"live probes refused: {exc}",)
    if backend is None:
        return None, (NO_BACKEND,)
    return capture_live(
        bundle,
        backend,
        out_dir,
        settings,
        clock=live.clock,
        runner=live.runner,
        tools=live.tools,
        sleep=live.sleep,
        budget=None if live.budget_s is None else CaptureBudget(live.budget_s),
        force_stacks=True,
    )


def observe_again(
    event: Event,
    first: Evidence,
    settings: Settings,
    live: Live = Live(),
    logs: JobLogs | None = None,
) -> Evidence:
    """The job as the second look sees it: the bundle read again as of now (never before the
    first look), with one more pair of live stacks; labelled as `first`'s `second_look/`. With
    `logs`, the logs are read through the job's log cache (only what they gained since)."""
    live = live or Live()
    now = max(live.clock(), first.now)
    label = first.job_dir.rstrip("/") + "/" + LOOK_DIR

    def read(cache: LogCache | None) -> Evidence:
        return collect_evidence(
            settings.bundle_root / event.job_dir,
            now=now,
            mode=event.mode,
            thresholds=first.thresholds,
            evidence_label=label,
            log_cache=cache,
        )

    bundle = read(None) if logs is None else _read_cached(logs, event.job_dir, read)
    with tempfile.TemporaryDirectory(prefix="rlhealth-look-") as tmp:
        directory, notes = _probe(bundle, event, settings, Path(tmp) / "probes", live)
        probes = read_probes(directory) if directory is not None else None
    failed = tuple(f"probe failed: {f}" for f in probes.failures) if probes else ()
    found = (*bundle.discrepancies, *notes, *failed)
    return dataclasses.replace(bundle, probes=probes, discrepancies=tuple(dict.fromkeys(found)))


def _read_cached(
    logs: JobLogs, job_dir: str, read: Callable[[LogCache | None], Evidence]
) -> Evidence:
    """`read` through the job's log cache, its S3 copy written before this returns."""
    try:
        return logs.read(job_dir, read)
    finally:
        logs.settle()


def freeze_look(store: ObjectStore, prefix: str, second: Evidence, waited_s: float) -> None:
    """Freeze the second observation under `prefix` (`look.json` first, the marker last)."""
    meta = json.dumps({"waited_s": waited_s}).encode()
    store.put_once(prefix + META, meta, "application/json")
    with tempfile.TemporaryDirectory(prefix="rlhealth-look-") as tmp:
        directory = Path(tmp)
        for path in freeze(second, directory):
            store.put_once(prefix + path.relative_to(directory).as_posix(), path.read_bytes())


def thaw_look(store: ObjectStore, prefix: str) -> tuple[Evidence, float] | None:
    """The frozen second observation and how long it waited; None when none is frozen whole."""
    if not store.exists(prefix + MARKER):
        return None
    with tempfile.TemporaryDirectory(prefix="rlhealth-look-") as tmp:
        directory = Path(tmp)
        download_prefix(store, prefix, directory)
        meta = json.loads((directory / META).read_bytes())
        return thaw(directory), float(meta["waited_s"])


# --- the look step (the pipeline's second look before a stall KILL) ----------------------------


@dataclasses.dataclass(frozen=True)
class LookAt:
    """Which second look a step takes: the lead, its evidence, when it was scheduled, the claim."""

    event_id: str
    evidence_id: str
    scheduled_at: float | None
    claim: str


class SecondLook:
    """When the second look of a report is due, and the look itself: taken once under a claim,
    frozen under `second_look/`, and read back from there (what a replay reads)."""

    def __init__(
        self,
        settings: Settings,
        store: ObjectStore,
        redis: Any,
        names: StreamNames,
        *,
        load_event: Callable[[str], Event],
        capturer: CaptureService,
    ) -> None:
        self.settings = settings
        self.store = store
        self.redis = redis
        self.names = names
        self.load_event = load_event
        self.capturer = capturer  # its live capture's tools and its log cache
        self.clock: Callable[[], float] = time.time  # epoch seconds: when the look is due

    def wait(self, report: Report, event_id: str, evidence_id: str) -> float | None:
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

    def observation(self, at: LookAt, first: Evidence) -> tuple[Evidence, float]:
        """The frozen second look, else one taken now under a claim, frozen, and judged as
        frozen (what a replay will read)."""
        prefix = look_prefix(evidence_prefix(at.evidence_id))
        frozen = thaw_look(self.store, prefix)
        if frozen is not None:
            return frozen
        key = self.names.capture_claim(f"{at.evidence_id}:second-look")
        holder = CaptureClaim(self.redis, key, at.claim, CLAIM_TTL_S)
        if not holder.acquire():
            raise CaptureBusyError(f"another second look of {at.evidence_id} is under way")
        with holder.kept():
            if not self.store.exists(prefix + MARKER):  # finished while we waited for the claim
                clear_prefix(self.store, prefix)
                self._take(at, first, prefix, holder)
        holder.release()
        frozen = thaw_look(self.store, prefix)
        if frozen is None:
            raise EvidenceLostError(f"the second look of {at.evidence_id} is gone from S3")
        return frozen

    def _take(self, at: LookAt, first: Evidence, prefix: str, holder: CaptureClaim) -> None:
        event = self.load_event(at.event_id)
        try:
            live = Live(tools=self.capturer.live.tools, budget_s=self.settings.capture_budget_s)
            logs = self.capturer.logs
            second = observe_again(event, first, self.settings, live=live, logs=logs)
        except Exception as exc:
            if must_propagate(exc):
                raise
            second = failure_evidence(event, self.store.uri(prefix), describe(exc))
        if not holder.held():
            raise CaptureBusyError(f"lost the claim on {prefix} (too slow)")
        waited_s = max(0.0, time.time() - at.scheduled_at) if at.scheduled_at else 0.0
        freeze_look(self.store, prefix, second, waited_s)
