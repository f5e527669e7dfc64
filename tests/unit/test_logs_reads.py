"""How the reader cuts a file into reads: a short first read, then reads of the budget's size,
each ending at a line end, and tables that do not depend on where the reads fall."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from bench.gen_continuous import generate_continuous
from bench.gen_finelog import generate as generate_finelog
from worker.evidence.logs import parse_log_file, reader
from worker.evidence.logs.reader import FIRST_READ_BYTES, _reads, parse_file_rows
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
    monkeypatch.setattr(reader, "FIRST_READ_BYTES", 3 * MB)
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
