"""Reading one log file: chunks through the parser, with or without the incremental cache.

One read-ahead thread scans the next read while the main thread parses the chunk before it; the
rows kept are checked against the budget after each chunk (docs/parsing.md). A file is opened once
and everything is read from that descriptor (a bundle's comes opened by `BundleFiles.open`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import date, datetime
from io import BufferedReader
from pathlib import Path
from typing import Final

import polars as pl

from worker.evidence.failures.rows import annotate
from worker.evidence.logs import detect
from worker.evidence.logs.budget import Held, ParseBudget
from worker.evidence.logs.chunk import TABLES, parse_chunk
from worker.evidence.logs.incremental import CacheEntry, EntryCache, cache_key, entry_for
from worker.evidence.logs.reads import iter_reads, read_tail, split_lines
from worker.evidence.logs.rules import LINE_MAX_BYTES
from worker.evidence.logs.scan import Scan, scan
from worker.evidence.logs.state import ParserState
from worker.evidence.logs.stitch import Stitched, build_tables, restitch, stitch
from worker.evidence.parsed import ClockSkew, LogTables, ParseSummary

__all__ = ["FileRows", "compression", "parse_file_rows", "parse_log_file"]

_LOGURU_TS: Final = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) \|"
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


@dataclass
class _Run:
    """A file read to its end: the rows up to the last safe cut (`committed`, and the state
    there), the rows of the final chunk (`tail`), the state after it and the bytes read."""

    committed: list[dict[str, pl.DataFrame]]
    committed_state: ParserState
    tail: dict[str, pl.DataFrame]
    state: ParserState
    bytes_read: int


@dataclass
class _Chunks:
    """Scans parsed in order, the lines after each cut carried on; after each chunk the rows kept
    (`kept`: with those of a cache entry) are checked against the budget."""

    state: ParserState
    source: str
    budget: ParseBudget
    kept: Held
    carry: Scan | None = None

    def __post_init__(self) -> None:
        self.committed: list[dict[str, pl.DataFrame]] = []

    def _joined(self, piece: Scan | None) -> Scan | None:
        carry, self.carry = self.carry, None
        if carry is None or piece is None:
            return carry or piece
        return carry.then(piece)

    def _parse(self, chunk: Scan, *, final: bool) -> dict[str, pl.DataFrame]:
        rows, self.carry = parse_chunk(chunk, self.state, self.source, final=final)
        self.kept.add(rows)
        self.budget.check(self.kept, self.source, self.state.line, self.state.offset)
        return rows

    def add(self, piece: Scan) -> None:
        """The chunk of `piece` and the lines carried parsed; its open end carried on."""
        chunk = self._joined(piece)
        if chunk is not None and chunk.size:
            self.committed.append(self._parse(chunk, final=False))

    def finish(self, piece: Scan | None) -> _Run:
        """The last chunk (`piece` and the lines carried) parsed as the final one."""
        saved = self.state.copy()
        chunk = self._joined(piece)
        tail = self._parse(chunk, final=True) if chunk is not None else {}
        bytes_read = saved.offset + (chunk.size if chunk is not None else 0)
        return _Run(self.committed, saved, tail, self.state, bytes_read)


def _run(log: BufferedReader, chunks: _Chunks, *, cache: bool) -> _Run:
    """Read `log` from the state's offset, each read scanned in the read-ahead thread while the
    chunk before it is parsed."""
    log.seek(chunks.state.offset)
    reads = iter_reads(log, chunks.budget.chunk_bytes)
    native = chunks.budget.native

    def scanned() -> tuple[bool, bool, Scan]:
        """Whether the next read is the last, whether it ends a line, and its scan."""
        read = next(reads)
        whole = read.data[read.end - 1 : read.end] == b"\n"
        return read.final, whole, scan(read, native=native)

    with ThreadPoolExecutor(1, thread_name_prefix="rlhealth-read") as ahead:
        pending: Future[tuple[bool, bool, Scan]] = ahead.submit(scanned)
        try:
            while True:
                final, whole, piece = pending.result()
                if final:
                    break
                pending = ahead.submit(scanned)
                chunks.add(piece)
        except BaseException:
            pending.cancel()
            raise
        if cache and whole:  # complete lines: the cache keeps every row up to the last safe cut
            chunks.add(piece)
            return chunks.finish(None)
        return chunks.finish(piece)


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


def _size(log: BufferedReader) -> int:
    return os.fstat(log.fileno()).st_size


def _stitch_committed(
    hit: CacheEntry | None, committed: dict[str, pl.DataFrame], run: _Run
) -> Stitched:
    if hit is None or hit.stitched is None:
        return stitch(committed)
    return restitch(hit.stitched, committed, run.committed)


def _read_file(
    path: Path,
    log: BufferedReader,
    source: str,
    reference_date: date | None,
    cache: EntryCache | None,
    budget: ParseBudget,
    *,
    stitched: bool,
) -> tuple[FileRows, Stitched | None]:
    """The raw rows of the open file `log` and, with `stitched`, their stitched tables (with a
    cache, kept in its entry). A compressed file is not read (a note says so)."""
    size = _size(log)
    packed = compression(log)
    if packed is not None:
        note = f"{source} is {packed}-compressed: not read (the logs must be synced as text)"
        return FileRows({}, ParseSummary(files=(source,), bytes=size, notes=(note,))), None
    key = cache_key(path, source, reference_date)
    hit = cache.lookup(key, log) if cache is not None else None
    state = hit.state.copy() if hit else ParserState.initial(reference_date)
    kept = Held()
    if hit is not None:
        kept.add(hit.rows)
    chunks = _Chunks(state, source, budget, kept)
    run = _run(log, chunks, cache=cache is not None)
    committed = _concat(([hit.rows] if hit else []) + run.committed)
    rows = _concat([committed, run.tail])
    known = _stitch_committed(hit, committed, run) if cache is not None and stitched else None
    if cache is not None:
        entry = entry_for(log, run.bytes_read, run.committed_state, committed, known)
        cache.store(key, entry)
    final = restitch(known, rows, [run.tail]) if known is not None else None
    tail_ts = _tail_timestamp(log, run.bytes_read)
    if "errors" in rows:
        rows["errors"] = annotate(rows["errors"])
    n_errors = rows["errors"].height if "errors" in rows else 0
    summary = _summary(run.state, source, run.bytes_read, tail_ts, n_errors)
    held = Held()
    held.add(rows)
    budget.keep(held)
    return FileRows(rows, summary), final


def _budget(
    log: BufferedReader, budget: ParseBudget | None, chunk_bytes: int | None
) -> ParseBudget:
    budget = budget or ParseBudget.for_logs(_size(log))
    return budget if chunk_bytes is None else replace(budget, chunk_bytes=chunk_bytes)


def parse_file_rows(
    path: Path,
    source: str,
    *,
    reference_date: date | None = None,
    cache: EntryCache | None = None,
    chunk_bytes: int | None = None,
    budget: ParseBudget | None = None,
    opened: BufferedReader | None = None,
) -> FileRows:
    """The raw rows of one file (`opened`, a bundle's, its owner closes it; else `path`), reusing
    and refreshing `cache`; `LogBudgetError` when it cannot be read within `budget`."""
    with nullcontext(opened) if opened is not None else path.open("rb") as log:
        limits = _budget(log, budget, chunk_bytes)
        return _read_file(path, log, source, reference_date, cache, limits, stitched=False)[0]


def parse_log_file(
    path: Path,
    source: str,
    *,
    reference_date: date | None = None,
    cache: EntryCache | None = None,
    chunk_bytes: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    budget: ParseBudget | None = None,
) -> LogTables:
    """The tables of one log file; `source` is the name written in provenance columns.
    `progress` is told `(source, 0, size)` before the read. `LogBudgetError` when the file
    cannot be read within `budget` (default: for its size, within RLHEALTH_PARSE_MEMORY_MB)."""
    with path.open("rb") as log:
        if progress is not None:
            progress(source, 0, _size(log))
        limits = _budget(log, budget, chunk_bytes)
        found, stitched = _read_file(
            path, log, source, reference_date, cache, limits, stitched=True
        )
    return build_tables(found.rows, found.summary, stitched)
