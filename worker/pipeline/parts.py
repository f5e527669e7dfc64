"""The table parts of frozen evidence, shared by the diagnoses of a job (`worker.evidence.frozen`).

    S3 evidence-parts/<job id>/<digest>-<sha256>.parquet     one part, written once
    <cache_dir>/parts/<digest>-<sha256>.parquet              the worker's disk copy of parts it
                                                             wrote or read (removed after an hour
                                                             unused)

`<job id>` is the job key's `job_id` (as the log cache's). A capture lists the job's parts stored
already and freezes only the others (a grown log: its tables' last part and the new ones); each
diagnosis's `evidence.json` lists the parts of each table in order. A gate thaws through the
process's `PartCache` (THAW_CACHE_BYTES), then the disk copy, then S3; every part is checked
against its SHA-256 when it is read (a damaged disk copy is read from S3 instead). A referenced
part that is gone is a `FrozenEvidenceError`, never a table cut short.

`sweep` applies worker.retention's rule: expired frozen evidence goes, and a part only when no
kept evidence references it and it is older than a grace (GRACE_S).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from shared.alerts import OutsideBundleRootError, confine
from shared.safefs import Folder, owned_directory
from worker.evidence.frozen import MARKER, FrozenEvidenceError, referenced_parts
from worker.pipeline.store import ObjectMissingError, ObjectStore, put_all
from worker.retention import FrozenRecord, expired_evidence, unreferenced_parts

__all__ = [
    "PARTS_PREFIX",
    "THAW_CACHE_BYTES",
    "SharedParts",
    "StoredLater",
    "Swept",
    "job_id",
    "job_parts",
    "part_matches",
    "part_name",
    "part_of",
    "parts_among",
    "stored_parts",
    "sweep",
]

log = logging.getLogger(__name__)

PARTS_PREFIX: Final = "evidence-parts/"
THAW_CACHE_BYTES: Final = 1024 * 2**20
"""The bytes of thawed parts (polars' estimate) one worker process keeps for later thaws."""
_PART_NAME: Final = re.compile(r"^([0-9a-f]{32})-([0-9a-f]{64})\.parquet$")
_DISK_MAX_AGE_S: Final = 3600
_EVIDENCE: Final = "evidence/"
GRACE_S: Final = 6 * 3600


def job_id(job: str) -> str:
    """The folder and key segment of a job key (the log cache's and the parts')."""
    return hashlib.sha256(job.encode("utf-8", errors="surrogateescape")).hexdigest()[:32]


def part_name(digest: str, sha256: str) -> str:
    """The object name of a part: its digest (32 hex) and the SHA-256 of its bytes."""
    return f"{digest}-{sha256}.parquet"


def job_parts(bundle_root: Path, job_dir: str) -> str:
    """The S3 prefix of the parts of a job (the job key as the coalescer and log cache see it)."""
    try:
        job = confine(bundle_root, job_dir)
    except OutsideBundleRootError:
        job = job_dir
    return f"{PARTS_PREFIX}{job_id(job)}/"


def part_matches(name: str, body: bytes) -> bool:
    """Whether `body` is the part `name` says (its SHA-256)."""
    match = _PART_NAME.match(name)
    return match is not None and hashlib.sha256(body).hexdigest() == match.group(2)


def stored_parts(store: ObjectStore, prefix: str) -> dict[str, str]:
    """The digest and SHA-256 of every part stored under `prefix`."""
    return parts_among(store.keys(prefix), prefix)


class StoredLater(Mapping[str, str]):
    """`stored_parts` listed by a thread from now on, so a freeze hashes its rows meanwhile: the
    first lookup waits for the listing (and raises what the listing raised). Use it as a context
    manager: leaving waits for the listing, so no request outlives the capture that made it."""

    def __init__(self, store: ObjectStore, prefix: str) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rlhealth-stored-parts")
        self._listed: Future[dict[str, str]] = self._pool.submit(stored_parts, store, prefix)

    def _parts(self) -> dict[str, str]:
        return self._listed.result()

    def __getitem__(self, digest: str) -> str:
        return self._parts()[digest]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts())

    def __len__(self) -> int:
        return len(self._parts())

    def __enter__(self) -> StoredLater:
        return self

    def __exit__(self, *_: object) -> None:
        self._pool.shutdown(wait=True)


def parts_among(keys: Iterable[str], prefix: str) -> dict[str, str]:
    """The digest and SHA-256 of every part among `keys` directly under `prefix`."""
    return dict(part for part in (part_of(key, prefix) for key in keys) if part is not None)


def part_of(key: str, prefix: str) -> tuple[str, str] | None:
    """The digest and SHA-256 of the part `key` names directly under `prefix` (None: no part)."""
    match = _PART_NAME.match(key[len(prefix) :]) if key.startswith(prefix) else None
    return None if match is None else (match.group(1), match.group(2))


class SharedParts:
    """The parts in S3, with the worker's disk copy in front."""

    def __init__(self, store: ObjectStore, directory: Path) -> None:
        self.store = store
        self.directory = directory

    def keep(self, prefix: str, path: Path) -> None:
        """Store the part file `path` under `prefix` (once), and keep a disk copy."""
        self.keep_all(prefix, [path])

    def keep_all(self, prefix: str, paths: list[Path]) -> None:
        """Store the part files `paths` under `prefix` (once each, a few at once: parts are
        content-addressed, their order does not matter), and keep their disk copies."""
        put_all(self.store, [(prefix + path.name, path) for path in paths])
        for path in paths:
            self._copy(path.name, path.read_bytes())

    def fetch(self, prefix: str, name: str) -> bytes:
        """The bytes of part `name` of `prefix` (frozen.Fetch); raises `FrozenEvidenceError` for
        a place that is not a job's parts, `ObjectMissingError` (a KeyError) when it is gone."""
        if not prefix.startswith(PARTS_PREFIX) or prefix.count("/") != 2 or "/" in name:
            raise FrozenEvidenceError(f"frozen evidence names parts outside {PARTS_PREFIX}")
        local = self.directory / name
        try:
            body = local.read_bytes()
            os.utime(local)
            if part_matches(name, body):  # else a damaged copy: S3's is read instead
                return body
        except OSError:
            pass
        body = self.store.get(prefix + name)
        self._copy(name, body)
        return body

    def _copy(self, name: str, body: bytes) -> None:
        """A disk copy written whole (a full disk costs the copy, not the diagnosis)."""
        staging: Path | None = None
        try:
            owned_directory(self.directory)  # under the checked cache root: made 0700 if missing
            fd, name_of = tempfile.mkstemp(prefix=".part-", dir=self.directory)
            staging = Path(name_of)
            with os.fdopen(fd, "wb") as handle:
                handle.write(body)
            staging.replace(self.directory / name)
        except OSError:
            if staging is not None:
                staging.unlink(missing_ok=True)

    def prune(self) -> None:
        """Remove disk copies unused for an hour, through the directory's descriptor (a symlink
        in it is removed, never followed)."""
        directory = Folder.existing(self.directory)
        if directory is None:
            return
        cutoff = time.time() - _DISK_MAX_AGE_S
        with directory:
            for entry in directory.entries():
                if entry.mtime < cutoff:
                    directory.remove(entry.name)


# --- retention ------------------------------------------------------------------------------------


@dataclass
class Swept:
    """What one sweep removed, and why it kept every part when it did."""

    evidence: list[str] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _records(store: ObjectStore, swept: Swept) -> list[FrozenRecord] | None:
    """Every frozen evidence under `evidence/` (marked whole), with the parts it references;
    None when one of them does not read (its parts are unknown, so none may go)."""
    records = []
    for key in store.keys(_EVIDENCE):
        segments = key[len(_EVIDENCE) :].split("/")
        if len(segments) != 2 or segments[1] != MARKER:
            continue
        try:
            parts = referenced_parts(store.get(key))
            records.append(FrozenRecord(segments[0], store.modified(key), parts))
        except ObjectMissingError:
            continue  # deleted meanwhile
        except FrozenEvidenceError as exc:
            swept.notes.append(f"kept every part: {key} does not read ({exc})")
            return None
    return records


def sweep(
    store: ObjectStore, *, keep_s: float, grace_s: float = GRACE_S, now: float | None = None
) -> Swept:
    """Delete the frozen evidence written more than `keep_s` ago (its `evidence.json` first, so
    what is left is an unmarked freeze), then the table parts no kept evidence references that
    are older than `grace_s` (worker.retention has the rule)."""
    now = time.time() if now is None else now
    swept = Swept()
    records = _records(store, swept)
    if records is None:
        return swept
    expired = set(expired_evidence(records, now, keep_s))
    for evidence_id in sorted(expired):
        prefix = f"{_EVIDENCE}{evidence_id}/"
        store.delete(prefix + MARKER)
        for key in store.keys(prefix):
            store.delete(key)
        swept.evidence.append(evidence_id)
    kept = [record for record in records if record.evidence_id not in expired]
    written = {}
    for key in store.keys(PARTS_PREFIX):
        try:
            written[key] = store.modified(key)
        except ObjectMissingError:
            continue
    for key in unreferenced_parts(written, kept, now, grace_s):
        store.delete(key)
        swept.parts.append(key)
    log.info("evidence sweep: %d expired, %d parts removed", len(swept.evidence), len(swept.parts))
    return swept
