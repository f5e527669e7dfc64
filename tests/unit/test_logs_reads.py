"""How the reader reads a file: reads that end at line ends and cover it once, tables that do not
depend on where the reads fall, a memory check after every chunk."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from polars.testing import assert_frame_equal

from testkit.gen_continuous import generate_continuous
from testkit.gen_finelog import generate as generate_finelog
from worker.evidence.log_cache import LogCache
from worker.evidence.logs import chunk, parse_log_file, reader
from worker.evidence.logs.budget import LogBudgetError, ParseBudget
from worker.evidence.logs.reader import parse_file_rows
from worker.evidence.logs.reads import iter_reads
from worker.evidence.logs.stitch import build_tables
from worker.evidence.model import LogTables

MB = 2**20
TABLES = ("metrics", "timers", "phases", "engines", "progress", "batches", "errors", "resumes")


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 7 MB of continuous finelog (stat lines, records, timers)."""
    return generate_continuous(tmp_path_factory.mktemp("reads") / "finelog.log", 7)


@pytest.fixture(scope="module")
def restarts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 5 MB of generated finelog: restarts that rewind steps, tracebacks, pprint-ed dicts,
    truncated records."""
    return generate_finelog(tmp_path_factory.mktemp("reads") / "finelog.log", 5)


def _same(a: LogTables, b: LogTables) -> None:
    for name in TABLES:
        assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    assert a.summary == b.summary


def test_reads_end_at_line_ends_and_cover_the_file_once(log: Path) -> None:
    """Every read but the last ends with a newline; together they are the file, byte for byte,
    and only the last is final."""
    data = log.read_bytes()
    at = 0
    with log.open("rb") as handle:
        found = list(iter_reads(handle, 3 * MB))
    for read in found:
        assert read.data[: read.end] == data[at : at + read.end]
        assert read.data[read.end - 1 : read.end] == b"\n"
        at += read.end
    assert at == len(data) and [read.final for read in found] == [False] * (len(found) - 1) + [True]


@pytest.mark.parametrize(
    ("content", "reads"),
    [
        (b"", [(0, True)]),
        (b"one\n", [(4, True)]),
        (b"one\ntwo\nno newline at the end", [(8, False), (21, True)]),
    ],
    ids=["empty", "one-line", "unterminated"],
)
def test_an_unterminated_last_line_is_a_final_read_of_its_own(
    content: bytes, reads: list[tuple[int, bool]], tmp_path: Path
) -> None:
    """A file that ends with a newline is one final read; a partial last line is the final
    read's alone (the lines before it are a read the cache may keep)."""
    path = tmp_path / "finelog.log"
    path.write_bytes(content)
    with path.open("rb") as handle:
        assert [(read.end, read.final) for read in iter_reads(handle, MB)] == reads


@pytest.mark.slow
@pytest.mark.parametrize("which", ["log", "restarts"])
def test_tables_do_not_depend_on_the_read_size(which: str, request: pytest.FixtureRequest) -> None:
    """Reads of 64 KiB, 1 MiB and the budget's size give the same tables and summary, on a
    continuous log and on one whose restarts rewind steps."""
    path: Path = request.getfixturevalue(which)
    whole = parse_log_file(path, "finelog.log")
    assert whole.metrics.height > 100 and whole.engines.height > 1000
    for size in (64 * 1024, MB):
        _same(whole, parse_log_file(path, "finelog.log", chunk_bytes=size))


def test_a_cache_gives_the_tables_of_a_plain_parse(log: Path, tmp_path: Path) -> None:
    """With a cache (the last read's committed rows kept apart), the tables are a plain parse's;
    read again from the cache, too."""
    plain = parse_log_file(log, "finelog.log", chunk_bytes=3 * MB)
    cache = LogCache(directory=tmp_path / "cache")
    _same(plain, parse_log_file(log, "finelog.log", chunk_bytes=3 * MB, cache=cache))
    _same(plain, parse_log_file(log, "finelog.log", chunk_bytes=3 * MB, cache=cache))


def _counted_checks(monkeypatch: pytest.MonkeyPatch, fail_at: int | None = None) -> list[int]:
    """The offset of each budget check made; with `fail_at`, that check raises."""
    offsets: list[int] = []
    check = ParseBudget.check

    def counted(self: ParseBudget, held: Any, source: str, line: int, offset: int) -> None:
        offsets.append(offset)
        if len(offsets) == fail_at:
            raise LogBudgetError(f"{source}: past the budget at byte {offset:,}")
        check(self, held, source, line, offset)

    monkeypatch.setattr(ParseBudget, "check", counted)
    return offsets


def test_every_chunk_is_checked_against_the_budget(
    log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One check after each chunk parse, the final one too (at the end of the file)."""
    parses: list[int] = []
    parse_chunk = chunk.parse_chunk

    def counted(*args: Any, **kwargs: Any) -> Any:
        parses.append(1)
        return parse_chunk(*args, **kwargs)

    monkeypatch.setattr(reader, "parse_chunk", counted)
    offsets = _counted_checks(monkeypatch)
    parse_log_file(log, "finelog.log", chunk_bytes=MB)
    assert len(offsets) == len(parses) > 5
    assert offsets[-1] == log.stat().st_size


@pytest.mark.parametrize("at", ["first", "final"])
def test_a_chunk_past_the_budget_stops_the_parse_and_its_read_ahead(
    at: str, log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk past the budget (the first, or the final one) stops the parse with
    `LogBudgetError`; no read-ahead thread is left running."""
    offsets = _counted_checks(monkeypatch)
    parse_log_file(log, "finelog.log", chunk_bytes=MB)
    monkeypatch.undo()
    _counted_checks(monkeypatch, 1 if at == "first" else len(offsets))
    with pytest.raises(LogBudgetError, match="past the budget"):
        parse_log_file(log, "finelog.log", chunk_bytes=MB)
    assert not [t for t in threading.enumerate() if t.name.startswith("rlhealth-read")]


@pytest.mark.parametrize("which", ["log", "restarts"])
def test_stitching_early_equals_stitching_at_the_end(
    which: str, request: pytest.FixtureRequest
) -> None:
    """A single file's committed rows are stitched while its final chunk is parsed, then only
    the steps of that chunk again; the tables equal a stitch of all rows at the end (restarts
    that rewind steps included)."""
    path: Path = request.getfixturevalue(which)
    early = parse_log_file(path, "finelog.log", chunk_bytes=MB // 2)
    found = parse_file_rows(path, "finelog.log", chunk_bytes=MB // 2)
    late = build_tables(found.rows, found.summary)
    assert early.metrics.height > 100 and early.phases.height > 100
    _same(early, late)
