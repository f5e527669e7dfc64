"""The pipeline's log cache (worker.pipeline.logcache): a job's parsed logs kept on the worker's
disk and in S3 (the in-memory store here), resumed when the log grew, read whole when it was
rotated or rewritten, and never trusted when the shared copy is damaged, forged or too large."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from io import BufferedReader
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from shared.settings import Settings
from testkit.bundles import write_job_bundle
from tests.unit.test_capture_requests import CountingStore
from worker.diagnosis import collect_evidence
from worker.evidence import log_cache
from worker.evidence.case import Evidence
from worker.evidence.log_cache import LogCache
from worker.evidence.logs import incremental, reader
from worker.evidence.logs.reads import Read
from worker.evidence.model import LogTables
from worker.pipeline import logcache, logshare
from worker.pipeline.logcache import (
    PREFIX,
    CacheLimits,
    CacheRun,
    JobLogCache,
    finish_sharing,
    job_id,
)
from worker.pipeline.store import MemoryStore

NOW = datetime(2026, 3, 27, 12, 0, tzinfo=UTC)
JOB = "jobs/cw/ops/rl-job"
TABLES = ("metrics", "timers", "phases", "engines", "progress", "batches", "errors", "resumes")
SECRET = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
_GENERATED: list[bytes] = []


def _log_bytes() -> bytes:
    """1 MB of the benchmark's generated finelog, made once."""
    if not _GENERATED:
        from testkit.gen_finelog import generate

        with tempfile.TemporaryDirectory() as tmp:
            _GENERATED.append(generate(Path(tmp) / "f.log", 1.0).read_bytes())
    return _GENERATED[0]


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The byte offset each read of a log file starts at (one per file parsed)."""
    found: list[int] = []
    original = reader.iter_reads

    def recording(handle: BufferedReader, chunk_bytes: int) -> Iterator[Read]:
        found.append(handle.tell())
        return original(handle, chunk_bytes)

    monkeypatch.setattr(reader, "iter_reads", recording)
    return found


class World:
    """A bundle root with one job, a shared store, and workers with their own disks."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "bundles"
        self.job = write_job_bundle(self.root, "rl-job")
        self.log = self.job / "finelog.log"
        self.store = MemoryStore()
        data = _log_bytes()
        self.half = len(data) // 2
        self.log.write_bytes(data[: self.half])

    def worker(self, disk: str = "w1", limits: CacheLimits | None = None) -> JobLogCache:
        settings = Settings(bundle_root=self.root, cache_dir=self.tmp / disk)
        return JobLogCache(settings, self.store, limits)

    def read(self, cache: LogCache | None) -> Evidence:
        return collect_evidence(self.job, now=NOW, log_cache=cache)

    def capture(
        self, disk: str = "w1", limits: CacheLimits | None = None
    ) -> tuple[Evidence, CacheRun]:
        return self.worker(disk, limits).collect(JOB, self.read)

    def grow(self, data: bytes | None = None) -> None:
        with self.log.open("ab") as handle:
            handle.write(_log_bytes()[self.half :] if data is None else data)

    def archives(self) -> list[str]:
        """The job's manifests in S3 (its parts are under `parts/`)."""
        prefix = f"{PREFIX}{job_id(JOB)}/"
        return [key for key in self.store.keys(prefix) if "/" not in key[len(prefix) :]]

    def parts(self) -> list[str]:
        return self.store.keys(f"{PREFIX}{job_id(JOB)}/parts/")

    def replace_archive(self, body: bytes, suffix: str = ".json") -> str:
        """Put `body` as the job's newest manifest (the others removed)."""
        for key in self.archives():
            self.store.delete(key)
        key = f"{PREFIX}{job_id(JOB)}/29991231T235959999999Z-{'0' * 16}{suffix}"
        self.store.put_once(key, body)
        return key


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _same_logs(left: LogTables | None, right: LogTables | None) -> None:
    assert left is not None and right is not None
    for name in TABLES:
        assert_frame_equal(getattr(left, name), getattr(right, name), check_row_order=True)
    assert left.summary == right.summary


def _finelog(run: CacheRun) -> tuple[int, int]:
    """(bytes reused, bytes parsed) of the finelog in a run."""
    read = next(r for r in run.reads if r.source == "finelog.log")
    return read.reused, read.parsed


# --- the worker's disk ----------------------------------------------------------------------------


def test_a_grown_log_is_resumed_from_the_disk_and_only_the_tail_is_parsed(
    world: World, starts: list[int]
) -> None:
    """The second capture on the same worker resumes the finelog at the committed offset of the
    first: it reads from there (not byte 0), parses only the bytes after it, and the evidence
    equals a full read of the grown log."""
    _, first = world.capture()
    assert first.origin == "none" and _finelog(first) == (0, world.half)
    world.grow()
    size = world.log.stat().st_size
    evidence, second = world.capture()
    reused, parsed = _finelog(second)
    assert second.origin == "disk" and second.notes == []
    assert starts[-1] == reused  # the read began at the resume point
    assert world.half - 64 * 1024 < reused <= world.half  # only an open tail is read again
    assert parsed == size - reused < size - world.half + 64 * 1024
    _same_logs(evidence.logs, world.read(None).logs)


def test_the_old_bytes_are_not_read_again(world: World) -> None:
    """Proof by contradiction: bytes changed in the middle of the committed part (more than
    4 KiB from the head and from the resume point) do not reach the evidence of the resumed
    read, so they were not read; a read without the cache sees them."""
    world.capture()
    with world.log.open("r+b") as handle:  # same inode, same head, same bytes before the offset
        data = bytearray(world.log.read_bytes())
        middle = data.index(b"WANDB_MIRROR", world.half // 3)
        handle.seek(middle)
        handle.write(b"XXXXX")
    world.grow()
    resumed, run = world.capture()
    assert _finelog(run)[0] > middle
    fresh = world.read(None)
    assert resumed.logs is not None and fresh.logs is not None
    assert resumed.logs.metrics.height > fresh.logs.metrics.height  # the record XXXXX broke


def test_an_unchanged_log_parses_no_new_bytes_and_uploads_nothing(world: World) -> None:
    """A repeated alert on a log that did not grow reuses everything but the open tail, and the
    unchanged entries are not written to S3 again."""
    world.capture()
    archives = world.archives()
    _, again = world.capture()
    reused, parsed = _finelog(again)
    assert reused > 0 and parsed == world.half - reused
    assert again.uploaded is None and world.archives() == archives


def test_a_rotated_log_is_read_whole(world: World, starts: list[int]) -> None:
    """A log replaced by a new file (a new inode) is read from byte 0, and the run says the
    entry was of another version of the file."""
    world.capture()
    replacement = world.tmp / "new.log"
    replacement.write_bytes(_log_bytes())
    replacement.replace(world.log)
    evidence, run = world.capture()
    assert starts[-1] == 0 and _finelog(run)[0] == 0
    assert next(r for r in run.reads if r.source == "finelog.log").stale
    _same_logs(evidence.logs, world.read(None).logs)


def test_a_log_rewritten_in_place_is_read_whole(world: World, starts: list[int]) -> None:
    """Same inode, same first 4 KiB, longer, other bytes before the committed offset: read whole."""
    world.capture()
    data, inode = _log_bytes(), world.log.stat().st_ino
    with world.log.open("r+b") as handle:
        handle.write(data[:4096] + data[world.half :] + data[4096 : world.half])
    assert world.log.stat().st_ino == inode
    evidence, run = world.capture()
    assert starts[-1] == 0 and _finelog(run)[0] == 0
    _same_logs(evidence.logs, world.read(None).logs)


# --- the S3 copy ----------------------------------------------------------------------------------


def test_another_worker_with_a_cold_disk_resumes_from_s3(world: World, starts: list[int]) -> None:
    """The first worker writes the job's archive; the second, with nothing on its disk,
    downloads it and resumes the grown log; the evidence equals a full read."""
    _, first = world.capture("w1")
    assert first.uploaded is not None and world.archives() == [first.uploaded]
    world.grow()
    evidence, second = world.capture("w2")
    assert second.origin == "s3" and "downloaded" in second.shared
    assert starts[-1] == _finelog(second)[0] > world.half - 64 * 1024
    _same_logs(evidence.logs, world.read(None).logs)


def test_a_worker_takes_a_newer_archive_over_its_own_older_entries(world: World) -> None:
    """w1 answers alert 1, w2 alert 2 (a grown log, a newer archive), w1 alert 3: w1 resumes
    from w2's archive (the later offset), not from its own older entry; two archives are kept."""
    world.capture("w1")
    world.grow(_log_bytes()[world.half : world.half + 200_000])
    _, second = world.capture("w2")
    world.grow(_log_bytes()[world.half + 200_000 :])
    evidence, third = world.capture("w1")
    assert third.origin == "s3"
    assert _finelog(third)[0] > world.half + 200_000 - 64 * 1024 > _finelog(second)[0]
    assert len(world.archives()) == 2
    _same_logs(evidence.logs, world.read(None).logs)


def _archive(world: World) -> bytes:
    world.capture("w1")
    return world.store.get(world.archives()[-1])


def _edit(body: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """The manifest `body` after `change` edited it in place."""
    manifest = json.loads(body)
    change(manifest)
    return json.dumps(manifest).encode()


def _entry_of(manifest: dict[str, Any]) -> dict[str, Any]:
    """The finelog's entry (the largest state) of a manifest."""
    return max(manifest["entries"].values(), key=lambda texts: len(texts["meta"]))


def _traversal(manifest: dict[str, Any]) -> None:
    texts = _entry_of(manifest)
    meta = json.loads(texts["meta"])
    meta["files"]["../../escape.json"] = next(iter(manifest["sizes"]))
    texts["meta"] = json.dumps(meta)


def _other_job(manifest: dict[str, Any]) -> None:
    manifest["job"] = "jobs/cw/ops/other"


def _old_format(manifest: dict[str, Any]) -> None:
    manifest["format"] = 1


def _forged_offset(manifest: dict[str, Any]) -> None:
    """A state claiming 1000 more bytes were read, its hash in meta.json recomputed."""
    texts = _entry_of(manifest)
    state = json.loads(texts["state"])
    state["offset"] += 1000
    texts["state"] = json.dumps(state)
    meta = json.loads(texts["meta"])
    meta["files"]["state.json"] = hashlib.sha256(texts["state"].encode()).hexdigest()
    texts["meta"] = json.dumps(meta)


@pytest.mark.parametrize(
    ("forge", "said"),
    [
        (lambda body: _edit(body, _traversal), "is not a cache entry's file"),
        (lambda body: _edit(body, _other_job), "belongs to another job"),
        (lambda body: _edit(body, _old_format), "not of this format"),
        (lambda body: b"{not json", "cannot be read"),
        (lambda body: body[: len(body) // 2], "cannot be read"),
    ],
    ids=["path-traversal", "other-job", "old-format", "junk", "cut"],
)
def test_a_damaged_or_forged_manifest_gives_a_whole_read_and_a_note(
    world: World, starts: list[int], forge: Callable[[bytes], bytes], said: str
) -> None:
    """A cold worker that finds a bad manifest notes why, reads the log whole, gives the same
    evidence as a full read, and replaces the manifest with a good one."""
    bad = world.replace_archive(forge(_archive(world)))
    world.grow()
    evidence, run = world.capture("w2")
    assert starts[-1] == 0 and _finelog(run)[0] == 0
    assert "ignored" in run.shared
    assert any(said in note for note in run.notes), run.notes
    assert (
        not (world.tmp / "escape.json").exists() and not (world.tmp / "w2" / "escape.json").exists()
    )
    _same_logs(evidence.logs, world.read(None).logs)
    assert run.uploaded is not None and world.archives() == [run.uploaded] != [bad]


def _flip(body: bytes) -> bytes:
    return body[:100] + bytes([body[100] ^ 0xFF]) + body[101:]


@pytest.mark.parametrize(
    ("damage", "said"),
    [("flip", "does not match its hash"), ("delete", "is missing")],
)
def test_a_damaged_or_missing_part_gives_a_whole_read(
    world: World, starts: list[int], damage: str, said: str
) -> None:
    """A part of the manifest that is damaged (one bit) or gone: the cold worker reads the log
    whole, notes why, and its evidence equals a full read; never a table from a bad part."""
    world.capture("w1")
    key = max(world.parts(), key=world.store.size)
    body = world.store.get(key)
    world.store.delete(key)
    if damage == "flip":
        world.store.put_once(key, _flip(body))
    world.grow()
    evidence, run = world.capture("w2")
    assert starts[-1] == 0 and _finelog(run)[0] == 0 and run.origin == "none"
    assert any(said in note for note in run.notes), run.notes
    _same_logs(evidence.logs, world.read(None).logs)


def test_a_cold_worker_assembles_the_cache_from_the_parts_a_grown_log_adds(
    world: World, starts: list[int]
) -> None:
    """w1 captures, the log grows, w1 again: only the new parts go to S3 (the earlier ones are
    named again); w2, cold, assembles the entries from the manifest and the parts, resumes the
    log, and its evidence equals w1's warm one and a full read."""
    _, first = world.capture("w1")
    before = set(world.parts())
    assert first.parts_written == len(before) > 0
    world.grow(_log_bytes()[world.half : world.half + 200_000])
    warm, second = world.capture("w1")
    added = set(world.parts()) - before
    assert 0 < second.parts_written == len(added) < len(before)
    manifest = json.loads(world.store.get(second.uploaded or ""))
    named = set(manifest["sizes"])
    assert {key.rsplit("-", 1)[1].removesuffix(".parquet") for key in before} & named
    shutil.rmtree(world.tmp / "w1")
    cold, third = world.capture("w2")
    assert third.origin == "s3" and third.parts_read == len(named)
    assert starts[-1] == _finelog(third)[0] > world.half
    _same_logs(cold.logs, warm.logs)
    _same_logs(cold.logs, world.read(None).logs)


def test_a_forged_state_with_matching_hashes_does_not_fit_the_log(
    world: World, starts: list[int]
) -> None:
    """An entry whose state was changed and its hash recomputed passes the cache's integrity
    checks, but not the log's identity (the bytes before its offset): read whole, said stale."""
    world.replace_archive(_edit(_archive(world), _forged_offset))
    world.grow()
    evidence, run = world.capture("w2")
    assert run.origin == "s3" and starts[-1] == 0 and _finelog(run)[0] == 0
    assert next(r for r in run.reads if r.source == "finelog.log").stale
    _same_logs(evidence.logs, world.read(None).logs)
    assert world.archives() == [run.uploaded]  # the useless manifest is gone


def test_an_archive_at_the_size_bound_is_used_and_one_byte_more_is_not(world: World) -> None:
    """The bound on what is downloaded (the manifest and its parts): exactly their size is
    read, one byte less refuses them."""
    body = _archive(world)
    size = len(body) + sum(json.loads(body)["sizes"].values())
    world.grow()
    _, just = world.capture("w2", CacheLimits(archive_bytes=size))
    assert just.origin == "s3" and _finelog(just)[0] > 0
    world.replace_archive(body)
    _, past = world.capture("w3", CacheLimits(archive_bytes=size - 1))
    assert past.origin == "none" and _finelog(past)[0] == 0
    assert any("more than the" in note for note in past.notes)


def test_an_entry_holding_a_secret_stays_on_the_worker(world: World) -> None:
    """A log whose parsed state holds a credential (here in its first lines): the entry is kept
    on the worker's disk and used there, but nothing of it goes to S3."""
    data = f"export HF_TOKEN={SECRET}\n".encode() + _log_bytes()[: world.half]
    world.log.write_bytes(data)
    _, first = world.capture()
    assert "withheld" in first.shared and first.uploaded is None
    assert all(SECRET.encode() not in body for body in world.store.objects.values())
    world.grow()
    _, second = world.capture()
    assert second.origin == "disk" and _finelog(second)[0] > 0


def test_a_store_that_fails_costs_the_cache_not_the_capture(world: World) -> None:
    """S3 unreachable for the cache: a note, the logs read whole, the evidence complete."""

    def broken(prefix: str) -> list[str]:
        raise ConnectionError("S3 is down")

    world.store.keys = broken  # type: ignore[method-assign]
    world.store.listing = broken  # type: ignore[method-assign,assignment]
    evidence, run = world.capture()
    assert any("S3 is down" in note for note in run.notes)
    _same_logs(evidence.logs, world.read(None).logs)


# --- the disk bound -------------------------------------------------------------------------------


def _job_folder(cache: JobLogCache, name: str, size: int, age_s: float) -> Path:
    folder = cache.root / name
    folder.mkdir(parents=True)
    (folder / "blob").write_bytes(b"x" * size)
    stamp = time.time() - age_s
    os.utime(folder, (stamp, stamp))
    return folder


def test_folders_past_the_age_are_removed_and_those_just_short_kept(world: World) -> None:
    cache = world.worker(limits=CacheLimits(archive_bytes=2**20, max_age_s=3600))
    old = _job_folder(cache, "old", 10, 3600 + 60)
    young = _job_folder(cache, "young", 10, 3600 - 60)
    assert cache.prune() == [old]
    assert young.is_dir() and not old.exists()


def test_staging_left_by_a_dead_process_goes_after_an_hour(world: World) -> None:
    cache = world.worker(limits=CacheLimits(archive_bytes=2**20))
    dead = _job_folder(cache, ".pull-dead", 10, 3600 + 60)
    busy = _job_folder(cache, ".pull-busy", 10, 3600 - 60)
    assert cache.prune() == [dead]
    assert busy.is_dir()


@pytest.mark.parametrize(("room", "kept"), [(3000, 3), (2999, 2)])
def test_the_least_recently_used_folders_go_beyond_the_disk_bound(
    world: World, room: int, kept: int
) -> None:
    """Three folders of 1000 bytes: a bound of 3000 keeps all, 2999 drops the oldest."""
    cache = world.worker(limits=CacheLimits(archive_bytes=2**20, disk_bytes=room))
    folders = [_job_folder(cache, f"j{i}", 1000, 100 - i) for i in range(3)]
    cache.prune()
    assert [f.is_dir() for f in folders] == [kept == 3, True, True]


def test_entries_of_files_the_job_no_longer_has_are_dropped(world: World) -> None:
    """A pod log read once and gone at the next capture: its entry leaves the job's folder."""
    pods = world.job / "pod_logs"
    pods.mkdir()
    (pods / "trainer.log").write_bytes(_log_bytes()[:50_000])
    _, first = world.capture()
    folder = world.worker().root / job_id(JOB)
    with_pod = {p.name for p in folder.iterdir() if p.is_dir()}
    shutil.rmtree(pods)
    world.capture()
    assert len({p.name for p in folder.iterdir() if p.is_dir()}) == len(with_pod) - 1
    assert len(first.reads) == 2


# --- a grown log's entry is written in parts ------------------------------------------------------


def _metrics_parts(world: World) -> list[Path]:
    folder = world.worker().root / job_id(JOB)
    return sorted(folder.glob("*/metrics*.parquet"))


def test_a_grown_log_writes_only_its_new_rows(world: World) -> None:
    """The entry of a grown log keeps its earlier table file (the same inode: a hard link, not
    a copy) and adds one part with the new rows only; a third capture reads the parts back and
    its evidence equals a full read."""
    data = _log_bytes()
    world.capture()
    (base,) = _metrics_parts(world)
    inode, rows = base.stat().st_ino, pl.read_parquet(base).height
    world.grow(data[world.half : world.half + 200_000])
    world.capture()
    first, second = sorted(_metrics_parts(world), key=lambda p: p.name != "metrics.parquet")
    assert first.name == "metrics.parquet" and first.stat().st_ino == inode
    assert second.name.startswith("metrics-") and 0 < pl.read_parquet(second).height < rows
    world.grow(data[world.half + 200_000 :])
    evidence, third = world.capture()
    assert third.notes == [] and len(_metrics_parts(world)) == 3
    _same_logs(evidence.logs, world.read(None).logs)


@pytest.mark.parametrize(("limit", "parts"), [(3, 3), (2, 1)])
def test_a_table_past_the_part_limit_is_written_whole(
    world: World, monkeypatch: pytest.MonkeyPatch, limit: int, parts: int
) -> None:
    """Three captures of a growing log make three parts; with a limit of two the third write
    starts again from one file."""
    monkeypatch.setattr(log_cache, "MAX_PARTS", limit)
    data = _log_bytes()
    world.capture()
    world.grow(data[world.half : world.half + 200_000])
    world.capture()
    world.grow(data[world.half + 200_000 :])
    evidence, _ = world.capture()
    assert len(_metrics_parts(world)) == parts
    _same_logs(evidence.logs, world.read(None).logs)


def test_a_secret_in_the_new_rows_of_a_grown_log_is_not_shared(world: World) -> None:
    """The earlier parts were found clean (and are not read again); a secret in the rows the log
    gained keeps the whole entry on the worker."""
    _, first = world.capture()
    assert first.uploaded is not None
    line = f"2026-03-27 00:00:00.000 | ERROR    | x:y:1 - RuntimeError: login failed {SECRET}\n"
    world.grow(line.encode() + _log_bytes()[world.half : world.half + 100_000])
    _, second = world.capture()
    assert "withheld" in second.shared and second.uploaded is None
    assert all(SECRET.encode() not in body for body in world.store.objects.values())


# --- through the pipeline's capture step ----------------------------------------------------------


def test_the_capture_step_reads_through_the_jobs_cache(world: World, starts: list[int]) -> None:
    """`Pipeline.capture` of two events for the job, the log grown in between: the second
    capture resumes the finelog (its cache folder and S3 archive exist) and its frozen evidence,
    thawed, holds the tables of a full read."""
    import fakeredis

    from shared.models import Event
    from worker.pipeline.steps import Pipeline

    settings = Settings(bundle_root=world.root, cache_dir=world.tmp / "w1", stream_prefix="t")
    pipeline = Pipeline(settings, world.store, fakeredis.FakeRedis())
    for event_id in ("e1", "e2"):
        event = Event(event_id=event_id, job_dir=JOB, published_at=NOW, now=NOW)
        pipeline.events.archive(event)
        pipeline.capture(event_id, event_id, claim="t1")
        if event_id == "e1":
            assert len(world.archives()) == 1
            world.grow()
    assert starts[0] == 0 and world.half - 64 * 1024 < starts[-1] <= world.half
    entry = next((world.tmp / "w1" / "logs" / job_id(JOB)).glob("*/meta.json"))
    assert json.loads(entry.read_text())["size"] == world.log.stat().st_size
    frozen = pipeline.frozen.thaw("e2")
    fresh = world.read(None)
    assert frozen.logs is not None and fresh.logs is not None
    for name in TABLES:
        assert getattr(frozen.logs, name).height == getattr(fresh.logs, name).height, name
    assert frozen.logs.summary.bytes == world.log.stat().st_size


# --- the entries a process keeps between captures ----------------------------------------------


def _entry_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The entry folders read back from disk (each read checks and loads every file)."""
    found: list[Path] = []
    original = log_cache._read_entry

    def recording(folder: Path, key: str) -> incremental.CacheEntry:
        found.append(folder)
        return original(folder, key)

    monkeypatch.setattr(log_cache, "_read_entry", recording)
    return found


def test_a_process_takes_the_entry_it_wrote_unless_its_folder_changed(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second capture in the same process, its folder unchanged since the first wrote it,
    reads no entry from disk and still resumes and gives what a full read gives; once the
    folder's `meta.json` is another (another worker's archive replaced it, say), the entry is
    read from disk and checked again."""
    reads = _entry_reads(monkeypatch)
    world.capture()
    world.grow()
    evidence, run = world.capture()
    assert reads == []
    assert run.reused_bytes > 0
    _same_logs(evidence.logs, world.read(None).logs)
    meta = next((world.tmp / "w1" / "logs" / job_id(JOB)).glob("*/meta.json"))
    meta.write_text(meta.read_text().replace('"size": ', '"size":  '))  # another meta.json
    _, run = world.capture()
    assert len(reads) == 1 and run.reused_bytes > 0


# --- fewer requests, same guarantees --------------------------------------------------------------


def _counting(world: World) -> CountingStore:
    world.store = CountingStore()
    return world.store


def test_a_grown_logs_share_lists_twice_and_asks_nothing_per_object(world: World) -> None:
    """A warm capture of the grown log lists the job's prefix before the read and for the expiry,
    and nothing else: no listing of the parts before the push (the first listing said which are
    stored), no read of the manifest it synced with (its parts are noted on the disk), no HEAD."""
    store = _counting(world)
    world.capture()
    world.grow(_log_bytes()[world.half : world.half + 200_000])
    world.capture()
    world.grow(_log_bytes()[world.half + 200_000 :])
    store.counted()
    _, third = world.capture()
    calls = store.counted()
    assert third.uploaded is not None and third.parts_written > 0
    assert calls["listing"] == 2 and calls["keys"] == 0, calls
    assert calls["get"] == 0 and not any(calls[n] for n in ("exists", "size", "modified")), calls
    assert len(world.archives()) == 2


def test_a_cold_worker_reads_the_manifest_and_parts_and_nothing_else(world: World) -> None:
    """A cold worker reads the newest manifest (its size from the listing, no HEAD) and the parts
    it lacks, a few at once; and does not look at those parts again for secrets (they were shared,
    so their writer found them clean): only the parts its read added are checked."""
    store = _counting(world)
    world.capture("w1")
    world.grow()
    store.counted()
    checked: list[int] = []
    original = logshare.clean_frame

    def clean_frame(frame: pl.DataFrame) -> bool:
        checked.append(frame.height)
        return original(frame)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(logshare, "clean_frame", clean_frame)
        evidence, cold = world.capture("w2")
    calls = store.counted()
    assert cold.origin == "s3" and cold.parts_read > 0
    assert calls["get"] == 1 + cold.parts_read and calls["size"] == 0, calls
    assert calls["listing"] == 2 and calls["keys"] == 0, calls
    assert 0 < len(checked) <= cold.parts_written < cold.parts_read
    _same_logs(evidence.logs, world.read(None).logs)


def test_a_secret_in_rows_a_cold_worker_adds_is_not_shared(world: World) -> None:
    """Trusting the parts read from S3 does not wave through new rows: a cold worker whose read
    adds a secret keeps the entry to itself."""
    world.capture("w1")
    line = f"2026-03-27 00:00:00.000 | ERROR    | x:y:1 - RuntimeError: login failed {SECRET}\n"
    world.grow(line.encode() + _log_bytes()[world.half : world.half + 100_000])
    _, cold = world.capture("w2")
    assert cold.origin == "s3" and "withheld" in cold.shared and cold.uploaded is None
    assert all(SECRET.encode() not in body for body in world.store.objects.values())


def test_a_part_gone_between_the_listing_and_the_push_costs_a_whole_read(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part the listing before the read showed, deleted before the push, is named again by the
    new manifest without being written again; the next cold worker finds it missing, ignores the
    manifest with a note (and deletes it), reads the log whole: time lost, never evidence."""
    world.capture("w1")
    world.grow(_log_bytes()[world.half : world.half + 200_000])
    victim = max(world.parts(), key=world.store.size)
    pull = logcache._SharedCopy.pull

    def pull_then_lose(self: Any, job: str, folder: Path, run: CacheRun) -> None:
        pull(self, job, folder, run)
        world.store.delete(victim)

    monkeypatch.setattr(logcache._SharedCopy, "pull", pull_then_lose)
    _, second = world.capture("w1")
    monkeypatch.undo()
    assert second.uploaded is not None and victim not in world.parts()
    world.grow(_log_bytes()[world.half + 200_000 :])
    evidence, cold = world.capture("w2")
    assert cold.origin == "none" and any("missing" in note for note in cold.notes)
    assert _finelog(cold) == (0, world.log.stat().st_size)
    assert second.uploaded not in world.archives()
    _same_logs(evidence.logs, world.read(None).logs)


def test_parts_no_manifest_names_go_once_an_hour_old(world: World) -> None:
    """The expiry (from one listing, its write times) deletes a part no kept manifest names once
    it is an hour old, and keeps one a few seconds younger (another capture's, perhaps)."""
    world.capture()
    prefix = f"{PREFIX}{job_id(JOB)}/parts/"
    stale, young = (prefix + "a" * 32 + "-" + c * 64 + ".parquet" for c in "bc")
    for key, age in ((stale, 3600 + 5), (young, 3600 - 5)):
        world.store.put_once(key, b"orphan")
        world.store.written_at[key] = time.time() - age
    world.grow()
    _, run = world.capture()
    assert run.uploaded is not None
    assert stale not in world.parts() and young in world.parts()


def test_the_share_written_beside_the_capture_is_done_when_finish_sharing_returns(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `share_later`, `collect` returns before the S3 copy is written; `finish_sharing` waits
    for it, and a later collect of the job waits for it before it reads the cache."""
    release, order = threading.Event(), []
    push = logcache._SharedCopy.push

    def slow_push(self: Any, job: str, folder: Path, run: CacheRun) -> None:
        release.wait(10)
        push(self, job, folder, run)
        order.append("pushed")

    monkeypatch.setattr(logcache._SharedCopy, "push", slow_push)
    _, run = world.worker().collect(JOB, world.read, share_later=True)
    assert run.uploaded is None and world.archives() == []
    pull = logcache._SharedCopy.pull
    monkeypatch.setattr(
        logcache._SharedCopy, "pull", lambda *args: (order.append("pulled"), pull(*args))[-1]
    )
    threading.Timer(0.2, release.set).start()
    world.worker().collect(JOB, world.read)
    assert order == ["pushed", "pulled", "pushed"]
    finish_sharing()
    assert run.uploaded is not None and run.uploaded in world.archives()


def test_a_memory_error_in_the_share_reaches_the_capture(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memory error while the S3 copy is written beside the capture is raised by
    `finish_sharing` (the capture fails as it would have), not lost with its thread."""

    def exhausted(self: Any, job: str, folder: Path, run: CacheRun) -> None:
        raise MemoryError("no room")

    monkeypatch.setattr(logcache._SharedCopy, "push", exhausted)
    world.worker().collect(JOB, world.read, share_later=True)
    with pytest.raises(MemoryError, match="no room"):
        finish_sharing()
    finish_sharing()  # raised once


def test_the_entry_written_beside_the_capture_is_resumed_by_another_process(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `share_later` the entry is kept for the read but written to the disk by the share
    (before its S3 copy): nothing is on the disk when `collect` returns, all of it once
    `finish_sharing` did, and a process that holds nothing in memory resumes the grown log
    from it."""
    release = threading.Event()
    write = logcache._WatchedCache.write_stored

    def held_back(self: Any) -> None:
        release.wait(10)
        write(self)

    monkeypatch.setattr(logcache._WatchedCache, "write_stored", held_back)
    folder = world.tmp / "w1" / "logs" / job_id(JOB)
    _, first = world.worker().collect(JOB, world.read, share_later=True)
    assert not list(folder.glob("*/meta.json"))
    release.set()
    finish_sharing()
    assert list(folder.glob("*/meta.json")) and first.uploaded is not None
    monkeypatch.setattr(logcache, "_KEPT", logcache._Kept(logcache.KEPT_BYTES))  # another process
    world.grow()
    evidence, second = world.capture()
    assert second.origin == "disk" and _finelog(second)[0] > world.half - 64 * 1024
    _same_logs(evidence.logs, world.read(None).logs)


def test_an_entry_write_that_fails_beside_the_capture_is_a_note(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk while the entry is written beside the capture costs the cache, not the
    evidence: a note, nothing shared, the evidence that of a full read."""

    def full(self: Any, key: str, entry: Any, previous: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(log_cache.LogCache, "_save", full)
    evidence, run = world.worker().collect(JOB, world.read, share_later=True)
    finish_sharing()
    assert any("No space left" in note for note in run.notes) and run.uploaded is None
    _same_logs(evidence.logs, world.read(None).logs)


def _checked_parts(patch: pytest.MonkeyPatch) -> list[int]:
    """The row counts of the parts the redaction check reads (from now on)."""
    checked: list[int] = []
    original = logshare.clean_frame

    def clean_frame(frame: pl.DataFrame) -> bool:
        checked.append(frame.height)
        return original(frame)

    patch.setattr(logshare, "clean_frame", clean_frame)
    return checked


def test_a_manifest_written_under_other_redactor_rules_is_checked_again(world: World) -> None:
    """A cold worker trusts the parts of a manifest written under the redactor's present rules;
    one written under other rules (`RULES_DIGEST`, before an upgrade) has every part checked
    again before anything is shared."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(logshare, "RULES_DIGEST", "0" * 16)
        world.capture("w1")
    world.grow()
    with pytest.MonkeyPatch.context() as patch:
        checked = _checked_parts(patch)
        _, cold = world.capture("w2")
    assert cold.origin == "s3" and cold.parts_read > 0 and cold.uploaded is not None
    assert len(checked) > cold.parts_read  # the pulled parts and the new ones
    world.grow(_log_bytes()[world.half : world.half + 10_000])
    with pytest.MonkeyPatch.context() as patch:
        checked = _checked_parts(patch)
        _, third = world.capture("w3")
    assert third.origin == "s3" and 0 < len(checked) <= third.parts_written < third.parts_read


def test_parts_found_clean_under_other_rules_are_checked_again(world: World) -> None:
    """The worker's own record of clean parts (`.clean`) holds under the rules it was made
    under: after a change of the rules a grown log's share checks every part, not only the
    new ones; under the same rules, only the new ones."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(logshare, "RULES_DIGEST", "0" * 16)
        world.capture()
    world.grow(_log_bytes()[world.half : world.half + 200_000])
    with pytest.MonkeyPatch.context() as patch:
        checked = _checked_parts(patch)
        _, again = world.capture()
    assert again.uploaded is not None and len(checked) > again.parts_written
    world.grow(_log_bytes()[world.half + 200_000 :])
    with pytest.MonkeyPatch.context() as patch:
        checked = _checked_parts(patch)
        _, third = world.capture()
    assert third.uploaded is not None and 0 < len(checked) <= third.parts_written
