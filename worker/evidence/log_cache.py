"""The log cache: entries of the incremental parse (`worker.evidence.logs.incremental`) kept in an
in-process LRU and, with `directory`, on disk (docs/parsing.md, "Incremental cache").

On disk: one folder per entry, renamed into place whole; a grown entry links the parts it keeps.
An entry that fails its version, hashes or schemas is ignored (said in `notes`) and the log read
whole."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, Final

import polars as pl

from shared.safefs import Folder, owned_directory, remove_tree
from worker.evidence import schema
from worker.evidence.logs.chunk import SCHEMAS
from worker.evidence.logs.incremental import CacheEntry
from worker.evidence.logs.state import ParserState
from worker.evidence.logs.stitch import Stitched, restitch, stitch, unchanged_rows

__all__ = ["MAX_PARTS", "VERSION", "LogCache"]

VERSION: Final = "9"  # 9: in-log attempts, replayed lines; 8: stitched tables, rows per part
MAX_PARTS: Final = 16
# past SPLIT_ROWS new rows, the last TAIL_ROWS are a part of their own (the next growth rewrites it)
TAIL_ROWS: Final = 16384
SPLIT_ROWS: Final = 4 * TAIL_ROWS
_STITCHED: Final[dict[str, dict[str, pl.DataType]]] = {
    "metrics": schema.METRICS,
    "phases": schema.PHASES,
}
_STEPPED: Final = ("metrics", "batches", "timers")  # the raw tables stitching reads
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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def _starts(frame: pl.DataFrame | None, head: pl.DataFrame | None) -> bool:
    """Whether `frame` (made from `head` and more rows) starts with `head`: its height and last
    row tell."""
    if head is None or head.is_empty():
        return True
    if frame is None or frame.height < head.height:
        return False
    last = head.height - 1
    return frame.slice(last, 1).equals(head.slice(last, 1))


def _resumed(entry: CacheEntry, previous: CacheEntry) -> bool:
    """Whether `entry` was read on from `previous` (the same file grown), so `previous.rows` are
    the first rows of `entry.rows`."""
    return (
        entry.inode == previous.inode
        and entry.head_len == previous.head_len
        and entry.head_hash == previous.head_hash
        and entry.size >= previous.size
        and entry.state.offset >= previous.state.offset
        and all(_starts(entry.rows.get(name), rows) for name, rows in previous.rows.items())
    )


def _with_stitched(entry: CacheEntry, previous: CacheEntry | None) -> CacheEntry:
    """`entry` with the stitched tables of its rows, re-stitched from `previous`'s if it can."""
    if previous is None or previous.stitched is None or not _resumed(entry, previous):
        return replace(entry, stitched=stitch(entry.rows), stitched_same={})
    fresh = {
        name: frame.slice(previous.rows[name].height if name in previous.rows else 0)
        for name, frame in entry.rows.items()
        if name in _STEPPED
    }
    same = unchanged_rows(previous.stitched, [fresh])
    return replace(
        entry, stitched=restitch(previous.stitched, entry.rows, [fresh]), stitched_same=same
    )


class LogCache:
    """An LRU of cache entries, optionally backed by a directory (see the module docstring)."""

    def __init__(self, max_entries: int = 64, directory: Path | None = None) -> None:
        self.max_entries = max_entries
        # made when missing; another user's is refused (it could hold forged entries)
        self.directory = owned_directory(directory) if directory is not None else None
        self.notes: list[str] = []  # entries on disk that were ignored, and why
        self._entries: OrderedDict[str, CacheEntry] = OrderedDict()
        self._stitch: set[str] = set()  # keys whose entries keep their stitched tables
        self._stored: dict[str, CacheEntry] = {}  # the entry stored last for each key

    def lookup(self, key: str, log: BinaryIO) -> CacheEntry | None:
        """The valid entry for `key` of the open file `log` (a stale one is dropped), or None."""
        entry = self._entries.get(key) or self._load(key)
        if entry is None:
            return None
        if not entry.matches(log):
            self._entries.pop(key, None)
            return None
        self._remember(key, entry)
        return entry

    def store(self, key: str, entry: CacheEntry) -> None:
        """Keep `entry`, and write it to the directory if any (a failed write is a note)."""
        previous = self._entries.get(key)
        if key in self._stitch and entry.stitched is None:
            entry = _with_stitched(entry, previous)
        self._remember(key, entry)
        self._stored[key] = entry
        if self.directory is None:
            return
        try:
            self._remember(key, self._save(key, entry, previous))
        except OSError as exc:
            self.notes.append(f"could not write the cache entry of {key}: {exc}")

    def keep_stitched(self, key: str) -> None:
        """Keep the stitched tables of `key`'s entries (each re-stitched from the one before);
        call it before each read of the file."""
        self._stitch.add(key)
        self._stored.pop(key, None)

    def stitched(self, key: str, rows: dict[str, pl.DataFrame]) -> Stitched | None:
        """`stitch(rows)` of the rows of the file whose entry was stored last under `key`, from
        the entry's stitched tables; None when there is none or `rows` do not start with its."""
        entry = self._stored.pop(key, None)
        if entry is None or entry.stitched is None:
            return None
        if not all(_starts(rows.get(name), entry.rows.get(name)) for name in _STEPPED):
            return None
        tail: dict[str, pl.DataFrame] = {
            name: rows[name].slice(entry.rows[name].height if name in entry.rows else 0)
            for name in _STEPPED
            if name in rows
        }
        return restitch(entry.stitched, rows, [tail])

    def files(self) -> list[Path]:
        """Every file of every entry in the directory, relative to it (what to copy to share)."""
        if self.directory is None or not self.directory.is_dir():
            return []
        found = (p for p in self.directory.glob("*/*") if p.is_file() and p.parent.name[0] != ".")
        return sorted(p.relative_to(self.directory) for p in found)

    def stored(self, key: str) -> bool:
        """Whether the directory holds an entry for `key` (valid or not)."""
        return self.directory is not None and (self._folder(key) / _META).is_file()

    def retain(self, keys: Iterable[str]) -> list[Path]:
        """Remove every entry whose key is not in `keys` from the directory (through its
        descriptor: no symlink followed); the folders removed."""
        if self.directory is None:
            return []
        kept = {self._folder(key).name for key in keys}
        directory = Folder.existing(self.directory)
        if directory is None:
            return []
        with directory:
            gone = [
                entry.name
                for entry in directory.entries()
                if entry.is_dir and entry.name[0] != "." and entry.name not in kept
            ]
            removed = [name for name in gone if directory.remove(name)]
        return [self.directory / name for name in removed]

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

    def _save(self, key: str, entry: CacheEntry, previous: CacheEntry | None) -> CacheEntry:
        """Write `entry` (reusing `previous`'s parts); it with its parts and hashes."""
        folder = self._folder(key)
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".entry-", dir=folder.parent))
        try:
            resumed = previous is not None and _resumed(entry, previous)
            written = _write_entry(staging, key, entry, _Reuse(folder, previous, resumed))
            old = folder.with_name(f".old-{folder.name}-{os.getpid()}")
            if folder.exists():
                folder.rename(old)
            staging.rename(folder)
            remove_tree(old)
        finally:
            remove_tree(staging)
        return written

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


@dataclass(frozen=True)
class _Reuse:
    """The entry a new one replaces, and its folder: the parts a grown table keeps."""

    folder: Path
    previous: CacheEntry | None
    resumed: bool  # the new entry was read on from `previous` (its rows start with its rows)

    def same(self, entry: CacheEntry, name: str, frame: pl.DataFrame) -> int:
        """How many first rows of table `name` (or `stitched_<name>`) are `previous`'s."""
        old = self.previous
        if old is None:
            return 0
        if name.startswith("stitched_"):
            if old.stitched is None or not self.resumed:
                return 0
            return entry.stitched_same.get(name.removeprefix("stitched_"), 0)
        rows = old.rows.get(name)
        if rows is None or rows.height > frame.height:
            return 0
        if self.resumed or frame.head(rows.height).equals(rows):
            return rows.height
        return 0

    def kept(self, name: str, same: int) -> tuple[tuple[str, ...], int]:
        """`previous`'s first parts of table `name` within its `same` first rows, and their rows."""
        old = self.previous
        if old is None or name not in old.parts or name not in old.part_rows:
            return (), 0
        parts, counts = old.parts[name], old.part_rows[name]
        if len(parts) >= MAX_PARTS or len(counts) != len(parts):
            return (), 0
        kept, done = [], 0
        for part, count in zip(parts, counts, strict=True):
            if done + count > same or part not in old.hashes:
                break
            kept.append(part)
            done += count
        return tuple(kept), done

    def link(self, part: str, target: Path) -> str:
        """`part` of the old folder in `target`; returns its hash (as the old meta.json says)."""
        source = self.folder / part
        try:
            os.link(source, target / part)
        except OSError:
            shutil.copy2(source, target / part)
        assert self.previous is not None
        return self.previous.hashes[part]


@dataclass
class _Written:
    """The parts written for an entry: each table's part files and rows, every file's hash."""

    parts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    rows: dict[str, tuple[int, ...]] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)


def _spans(done: int, height: int) -> list[tuple[int, int]]:
    """`(offset, length)` of the parts for rows `done`.. of a table: the last TAIL_ROWS apart past
    SPLIT_ROWS."""
    rows = height - done
    if rows <= SPLIT_ROWS:
        return [(done, rows)]
    return [(done, rows - TAIL_ROWS), (height - TAIL_ROWS, TAIL_ROWS)]


def _write_part(folder: Path, name: str, rows: pl.DataFrame, *, first: bool) -> tuple[str, str]:
    """One part of table `name` (the first `<name>.parquet`, others named by their hash): its file
    name and SHA-256."""
    if first:
        rows.write_parquet(folder / f"{name}.parquet")
        return f"{name}.parquet", _sha256(folder / f"{name}.parquet")
    staged = folder / f".{name}.new"
    rows.write_parquet(staged)
    digest = _sha256(staged)
    part = f"{name}-{digest[:16]}.parquet"
    staged.rename(folder / part)
    return part, digest


def _write_table(
    folder: Path, name: str, frame: pl.DataFrame, same: int, reuse: _Reuse, out: _Written
) -> None:
    """The parts of one table: the previous entry's within its first `same` rows linked, the rest
    written (`_spans`)."""
    kept, done = reuse.kept(name, same)
    parts = list(kept)
    counts = list(reuse.previous.part_rows[name][: len(parts)]) if reuse.previous else []
    for part in parts:
        out.hashes[part] = reuse.link(part, folder)
    if not parts or done < frame.height:
        for offset, length in _spans(done, frame.height):
            part, digest = _write_part(folder, name, frame.slice(offset, length), first=not parts)
            out.hashes[part] = digest
            parts.append(part)
            counts.append(length)
    out.parts[name], out.rows[name] = tuple(parts), tuple(counts)


def _tables(entry: CacheEntry) -> dict[str, pl.DataFrame]:
    """The tables of `entry` as written: the raw ones, then `stitched_<name>` when kept."""
    tables = dict(entry.rows)
    if entry.stitched is not None:
        tables.update({f"stitched_{name}": getattr(entry.stitched, name) for name in _STITCHED})
    return tables


def _write_entry(folder: Path, key: str, entry: CacheEntry, reuse: _Reuse) -> CacheEntry:
    """Every file of `entry` in `folder`, `meta.json` last; `entry` with its parts and hashes."""
    out = _Written()
    for name, frame in _tables(entry).items():
        _write_table(folder, name, frame, reuse.same(entry, name, frame), reuse, out)
    (folder / _STATE).write_text(entry.state.to_json())
    files = {**out.hashes, _STATE: _sha256(folder / _STATE)}
    meta = {
        "version": VERSION,
        "key": key,
        "inode": entry.inode,
        "size": entry.size,
        "head_len": entry.head_len,
        "head_hash": entry.head_hash,
        "before_hash": entry.before_hash,
        "tables": {name: list(out.parts[name]) for name in sorted(out.parts)},
        "rows": {name: list(out.rows[name]) for name in sorted(out.rows)},
        "stitched": entry.stitched is not None,
        "files": files,
    }
    (folder / _META).write_text(json.dumps(meta))
    return replace(entry, parts=out.parts, hashes=files, part_rows=out.rows)


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


def _table_parts(
    meta: dict[str, Any],
) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[int, ...]]]:
    """Each table's part files (each listed with a hash) and their rows, as `meta.json` says."""
    tables, counts = meta["tables"], meta["rows"]
    if not isinstance(tables, dict) or not isinstance(counts, dict):
        raise _DamagedError("meta.json does not list the parts of each table")
    parts = {str(name): tuple(str(part) for part in names) for name, names in tables.items()}
    rows = {str(name): tuple(int(n) for n in numbers) for name, numbers in counts.items()}
    for name, names in parts.items():
        if not names or any(part not in meta["files"] or "/" in part for part in names):
            raise _DamagedError(f"{name} has a part that is not listed with a hash")
        if len(rows.get(name, ())) != len(names) or any(n < 0 for n in rows[name]):
            raise _DamagedError(f"{name} does not list the rows of each part")
    return parts, rows


def _read_table(folder: Path, parts: tuple[str, ...], rows: tuple[int, ...]) -> pl.DataFrame:
    frames = [pl.read_parquet(folder / part) for part in parts]
    if [frame.height for frame in frames] != list(rows):
        raise _DamagedError(f"{parts[0]} does not hold the rows meta.json lists")
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")


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
    parts, counts = _table_parts(meta)
    tables = {name: _read_table(folder, names, counts[name]) for name, names in parts.items()}
    raw = {name: frame for name, frame in tables.items() if not name.startswith("stitched_")}
    rows = _checked(raw, SCHEMAS)
    stitched = None
    if meta["stitched"]:
        frames = {name: tables.get(f"stitched_{name}") for name in _STITCHED}
        if any(frame is None for frame in frames.values()):
            raise _DamagedError("meta.json does not list the stitched tables")
        stitched = Stitched(
            **_checked({k: v for k, v in frames.items() if v is not None}, _STITCHED)
        )
    return CacheEntry(
        inode=int(meta["inode"]),
        size=int(meta["size"]),
        head_len=int(meta["head_len"]),
        head_hash=str(meta["head_hash"]),
        state=state,
        rows=rows,
        stitched=stitched,
        before_hash=str(meta["before_hash"]),
        parts=parts,
        hashes={str(name): str(digest) for name, digest in meta["files"].items()},
        part_rows=counts,
    )
