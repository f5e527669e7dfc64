"""The incremental cache: a grown log is read from its last safe cut point only.

An entry is keyed on the file's path, its source name and the reference date, and is valid while
the file keeps its inode, has not shrunk, and still starts with the same bytes (a hash of its
head). It holds the parser state at the last committed line, the rows read up to there and (when
made by `parse_log_file`) their stitched METRICS and PHASES; the lines after (an open construct, a
partial last line) are read again on every parse. Entries live in an in-process LRU and,
optionally, in a directory (state as JSON, rows and stitched tables as Parquet).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Final

import polars as pl

from worker.evidence.logs.state import ParserState
from worker.evidence.logs.stitch import Stitched

__all__ = ["CacheEntry", "LogCache", "cache_key", "head_hash"]

HEAD_BYTES: Final = 4096
VERSION: Final = "5"  # 5: clock offsets (issue 8) and failure columns in ERRORS (issue 10)
_STITCHED: Final = ("metrics", "phases")


def cache_key(path: Path, source: str, reference_date: date | None) -> str:
    """The key of a file's entry."""
    ref = reference_date.isoformat() if reference_date else "-"
    return f"{VERSION}|{path.resolve()}|{source}|{ref}"


def head_hash(path: Path, length: int) -> str:
    """SHA-256 of the first `length` bytes of `path`."""
    with path.open("rb") as handle:
        return hashlib.sha256(handle.read(length)).hexdigest()


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

    def matches(self, path: Path) -> bool:
        """True while `path` is the same file, grown or unchanged."""
        try:
            stat = path.stat()
            same = stat.st_ino == self.inode and stat.st_size >= self.size
            return same and head_hash(path, self.head_len) == self.head_hash
        except OSError:
            return False


class LogCache:
    """An LRU of cache entries, optionally backed by a directory."""

    def __init__(self, max_entries: int = 64, directory: Path | None = None) -> None:
        self.max_entries = max_entries
        self.directory = directory
        self._entries: OrderedDict[str, CacheEntry] = OrderedDict()

    def lookup(self, key: str, path: Path) -> CacheEntry | None:
        """The valid entry for `key`, or None (a stale entry is dropped)."""
        entry = self._entries.get(key) or self._load(key)
        if entry is None:
            return None
        if not entry.matches(path):
            self._entries.pop(key, None)
            return None
        self._remember(key, entry)
        return entry

    def store(self, key: str, entry: CacheEntry) -> None:
        """Keep `entry` (and write it to the directory when there is one)."""
        self._remember(key, entry)
        if self.directory is not None:
            self._save(key, entry)

    def __len__(self) -> int:
        return len(self._entries)

    def _remember(self, key: str, entry: CacheEntry) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def _folder(self, key: str) -> Path:
        assert self.directory is not None
        return self.directory / hashlib.sha256(key.encode()).hexdigest()[:32]

    def _save(self, key: str, entry: CacheEntry) -> None:
        folder = self._folder(key)
        folder.mkdir(parents=True, exist_ok=True)
        for name, frame in entry.rows.items():
            frame.write_parquet(folder / f"{name}.parquet")
        if entry.stitched is not None:
            for name in _STITCHED:
                getattr(entry.stitched, name).write_parquet(folder / f"stitched_{name}.parquet")
        meta = {
            "key": key,
            "inode": entry.inode,
            "size": entry.size,
            "head_len": entry.head_len,
            "head_hash": entry.head_hash,
            "tables": sorted(entry.rows),
            "stitched": entry.stitched is not None,
        }
        (folder / "state.json").write_text(entry.state.to_json())
        (folder / "meta.json").write_text(json.dumps(meta))

    def _load(self, key: str) -> CacheEntry | None:
        if self.directory is None:
            return None
        folder = self._folder(key)
        try:
            meta = json.loads((folder / "meta.json").read_text())
            if meta.get("key") != key:
                return None
            state = ParserState.from_json((folder / "state.json").read_text())
            rows = {name: pl.read_parquet(folder / f"{name}.parquet") for name in meta["tables"]}
            stitched = _load_stitched(folder) if meta["stitched"] else None
        except (OSError, ValueError, KeyError, pl.exceptions.PolarsError):
            return None
        return CacheEntry(
            meta["inode"], meta["size"], meta["head_len"], meta["head_hash"], state, rows, stitched
        )


def _load_stitched(folder: Path) -> Stitched:
    frames = {name: pl.read_parquet(folder / f"stitched_{name}.parquet") for name in _STITCHED}
    return Stitched(**frames)
