"""Reading one log file: chunks through the parser, with or without the incremental cache.

Reads are scanned (split, classified, stat lines read) in a worker thread, up to `PREFETCH` reads
ahead, while the main thread parses the chunks in order; polars releases the GIL, so a scan and a
parse run on two cores at once. One scan thread, not two: polars runs each query on its own pool
too, and on a two-core machine a second scan thread gave the same wall time with ~9 MB more peak
memory (docs/performance.md, issue 12, sixth round).

Each chunk parse has a fixed cost (~140 small queries), so the short first read is parsed with
the next one when both are scanned at once (the budget has room for two reads), and without a
cache an empty final read (the usual one) is not scanned: the chunk before it is the final chunk,
not a scan and a parse of nothing. Until a scan is seen the budget assumes the worst cost of a
read; the first scan is waited for, not parsed, to learn the cost (`_make_room`), so the next
reads are scanned while the first chunk is parsed. A file of one read is one chunk parse. A
chunk taken to make room for the next read is parsed after that read is handed on, when the
budget's room holds the chunk as one more read (`_holds`): the scan thread then has a read to
scan while the chunk is parsed.

A file is opened once and everything is read from that one descriptor: its size, its head (is it
compressed?), the cache's identity checks, the reads and the tail. A bundle's log comes opened
(`BundleFiles.open`: beneath the job directory's descriptor, no symlink followed), so a file
swapped after it was checked is never the one read; a file the operator names is opened here.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import date, datetime
from io import BufferedReader
from pathlib import Path
from typing import Final

import polars as pl

from worker.evidence.logs import detect, errors, native
from worker.evidence.logs.budget import Held, MemoryBudget
from worker.evidence.logs.chunk import TABLES, parse_chunk
from worker.evidence.logs.incremental import CacheEntry, LogCache, cache_key, entry_for
from worker.evidence.logs.lines import LINE_MAX_BYTES, Read, read_tail, split_lines
from worker.evidence.logs.prelude import Prelude, Taken
from worker.evidence.logs.reads import FIRST_READ_BYTES, first_reads
from worker.evidence.logs.scan import Scan, scan
from worker.evidence.logs.state import ParserState
from worker.evidence.logs.stitch import Stitched, build_tables, restitch, stitch
from worker.evidence.parsed import ClockSkew, LogTables, ParseSummary

__all__ = [
    "COMPRESSED_MAGIC",
    "FIRST_READ_BYTES",
    "FileRows",
    "compression",
    "parse_file_rows",
    "parse_log_file",
]

_LOGURU_TS: Final = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) \|"
PREFETCH: Final = 2
_WORKERS: Final = 1
_WORST_DENSITY: Final = 4.0
# Scans already done are parsed as one chunk until it holds this many bytes (`_ready`).
JOIN_BYTES: Final = 32 * 2**20
# A log file that starts with one of these is compressed: it is not read (a few MB of gzip can
# expand to more than any budget), the report says so.
COMPRESSED_MAGIC: Final = {
    b"\x1f\x8b": "gzip",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x04\x22\x4d\x18": "lz4",
    b"PK\x03\x04": "zip",
    b"7z\xbc\xaf\x27\x1c": "7z",
}


@dataclass(frozen=True)
class FileRows:
    """The raw (unstitched) rows of one file and its summary."""

    rows: dict[str, pl.DataFrame]
    summary: ParseSummary


def _concat(parts: list[dict[str, pl.DataFrame]]) -> dict[str, pl.DataFrame]:
    return {
        name: pl.concat([p[name] for p in parts if name in p], how="vertical")
        for name in TABLES
        if any(name in p for p in parts)
    }


@dataclass(frozen=True)
class _Early:
    """The stitched tables of the first `parts` committed parts, made in the pool."""

    parts: int
    stitched: Future[Stitched]


@dataclass
class _Run:
    committed: list[dict[str, pl.DataFrame]]
    committed_state: ParserState
    tail: dict[str, pl.DataFrame]
    state: ParserState
    bytes_read: int
    early: _Early | None = None

    def stitched(self, rows: dict[str, pl.DataFrame]) -> Stitched | None:
        """The stitched tables of `rows` (this run's rows) from `early`, when it was made."""
        if self.early is None:
            return None
        fresh = [*self.committed[self.early.parts :], self.tail]
        return restitch(self.early.stitched.result(), rows, fresh)


class _Chunks:
    """Scans parsed in order; the lines after each cut are carried into the next chunk.

    After each chunk the rows kept (with `kept`, those of a cache entry) are checked against the
    budget: a parse that could not finish within it stops with `LogBudgetError`.
    """

    def __init__(self, state: ParserState, source: str, budget: MemoryBudget, kept: Held) -> None:
        self.state = state
        self.source = source
        self.budget = budget
        self.kept = kept
        self.carry: Scan | None = None
        self.committed: list[dict[str, pl.DataFrame]] = []
        self.early: _Early | None = None
        # the last scan's frames for each byte read (records: ~3; busy: ~0.2); until a scan is
        # seen, the worst is assumed, so the first reads of a tight budget are not run at once
        self.density = _WORST_DENSITY
        self.seen = False

    def learn(self, piece: Scan) -> None:
        """What a read of this log costs, from the scan `piece` (`room`)."""
        self.density = piece.density
        self.seen = True

    def add(self, piece: Scan) -> None:
        self.learn(piece)
        chunk = self.carry.then(piece) if self.carry is not None else piece
        rows, self.carry = parse_chunk(chunk, self.state, self.source, final=False)
        self.committed.append(rows)
        self.kept.add(rows)
        self.budget.check(self.kept, self.source, self.state.line, self.state.offset)

    def room(self, in_flight: int) -> bool:
        """True when one more read may be scanned beside the `in_flight` ones."""
        return self.budget.room(self.kept, in_flight + 1, self.density)

    def finish(self, piece: Scan) -> _Run:
        """The last chunk parsed (`final`: open blocks closed) and checked against the budget."""
        saved = self.state.copy()
        chunk = self.carry.then(piece) if self.carry is not None else piece
        tail, _ = parse_chunk(chunk, self.state, self.source, final=True)
        self.kept.add(tail)
        self.budget.check(self.kept, self.source, self.state.line, self.state.offset)
        bytes_read = saved.offset + chunk.size
        return _Run(self.committed, saved, tail, self.state, bytes_read, self.early)


def _reads(handle: BufferedReader, chunk_bytes: int) -> Iterator[Read]:
    """`reads.first_reads`: a short first read, then `chunk_bytes` each."""
    return first_reads(handle, chunk_bytes)


def _joined(piece: Scan, other: Scan) -> Scan:
    # `then` does not carry the cost of a read (density): the costlier one is kept
    return replace(piece.then(other), density=max(piece.density, other.density))


def _ready(pending: deque[Future[Scan]], keep: int, *, first: bool = False) -> Scan:
    """The first pending scan (waited for), followed by the next ones already done, up to
    JOIN_BYTES in all and leaving `keep` pending: one chunk parse for several reads when the
    parse is behind (each parse has a fixed cost). `first`: the file's first chunk, whose short
    first read (`reads.first_reads`) is joined with the next read even if it is not yet done."""
    piece = pending.popleft().result()
    if first and len(pending) > keep and piece.size <= FIRST_READ_BYTES:
        piece = _joined(piece, pending.popleft().result())
    while len(pending) > keep and pending[0].done() and piece.size < JOIN_BYTES:
        piece = _joined(piece, pending.popleft().result())
    return piece


def _make_room(pending: deque[Future[Scan]], chunks: _Chunks) -> Scan | None:
    """Parse pending scans until one more read may be scanned: at most PREFETCH + 1 in flight,
    within the budget's room. Until a scan is seen the room assumes the worst cost, so the first
    scan is waited for (not parsed) to learn the cost: the next reads are then scanned while the
    first chunk is parsed.

    The last chunk taken to make room is returned, not parsed, when the room holds it as one more
    read beside those in flight: the caller hands the next read to the scan thread first and then
    parses it (`_scan_reads`), so the scan thread is not left idle while the chunk is parsed."""
    while pending and (len(pending) > PREFETCH or not chunks.room(len(pending))):
        if not chunks.seen:
            chunks.learn(pending[0].result())
            continue
        piece = _ready(pending, keep=0, first=not chunks.committed)
        chunks.learn(piece)  # holding it is reckoned at its own cost, not the last chunk's
        if _holds(pending, chunks):
            return piece
        chunks.add(piece)
    return None


def _holds(pending: deque[Future[Scan]], chunks: _Chunks) -> bool:
    """Whether one more read may be scanned while a chunk taken from the scans is still held
    (counted as one more read in flight, as its frames are while it is parsed)."""
    return len(pending) <= PREFETCH and chunks.room(len(pending) + 1)


def _scan_reads(
    reads: Iterator[tuple[Read, native.Raw | None]],
    pending: deque[Future[Scan]],
    pool: ThreadPoolExecutor,
    chunks: _Chunks,
    *,
    whole: bool,
) -> None:
    """Hand the reads to scans in order, each once there is room (`_make_room`). With `whole`,
    an empty final read after others is not scanned: the reads before it are the last chunk."""
    for read, passed in reads:
        if whole and read.final and not read.size and pending:
            return
        # an empty final read holds nothing: no room is needed
        taken = _make_room(pending, chunks) if read.size else None
        pending.append(pool.submit(scan, read, passed))
        if taken is not None:  # parsed while the read just handed on is scanned
            chunks.add(taken)
        if read.final:
            return


def _stitch_parts(parts: list[dict[str, pl.DataFrame]]) -> Stitched:
    return stitch(_concat(parts))


def _sources(
    handle: BufferedReader, chunk_bytes: int, taken: Taken | None
) -> Iterator[tuple[Read, native.Raw | None]]:
    """The reads of `handle` (from where it is), with the native passes a prelude made."""
    if taken is not None:
        return taken.reads()
    return ((read, None) for read in _reads(handle, chunk_bytes))


def _run(
    log: BufferedReader,
    state: ParserState,
    source: str,
    chunks: _Chunks,
    chunk_bytes: int,
    *,
    early: bool,
    whole: bool = False,
    prelude: Prelude | None = None,
) -> _Run:
    """Scan reads ahead in the pool, as many as the budget has room for (at most PREFETCH + 1),
    while the chunks are parsed in order; on `LogBudgetError` the reads not begun are dropped.

    With `early`, once every read is scanned or queued, the rows committed so far are stitched in
    the pool while the last chunks are parsed (`_Run.early`): only the steps of those chunks are
    stitched again at the end (`restitch`). With `prelude` (reading this file from its start with
    this read size), its reads and handle are taken: the same reads, some already passed. With
    `whole` (no cache: the rows before the final read are not kept apart), an empty final read
    is not scanned: the chunk before it is the final chunk, not a parse of nothing."""
    pending: deque[Future[Scan]] = deque()
    taken = prelude.take(chunk_bytes) if prelude is not None and state.offset == 0 else None
    if taken is not None:  # read before the budget first read the RSS: the parse's own
        chunks.budget.held_before(taken.held)
    # the prelude's handle is closed here; the caller's `log` is its own to close
    opened: AbstractContextManager[BufferedReader] = (
        taken.handle if taken is not None else nullcontext(log)
    )
    with opened as handle, ThreadPoolExecutor(_WORKERS) as pool:
        try:
            if taken is None:
                handle.seek(state.offset)
            _scan_reads(_sources(handle, chunk_bytes, taken), pending, pool, chunks, whole=whole)
            if early and chunks.committed:
                parts = list(chunks.committed)
                chunks.early = _Early(len(parts), pool.submit(_stitch_parts, parts))
            while len(pending) > 1:
                chunks.add(_ready(pending, keep=1, first=not chunks.committed))
            return chunks.finish(pending.popleft().result())
        except BaseException:
            for future in pending:
                future.cancel()
            raise


def _tail_timestamp(log: BufferedReader, size: int) -> datetime | None:
    lines = split_lines(read_tail(log, size)).to_frame()
    stamps = lines.select(
        detect.strip_sgr(pl.col("line"))
        .str.extract(_LOGURU_TS, 1)
        .str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us", time_zone="UTC")
        .max()
    ).item()
    return stamps if isinstance(stamps, datetime) else None


def _notes(state: ParserState, source: str) -> tuple[str, ...]:
    """What the report must say about how this file was read."""
    if not state.cut_lines:
        return ()
    plural = "s" if state.cut_lines > 1 else ""
    return (
        f"{source}: {state.cut_lines:,} line{plural} longer than {LINE_MAX_BYTES:,} bytes cut "
        f"(kept with a marker): {'; '.join(state.cut_examples)}",
    )


def _summary(
    state: ParserState, source: str, size: int, tail_ts: datetime | None, n_errors: int
) -> ParseSummary:
    # the tail's raw loguru time is not reconciled with the Iris prefix: unused when they disagree
    tail_ts = tail_ts if state.skew_off_lines == 0 else None
    last = max((t for t in (state.last_ts, tail_ts) if t is not None), default=None)
    records = {**state.records, "error": n_errors} if n_errors else dict(state.records)
    return ParseSummary(
        files=(source,),
        lines=state.line,
        bytes=size,
        records=dict(sorted(records.items())),
        malformed=state.malformed,
        malformed_examples=tuple(state.malformed_examples),
        serializations=tuple(sorted(k for k, v in records.items() if v)),
        first_timestamp=state.first_ts,
        last_timestamp=last,
        head=tuple(state.head),
        head_lines=tuple(state.head_lines),
        clock=ClockSkew(
            lines=state.skew_lines,
            min_s=state.skew_min_s,
            max_s=state.skew_max_s,
            off_lines=state.skew_off_lines,
            first_line=state.skew_first_line,
            source=source,
            replayed=state.replayed_lines,
            replayed_examples=tuple(state.replayed_examples),
        ),
        cut_lines=state.cut_lines,
        cut_examples=tuple(state.cut_examples),
        notes=_notes(state, source),
    )


def compression(log: BufferedReader) -> str | None:
    """The compression format the open file starts with (`gzip`, `zstd`, ...), or None."""
    head = os.pread(log.fileno(), 8, 0)
    return next((name for magic, name in COMPRESSED_MAGIC.items() if head.startswith(magic)), None)


def _unread(source: str, size: int, note: str) -> FileRows:
    return FileRows({}, ParseSummary(files=(source,), bytes=size, notes=(note,)))


def _stitch_committed(
    hit: CacheEntry | None, committed: dict[str, pl.DataFrame], run: _Run
) -> Stitched:
    if hit is None or hit.stitched is None:
        return stitch(committed)
    return restitch(hit.stitched, committed, run.committed)


@dataclass(frozen=True)
class _Options:
    reference_date: date | None
    cache: LogCache | None
    budget: MemoryBudget
    chunk_bytes: int
    stitched: bool  # keep the stitched tables of the committed rows in the cache entry
    early: bool = False  # stitch the first rows while the last chunks are parsed (one file)
    prelude: Prelude | None = None  # this file's first reads, begun before polars was imported


def _store(
    cache: LogCache,
    key: str,
    log: BufferedReader,
    run: _Run,
    rows: dict[str, pl.DataFrame],
    known: Stitched | None,
) -> None:
    cache.store(key, entry_for(log, run.bytes_read, run.committed_state, rows, known))


@contextmanager
def _log_file(path: Path, opened: BufferedReader | None) -> Iterator[BufferedReader]:
    """`opened` (its owner closes it), else `path` opened here (a file the operator named)."""
    if opened is not None:
        yield opened
        return
    with path.open("rb") as handle:
        yield handle


def _size(log: BufferedReader) -> int:
    return os.fstat(log.fileno()).st_size


def _read_file(
    path: Path, source: str, opts: _Options, log: BufferedReader
) -> tuple[FileRows, Stitched | None]:
    """The raw rows of one file (`log`, open: every read is of it) and, with a cache and
    `opts.stitched`, their stitched tables.

    The stitched tables of the committed rows are cached with them, so the next parse re-stitches
    only the steps its new rows touch. A compressed file is not read (a note says so).
    """
    size = _size(log)
    packed = compression(log)
    if packed is not None:
        note = f"{source} is {packed}-compressed: not read (the logs must be synced as text)"
        return _unread(source, size, note), None
    cache = opts.cache
    key = cache_key(path, source, opts.reference_date)
    hit = cache.lookup(key, log) if cache is not None else None
    state = hit.state.copy() if hit else ParserState.initial(opts.reference_date)
    kept = Held()
    if hit is not None:
        kept.add(hit.rows)
    chunks = _Chunks(state, source, opts.budget, kept)
    run = _run(
        log,
        state,
        source,
        chunks,
        opts.chunk_bytes,
        early=opts.early and hit is None,
        whole=cache is None,
        prelude=opts.prelude,
    )
    committed = _concat(([hit.rows] if hit else []) + run.committed)
    rows = _concat([committed, run.tail])
    known = _stitch_committed(hit, committed, run) if cache is not None and opts.stitched else None
    if cache is not None:
        _store(cache, key, log, run, committed, known)
    final = restitch(known, rows, [run.tail]) if known is not None else run.stitched(rows)
    tail_ts = _tail_timestamp(log, run.bytes_read)
    if "errors" in rows:
        rows["errors"] = errors.annotate(rows["errors"])
    n_errors = rows["errors"].height if "errors" in rows else 0
    summary = _summary(run.state, source, run.bytes_read, tail_ts, n_errors)
    held = Held()
    held.add(rows)
    opts.budget.keep(held)
    return FileRows(rows, summary), final


def _options(
    size: int,
    reference_date: date | None,
    cache: LogCache | None,
    chunk_bytes: int | None,
    budget: MemoryBudget | None,
    *,
    stitched: bool,
    early: bool = False,
    prelude: Prelude | None = None,
) -> _Options:
    budget = budget or MemoryBudget.for_logs(size)
    chunk = chunk_bytes if chunk_bytes is not None else budget.chunk_bytes
    return _Options(reference_date, cache, budget, chunk, stitched, early, prelude)


def parse_file_rows(
    path: Path,
    source: str,
    *,
    reference_date: date | None = None,
    cache: LogCache | None = None,
    chunk_bytes: int | None = None,
    budget: MemoryBudget | None = None,
    opened: BufferedReader | None = None,
) -> FileRows:
    """The raw rows of one file, reusing and refreshing `cache` when given.

    `budget` (default: for this file's size) bounds the memory; `LogBudgetError` when the file
    cannot be read within it. `chunk_bytes` overrides the budget's read size (tests). `opened`:
    the file already open (a bundle's, `BundleFiles.open`), read instead of opening `path`.
    """
    with _log_file(path, opened) as log:
        opts = _options(_size(log), reference_date, cache, chunk_bytes, budget, stitched=False)
        return _read_file(path, source, opts, log)[0]


def parse_log_file(
    path: Path,
    source: str,
    *,
    reference_date: date | None = None,
    cache: LogCache | None = None,
    chunk_bytes: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    budget: MemoryBudget | None = None,
    prelude: Prelude | None = None,
) -> LogTables:
    """The tables of one log file; `source` is the name written in provenance columns.
    `progress` is told `(source, 0, size)` before the read. `LogBudgetError` when the file
    cannot be read within `budget` (default: 1.5x its size, at most RLHEALTH_PARSE_MEMORY_MB).
    `prelude`: reads of `path` begun before polars was imported (`prelude.Prelude.start`), used
    when they are those this parse would make; it is closed (its thread joined) on return."""
    try:
        with path.open("rb") as log:
            if progress is not None:
                progress(source, 0, _size(log))
            with_cache = cache is not None
            opts = _options(
                _size(log),
                reference_date,
                cache,
                chunk_bytes,
                budget,
                stitched=with_cache,
                early=not with_cache,
                prelude=prelude,
            )
            found, stitched = _read_file(path, source, opts, log)
    finally:
        if prelude is not None:
            prelude.close()
    return build_tables(found.rows, found.summary, stitched)
