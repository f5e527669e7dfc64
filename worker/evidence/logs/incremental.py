"""What a read of a grown log resumes from (docs/parsing.md, "Incremental cache"): a cache entry
(the parser state after the last committed line and the rows before it) and the checks that the
open file is still the file it was made from. The cache that keeps entries (in memory, and on
disk) is `worker.evidence.log_cache.LogCache`; the parser takes any `EntryCache`."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import BinaryIO, Final, Protocol

import polars as pl

from worker.evidence.logs.state import ParserState
from worker.evidence.logs.stitch import Stitched

__all__ = ["CacheEntry", "EntryCache", "cache_key", "entry_for", "span_hash"]

HEAD_BYTES: Final = 4096


def cache_key(path: Path, source: str, reference_date: date | None) -> str:
    """The key of a file's entry."""
    ref = reference_date.isoformat() if reference_date else "-"
    return f"{path.resolve()}|{source}|{ref}"


def span_hash(log: BinaryIO, start: int, length: int) -> str:
    """SHA-256 of `length` bytes of the open file from `start` (its position left as it is)."""
    return hashlib.sha256(_read_at(log.fileno(), start, length)).hexdigest()


def _read_at(fd: int, start: int, length: int) -> bytes:
    """`length` bytes from `start`, fewer only at the end of the file."""
    parts, done = [], 0
    while done < length:
        part = os.pread(fd, length - done, start + done)
        if not part:
            break
        parts.append(part)
        done += len(part)
    return b"".join(parts)


def _before_hash(log: BinaryIO, offset: int) -> str:
    """SHA-256 of the HEAD_BYTES before `offset` ("" at offset 0)."""
    start = max(0, offset - HEAD_BYTES)
    return span_hash(log, start, offset - start) if offset else ""


@dataclass(frozen=True)
class CacheEntry:
    """What a later parse of the same file may reuse."""

    inode: int
    size: int  # bytes read when the entry was made
    head_len: int
    head_hash: str
    state: ParserState  # after the last committed line
    rows: dict[str, pl.DataFrame]  # rows of the committed lines
    stitched: Stitched | None = None  # stitch(rows), when kept
    before_hash: str = ""  # SHA-256 of the HEAD_BYTES before state.offset ("" at offset 0)
    # where it is on disk, when it is: each table's part files, and every file's SHA-256
    parts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)
    part_rows: dict[str, tuple[int, ...]] = field(default_factory=dict)  # rows of each part
    # with `stitched`: how many of its first rows (metrics, phases) equal the `stitched` of the
    # entry it was re-stitched from (the parts on disk that stay)
    stitched_same: dict[str, int] = field(default_factory=dict)

    def matches(self, log: BinaryIO) -> bool:
        """True while the open file is the same file, grown or unchanged."""
        try:
            stat = os.fstat(log.fileno())
            same = stat.st_ino == self.inode and stat.st_size >= self.size
            head = span_hash(log, 0, self.head_len) == self.head_hash
            return same and head and _before_hash(log, self.state.offset) == self.before_hash
        except OSError:
            return False


def entry_for(
    log: BinaryIO,
    size: int,
    state: ParserState,
    rows: dict[str, pl.DataFrame],
    stitched: Stitched | None,
) -> CacheEntry:
    """The entry of the open file read to `size` bytes, committed up to `state.offset`."""
    head_len = min(HEAD_BYTES, size)
    return CacheEntry(
        inode=os.fstat(log.fileno()).st_ino,
        size=size,
        head_len=head_len,
        head_hash=span_hash(log, 0, head_len),
        state=state,
        rows=rows,
        stitched=stitched,
        before_hash=_before_hash(log, state.offset),
    )


class EntryCache(Protocol):
    """What the parser asks of a cache (`worker.evidence.log_cache.LogCache` is one)."""

    def lookup(self, key: str, log: BinaryIO) -> CacheEntry | None:
        """The valid entry for `key` of the open file `log`, or None."""

    def store(self, key: str, entry: CacheEntry) -> None:
        """Keep `entry` for `key`."""

    def keep_stitched(self, key: str) -> None:
        """Keep the stitched tables of `key`'s entries."""

    def stitched(self, key: str, rows: dict[str, pl.DataFrame]) -> Stitched | None:
        """`stitch(rows)` from the entry stored last under `key`, when it can."""
