"""The incremental cache: a grown log is read from its last safe cut point only.

An entry is keyed on the file's path, its source name and the reference date, and is valid while
the file keeps its inode, has not shrunk, still starts with the same bytes (a hash of its head)
and still holds the same bytes just before the committed offset (a hash of the 4 KiB there: a log
rewritten in place with the same first lines is read whole, not resumed in the middle of other
text). It holds the parser state at the last committed line, the rows read up to there and (when
made by `parse_log_file`) their stitched METRICS and PHASES; the lines after (an open construct, a
partial last line) are read again on every parse.

Entries live in an in-process LRU and, with `directory`, on disk, one folder per entry:

    <directory>/<sha256 of the key, 32 hex>/meta.json     key, version, file identity, and the
                                                          SHA-256 of every other file
                                          /state.json    the parser state
                                          /<table>.parquet, stitched_<table>.parquet

`meta.json` is written last and each folder is renamed into place whole, so a crash never leaves
half an entry. An entry of another cache version, or one whose files do not match their hashes or
do not read back with the expected columns, is ignored (never trusted) and said in `notes`; the
file is then read whole and the entry replaced. A directory holds the entries of any number of
files and jobs; `files()` lists what to copy to share it (the pipeline keeps one directory per
job beside its frozen evidence in S3, so another worker picks it up).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, Final

import polars as pl

from worker.evidence import schema
from worker.evidence.logs.chunk import SCHEMAS
from worker.evidence.logs.state import ParserState
from worker.evidence.logs.stitch import Stitched

__all__ = [
    "VERSION",
    "CacheEntry",
    "LogCache",
    "cache_key",
    "entry_for",
    "head_hash",
    "span_hash",
]

HEAD_BYTES: Final = 4096
VERSION: Final = "6"  # 6: cut lines in the state, the hash before the offset, file hashes
_STITCHED: Final[dict[str, dict[str, pl.DataType]]] = {
    "metrics": schema.METRICS,
    "phases": schema.PHASES,
}
_META: Final = "meta.json"
_STATE: Final = "state.json"
# what a damaged entry raises while it is read back (it is then ignored, never trusted)
_UNREADABLE: Final = (
    OSError,
    ValueError,
    KeyError,
    TypeError,
    RecursionError,
    pl.exceptions.PolarsError,
)


class _DamagedError(ValueError):
    """An entry on disk that cannot be trusted."""


def cache_key(path: Path, source: str, reference_date: date | None) -> str:
    """The key of a file's entry."""
    ref = reference_date.isoformat() if reference_date else "-"
    return f"{path.resolve()}|{source}|{ref}"


def span_hash(path: Path, start: int, length: int) -> str:
    """SHA-256 of `length` bytes of `path` from `start`."""
    with path.open("rb") as handle:
        handle.seek(start)
        return hashlib.sha256(handle.read(length)).hexdigest()


def head_hash(path: Path, length: int) -> str:
    """SHA-256 of the first `length` bytes of `path`."""
    return span_hash(path, 0, length)


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

    def matches(self, path: Path) -> bool:
        """True while `path` is the same file, grown or unchanged."""
        try:
            stat = path.stat()
            same = stat.st_ino == self.inode and stat.st_size >= self.size
            return same and head_hash(path, self.head_len) == self.head_hash and self._before(path)
        except OSError:
            return False

    def _before(self, path: Path) -> bool:
        start = max(0, self.state.offset - HEAD_BYTES)
        found = span_hash(path, start, self.state.offset - start) if self.state.offset else ""
        return found == self.before_hash


def entry_for(
    path: Path,
    size: int,
    state: ParserState,
    rows: dict[str, pl.DataFrame],
    stitched: Stitched | None,
) -> CacheEntry:
    """The entry of `path` read to `size` bytes, committed up to `state.offset`."""
    head_len = min(HEAD_BYTES, size)
    start = max(0, state.offset - HEAD_BYTES)
    return CacheEntry(
        inode=path.stat().st_ino,
        size=size,
        head_len=head_len,
        head_hash=head_hash(path, head_len),
        state=state,
        rows=rows,
        stitched=stitched,
        before_hash=span_hash(path, start, state.offset - start) if state.offset else "",
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


class LogCache:
    """An LRU of cache entries, optionally backed by a directory (see the module docstring)."""

    def __init__(self, max_entries: int = 64, directory: Path | None = None) -> None:
        self.max_entries = max_entries
        self.directory = directory
        self.notes: list[str] = []  # entries on disk that were ignored, and why
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
        """Keep `entry` (and write it to the directory when there is one; a write that fails,
        a full disk or another process writing the same entry, is a note, not an error)."""
        self._remember(key, entry)
        if self.directory is None:
            return
        try:
            self._save(key, entry)
        except OSError as exc:
            self.notes.append(f"could not write the cache entry of {key}: {exc}")

    def files(self) -> list[Path]:
        """Every file of every entry in the directory, relative to it (what to copy to share
        the cache); empty without a directory."""
        if self.directory is None or not self.directory.is_dir():
            return []
        found = (p for p in self.directory.glob("*/*") if p.is_file() and p.parent.name[0] != ".")
        return sorted(p.relative_to(self.directory) for p in found)

    def stored(self, key: str) -> bool:
        """Whether the directory holds an entry for `key` (valid or not)."""
        return self.directory is not None and (self._folder(key) / _META).is_file()

    def retain(self, keys: Iterable[str]) -> list[Path]:
        """Remove from the directory every entry whose key is not in `keys` (the files a job no
        longer has); returns the folders removed."""
        if self.directory is None or not self.directory.is_dir():
            return []
        kept = {self._folder(key).name for key in keys}
        gone = [
            folder
            for folder in self.directory.iterdir()
            if folder.is_dir() and folder.name[0] != "." and folder.name not in kept
        ]
        for folder in gone:
            shutil.rmtree(folder, ignore_errors=True)
        return gone

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
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".entry-", dir=folder.parent))
        try:
            _write_entry(staging, key, entry)
            old = folder.with_name(f".old-{folder.name}-{os.getpid()}")
            if folder.exists():
                folder.rename(old)
            staging.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _load(self, key: str) -> CacheEntry | None:
        if self.directory is None:
            return None
        folder = self._folder(key)
        if not (folder / _META).is_file():
            return None
        try:
            return _read_entry(folder, key)
        except (_DamagedError, *_UNREADABLE) as exc:
            reason = str(exc) if isinstance(exc, _DamagedError) else f"{type(exc).__name__}: {exc}"
            self.notes.append(f"ignored the cache entry {folder}: {reason}; the log is read whole")
            return None


def _write_entry(folder: Path, key: str, entry: CacheEntry) -> None:
    """Every file of `entry` in `folder`, `meta.json` (with the others' hashes) last."""
    names: list[str] = []
    for name, frame in entry.rows.items():
        frame.write_parquet(folder / f"{name}.parquet")
        names.append(f"{name}.parquet")
    if entry.stitched is not None:
        for name in _STITCHED:
            getattr(entry.stitched, name).write_parquet(folder / f"stitched_{name}.parquet")
            names.append(f"stitched_{name}.parquet")
    (folder / _STATE).write_text(entry.state.to_json())
    names.append(_STATE)
    meta = {
        "version": VERSION,
        "key": key,
        "inode": entry.inode,
        "size": entry.size,
        "head_len": entry.head_len,
        "head_hash": entry.head_hash,
        "before_hash": entry.before_hash,
        "tables": sorted(entry.rows),
        "stitched": entry.stitched is not None,
        "files": {name: _sha256(folder / name) for name in names},
    }
    (folder / _META).write_text(json.dumps(meta))


def _read_meta(folder: Path, key: str) -> dict[str, Any]:
    meta = json.loads((folder / _META).read_text())
    if not isinstance(meta, dict):
        raise _DamagedError("meta.json is not a JSON object")
    if meta.get("version") != VERSION:
        raise _DamagedError(f"written by cache version {meta.get('version')!r}, not {VERSION}")
    if meta.get("key") != key:
        raise _DamagedError("it belongs to another file")
    files: dict[str, str] = meta["files"]
    for name, digest in files.items():
        if _sha256(folder / Path(name).name) != digest:
            raise _DamagedError(f"{name} does not match its hash")
    return meta


def _read_frame(folder: Path, name: str, meta: dict[str, Any]) -> pl.DataFrame:
    if f"{name}.parquet" not in meta["files"]:
        raise _DamagedError(f"{name}.parquet is not listed with a hash")
    return pl.read_parquet(folder / f"{name}.parquet")


def _checked(
    rows: dict[str, pl.DataFrame], schemas: dict[str, dict[str, pl.DataType]]
) -> dict[str, pl.DataFrame]:
    """`rows` when every table has the columns and types a parse makes, else `_DamagedError`."""
    for name, frame in rows.items():
        wanted = schemas.get(name)
        if wanted is None or dict(frame.schema) != dict(wanted):
            raise _DamagedError(f"{name}.parquet lacks the columns of a parsed {name} table")
    return rows


def _state(text: str) -> ParserState:
    state = ParserState.from_json(text)
    counters = (state.line, state.offset, state.attempt, state.completed, state.rolls)
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in counters):
        raise _DamagedError("state.json does not hold a parser state")
    if state.line < 0 or state.offset < 0:
        raise _DamagedError("state.json holds a negative line or offset")
    return state


def _read_entry(folder: Path, key: str) -> CacheEntry:
    meta = _read_meta(folder, key)
    if _STATE not in meta["files"]:
        raise _DamagedError("state.json is not listed with a hash")
    state = _state((folder / _STATE).read_text())
    rows = _checked({name: _read_frame(folder, name, meta) for name in meta["tables"]}, SCHEMAS)
    stitched = None
    if meta["stitched"]:
        frames = {name: _read_frame(folder, f"stitched_{name}", meta) for name in _STITCHED}
        stitched = Stitched(**_checked(frames, _STITCHED))
    return CacheEntry(
        inode=int(meta["inode"]),
        size=int(meta["size"]),
        head_len=int(meta["head_len"]),
        head_hash=str(meta["head_hash"]),
        state=state,
        rows=rows,
        stitched=stitched,
        before_hash=str(meta["before_hash"]),
    )
