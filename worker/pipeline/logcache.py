"""The parsed logs of each job, kept between alerts: a repeated alert parses only what is new.

A capture reads the job's logs through a `LogCache` (`worker.evidence.logs.incremental`) whose
directory belongs to the job; a log that grew is parsed from its last committed line, a rewritten
or rotated one is read whole (the cache's own identity checks). The directory lives on the worker's
disk, and a copy of it in S3, so the worker that takes the job's next alert finds it:

    <cache_dir>/logs/<job id>/<entry>/...          the LogCache directory of the job
    <cache_dir>/logs/<job id>/.shared              which S3 manifest the directory was last
                                                   synced with, and a digest of its entries then
    <cache_dir>/logs/<job id>/.clean               SHA-256 of the table files that passed the
                                                   redactor (a grown log's new part alone is read)
    S3 logcache/<job id>/<stamp>-<digest>.json     the job's manifest, written once per change,
                                                   the newest stamp wins: each shareable entry's
                                                   meta.json and state.json, and the size of
                                                   every Parquet part they name
    S3 logcache/<job id>/parts/<sha>-<sha256>.parquet   one Parquet file of an entry, named by
                                                   its SHA-256 (the frozen evidence's part names,
                                                   worker.pipeline.parts), written once

`<job id>` is the SHA-256 (32 hex) of the job key: the job directory relative to the bundle root,
the key the coalescer uses. Before a capture reads the logs, one listing of the job's prefix
says which manifests and parts S3 holds; the newest manifest of the job is read when the
directory was not synced with it (a cold disk, or another worker answered a later alert) and the
entries assembled from it: each part the disk holds already (the same file name with the same
SHA-256 in its entry's meta.json) is linked from there, the others read from S3, a few at once.
After, when the entries changed, the parts that listing did not show are written (a grown log:
the last part of each grown table and the new ones, see `worker.evidence.logs.incremental`), a
few at once, then the manifest; manifests older than the newest two are deleted, and the parts
no kept manifest names once they are an hour old (a younger one may be another capture's, its
manifest not written yet), from one more listing (its write times; the parts of the manifest the
directory was synced with are noted in `.shared`, not read again). A part deleted between the
first listing and the push leaves a manifest that names it: the next reader finds it missing and
reads the log whole (time, never evidence).

The pipeline's capture (`JobLogCache.read`, the `JobLogs` of `worker.pipeline.capture`) writes
the new entries to the disk, then the S3 copy, from a thread of the worker process while it
freezes the evidence (the read itself keeps the entries in memory); `settle` waits for it at the
end of the capture, and a later read of the same job in the process waits for it before it
starts.

What is checked before anything downloaded is used: the manifest's size and the sum of the parts'
(at most the memory one parse may use, RLHEALTH_PARSE_MEMORY_MB), its shape (entry folder and
file names only, every part listed with a size), the job it names, each part's size and SHA-256;
then, when the logs are read, the cache's own checks (its version, the log's key, every file's
SHA-256, each part's rows, the tables' columns) and the log's identity (inode, size, head hash,
the bytes before the resume point). Anything that fails (a damaged or missing part included) is
ignored with a note (a warning in the worker's log and the
`rlhealth_log_cache_shared{outcome="ignored"}` metric) and the log is read whole: a bad entry
costs time, never the evidence. A manifest that was refused, held a damaged entry or was of no
use (every entry of another version of its log) is deleted, so the next one written is the
newest. (The hashes prove integrity, not authorship: a party that can
write the bucket can also write frozen evidence; the bucket is inside the trust boundary.)

Redaction: the entries hold the parsed rows and the parser state as read, unredacted (they must
give exactly the rows a full read gives; the frozen evidence is redacted when it is written). On
the worker's disk they sit beside the logs they came from. Only entries that pass the redactor
unchanged leave the worker: an entry with a string the redactor would rewrite (a token in an error
line, say) is withheld from the manifest, its parts are not written (`outcome="withheld"`), and
its log is read whole by the next worker. The parts assembled from a manifest count as clean
(a manifest only ever names entries found clean, and they are in S3 already), so a cold worker
checks only the parts its own read adds — when the manifest was written under the redactor's
present rules (`shared.redact.RULES_DIGEST`, in the manifest and in `.clean`): after a change of
the rules every part is checked again once, so a string a new rule hides never leaves the worker
on the strength of an older check.

The disk is bounded: job folders unused for `max_age_s` are removed, then the least recently used
until all fit in `disk_bytes`. In memory, each worker process keeps the entries it read or wrote
last (at most KEPT_BYTES of rows) with the `meta.json` they match: the next capture of the job in
that process, its folder unchanged, takes the entry without reading its rows back from disk.

Every capture logs one line saying how many bytes it parsed and reused, and counts them in
`rlhealth_log_cache_files` / `rlhealth_log_cache_bytes`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Final, Protocol

from shared.alerts import OutsideBundleRootError, confine
from shared.safefs import Folder, owned_directory, remove_tree
from shared.settings import Settings
from worker.evidence.case import Evidence
from worker.evidence.log_cache import LogCache
from worker.evidence.logs.incremental import CacheEntry
from worker.pipeline.failures import describe, is_time_limit
from worker.pipeline.logshare import (
    RefusedError,
    assemble,
    checked_manifest,
    described,
    entries_digest,
    entry_folders,
    found_clean,
    part_files,
    read_synced,
    shareable,
    synced_parts,
    write_clean,
    write_synced,
)
from worker.pipeline.metrics import log_cache_used
from worker.pipeline.parts import (
    job_id,
    part_matches,
    part_name,
    part_of,
    parts_among,
    stored_parts,
)
from worker.pipeline.store import ObjectMissingError, ObjectStore, put_all

__all__ = [
    "CacheLimits",
    "CacheRun",
    "FileRead",
    "JobLogCache",
    "JobLogs",
    "Read",
    "finish_sharing",
    "job_id",
]

log = logging.getLogger(__name__)

Read = Callable[[LogCache | None], Evidence]
"""Collects the evidence, reading the logs through the cache given (or none)."""

PREFIX: Final = "logcache/"
_MANIFEST_NAME: Final = re.compile(r"^\d{8}T\d{12}Z-[0-9a-f]{16}\.json$")
_PARTS: Final = "parts/"
_PART_GRACE_S: Final = 3600  # an unreferenced part younger than this may be another capture's
_MAX_JSON_BYTES: Final = 16 * 2**20
_LEFTOVER_S: Final = 3600  # a staging folder this old belongs to a process that died
KEPT_BYTES: Final = 512 * 2**20
"""The parsed rows (polars' estimate) of the entries one process keeps between captures."""


@dataclass(frozen=True)
class CacheLimits:
    """The bounds of the cache: the largest archive read or written, the disk, the age."""

    archive_bytes: int
    disk_bytes: int = 8 * 2**30
    max_age_s: float = 7 * 86400
    kept_archives: int = 2

    @classmethod
    def from_settings(cls, settings: Settings) -> CacheLimits:
        """An archive is at most the memory one parse may hold (RLHEALTH_PARSE_MEMORY_MB): the
        parsed state of a log is no larger in Parquet than in memory."""
        return cls(archive_bytes=settings.parse_memory_mb * 2**20)


@dataclass(frozen=True)
class FileRead:
    """One log file read by a capture: its size, and the bytes reused from a cache entry."""

    source: str
    size: int
    reused: int
    stale: bool = False  # an entry was there but is of another version of the file

    @property
    def parsed(self) -> int:
        return self.size - self.reused


@dataclass
class CacheRun:
    """What the cache did for one capture."""

    job: str
    origin: str = "none"  # where the entries came from: "disk", "s3" or "none"
    reads: list[FileRead] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    shared: list[str] = field(default_factory=list)  # outcomes for the S3 copy
    pulled: str | None = None  # the manifest downloaded
    uploaded: str | None = None  # the manifest written
    parts_read: int = 0  # the parts read from S3 (the others were on the disk)
    parts_written: int = 0  # the parts written to S3 (the others were there)
    stored: frozenset[str] | None = None  # the SHA-256 of the job's parts listed before the read

    @property
    def parsed_bytes(self) -> int:
        return sum(read.parsed for read in self.reads)

    @property
    def reused_bytes(self) -> int:
        return sum(read.reused for read in self.reads)

    def line(self) -> str:
        """The log line of the run."""
        resumed = [r for r in self.reads if r.reused]
        files = ", ".join(f"{r.source} from byte {r.reused:,} of {r.size:,}" for r in resumed)
        told = f"; resumed {files}" if files else ""
        stale = ", ".join(r.source for r in self.reads if r.stale)
        told += f"; read whole, their entry was of another version: {stale}" if stale else ""
        if self.pulled is not None:
            told += f"; read {self.parts_read} parts from S3"
        if self.uploaded is not None:
            told += f"; wrote {self.parts_written} parts to S3"
        return (
            f"log cache ({self.origin}) for {self.job}: parsed {self.parsed_bytes:,} bytes, "
            f"reused {self.reused_bytes:,}{told}"
        )


class _Kept:
    """The entries this process read or wrote last, each with the `meta.json` it was read or
    written with: a later capture of the same job in this process whose folder still holds that
    `meta.json` (which lists every file's SHA-256) takes the entry as it is, instead of reading
    and checking every file again. At most `max_bytes` of rows; least recently used go first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Path, tuple[bytes, CacheEntry, int]] = OrderedDict()

    def get(self, folder: Path) -> CacheEntry | None:
        found = self._items.get(folder)
        if found is None:
            return None
        if _meta_bytes(folder) != found[0]:
            del self._items[folder]
            return None
        self._items.move_to_end(folder)
        return found[1]

    def put(self, folder: Path, entry: CacheEntry) -> None:
        self._items.pop(folder, None)
        meta = _meta_bytes(folder)
        size = _entry_bytes(entry)
        if meta is None or size > self.max_bytes:
            return
        self._items[folder] = (meta, entry, size)
        while sum(item[2] for item in self._items.values()) > self.max_bytes:
            self._items.popitem(last=False)

    def forget(self, folder: Path) -> None:
        self._items.pop(folder, None)


def _meta_bytes(folder: Path) -> bytes | None:
    try:
        return (folder / "meta.json").read_bytes()
    except OSError:
        return None


def _entry_bytes(entry: CacheEntry) -> int:
    frames = list(entry.rows.values())
    if entry.stitched is not None:
        frames += [entry.stitched.metrics, entry.stitched.phases]
    return sum(int(frame.estimated_size()) for frame in frames)


_KEPT: Final = _Kept(KEPT_BYTES)


class _WatchedCache(LogCache):
    """A `LogCache` that remembers each lookup (the bytes a read reuses), and takes the entries
    this process kept (`_Kept`) when their folder did not change since. With `write_later`,
    `store` keeps an entry (stitched, remembered, as the read needs it) without writing it to
    the disk; `write_stored` writes it afterwards, as `store` would have (the capture does it
    beside its freeze)."""

    def __init__(self, directory: Path, *, write_later: bool = False) -> None:
        super().__init__(max_entries=1024, directory=directory)
        self.reads: dict[str, FileRead] = {}
        self.write_later = write_later
        self._unwritten: list[tuple[str, CacheEntry, CacheEntry | None]] = []

    def lookup(self, key: str, log: BinaryIO) -> CacheEntry | None:
        had, notes = self.stored(key), len(self.notes)
        entry = super().lookup(key, log)
        source = key.rsplit("|", 2)[1] if key.count("|") >= 2 else key
        reused = entry.state.offset if entry is not None else 0
        stale = had and entry is None and len(self.notes) == notes  # not damaged: outdated
        self.reads[key] = FileRead(source, os.fstat(log.fileno()).st_size, reused, stale)
        return entry

    def _load(self, key: str) -> CacheEntry | None:
        folder = self._folder(key)
        kept = _KEPT.get(folder)
        if kept is not None:
            return kept
        entry = super()._load(key)
        if entry is not None:
            _KEPT.put(folder, entry)
        return entry

    def store(self, key: str, entry: CacheEntry) -> None:
        if self.write_later:
            previous, directory = self._entries.get(key), self.directory
            self.directory = None  # kept and stitched as the read needs it, not written yet
            try:
                super().store(key, entry)
            finally:
                self.directory = directory
            self._unwritten.append((key, self._entries[key], previous))
            return
        notes = len(self.notes)
        super().store(key, entry)
        self._keep(key, self._entries.get(key) if len(self.notes) == notes else None)

    def write_stored(self) -> None:
        """Write the entries `store` kept back (a write that fails is a note, as in `store`)."""
        while self._unwritten:
            key, entry, previous = self._unwritten.pop(0)
            try:
                saved: CacheEntry | None = self._save(key, entry, previous)
            except OSError as exc:
                self.notes.append(f"could not write the cache entry of {key}: {exc}")
                saved = None
            if saved is not None:
                self._remember(key, saved)
            self._keep(key, saved)

    def _keep(self, key: str, saved: CacheEntry | None) -> None:
        """Keep `saved` in this process (with its parts and hashes, as its meta.json says)."""
        folder = self._folder(key)
        if saved is not None and self.stored(key):
            _KEPT.put(folder, saved)
        else:
            _KEPT.forget(folder)


def _noted(run: CacheRun, notes: list[str]) -> None:
    """The cache's notes (entries ignored, writes failed) in the run: their logs read whole."""
    run.notes.extend(notes)
    if notes:
        run.shared.append("ignored")


def _must_propagate(exc: BaseException) -> bool:
    return is_time_limit(exc) or isinstance(exc, MemoryError)


class _SharedCopy:
    """The S3 copy of the jobs' log caches: a job's newest manifest pulled into its folder,
    the folder's shareable entries pushed (new parts, then a manifest), old ones expired."""

    def __init__(self, store: ObjectStore, limits: CacheLimits) -> None:
        self.store = store
        self.limits = limits

    def _prefix(self, job: str) -> str:
        return f"{PREFIX}{job_id(job)}/"

    def pull(self, job: str, folder: Path, run: CacheRun) -> None:
        """Replace `folder` by the entries of the job's newest manifest, when it was not synced
        with it: the parts the disk holds already (same name, same SHA-256 in its meta.json) are
        taken from there, the others read from S3."""
        run.origin = "disk" if entry_folders(folder) else "none"
        listed = self.store.listing(self._prefix(job))
        run.stored = frozenset(parts_among(listed, self._parts_prefix(job)).values())
        newest = self._manifests_among(job, listed)[-1:]
        synced = read_synced(folder)
        if not newest or newest[0] == synced.get("key"):
            return
        key = newest[0]
        root = owned_directory(folder.parent)  # the job folders' root (`JobLogCache.root`)
        staging = Path(tempfile.mkdtemp(prefix=".pull-", dir=root))
        try:
            body = self._fetch(key, listed[key].size)
            bound = self.limits.archive_bytes - len(body)
            manifest = checked_manifest(body, job)
            run.parts_read = assemble(manifest, staging, folder, self._part, bound)
        except RefusedError as exc:
            remove_tree(staging)
            run.notes.append(f"ignored the shared log cache {key}: {exc}; the logs are read whole")
            run.shared.append("ignored")
            self.store.delete(key)  # no other worker fetches it again
            return
        write_synced(staging, key, entries_digest(staging), manifest["sizes"])
        write_clean(staging, found_clean(manifest))
        _swap(staging, folder)
        run.origin, run.pulled = "s3", key
        run.shared.append("downloaded")

    def _part(self, job: str, sha: str, size: int) -> bytes:
        """The part of SHA-256 `sha` of the job's log cache, checked; `RefusedError` when it is
        missing, of another size or damaged."""
        name = part_name(sha[:32], sha)
        try:
            body = self.store.get(self._parts_prefix(job) + name)
        except ObjectMissingError as exc:
            raise RefusedError(f"its part {name} is missing") from exc
        if len(body) != size or not part_matches(name, body):
            raise RefusedError(f"its part {name} does not match its hash")
        return body

    def _parts_prefix(self, job: str) -> str:
        return f"{self._prefix(job)}{_PARTS}"

    def _manifests_among(self, job: str, keys: Iterable[str]) -> list[str]:
        """The job's manifests among `keys`, oldest first."""
        prefix = self._prefix(job)
        return sorted(k for k in keys if _MANIFEST_NAME.match(k[len(prefix) :]))

    def _fetch(self, key: str, size: int) -> bytes:
        """The manifest `key`, the size a listing gave checked before it is read;
        `RefusedError` when it is too large or gone."""
        bound = min(self.limits.archive_bytes, _MAX_JSON_BYTES)
        try:
            if size > bound:
                raise RefusedError(f"it holds {size:,} bytes, more than the {bound:,} allowed")
            body = self.store.get(key)
        except ObjectMissingError as exc:
            raise RefusedError("it vanished while it was read") from exc
        if len(body) > bound:
            raise RefusedError(f"it holds {len(body):,} bytes, more than the {bound:,} allowed")
        return body

    def push(self, job: str, folder: Path, run: CacheRun) -> None:
        """Write the shareable entries of `folder` to S3 when they changed since the sync: the
        parts not stored yet (those the capture's listing did not show, a few at once), then a
        manifest naming every entry's parts."""
        digest, synced = entries_digest(folder), read_synced(folder)
        if not digest or digest == synced.get("digest"):
            return
        clean, withheld = shareable(folder)
        for entry in withheld:
            run.notes.append(f"kept the log cache entry {entry.name} on this worker: {_WITHHELD}")
            run.shared.append("withheld")
        if not clean:
            return
        manifest = described(job, clean)
        body = json.dumps(manifest).encode()
        total = len(body) + sum(manifest["sizes"].values())
        if total > self.limits.archive_bytes or len(body) > _MAX_JSON_BYTES:
            run.notes.append(f"the log cache of {job} is too large to share ({total:,} bytes)")
            return
        prefix = self._parts_prefix(job)
        if run.stored is None:  # the listing before the read failed: list now
            run.stored = frozenset(stored_parts(self.store, prefix).values())
        new = {sha: path for path, sha in part_files(clean) if sha not in run.stored}
        put_all(self.store, [(prefix + part_name(sha[:32], sha), p) for sha, p in new.items()])
        run.parts_written = len(new)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        key = f"{self._prefix(job)}{stamp}-{digest[:16]}.json"
        self.store.put_once(key, body, "application/json")
        write_synced(folder, key, digest, manifest["sizes"])
        run.uploaded = key
        run.shared.append("uploaded")
        self._expire(job, key, manifest, synced_parts(synced))

    def _expire(
        self, job: str, key: str, manifest: dict[str, Any], known: dict[str, set[str]]
    ) -> None:
        """Delete the manifests older than the newest `kept_archives`, then the parts no kept
        manifest names that are older than an hour; from one listing of the job's prefix.
        `known` holds the parts of a manifest this worker synced with (not read again)."""
        listed = self.store.listing(self._prefix(job))
        manifests = self._manifests_among(job, {*listed, key})
        for old in manifests[: -self.limits.kept_archives]:
            if old != key:
                self.store.delete(old)
        named = set(manifest["sizes"])
        for other in manifests[-self.limits.kept_archives :]:
            if other in known:
                named |= known[other]
            elif other != key:
                named |= self._named_by(job, other, listed[other].size)
        parts = self._parts_prefix(job)
        cutoff = time.time() - _PART_GRACE_S
        for name, item in listed.items():
            part = part_of(name, parts)
            if part is not None and part[1] not in named and item.modified < cutoff:
                self.store.delete(name)

    def _named_by(self, job: str, key: str, size: int) -> set[str]:
        """The parts manifest `key` names; none when it is refused (it is deleted: no worker
        fetches it again)."""
        try:
            return set(checked_manifest(self._fetch(key, size), job)["sizes"])
        except RefusedError:
            self.store.delete(key)
            return set()


class JobLogs(Protocol):
    """The log cache a capture reads a job's logs through (`JobLogCache`; tests give a fake):
    `read` gives `read` the job's cache, its S3 copy written meanwhile; `settle` waits for the
    copies."""

    def read(self, job_dir: str, read: Read) -> Evidence: ...

    def settle(self) -> None: ...


class JobLogCache:
    """The adapter between a capture and the job's log cache on disk and in S3."""

    def __init__(self, settings: Settings, store: ObjectStore, limits: CacheLimits | None = None):
        self.cache_root = settings.cache_root()
        self.root = self._own_root()
        self.bundle_root = settings.bundle_root
        self.store = store
        self.limits = limits or CacheLimits.from_settings(settings)
        self.shared = _SharedCopy(store, self.limits)

    def _own_root(self) -> Path:
        """This process's own (no other user may put an entry in it), or UnsafeDirectoryError;
        checked again by every read (a long-lived process's folder may have been replaced)."""
        return owned_directory(owned_directory(self.cache_root) / "logs")

    def read(self, job_dir: str, read: Read) -> Evidence:
        """The capture's read (`worker.pipeline.capture.JobLogs`): the evidence, its logs read
        through the job's cache, the S3 copy written meanwhile until `settle`."""
        return self.collect(job_dir, read, share_later=True)[0]

    def settle(self) -> None:
        """Wait for the S3 copies this process is writing (`finish_sharing`)."""
        finish_sharing()

    def collect(
        self, job_dir: str, read: Read, *, share_later: bool = False
    ) -> tuple[Evidence, CacheRun]:
        """The evidence, its logs read through the job's cache; and what the cache did. With
        `share_later`, the S3 copy is written by a thread of this process while the caller
        goes on (the run is complete once `finish_sharing` returned); a later collect of the
        same job in this process waits for it first."""
        self.root = self._own_root()
        try:
            job = confine(self.bundle_root, job_dir)
        except OutsideBundleRootError:
            return read(None), CacheRun(job=job_dir, notes=["outside the bundle root: no cache"])
        run = CacheRun(job=job)
        folder = self.root / job_id(job)
        finish_sharing(folder)
        self._guarded(run, "read the shared log cache", lambda: self.shared.pull(job, folder, run))
        cache = _WatchedCache(folder, write_later=share_later)
        evidence = read(cache)
        run.reads = list(cache.reads.values())
        _noted(run, cache.notes)
        if run.pulled is not None and (cache.notes or not run.reused_bytes):
            # an archive with a damaged entry, or of no use (all of another version): it goes,
            # so the one written after this capture is the newest
            pulled = run.pulled
            self._guarded(run, "delete a useless archive", lambda: self.store.delete(pulled))
        finish = partial(self._finish, job, folder, cache, run)
        if share_later:
            _Share.start_for(folder, finish)
        else:
            finish()
        return evidence, run

    def _finish(self, job: str, folder: Path, cache: _WatchedCache, run: CacheRun) -> None:
        """After the read: write the entries kept back, tidy the disk, share, report."""
        notes = len(cache.notes)
        self._guarded(run, "write the log cache", cache.write_stored)
        _noted(run, cache.notes[notes:])
        self._guarded(run, "tidy the log cache", lambda: self._tidy(cache, folder))
        self._guarded(run, "share the log cache", lambda: self.shared.push(job, folder, run))
        self._report(run)

    # --- disk -----------------------------------------------------------------------------------

    def _tidy(self, cache: _WatchedCache, folder: Path) -> None:
        """Drop the entries of files the job no longer has; bound the disk."""
        if cache.reads:
            cache.retain(cache.reads)
        if folder.is_dir():
            os.utime(folder)
        self.prune()

    def prune(self) -> list[Path]:
        """Remove job folders older than `max_age_s`, then the least recently used beyond
        `disk_bytes`, and what a process that died left (staging folders older than an hour);
        returns what was removed. Listed and removed through the root's descriptor: a symlink
        in it is never followed (`shared.safefs.Folder`)."""
        root = Folder.existing(self.root)
        if root is None:
            return []
        with root:
            removed = _pruned(root, self.limits, time.time())
        return [self.root / name for name in removed]

    # --- reporting ------------------------------------------------------------------------------

    def _guarded(self, run: CacheRun, what: str, step: Callable[[], None]) -> None:
        """Run a cache step; its failure is a note (the logs are then read whole), not an error
        of the capture (time limits and memory excepted)."""
        try:
            step()
        except Exception as exc:
            if _must_propagate(exc):
                raise
            run.notes.append(f"could not {what}: {describe(exc)}")

    def _report(self, run: CacheRun) -> None:
        log.info("%s", run.line())
        for note in run.notes:
            log.warning("log cache for %s: %s", run.job, note)
        resumed = sum(1 for r in run.reads if r.reused)
        log_cache_used(
            resumed, len(run.reads) - resumed, run.parsed_bytes, run.reused_bytes, run.shared
        )


class _Share(threading.Thread):
    """The S3 copy of one job's log cache, written beside the capture (`share_later`)."""

    _under_way: ClassVar[dict[Path, _Share]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, step: Callable[[], None]) -> None:
        super().__init__(name="rlhealth-log-cache-share", daemon=True)
        self.step = step
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self.step()
        except BaseException as exc:  # handed to the thread that waits (a MemoryError, say)
            self.failure = exc

    @classmethod
    def start_for(cls, folder: Path, step: Callable[[], None]) -> None:
        share = cls(step)
        with cls._lock:
            cls._under_way[folder] = share
        share.start()

    @classmethod
    def taken(cls, folder: Path | None) -> list[_Share]:
        with cls._lock:
            if folder is None:
                shares = list(cls._under_way.values())
                cls._under_way.clear()
                return shares
            share = cls._under_way.pop(folder, None)
            return [] if share is None else [share]


def finish_sharing(folder: Path | None = None) -> None:
    """Wait for the S3 copies this process is writing (of the job folder `folder`, or all);
    what failed in one of them that is not a note (a memory error) is raised here."""
    for share in _Share.taken(folder):
        share.join()
        if share.failure is not None:
            raise share.failure


# --- the disk -----------------------------------------------------------------------------------

_WITHHELD: Final = "it holds text the redactor hides, so it is not shared through S3"


def _pruned(root: Folder, limits: CacheLimits, now: float) -> list[str]:
    """Remove from `root` the staging folders older than `_LEFTOVER_S`, then the job folders
    older than `limits.max_age_s` and the least recently used beyond `limits.disk_bytes`; the
    names removed. Symlinks are neither followed nor counted."""
    every = [entry for entry in root.entries() if entry.is_dir]
    leftovers = [e.name for e in every if e.name.startswith(".") and e.mtime < now - _LEFTOVER_S]
    folders = sorted(
        (e for e in every if not e.name.startswith(".")), key=lambda e: e.mtime, reverse=True
    )
    cutoff, used, old = now - limits.max_age_s, 0, []
    for entry in folders:
        used += root.size(entry.name)
        if entry.mtime < cutoff or used > limits.disk_bytes:
            old.append(entry.name)
    return [name for name in [*leftovers, *old] if root.remove(name)]


def _swap(staging: Path, folder: Path) -> None:
    """Put `staging` where `folder` is, whole."""
    old = folder.with_name(f".old-{folder.name}-{os.getpid()}")
    if folder.exists():
        folder.rename(old)
    staging.rename(folder)
    remove_tree(old)
