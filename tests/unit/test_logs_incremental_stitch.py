"""A job's finelog re-read as it grows: the cache keeps its stitched tables, re-stitched from the
ones before, and the tables equal a whole read (through the real parser, `parse_job_logs`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from testkit.gen_finelog import generate
from worker.evidence import log_cache
from worker.evidence.log_cache import LogCache
from worker.evidence.logs.incremental import CacheEntry
from worker.evidence.logs.job import parse_job_logs
from worker.evidence.model import LogTables

TABLES = ("metrics", "timers", "phases", "engines", "progress", "batches", "errors", "resumes")
RESUMING = b"Resuming from global_step:"


def _same(left: LogTables | None, right: LogTables | None) -> None:
    assert left is not None and right is not None
    for name in TABLES:
        assert_frame_equal(getattr(left, name), getattr(right, name), check_row_order=True)
    assert left.summary == right.summary


def _job(tmp_path: Path, head: bytes) -> tuple[Path, Path]:
    """A job directory under `tmp_path` whose finelog holds `head`; the folder and the log."""
    job = tmp_path / "job"
    job.mkdir()
    path = job / "finelog.log"
    path.write_bytes(head)
    return job, path


def _log(tmp_path: Path) -> bytes:
    """About 1 MB of generated finelog, then a restart (Iris setup, "Resuming from ...") and
    the last 40 % of it again: the new attempt writes steps the first one wrote."""
    data = generate(tmp_path / "source.log", 0.6).read_bytes()
    lines = data.splitlines(keepends=True)
    setup, scratch = lines[0], next(line for line in lines if b"No checkpoint found" in line)
    resume = scratch.replace(
        b"No checkpoint found, starting training from scratch", RESUMING + b" 5"
    )
    again = b"".join(lines[(len(lines) * 3) // 5 :])
    return data + setup + resume + again


def _entry(cache: LogCache) -> CacheEntry:
    (entry,) = [e for k, e in cache._entries.items() if k.split("|")[1] == "finelog.log"]
    return entry


def _cuts(data: bytes) -> list[int]:
    """Growth points: mid-line, just before a restart, just after it, and the end."""
    restart = data.index(RESUMING)
    return [len(data) // 3 + 7, restart - 40, restart + 200, (len(data) * 3) // 4, len(data)]


@pytest.mark.parametrize("on_disk", [False, True])
def test_grown_finelog_restitched_equals_a_whole_read(tmp_path: Path, on_disk: bool) -> None:
    """Each growth (one starting a new attempt that resumes earlier steps) gives the tables of
    a whole read, and the cache entry's stitched tables keep the rows before the new steps."""
    data = _log(tmp_path)
    job, path = _job(tmp_path, b"")
    cache = LogCache(directory=tmp_path / "cache" if on_disk else None)
    kept = []
    for cut in _cuts(data):
        with path.open("ab") as handle:
            handle.write(data[path.stat().st_size : cut])
        grown = parse_job_logs(job, cache=cache)
        _same(grown, parse_job_logs(job))
        entry = _entry(cache)
        assert entry.stitched is not None
        kept.append(entry.stitched_same.get("metrics", 0))
    assert kept[0] == 0 and all(n > 0 for n in kept[1:])  # re-stitched, not stitched whole


def test_disk_entry_keeps_stitched_parts_and_a_new_cache_reads_them(tmp_path: Path) -> None:
    """On disk the stitched tables are parts like the raw ones: a growth links the unchanged
    first parts, and a new cache object reading the folder gives the same tables."""
    data = _log(tmp_path)
    job, path = _job(tmp_path, data[: len(data) // 4])
    parse_job_logs(job, cache=LogCache(directory=tmp_path / "c"))
    with path.open("ab") as handle:  # within the first attempt: no earlier step is touched
        handle.write(data[len(data) // 4 : data.index(RESUMING) - 100])
    cache = LogCache(directory=tmp_path / "c")
    _same(parse_job_logs(job, cache=cache), parse_job_logs(job))
    entry = _entry(cache)
    assert len(entry.parts["stitched_metrics"]) == 2
    assert sum(entry.part_rows["stitched_metrics"]) == entry.stitched.metrics.height  # type: ignore[union-attr]


def test_rewritten_finelog_is_stitched_whole(tmp_path: Path) -> None:
    """A finelog rewritten in place (same inode, other head) or rotated (a new file) is read
    whole: its tables equal a whole read, nothing of the old stitched tables is kept."""
    data = _log(tmp_path)
    job, path = _job(tmp_path, data[: len(data) // 2])
    cache = LogCache(directory=tmp_path / "c")
    parse_job_logs(job, cache=cache)
    inode = path.stat().st_ino
    with path.open("r+b") as handle:  # rewritten in place: the head changes, the size grows
        handle.write(b"[iris setup] step 2/2 \n")
        handle.seek(0, os.SEEK_END)
        handle.write(data[len(data) // 2 :])
    assert path.stat().st_ino == inode
    _same(parse_job_logs(job, cache=cache), parse_job_logs(job))
    assert _entry(cache).stitched_same == {}
    rotated = tmp_path / "rotated.log"
    rotated.write_bytes(data[len(data) // 4 :])
    rotated.replace(path)
    _same(parse_job_logs(job, cache=cache), parse_job_logs(job))
    assert _entry(cache).stitched_same == {}


@pytest.mark.parametrize(
    ("done", "height", "spans"),
    [
        (0, 0, [(0, 0)]),
        (0, 256, [(0, 256)]),  # just short: one part
        (0, 257, [(0, 193), (193, 64)]),  # just past: the last TAIL_ROWS rows apart
        (100, 356, [(100, 256)]),
        (100, 357, [(100, 193), (293, 64)]),
    ],
)
def test_rows_written_past_split_rows_are_two_parts(
    monkeypatch: pytest.MonkeyPatch, done: int, height: int, spans: list[tuple[int, int]]
) -> None:
    monkeypatch.setattr(log_cache, "TAIL_ROWS", 64)
    monkeypatch.setattr(log_cache, "SPLIT_ROWS", 256)
    assert log_cache._spans(done, height) == spans


def test_grown_stitched_table_rewrites_its_tail_part_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A growth that re-stitches the last steps of a stitched table links the part before its
    last TAIL_ROWS rows and writes the rest; the tables equal a whole read. Without the split, the
    whole stitched table was written again at every growth."""
    monkeypatch.setattr(log_cache, "TAIL_ROWS", 4)
    monkeypatch.setattr(log_cache, "SPLIT_ROWS", 16)
    data = _log(tmp_path)
    job, path = _job(tmp_path, data[: len(data) // 4])
    first = LogCache(directory=tmp_path / "c")
    parse_job_logs(job, cache=first)
    before = _entry(first)
    assert before.stitched is not None
    body, tail = before.parts["stitched_phases"]  # 28 rows: 24, then the last 4
    assert before.part_rows["stitched_phases"] == (24, 4)
    with path.open("ab") as handle:  # within the first attempt: the last step is re-stitched
        handle.write(data[len(data) // 4 : data.index(RESUMING) - 100])
    cache = LogCache(directory=tmp_path / "c")
    _same(parse_job_logs(job, cache=cache), parse_job_logs(job))
    entry = _entry(cache)
    assert entry.stitched is not None
    assert 24 <= entry.stitched_same["phases"] < before.stitched.phases.height
    parts, rows = entry.parts["stitched_phases"], entry.part_rows["stitched_phases"]
    assert parts[0] == body and tail not in parts  # the body linked, the tail written again
    assert rows[0] == 24 and rows[-1] == 4 and sum(rows) == entry.stitched.phases.height
    # a new cache object reads the parts back (linked and written) as the same tables
    _same(parse_job_logs(job, cache=LogCache(directory=tmp_path / "c")), parse_job_logs(job))
