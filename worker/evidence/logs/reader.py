"""Reading one log file: chunks through the parser, with or without the incremental cache."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Final

import polars as pl

from worker.evidence.logs import detect
from worker.evidence.logs.chunk import TABLES, parse_chunk
from worker.evidence.logs.incremental import HEAD_BYTES, CacheEntry, LogCache, cache_key, head_hash
from worker.evidence.logs.lines import CHUNK_BYTES, iter_reads, read_tail, split_lines
from worker.evidence.logs.state import ParserState
from worker.evidence.logs.stitch import build_tables
from worker.evidence.model import LogTables, ParseSummary

__all__ = ["FileRows", "parse_file_rows", "parse_log_file"]

_LOGURU_TS: Final = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) \|"


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
    committed: list[dict[str, pl.DataFrame]]
    committed_state: ParserState
    tail: dict[str, pl.DataFrame]
    state: ParserState
    bytes_read: int


def _run(path: Path, state: ParserState, source: str, chunk_bytes: int) -> _Run:
    committed: list[dict[str, pl.DataFrame]] = []
    pending = b""
    with path.open("rb") as handle:
        handle.seek(state.offset)
        for data in iter_reads(handle, chunk_bytes):
            end = data.rfind(b"\n") + 1
            if end == 0:
                pending += data
                continue
            # One copy: the carried bytes joined with the complete lines of this read.
            raw = b"".join((pending, memoryview(data)[:end]))
            rows, used = parse_chunk(raw, state, source, final=False)
            committed.append(rows)
            pending = raw[used:] + data[end:]
    saved = state.copy()
    tail, _ = parse_chunk(pending, state, source, final=True)
    return _Run(committed, saved, tail, state, saved.offset + len(pending))


def _tail_timestamp(path: Path, size: int) -> datetime | None:
    lines = split_lines(read_tail(path, size)).to_frame()
    stamps = lines.select(
        detect.strip_sgr(pl.col("line"))
        .str.extract(_LOGURU_TS, 1)
        .str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us", time_zone="UTC")
        .max()
    ).item()
    return stamps if isinstance(stamps, datetime) else None


def _summary(state: ParserState, source: str, size: int, tail_ts: datetime | None) -> ParseSummary:
    last = max((t for t in (state.last_ts, tail_ts) if t is not None), default=None)
    return ParseSummary(
        files=(source,),
        lines=state.line,
        bytes=size,
        records=dict(sorted(state.records.items())),
        malformed=state.malformed,
        malformed_examples=tuple(state.malformed_examples),
        serializations=tuple(sorted(k for k, v in state.records.items() if v)),
        first_timestamp=state.first_ts,
        last_timestamp=last,
        head=tuple(state.head),
    )


def parse_file_rows(
    path: Path,
    source: str,
    *,
    reference_date: date | None = None,
    cache: LogCache | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> FileRows:
    """The raw rows of one file, reusing and refreshing `cache` when given."""
    key = cache_key(path, source, reference_date)
    hit = cache.lookup(key, path) if cache is not None else None
    state = hit.state.copy() if hit else ParserState.initial(reference_date)
    run = _run(path, state, source, chunk_bytes)
    committed = _concat(([hit.rows] if hit else []) + run.committed)
    if cache is not None:
        head_len = min(HEAD_BYTES, run.bytes_read)
        entry = CacheEntry(
            inode=path.stat().st_ino,
            size=run.bytes_read,
            head_len=head_len,
            head_hash=head_hash(path, head_len),
            state=run.committed_state,
            rows=committed,
        )
        cache.store(key, entry)
    rows = _concat([committed, run.tail])
    tail_ts = _tail_timestamp(path, run.bytes_read)
    return FileRows(rows, _summary(run.state, source, run.bytes_read, tail_ts))


def parse_log_file(
    path: Path,
    source: str,
    *,
    reference_date: date | None = None,
    cache: LogCache | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> LogTables:
    """The tables of one log file; `source` is the name written in provenance columns."""
    found = parse_file_rows(
        path, source, reference_date=reference_date, cache=cache, chunk_bytes=chunk_bytes
    )
    return build_tables(found.rows, found.summary)
