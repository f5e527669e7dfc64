"""The table parts of frozen evidence, shared by the diagnoses of a job (`worker.evidence.frozen`).

    S3 evidence-parts/<job id>/<digest>-<sha256>.parquet     one part, written once
    <cache_dir>/parts/<digest>-<sha256>.parquet              the worker's disk copy of parts it
                                                             wrote or read (removed after an hour
                                                             unused)

`<job id>` is the job key's `job_id` (as the log cache's). A capture lists the job's parts stored
already and freezes only the others (a grown log: its tables' last part and the new ones); each
diagnosis's `evidence.json` lists the parts of each table in order. A gate thaws through the
process's `PartCache` (THAW_CACHE_BYTES), then the disk copy, then S3; every part is checked
against its SHA-256 when it is read. A referenced part that is gone is a `FrozenEvidenceError`,
never a table cut short.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path
from typing import Final

from shared.alerts import OutsideBundleRootError, confine
from worker.evidence.frozen import FrozenEvidenceError
from worker.pipeline.logcache import job_id
from worker.pipeline.store import ObjectStore

__all__ = ["PARTS_PREFIX", "THAW_CACHE_BYTES", "SharedParts", "job_parts", "stored_parts"]

PARTS_PREFIX: Final = "evidence-parts/"
THAW_CACHE_BYTES: Final = 1024 * 2**20
"""The bytes of thawed parts (polars' estimate) one worker process keeps for later thaws."""
_PART_NAME: Final = re.compile(r"^([0-9a-f]{32})-([0-9a-f]{64})\.parquet$")
_DISK_MAX_AGE_S: Final = 3600


def job_parts(bundle_root: Path, job_dir: str) -> str:
    """The S3 prefix of the parts of a job (the job key as the coalescer and log cache see it)."""
    try:
        job = confine(bundle_root, job_dir)
    except OutsideBundleRootError:
        job = job_dir
    return f"{PARTS_PREFIX}{job_id(job)}/"


def stored_parts(store: ObjectStore, prefix: str) -> dict[str, str]:
    """The digest and SHA-256 of every part stored under `prefix`."""
    found: dict[str, str] = {}
    for key in store.keys(prefix):
        match = _PART_NAME.match(key[len(prefix) :])
        if match is not None:
            found[match.group(1)] = match.group(2)
    return found


class SharedParts:
    """The parts in S3, with the worker's disk copy in front."""

    def __init__(self, store: ObjectStore, directory: Path) -> None:
        self.store = store
        self.directory = directory

    def keep(self, prefix: str, path: Path) -> None:
        """Store the part file `path` under `prefix` (once), and keep a disk copy."""
        self.store.put_once(prefix + path.name, path.read_bytes())
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
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, name_of = tempfile.mkstemp(prefix=".part-", dir=self.directory)
            staging = Path(name_of)
            with os.fdopen(fd, "wb") as handle:
                handle.write(body)
            staging.replace(self.directory / name)
        except OSError:
            if staging is not None:
                staging.unlink(missing_ok=True)

    def prune(self) -> None:
        """Remove disk copies unused for an hour."""
        if not self.directory.is_dir():
            return
        cutoff = time.time() - _DISK_MAX_AGE_S
        for path in self.directory.iterdir():
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
            except OSError:
                continue
