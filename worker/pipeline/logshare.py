"""The log cache's shared form: what a job's cache folder holds, the S3 manifest that describes
it, its assembly from a manifest, and what may leave the worker (`worker.pipeline.logcache`
moves them; here are the format and its checks).

    <cache_dir>/logs/<job id>/.shared   the manifest the folder was last synced with, the digest of
                                        its entries then, the parts the manifest names
    <cache_dir>/logs/<job id>/.clean    the SHA-256 of the table files found clean, and under which
                                        redactor rules (`shared.redact.RULES_DIGEST`)
    a manifest                          `format`, `job`, `rules`, each entry's meta.json and
                                        state.json as text, the size of every part they name

A manifest is checked before anything in it is used (`checked_manifest`: its format, the job,
entry folder and file names only, every part a SHA-256 with a size); anything off is a
`RefusedError` and the log is read whole. An entry leaves the worker only when every string in it
passes the redactor unchanged (`shareable`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import polars as pl

from shared.redact import PREFILTER, RULES_DIGEST, redact_data, redact_text
from worker.evidence.values import loads_json
from worker.pipeline.store import in_parallel

__all__ = [
    "RefusedError",
    "assemble",
    "checked_manifest",
    "clean_frame",
    "described",
    "entries_digest",
    "entry_folders",
    "found_clean",
    "part_files",
    "read_synced",
    "shareable",
    "synced_parts",
    "write_clean",
    "write_synced",
]

_SYNCED: Final = ".shared"
_CLEAN: Final = ".clean"
_FORMAT: Final = 2  # a manifest and content-addressed parts
_ENTRY: Final = re.compile(r"^[0-9a-f]{32}$")
_FILE: Final = re.compile(r"^(?:stitched_)?[a-z_]{1,40}(?:-[0-9a-f]{16})?\.parquet$")
_SHA: Final = re.compile(r"^[0-9a-f]{64}$")
_MAX_ENTRIES: Final = 4096
_MANIFEST_DEPTH: Final = 8  # a manifest nests 3 levels (entries, an entry, its texts)


class RefusedError(ValueError):
    """A downloaded archive that is not used."""


def entry_folders(folder: Path) -> list[Path]:
    """The entry folders of a LogCache directory (those with their `meta.json`)."""
    if not folder.is_dir():
        return []
    found = (p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    return sorted(p for p in found if (p / "meta.json").is_file())


def entries_digest(folder: Path) -> str:
    """A digest of the entries of `folder` (each `meta.json` holds its files' SHA-256)."""
    entries = entry_folders(folder)
    if not entries:
        return ""
    digest = hashlib.sha256()
    for entry in entries:
        digest.update(entry.name.encode() + b"\0" + (entry / "meta.json").read_bytes() + b"\0")
    return digest.hexdigest()


def read_synced(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / _SYNCED).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_synced(folder: Path, key: str, digest: str, sizes: dict[str, int]) -> None:
    """Which manifest `folder` was synced with, the digest of its entries, the parts it names."""
    synced = {"key": key, "digest": digest, "parts": sorted(sizes)}
    (folder / _SYNCED).write_text(json.dumps(synced))


def synced_parts(synced: dict[str, Any]) -> dict[str, set[str]]:
    """The parts of the manifest a folder was synced with, by its key (none when not noted)."""
    key, parts = synced.get("key"), synced.get("parts")
    if not isinstance(key, str) or not isinstance(parts, list):
        return {}
    if not all(isinstance(sha, str) and _SHA.match(sha) for sha in parts):
        return {}
    return {key: set(parts)}


def _meta(entry: Path) -> dict[str, Any]:
    data = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def part_files(entries: list[Path]) -> Iterator[tuple[Path, str]]:
    """The Parquet files of the entries with their SHA-256 (as each meta.json lists them)."""
    for entry in entries:
        for name, sha in _meta(entry).get("files", {}).items():
            if _FILE.match(name):
                yield entry / name, str(sha)


def described(job: str, entries: list[Path]) -> dict[str, Any]:
    """The manifest of the entries: each one's meta.json and state.json as text, and the size
    of every part they name."""
    return {
        "format": _FORMAT,
        "job": job,
        "rules": RULES_DIGEST,  # the redactor's rules the entries were found clean under
        "entries": {
            entry.name: {
                "meta": (entry / "meta.json").read_text(encoding="utf-8"),
                "state": (entry / "state.json").read_text(encoding="utf-8"),
            }
            for entry in entries
        },
        "sizes": {sha: path.stat().st_size for path, sha in part_files(entries)},
    }


def checked_manifest(body: bytes, job: str) -> dict[str, Any]:
    """A manifest of the job's log cache after checking its shape; raises `RefusedError`."""
    try:
        manifest = loads_json(body, _MANIFEST_DEPTH)  # bounded: a deep one is refused, not raised
    except ValueError as exc:
        raise RefusedError(f"it cannot be read ({type(exc).__name__}: {exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        raise RefusedError("its manifest is not of this format")
    if manifest.get("job") != job:
        raise RefusedError("it belongs to another job")
    entries, sizes = manifest.get("entries"), manifest.get("sizes")
    if not isinstance(entries, dict) or not isinstance(sizes, dict):
        raise RefusedError("it does not list the entries and their parts")
    if len(entries) > _MAX_ENTRIES or not all(_ENTRY.match(str(name)) for name in entries):
        raise RefusedError("it names an entry that is not a cache entry's folder")
    for texts in entries.values():
        if not isinstance(texts, dict) or not all(
            isinstance(texts.get(name), str) for name in ("meta", "state")
        ):
            raise RefusedError("an entry lacks its meta.json or state.json")
    for sha, size in sizes.items():
        if not _SHA.match(str(sha)) or not isinstance(size, int) or size < 0:
            raise RefusedError("it lists a part that is not a SHA-256 and a size")
    return manifest


def _entry_files(meta_text: str, sizes: dict[str, int]) -> dict[str, str]:
    """The Parquet files an entry's meta.json names, with their SHA-256 (each listed with a
    size in the manifest); `RefusedError` for any other name."""
    try:
        files = json.loads(meta_text).get("files")
    except (ValueError, AttributeError) as exc:
        raise RefusedError("an entry's meta.json does not read") from exc
    if not isinstance(files, dict):
        raise RefusedError("an entry's meta.json lists no files")
    found = {}
    for name, sha in files.items():
        if name == "state.json":
            continue
        if not _FILE.match(str(name)):
            raise RefusedError(f"{str(name)[:80]!r} is not a cache entry's file")
        if str(sha) not in sizes:
            raise RefusedError(f"{name} is not listed with a size")
        found[str(name)] = str(sha)
    return found


def assemble(
    manifest: dict[str, Any],
    target: Path,
    disk: Path,
    fetch: Callable[[str, str, int], bytes],
    bound: int,
) -> int:
    """The entries of a manifest in `target`, each part taken from the entry of `disk` that
    lists it with the same SHA-256 or read through `fetch(job, sha, size)`; returns how many
    were read. `RefusedError` for anything off (the cache checks every hash again)."""
    sizes: dict[str, int] = manifest["sizes"]
    if sum(sizes.values()) > bound:
        raise RefusedError(f"with its parts it holds more than the {bound:,} bytes allowed")
    wanted: list[tuple[Path, str]] = []
    for name, texts in manifest["entries"].items():
        files = _entry_files(texts["meta"], sizes)
        folder = target / name
        folder.mkdir()
        local = _local_files(disk / name)
        for file, sha in files.items():
            if not (local.get(file) == sha and _linked(disk / name / file, folder / file)):
                wanted.append((folder / file, sha))
        (folder / "state.json").write_text(texts["state"], encoding="utf-8")
        (folder / "meta.json").write_text(texts["meta"], encoding="utf-8")

    def fetched(path: Path, sha: str) -> Callable[[], int]:
        return lambda: path.write_bytes(fetch(manifest["job"], sha, sizes[sha]))

    in_parallel([fetched(path, sha) for path, sha in wanted])  # a few parts at once
    return len(wanted)


def _local_files(entry: Path) -> dict[str, str]:
    """The files an entry on the disk lists in its meta.json, with their SHA-256 (none when it
    does not read)."""
    try:
        files = _meta(entry).get("files", {})
    except (OSError, ValueError):
        return {}
    return {str(name): str(sha) for name, sha in files.items()} if isinstance(files, dict) else {}


def _linked(source: Path, target: Path) -> bool:
    try:
        os.link(source, target)
    except OSError:
        try:
            shutil.copy2(source, target)
        except OSError:
            return False
    return True


# --- what may leave the worker --------------------------------------------------------------------


def found_clean(manifest: dict[str, Any]) -> set[str]:
    """The parts a manifest names, found clean by its writer: taken as clean when it was written
    under the redactor's present rules, else none (every part is checked again once)."""
    return set(manifest["sizes"]) if manifest.get("rules") == RULES_DIGEST else set()


def shareable(folder: Path) -> tuple[list[Path], list[Path]]:
    """The entries of `folder` that pass the redactor unchanged, and those that do not.

    The Parquet files found clean are remembered by their SHA-256 (`.clean`): a grown log's
    earlier parts are not looked at again, only its new rows."""
    known = _read_clean(folder)
    good: list[Path] = []
    held: list[Path] = []
    seen: set[str] = set()
    for entry in entry_folders(folder):
        (good if _clean_entry(entry, known, seen) else held).append(entry)
    write_clean(folder, known & seen)
    return good, held


def write_clean(folder: Path, hashes: set[str]) -> None:
    data = {"rules": RULES_DIGEST, "clean": sorted(hashes)}
    (folder / _CLEAN).write_text(json.dumps(data))


def _read_clean(folder: Path) -> set[str]:
    """The hashes found clean under the redactor's present rules (none when they were found
    under other rules: they are checked again)."""
    try:
        data = json.loads((folder / _CLEAN).read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(data, dict) or data.get("rules") != RULES_DIGEST:
        return set()
    found = data.get("clean")
    return {str(item) for item in found} if isinstance(found, list) else set()


def _clean_entry(entry: Path, known: set[str], seen: set[str]) -> bool:
    """Whether every file of `entry` passes the redactor unchanged; `known` holds the hashes of
    Parquet files found clean before (and gains those found now), `seen` every hash looked up."""
    hashes = json.loads((entry / "meta.json").read_text(encoding="utf-8")).get("files", {})
    for path in entry.iterdir():
        if path.suffix == ".json" and not _clean_json(path):
            return False
        if path.suffix != ".parquet":
            continue
        digest = str(hashes.get(path.name, ""))
        seen.add(digest)
        if digest in known:
            continue
        if not clean_frame(pl.read_parquet(path)):
            return False
        if digest:
            known.add(digest)
    return True


def _clean_json(path: Path) -> bool:
    data = json.loads(path.read_text(encoding="utf-8"))
    if path.name == "meta.json":
        # the cache's own fields: the log's path under "key" (which `redact_data` would take for
        # a credential by its name), sizes and hashes; each string must pass the redactor
        return all(redact_text(text) == text for text in _strings(data))
    return bool(redact_data(data) == data)


def _strings(data: Any) -> Iterator[str]:
    """Every string in JSON-like data, keys included."""
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict):
        for key, value in data.items():
            yield str(key)
            yield from _strings(value)
    elif isinstance(data, list):
        for value in data:
            yield from _strings(value)


def clean_frame(frame: pl.DataFrame) -> bool:
    """True when no string of `frame` is changed by the redactor (each distinct value once)."""
    for name, dtype in frame.schema.items():
        if dtype.is_numeric() or dtype.is_temporal() or dtype in (pl.Boolean, pl.Null):
            continue
        if dtype != pl.String:
            return False  # nested or binary: not looked into, so not shared
        values = frame.get_column(name).drop_nulls().unique()
        flagged = values.filter(values.str.contains(PREFILTER))
        if any(redact_text(value) != value for value in flagged):
            return False
    return True
