"""How the reader cuts a file into reads: a short first read, then reads of the budget's size,
each ending at a line end, and tables that do not depend on where the reads fall."""

from __future__ import annotations

import math
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from bench.gen_continuous import generate_continuous
from bench.gen_finelog import generate as generate_finelog
from worker.evidence.logs import LogCache, parse_log_file, reader, reads
from worker.evidence.logs import budget as budget_module
from worker.evidence.logs.budget import Held, LogBudgetError, MemoryBudget
from worker.evidence.logs.reader import FIRST_READ_BYTES, _reads, parse_file_rows
from worker.evidence.logs.reads import Read
from worker.evidence.logs.scan import Scan, scan
from worker.evidence.logs.state import ParserState
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

    def counted(pending: deque[Future[Scan]], keep: int, *, first: bool = False) -> Scan:
        wait(list(pending), timeout=60)
        before = len(pending)
        found = ready(pending, keep, first=first)
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


def _later(piece: Scan) -> Future[Scan]:
    """A scan that is done a moment after it is asked for (a read still being scanned)."""
    future: Future[Scan] = Future()
    threading.Timer(0.2, future.set_result, (piece,)).start()
    return future


def test_the_short_first_read_is_parsed_with_the_next_one(log: Path) -> None:
    """The file's first chunk waits for the next read's scan when its own read is the short
    first one (at most FIRST_READ_BYTES); a first piece just past it, or a later chunk, does not
    wait for a scan not done."""
    pieces = _scans(log, 3 * MB)
    assert pieces[0].size <= FIRST_READ_BYTES < pieces[1].size
    pending = deque([_done(pieces[0]), _later(pieces[1])])
    joined = reader._ready(pending, keep=0, first=True)
    assert joined.lines == pieces[0].lines + pieces[1].lines and not pending
    waiting = _later(pieces[2])
    pending = deque([_done(pieces[1]), waiting])
    assert reader._ready(pending, keep=0, first=True).lines == pieces[1].lines
    pending = deque([_done(pieces[0]), waiting])
    assert reader._ready(pending, keep=0).lines == pieces[0].lines
    assert reader._ready(deque([_done(pieces[0]), _done(pieces[1])]), keep=1, first=True).lines == (
        pieces[0].lines
    )  # `keep`: the next one stays pending


def _chunk_parses(
    monkeypatch: pytest.MonkeyPatch, path: Path, cache: LogCache | None
) -> tuple[list[tuple[int, bool]], int]:
    """The (bytes, final) of each chunk parse of `path` and how many budget checks were made."""
    parsed: list[tuple[int, bool]] = []
    checks: list[int] = []
    parse_chunk, check = reader.parse_chunk, MemoryBudget.check

    def counted_parse(chunk: Scan, *args: Any, final: bool, **kwargs: Any) -> Any:
        parsed.append((chunk.size, final))
        return parse_chunk(chunk, *args, final=final, **kwargs)

    def counted_check(self: MemoryBudget, *args: Any) -> None:
        checks.append(1)
        check(self, *args)

    monkeypatch.setattr(reader, "parse_chunk", counted_parse)
    monkeypatch.setattr(MemoryBudget, "check", counted_check)
    parse_log_file(path, "finelog.log", cache=cache, budget=_roomy(path))
    monkeypatch.undo()
    return parsed, len(checks)


def _roomy(path: Path) -> MemoryBudget:
    """Reads of 3 MB with room for every read in flight (as a large log's budget has)."""
    size = path.stat().st_size
    return MemoryBudget(
        limit_bytes=8 * 2**30, chunk_bytes=3 * MB, aim_bytes=8 * 2**30, log_bytes=size
    )


def test_without_a_cache_no_chunk_parse_is_of_nothing(
    log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a cache the empty final read is no chunk parse of its own (it is not even
    scanned: the read before it ends the last chunk), and the short first read is parsed with
    the next; with a cache the final read stays a chunk of its own (the rows before it are what
    the cache keeps). Every chunk, the final one too, is checked against the
    budget; the tables are the same."""
    assert log.read_bytes().endswith(b"\n")  # so the final read is empty
    whole, whole_checks = _chunk_parses(monkeypatch, log, None)
    cached, cached_checks = _chunk_parses(monkeypatch, log, LogCache(directory=tmp_path))
    assert all(size > 0 for size, _ in whole) and whole[-1][1]
    assert whole[0][0] > FIRST_READ_BYTES
    assert cached[-1] == (0, True)
    assert sum(size for size, _ in whole) == sum(size for size, _ in cached) == log.stat().st_size
    assert (whole_checks, cached_checks) == (len(whole), len(cached))
    again = parse_log_file(
        log, "finelog.log", chunk_bytes=3 * MB, cache=LogCache(directory=tmp_path)
    )
    plain = parse_log_file(log, "finelog.log", chunk_bytes=3 * MB)
    for name in ("metrics", "timers", "phases", "engines", "progress", "batches", "errors"):
        assert_frame_equal(getattr(again, name), getattr(plain, name))
    assert again.summary == plain.summary


def test_a_final_chunk_past_the_budget_stops_the_parse(
    log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget that every chunk but the final one fits: the final chunk's rows stop it."""
    parsed, _ = _chunk_parses(monkeypatch, log, None)
    calls: list[int] = []
    check = MemoryBudget.check

    def last_one_fails(self: MemoryBudget, held: Any, source: str, line: int, offset: int) -> None:
        calls.append(offset)
        if len(calls) == len(parsed):
            raise LogBudgetError(f"{source}: past the budget at byte {offset:,}")
        check(self, held, source, line, offset)

    monkeypatch.setattr(MemoryBudget, "check", last_one_fails)
    with pytest.raises(LogBudgetError, match="past the budget"):
        parse_log_file(log, "finelog.log", budget=_roomy(log))
    assert calls[-1] == log.stat().st_size


def _parses_and_scans(
    monkeypatch: pytest.MonkeyPatch,
    path: Path,
    budget: MemoryBudget,
    scanned: list[int] | None = None,
) -> tuple[list[int], list[int]]:
    """For each chunk parse of `path`: how many reads had been handed to a scan before it, and
    the chunk's bytes; `scanned` is given the bytes of each read handed to a scan."""
    submitted: list[int] = []
    before: list[int] = []
    sizes: list[int] = []
    parse_chunk = reader.parse_chunk

    class Counting(ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            if fn is reader.scan:
                submitted.append(1)
                if scanned is not None:
                    scanned.append(args[0].size)
            return super().submit(fn, *args, **kwargs)

    def counted_parse(chunk: Scan, *args: Any, final: bool, **kwargs: Any) -> Any:
        before.append(len(submitted))
        sizes.append(chunk.size)
        return parse_chunk(chunk, *args, final=final, **kwargs)

    monkeypatch.setattr(reader, "ThreadPoolExecutor", Counting)
    monkeypatch.setattr(reader, "parse_chunk", counted_parse)
    parse_log_file(path, "finelog.log", budget=budget)
    monkeypatch.undo()
    return before, sizes


def _aimed(path: Path, reads: float, chunk: int = 3 * MB) -> MemoryBudget:
    """Reads of `chunk` bytes, aiming at room for `reads` reads of the cost the first read's scan
    shows (`MemoryBudget.room`), when nothing is kept yet; the worst cost leaves room for none."""
    with path.open("rb") as handle:
        density = scan(next(_reads(handle, chunk))).density
    per_read = (budget_module._SCAN_READS + budget_module._DENSITY_COPIES * density) * chunk
    aim = int(budget_module._FIXED + reads * per_read)
    worst = budget_module._SCAN_READS + budget_module._DENSITY_COPIES * reader._WORST_DENSITY
    assert aim < budget_module._FIXED + 2 * worst * chunk  # no room for two at the worst cost
    return MemoryBudget(
        limit_bytes=8 * 2**30, chunk_bytes=chunk, aim_bytes=aim, log_bytes=path.stat().st_size
    )


def test_the_first_scan_tells_the_cost_before_anything_is_parsed(
    log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until a scan is seen the budget assumes the worst cost of a read. The first scan is waited
    for (not parsed) to learn the cost: with room for three reads of that cost, three are being
    scanned before the first chunk is parsed, and the short first read is parsed with the next.
    With room for one and a half, just short of two, the first chunk is parsed alone first, as
    before. The tables are the same."""
    roomy, roomy_sizes = _parses_and_scans(monkeypatch, log, _aimed(log, 3.01))
    assert roomy[0] >= reader.PREFETCH + 1 and roomy_sizes[0] > FIRST_READ_BYTES
    tight, tight_sizes = _parses_and_scans(monkeypatch, log, _aimed(log, 1.5))
    assert tight[0] == 1 and tight_sizes[0] <= FIRST_READ_BYTES
    assert sum(roomy_sizes) == sum(tight_sizes) == log.stat().st_size
    plain = parse_log_file(log, "finelog.log", budget=_aimed(log, 1.5))
    again = parse_log_file(log, "finelog.log", budget=_aimed(log, 3.01))
    for name in ("metrics", "timers", "phases", "engines", "progress", "batches", "errors"):
        assert_frame_equal(getattr(again, name), getattr(plain, name))
    assert again.summary == plain.summary


class _Synchronous(ThreadPoolExecutor):
    """Runs each task at once, in the caller's thread: every scan is done when it is handed on,
    so a chunk taken to make room always joins every scan pending (the most it can take)."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def _in_flight_at_parses(
    monkeypatch: pytest.MonkeyPatch, path: Path, budget: MemoryBudget
) -> list[int]:
    """For each chunk parse of `path` (scans run synchronously; a chunk joins every scan pending,
    `JOIN_BYTES` being three reads): the bytes handed to scans and not in a chunk parsed so far,
    the chunk being parsed excluded (what is scanned meanwhile)."""
    handed: list[int] = []
    parsed: list[int] = []
    found: list[int] = []
    parse_chunk = reader.parse_chunk

    class Recording(_Synchronous):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
            if fn is reader.scan:
                handed.append(args[0].size)
            return super().submit(fn, *args, **kwargs)

    def recorded_parse(chunk: Scan, *args: Any, final: bool, **kwargs: Any) -> Any:
        parsed.append(chunk.size)
        found.append(sum(handed) - sum(parsed))
        return parse_chunk(chunk, *args, final=final, **kwargs)

    monkeypatch.setattr(reader, "ThreadPoolExecutor", Recording)
    monkeypatch.setattr(reader, "parse_chunk", recorded_parse)
    monkeypatch.setattr(reader, "JOIN_BYTES", 3 * budget.chunk_bytes)
    parse_log_file(path, "finelog.log", budget=budget)
    monkeypatch.undo()
    assert sum(parsed) == path.stat().st_size
    return found


def test_the_next_read_is_handed_on_before_the_chunk_that_made_room_is_parsed(
    log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk taken from the scans to make room for the next read is parsed after that read is
    handed to the scan thread, when the budget holds the chunk as one more read: every parse but
    the last has a read being scanned beside it, even when the chunk took every scan pending.
    With room for 1.9 reads, just short of the two that holding a chunk needs (the chunk and the
    next read), each chunk is parsed before the next read is handed on, as before. The tables
    are the same."""
    roomy = MemoryBudget(limit_bytes=8 * 2**30, chunk_bytes=MB // 4, aim_bytes=8 * 2**30)
    found = _in_flight_at_parses(monkeypatch, log, roomy)
    assert len(found) > 5 and all(bytes_ > 0 for bytes_ in found[:-1])
    tight = _aimed(log, 1.9, MB // 4)
    assert _in_flight_at_parses(monkeypatch, log, tight)[:-1].count(0) > 5
    plain = parse_log_file(log, "finelog.log", budget=_aimed(log, 1.9, MB // 4))
    again = parse_log_file(log, "finelog.log", budget=roomy)
    for name in ("metrics", "timers", "phases", "engines", "progress", "batches", "errors"):
        assert_frame_equal(getattr(again, name), getattr(plain, name))
    assert again.summary == plain.summary


def _done(piece: Scan) -> Future[Scan]:
    future: Future[Scan] = Future()
    future.set_result(piece)
    return future


def _records(count: int, first_step: int) -> bytes:
    pairs = ", ".join(f'"k{j}": {j}.5' for j in range(20))
    return b"".join(
        f"WANDB_MIRROR kind=train step={first_step + i} metrics={{{pairs}}}\n".encode()
        for i in range(count)
    )


@pytest.mark.parametrize(
    ("extra", "held"), [(0, True), (-1, False)], ids=["room", "one-byte-short"]
)
def test_a_chunk_is_held_only_when_the_room_holds_it_at_its_own_cost(
    extra: int, held: bool
) -> None:
    """The room for holding a chunk taken to make room (`_holds`) is reckoned at that chunk's
    cost, not the last chunk's: after a busy stretch (~0.1 bytes of frames per byte read), a
    chunk of dense records (~6) is held only when the room has space for two reads of its cost
    beside nothing else; one byte short, it is parsed at once, before the next read is handed on."""
    busy = b"".join(
        b"INFO 03-26 21:54:25 [loggers.py:1] nothing here %d\n" % i for i in range(3000)
    )
    reads = [_records(100, 100 * i) for i in range(3)]
    scans = [scan(Read(data, len(data), False)) for data in reads]
    density = max(piece.density for piece in scans)
    per_read = (budget_module._SCAN_READS + budget_module._DENSITY_COPIES * density) * MB
    aim = math.ceil(budget_module._FIXED + 2 * per_read) + extra
    budget = MemoryBudget(limit_bytes=8 * 2**30, chunk_bytes=MB, aim_bytes=aim)
    chunks = reader._Chunks(ParserState.initial(None), "finelog.log", budget, Held())
    chunks.learn(scan(Read(busy, len(busy), False)))
    assert chunks.density < 0.2 and density > 5
    pending = deque(_done(piece) for piece in scans)
    taken = reader._make_room(pending, chunks)
    assert not pending  # the three scans joined into one chunk
    assert (taken is not None) is held
    assert len(chunks.committed) == (0 if held else 1)
    if taken is not None:
        assert taken.size == sum(len(data) for data in reads)


@pytest.mark.parametrize(
    ("content", "parses"),
    [
        (b"WANDB_MIRROR kind=train step=1 metrics={}\n", 1),  # one read, an empty final read
        (b"one\n" * 1000, 1),
        (b"one\ntwo\nno newline at the end", 2),  # the final read holds a line
    ],
    ids=["one-line", "lines", "unterminated"],
)
def test_a_small_file_is_one_chunk_parse(
    content: bytes, parses: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file of one read is parsed once (its empty final read holds nothing and needs no room:
    it is parsed with it); a final read that holds a line is a chunk of its own."""
    path = tmp_path / "finelog.log"
    path.write_bytes(content)
    _, sizes = _parses_and_scans(monkeypatch, path, MemoryBudget.for_logs(len(content)))
    assert len(sizes) == parses and sum(sizes) == len(content)


@pytest.mark.parametrize(
    ("content", "scanned"),
    [
        (b"", [0]),  # nothing but the empty final read: it is the file
        (b"one\n", [4]),
        (b"one\ntwo\nno newline at the end", [8, 21]),  # the final read holds a line
    ],
    ids=["empty", "one-line", "unterminated"],
)
def test_without_a_cache_an_empty_final_read_is_not_scanned(
    content: bytes, scanned: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty final read holds nothing: the read before it ends the last chunk. A final read
    that holds a line, or the only read of an empty file, is scanned."""
    path = tmp_path / "finelog.log"
    path.write_bytes(content)
    found: list[int] = []
    _parses_and_scans(monkeypatch, path, MemoryBudget.for_logs(len(content)), found)
    assert found == scanned


def test_every_read_but_an_empty_final_one_is_scanned(
    log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with log.open("rb") as handle:
        sizes = [read.size for read in _reads(handle, 3 * MB)]
    assert sizes[-1] == 0 and all(sizes[:-1])
    found: list[int] = []
    _parses_and_scans(monkeypatch, log, _roomy(log), found)
    assert found == sizes[:-1]
