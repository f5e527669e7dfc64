"""The capture service (`worker.pipeline.capture.CaptureService`) with in-memory fakes for its two
collaborators: a log cache that keeps parsed logs in memory and counts each lookup, and a frozen
store that keeps what it was given. The live probes run the real capture policy against a
scripted cluster (a runner that answers like `iris` and records every command)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from shared.models import Event
from shared.settings import Settings
from testkit.bundles import write_job_bundle
from tests.unit.test_pipeline_capture import NOW, ScriptedIris
from worker.backends import Toolbox
from worker.diagnosis import collect_evidence
from worker.evidence.case import Evidence
from worker.evidence.logs.incremental import CacheEntry
from worker.pipeline.capture import CaptureService, LiveCapture
from worker.pipeline.logcache import LogCache  # the parser's cache the pipeline's one wraps

JOB = "jobs/cw/ops/rl-job"
FRESH = NOW  # the bundle's manifest synced 30 s after its last step, which is at NOW - 30 s
STALE = NOW + timedelta(hours=2)  # manifest and log far older than MAX_EVIDENCE_AGE_S


class CountingCache(LogCache):
    """An in-memory log cache that counts the lookups of each log and the bytes they reused."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups: dict[str, int] = {}
        self.reused: dict[str, int] = {}

    def lookup(self, key: str, log: BinaryIO) -> CacheEntry | None:
        entry = super().lookup(key, log)
        self.lookups[key] = self.lookups.get(key, 0) + 1
        self.reused[key] = entry.state.offset if entry is not None else 0
        return entry


@dataclass
class FakeLogs:
    """The `JobLogs` fake: one in-memory cache per job, kept between reads like the real one's
    folder; every read and every settle recorded."""

    caches: dict[str, CountingCache] = field(default_factory=dict)
    reads: list[str] = field(default_factory=list)
    settled: int = 0

    def read(self, job_dir: str, read: Callable[[LogCache | None], Evidence]) -> Evidence:
        self.reads.append(job_dir)
        return read(self.caches.setdefault(job_dir, CountingCache()))

    def settle(self) -> None:
        self.settled += 1


@dataclass
class FakeFrozen:
    """The `FrozenStore` fake: the evidence it was given, by id, and the live outputs beside."""

    frozen: dict[str, Evidence] = field(default_factory=dict)
    live_files: dict[str, list[str]] = field(default_factory=dict)
    discarded: list[str] = field(default_factory=list)

    def label(self, evidence_id: str) -> str:
        return f"memory://evidence/{evidence_id}/"

    def whole(self, evidence_id: str) -> bool:
        return evidence_id in self.frozen

    def discard(self, evidence_id: str) -> None:
        self.discarded.append(evidence_id)
        self.frozen.pop(evidence_id, None)

    def freeze(
        self,
        evidence: Evidence,
        *,
        job_dir: str,
        evidence_id: str,
        live: Path,
        held: Callable[[], bool],
        mark: Callable[[str], None],
    ) -> None:
        assert held() and job_dir == JOB
        self.frozen[evidence_id] = evidence
        found = sorted(p.relative_to(live).as_posix() for p in live.rglob("*") if p.is_file())
        self.live_files[evidence_id] = found
        mark("freeze")
        mark("store")


@dataclass
class Service:
    """A capture service on the fakes, probing the scripted cluster."""

    capture: CaptureService
    logs: FakeLogs
    frozen: FakeFrozen
    iris: ScriptedIris

    def run(self, now: datetime, event_id: str = "e1", **fields: Any) -> Evidence:
        event = Event(event_id=event_id, job_dir=JOB, published_at=now, now=now, **fields)
        self.capture.capture(event, lambda: True)
        return self.frozen.frozen[event_id]

    def stacks_taken(self) -> bool:
        return any("py-spy" in argv for argv, _timeout in self.iris.calls)


def _service(tmp_path: Path, backend: str = "iris") -> Service:
    write_job_bundle(tmp_path / "bundles", "rl-job")
    settings = Settings(
        bundle_root=tmp_path / "bundles",
        cache_dir=tmp_path / "cache",
        iris_controller_url="http://controller.test",
        backend=backend,
    )
    logs, frozen, iris = FakeLogs(), FakeFrozen(), ScriptedIris()
    service = CaptureService(settings, logs, frozen)
    service.__dict__["live"] = LiveCapture(
        settings, Toolbox(), runner=iris, monotonic=iris.monotonic, sleep=iris.sleep
    )
    return Service(service, logs, frozen, iris)


@pytest.fixture
def service(tmp_path: Path) -> Service:
    return _service(tmp_path)


def test_a_fresh_bundle_takes_no_stacks_and_no_refresh(service: Service) -> None:
    """A bundle synced just now whose log is not quiet: the policy asks the cluster only for the
    attempt history (which no bundle holds); no stacks, no watcher refresh."""
    evidence = service.run(FRESH)
    assert service.iris.calls and not service.stacks_taken()
    notes = " ".join(evidence.discrepancies)
    assert "attempt history unavailable" in notes and "bundle stale" not in notes
    assert "trainer log quiet" not in notes


def test_a_stale_bundle_is_probed_with_stacks(service: Service) -> None:
    """A bundle two hours old (manifest stale, log quiet beyond STALL_FLOOR_S): the policy names
    both reasons, the stacks are taken, and the frozen evidence holds the probes."""
    evidence = service.run(STALE)
    notes = " ".join(evidence.discrepancies)
    assert "live probes: bundle stale" in notes and "live probes: trainer log quiet" in notes
    assert service.stacks_taken()
    assert evidence.probes is not None and evidence.probes.stacks


def test_the_quiet_boundary_decides_the_stacks(tmp_path: Path) -> None:
    """Stacks are taken for a log quiet one second past STALL_FLOOR_S (600 s) and not at it
    (the manifest fresh in both): the capture policy decides, not the service."""
    short = _service(tmp_path / "short")
    last_line = collect_evidence(tmp_path / "short" / "bundles" / JOB, now=NOW).logs
    assert last_line is not None and last_line.summary.last_timestamp is not None
    at_floor = last_line.summary.last_timestamp + timedelta(seconds=600)
    short.run(at_floor)
    past = _service(tmp_path / "past")
    past.run(at_floor + timedelta(seconds=1))
    assert (short.stacks_taken(), past.stacks_taken()) == (False, True)


def test_no_backend_no_probe(tmp_path: Path) -> None:
    """With RLHEALTH_BACKEND=none the stale bundle is frozen as read: nothing runs, one read."""
    service = _service(tmp_path, backend="none")
    evidence = service.run(STALE)
    assert service.iris.calls == [] and evidence.probes is None and evidence.logs is not None
    assert not any("live" in note for note in evidence.discrepancies)
    assert service.logs.reads == [JOB]


def test_the_evidence_is_frozen_through_the_one_adapter(service: Service) -> None:
    """What the capture froze is what the service read and probed, given to the store once,
    with the raw probe outputs beside it; a capture again discards the earlier freeze first."""
    evidence = service.run(STALE)
    assert list(service.frozen.frozen) == ["e1"] and service.frozen.discarded == ["e1"]
    assert evidence.job_dir == service.frozen.label("e1") and evidence.probes is not None
    assert "probes.json" in service.frozen.live_files["e1"]
    service.run(STALE)
    assert service.frozen.discarded == ["e1", "e1"]


def test_the_log_cache_is_asked_once_per_log(tmp_path: Path) -> None:
    """Without probes, one read of the bundle: every log looked up once, the cache's S3 copy
    waited for once."""
    service = _service(tmp_path, backend="none")
    service.run(FRESH)
    cache = service.logs.caches[JOB]
    assert cache.lookups and set(cache.lookups.values()) == {1}
    assert (service.logs.reads, service.logs.settled) == ([JOB], 1)


def test_the_read_after_the_probes_reuses_the_cache(service: Service) -> None:
    """With probes the bundle is read again with their directory, through the same cache: each
    log is looked up once per read, and the second lookup resumes where the first ended."""
    service.run(STALE)
    cache = service.logs.caches[JOB]
    assert service.logs.reads == [JOB, JOB] and service.logs.settled == 1
    assert cache.lookups and set(cache.lookups.values()) == {2}
    assert all(cache.reused.values())
