"""What a capture asks of S3 and Redis, counted (never timed): one listing where there was one
request per object, nothing read back that this worker just wrote; and the checks that keep
evidence whole with fewer requests: a part gone between the check and its use is still lost
evidence, a claim lost mid-way still stops the freeze."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from shared.models import Event
from shared.settings import Settings
from testkit.bundles import write_job_bundle
from tests.unit.test_frozen import assert_same
from worker.evidence.frozen import MARKER
from worker.pipeline.claim import CaptureClaim
from worker.pipeline.failures import EvidenceLostError
from worker.pipeline.parts import PARTS_PREFIX
from worker.pipeline.steps import CaptureBusyError, Pipeline
from worker.pipeline.store import Listed, MemoryStore

NOW = datetime(2026, 7, 30, 21, 15, tzinfo=UTC)
JOB = "jobs/cw/ops/rl-job"
_PER_OBJECT = ("exists", "size", "modified")  # one request per object asked about


class CountingStore(MemoryStore):
    """The in-memory store, counting each call as the request S3 would get."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.read: list[str] = []

    def put_once(self, key: str, body: bytes, content_type: str = "") -> bool:
        self.calls["put_once"] += 1
        return super().put_once(key, body)

    def get(self, key: str) -> bytes:
        self.calls["get"] += 1
        self.read.append(key)
        return super().get(key)

    def exists(self, key: str) -> bool:
        self.calls["exists"] += 1
        return super().exists(key)

    def size(self, key: str) -> int:
        self.calls["size"] += 1
        return super().size(key)

    def modified(self, key: str) -> float:
        self.calls["modified"] += 1
        return super().modified(key)

    def keys(self, prefix: str) -> list[str]:
        self.calls["keys"] += 1
        return super().keys(prefix)

    def listing(self, prefix: str) -> dict[str, Listed]:
        self.calls["listing"] += 1
        return super().listing(prefix)

    def counted(self) -> Counter[str]:
        """The calls since the last `counted`."""
        calls = Counter(self.calls)
        self.calls.clear()
        self.read.clear()
        return calls


@pytest.fixture
def store() -> CountingStore:
    return CountingStore()


def _pipeline(tmp_path: Path, store: CountingStore, disk: str = "cache") -> Pipeline:
    settings = Settings(
        bundle_root=tmp_path / "bundles", stream_prefix="t", cache_dir=tmp_path / disk
    )
    return Pipeline(settings, store, fakeredis.FakeRedis())


@pytest.fixture
def pipeline(tmp_path: Path, store: CountingStore) -> Pipeline:
    job = write_job_bundle(tmp_path / "bundles", "rl-job")
    log = job / "finelog.log"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-4]))
    (tmp_path / "tail").write_bytes(b"".join(lines[-4:]))
    return _pipeline(tmp_path, store)


def _grow(pipeline: Pipeline) -> None:
    root = pipeline.settings.bundle_root
    with (root / JOB / "finelog.log").open("ab") as handle:
        handle.write((root.parent / "tail").read_bytes())


def _capture(pipeline: Pipeline, event_id: str, evidence_id: str | None = None) -> None:
    event = Event(event_id=event_id, job_dir=JOB, published_at=NOW, now=NOW)
    pipeline.events.archive(event)
    pipeline.capture(event_id, evidence_id or event_id, claim=f"task-{event_id}")


def _part_keys(store: MemoryStore) -> list[str]:
    return sorted(key for key in store.objects if key.startswith(PARTS_PREFIX))


# --- the capture step ---------------------------------------------------------------------------


def test_a_grown_logs_capture_asks_nothing_per_object(
    pipeline: Pipeline, store: CountingStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capture after the log grew lists four times (the log cache before the read and for
    its expiry, the freeze's prefix, the job's table parts), reads three objects (the marker
    before and after the claim, the event) and asks nothing about single objects; the claim is
    looked at twice in Redis (before the parts, before the marker), not once per file."""
    held: list[bool] = []
    original = CaptureClaim.held

    def looked_at(self: CaptureClaim) -> bool:
        held.append(original(self))
        return held[-1]

    monkeypatch.setattr(CaptureClaim, "held", looked_at)
    _capture(pipeline, "e1")
    _grow(pipeline)
    store.counted()
    held.clear()
    _capture(pipeline, "e2")
    calls = store.counted()
    assert not any(calls[name] for name in _PER_OBJECT), calls
    assert calls["keys"] + calls["listing"] == 4, calls
    assert calls["get"] == 3, calls
    assert held == [True, True]


def test_a_whole_freeze_is_checked_with_one_listing_of_its_parts(
    pipeline: Pipeline, store: CountingStore
) -> None:
    """A capture that finds the freeze whole (a replay, a task sent again) reads its marker and
    lists the job's parts once, whatever the number of parts, instead of asking for each."""
    _capture(pipeline, "e1")
    assert len(_part_keys(store)) > 3
    store.counted()
    _capture(pipeline, "e2", "e1")
    calls = store.counted()
    assert calls["keys"] == 1 and calls["get"] == 1 and calls["exists"] == 0, calls


def test_a_part_deleted_after_the_check_is_still_lost_evidence(
    pipeline: Pipeline, store: CountingStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker deletes a part right after the listing that found the freeze whole: the
    replay's capture passes, but the gate that needs the part raises EvidenceLostError naming it
    (never a shorter table), and the diagnosis is answered ERROR."""
    _capture(pipeline, "e1")
    victim = _part_keys(store)[0]
    listing = MemoryStore.keys

    def listed_then_deleted(self: MemoryStore, prefix: str) -> list[str]:
        found = listing(self, prefix)
        if victim in found:
            self.objects.pop(victim, None)
        return found

    monkeypatch.setattr(MemoryStore, "keys", listed_then_deleted)
    _capture(pipeline, "e2", "e1")
    monkeypatch.undo()
    shutil.rmtree(pipeline.settings.cache_dir / "parts")  # type: ignore[operator]
    gates = Pipeline(pipeline.settings, store, pipeline.redis)  # another process
    with pytest.raises(EvidenceLostError, match=victim.rsplit("/", 1)[1]):
        gates.gate("e1", "liveness")
    entry = gates.publisher.fail("e1", JOB, "the frozen evidence of e1 cannot be read")
    assert entry is not None and entry.verdict.value == "ERROR"


def test_the_gates_judge_the_freeze_the_capture_left_on_the_disk(
    tmp_path: Path, pipeline: Pipeline, store: CountingStore
) -> None:
    """The gate processes of the capturing worker read the freeze it left on the disk: the first
    asks S3 once that the marker is still there, the next asks nothing, neither downloads; and
    they thaw what a worker that downloads it thaws."""
    _capture(pipeline, "e1")
    store.counted()
    first = Pipeline(pipeline.settings, store, pipeline.redis)
    local = first.frozen.thaw("e1")
    calls = store.counted()
    assert calls["exists"] == 1 and calls["keys"] == 0, calls
    assert not any(key.startswith("evidence/") for key in store.read)
    Pipeline(pipeline.settings, store, pipeline.redis).frozen.thaw("e1")
    assert store.counted()["exists"] == 0
    downloaded = _pipeline(tmp_path, store, disk="other").frozen.thaw("e1")
    assert_same(local, downloaded)


def test_a_freeze_gone_after_the_capture_is_lost_for_its_gates(
    pipeline: Pipeline, store: CountingStore
) -> None:
    """The copy on the disk does not stand in for a freeze gone from S3: the first gate that
    reads it finds the marker gone and raises EvidenceLostError."""
    _capture(pipeline, "e1")
    store.objects.pop("evidence/e1/" + MARKER)
    with pytest.raises(EvidenceLostError, match="gone from S3"):
        Pipeline(pipeline.settings, store, pipeline.redis).gate("e1", "liveness")


def test_a_capture_taken_again_replaces_the_copy_on_the_disk(
    pipeline: Pipeline, store: CountingStore
) -> None:
    """A freeze whose part went missing is captured again after the log grew: the copy on the
    disk is the new freeze (its marker as stored), not the one whose part is gone."""
    _capture(pipeline, "e1")
    Pipeline(pipeline.settings, store, pipeline.redis).frozen.thaw("e1")  # checked: a plain copy
    store.objects.pop(_part_keys(store)[0])
    shutil.rmtree(pipeline.settings.cache_dir / "parts")  # type: ignore[operator]
    _grow(pipeline)
    _capture(pipeline, "e1")
    local = pipeline.frozen.cache_root / "e1" / MARKER
    assert local.read_bytes() == store.objects["evidence/e1/" + MARKER]
    gates = Pipeline(pipeline.settings, store, pipeline.redis)
    assert gates.gate("e1", "liveness")["result"]["status"] != "ERROR"


def test_a_claim_lost_after_the_parts_writes_no_marker(
    pipeline: Pipeline, store: CountingStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capture whose claim is taken over while its parts upload stops before the marker: no
    freeze under the prefix, nothing left on the disk for the gates."""
    answers = iter([True, False])
    monkeypatch.setattr(CaptureClaim, "held", lambda self: next(answers))
    event = Event(event_id="e1", job_dir=JOB, published_at=NOW, now=NOW)
    pipeline.events.archive(event)
    holder = CaptureClaim(pipeline.redis, pipeline.names.capture_claim("e1"), "t1")
    with pytest.raises(CaptureBusyError, match="lost the capture claim"):
        pipeline.capturer.capture(event, holder.held)
    assert _part_keys(store)  # the parts went out before the claim was seen lost
    assert not any(key.startswith("evidence/e1/") for key in store.objects)
    assert not (pipeline.frozen.cache_root / "e1").exists()


def test_the_capture_steps_request_counts_hold_on_a_cold_worker(
    tmp_path: Path, pipeline: Pipeline, store: CountingStore
) -> None:
    """A worker with nothing on its disk captures the grown log: the log cache's manifest is
    read once, its size taken from the listing; no request about single objects."""
    _capture(pipeline, "e1")
    _grow(pipeline)
    cold = _pipeline(tmp_path, store, disk="cold")
    store.counted()
    event = Event(event_id="e2", job_dir=JOB, published_at=NOW, now=NOW)
    cold.events.archive(event)
    cold.capture("e2", "e2", claim="t2")
    calls = store.counted()
    assert not any(calls[name] for name in _PER_OBJECT), calls
    assert calls["keys"] + calls["listing"] == 4, calls


def _document(store: MemoryStore, evidence_id: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(store.objects[f"evidence/{evidence_id}/{MARKER}"])
    return body


def test_a_grown_logs_freeze_still_lists_every_part(
    pipeline: Pipeline, store: CountingStore
) -> None:
    """Fewer requests, same freeze: the grown log's evidence lists the parts of every table, each
    one stored, and thaws into what a full read gives."""
    _capture(pipeline, "e1")
    _grow(pipeline)
    _capture(pipeline, "e2")
    document = _document(store, "e2")
    place = document["parts_at"]
    for refs in document["logs"]["tables"].values():
        for digest, sha, _rows in refs:
            assert f"{place}{digest}-{sha}.parquet" in store.objects
    thawed = _pipeline(pipeline.settings.bundle_root.parent, store, "fresh").frozen.thaw("e2")
    from worker.diagnosis import collect_evidence

    full = collect_evidence(pipeline.settings.bundle_root / JOB, now=NOW)
    assert thawed.logs is not None and full.logs is not None
    assert_same(thawed.logs, full.logs)
