"""How the reader cuts a file into reads: a short first read, then reads of the budget's size,
each ending at a line end, and tables that do not depend on where the reads fall."""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, wait
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from bench.gen_continuous import generate_continuous
from bench.gen_finelog import generate as generate_finelog
from worker.evidence.logs import parse_log_file, reader, reads
from worker.evidence.logs.reader import FIRST_READ_BYTES, _reads, parse_file_rows
from worker.evidence.logs.scan import Scan, scan
from worker.evidence.logs.stitch import Stitched, build_tables, stitch

MB = 2**20


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 7 MB of continuous finelog (stat lines, records, timers)."""
    return generate_continuous(tmp_path_factory.mktemp("reads") / "finelog.log", 7)


def _sizes(path: Path, chunk_bytes: int) -> list[tuple[int, bool]]:
    with path.open("rb") as handle:
        return [(read.end, read.final) for read in _reads(handle, chunk_bytes)]


def _full(sizes: list[tuple[int, bool]]) -> list[int]:
    """The reads before the file ran out (the last two: what was left, then the final read)."""
    assert sizes[-1][1] and not any(final for _, final in sizes[:-1])
    return [end for end, _ in sizes[:-2]]


def test_the_first_read_is_short_and_the_others_take_the_budget(log: Path) -> None:
    sizes = _sizes(log, 3 * MB)
    first, *others = _full(sizes)
    assert FIRST_READ_BYTES - 2000 < first <= FIRST_READ_BYTES
    assert others and all(3 * MB - 2000 < end <= 3 * MB for end in others)
    assert sum(end for end, _ in sizes) == log.stat().st_size


def test_reads_end_at_line_ends_and_cover_the_file_once(log: Path) -> None:
    data = log.read_bytes()
    at = 0
    with log.open("rb") as handle:
        for read in _reads(handle, 3 * MB):
            assert read.data[: read.end] == data[at : at + read.end]
            assert read.final or read.data[read.end - 1 : read.end] == b"\n"
            at += read.end
    assert at == len(data)


@pytest.mark.parametrize("chunk", [FIRST_READ_BYTES, FIRST_READ_BYTES - 1, 4096])
def test_a_budget_at_or_below_the_first_read_reads_evenly(log: Path, chunk: int) -> None:
    """Just at and just below the first read's size, every read but the last is `chunk` long."""
    full = _full(_sizes(log, chunk))
    assert len(full) > 2 and all(chunk - 2000 < end <= chunk for end in full)


def test_a_file_shorter_than_the_first_read_is_read_as_before(tmp_path: Path) -> None:
    """Its complete lines, then the unterminated rest: as one read of any size reads it."""
    path = tmp_path / "finelog.log"
    path.write_bytes(b"one\ntwo\nno newline at the end")
    assert _sizes(path, 3 * MB) == [(8, False), (21, True)]


def test_tables_do_not_depend_on_the_short_first_read(
    log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same tables with the short first read and with every read of the same size."""
    short = parse_log_file(log, "finelog.log", chunk_bytes=3 * MB)
    monkeypatch.setattr(reads, "FIRST_READ_BYTES", 3 * MB)
    assert _sizes(log, 3 * MB)[0][0] > FIRST_READ_BYTES  # the first read is a full one now
    even = parse_log_file(log, "finelog.log", chunk_bytes=3 * MB)
    for name in ("metrics", "timers", "phases", "engines", "progress", "batches", "errors"):
        assert_frame_equal(getattr(short, name), getattr(even, name))
    assert short.summary == even.summary
    assert short.engines.height > 10_000


@pytest.fixture(scope="module")
def restarts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 5 MB of generated finelog: restarts that rewind steps, tracebacks, pprint-ed dicts,
    truncated records."""
    return generate_finelog(tmp_path_factory.mktemp("reads") / "finelog.log", 5)


@pytest.mark.parametrize("which", ["log", "restarts"])
@pytest.mark.parametrize("chunk", [MB // 2, 3 * MB])
def test_stitching_early_equals_stitching_at_the_end(
    which: str, chunk: int, request: pytest.FixtureRequest
) -> None:
    """A single file's first rows are stitched while its last chunks are parsed (`early`); the
    tables equal those stitched from all rows at the end (`parse_file_rows`: no early stitch)."""
    path: Path = request.getfixturevalue(which)
    early = parse_log_file(path, "finelog.log", chunk_bytes=chunk)
    found = parse_file_rows(path, "finelog.log", chunk_bytes=chunk)
    late = build_tables(found.rows, found.summary)
    assert early.metrics.height > 100 and early.phases.height > 100
    for name in ("metrics", "phases", "timers", "batches", "engines"):
        assert_frame_equal(getattr(early, name), getattr(late, name))


def test_early_stitching_happens_when_the_file_has_several_chunks(
    log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The early stitch runs (on a part of the rows, not all of them), and only for one file
    read without a cache."""
    seen: list[int] = []

    def counted(parts: list[dict[str, pl.DataFrame]]) -> Stitched:
        seen.append(len(parts))
        return stitch(reader._concat(parts))

    monkeypatch.setattr(reader, "_stitch_parts", counted)
    parse_log_file(log, "finelog.log", chunk_bytes=MB // 2)
    assert len(seen) == 1 and seen[0] >= 1
    parse_file_rows(log, "finelog.log", chunk_bytes=MB // 2)
    assert len(seen) == 1


def _scans(path: Path, chunk_bytes: int) -> list[Scan]:
    with path.open("rb") as handle:
        return [scan(read) for read in _reads(handle, chunk_bytes)]


def _done(piece: Scan) -> Future[Scan]:
    future: Future[Scan] = Future()
    future.set_result(piece)
    return future


def test_ready_joins_the_scans_already_done_up_to_join_bytes(
    log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Done scans are joined while the chunk holds less than JOIN_BYTES; one not done yet, or
    the `keep` last, stay pending; the join has the lines of its parts and the costlier
    density."""
    pieces = _scans(log, MB // 2)
    assert len(pieces) > 6
    monkeypatch.setattr(reader, "JOIN_BYTES", pieces[0].size + pieces[1].size + 1)
    waiting: Future[Scan] = Future()
    pending = deque([_done(p) for p in pieces[:5]] + [waiting])
    joined = reader._ready(pending, keep=0)
    assert joined.lines == sum(p.lines for p in pieces[:3])  # two were 1 byte short: a third
    assert joined.density == max(p.density for p in pieces[:3]) > 0
    assert len(pending) == 3
    assert reader._ready(pending, keep=2).lines == pieces[3].lines  # two must stay pending
    assert len(pending) == 2
    assert reader._ready(pending, keep=0).lines == pieces[4].lines  # the next is not done
    assert list(pending) == [waiting]


def test_ready_stops_at_join_bytes(log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At JOIN_BYTES exactly, the chunk takes no more."""
    pieces = _scans(log, MB // 2)
    monkeypatch.setattr(reader, "JOIN_BYTES", pieces[0].size + pieces[1].size)
    pending = deque(_done(p) for p in pieces[:4])
    assert reader._ready(pending, keep=0).lines == pieces[0].lines + pieces[1].lines
    assert len(pending) == 2


def test_tables_do_not_depend_on_scans_parsed_together(
    log: Path, restarts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the scans ahead are done (the parse waits for them here, as a parse that falls
    behind does), they are parsed together; the tables equal those of one chunk per read."""
    joins: list[int] = []
    ready = reader._ready

    def counted(pending: deque[Future[Scan]], keep: int) -> Scan:
        wait(list(pending), timeout=60)
        before = len(pending)
        found = ready(pending, keep)
        joins.append(before - len(pending))
        return found

    for path in (log, restarts):
        monkeypatch.setattr(reader, "JOIN_BYTES", 0)
        apart = parse_log_file(path, "finelog.log", chunk_bytes=MB // 2)
        monkeypatch.setattr(reader, "JOIN_BYTES", 8 * MB)
        monkeypatch.setattr(reader, "_ready", counted)
        together = parse_log_file(path, "finelog.log", chunk_bytes=MB // 2)
        monkeypatch.undo()
        for name in ("metrics", "timers", "phases", "engines", "progress", "batches", "errors"):
            assert_frame_equal(getattr(apart, name), getattr(together, name))
        assert apart.summary == together.summary
    assert max(joins) > 1
