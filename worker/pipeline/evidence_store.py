"""The storage adapter of frozen evidence: a capture's freeze written to S3, and read back.

    S3 evidence/<evidence id>/...                   the freeze (`worker.evidence.frozen`), its
                                                    marker `evidence.json` last
    S3 evidence-parts/<job id>/...                  its table parts (`worker.pipeline.parts`)
    <cache_dir>/evidence/<evidence id>/             this worker's copy, for its gates: left by
                                                    the capture (checked against S3 once before
                                                    use) or downloaded

A freeze whose marker is there but a referenced part is gone is lost evidence, captured again like
a freeze gone whole. Writing checks the capture's claim before every object, so a holder that was
frozen past its expiry stops instead of mixing its files with its successor's. Reading thaws once
per process and keeps the last few thawed (`_THAWED_KEPT`) for the next gate.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from typing import Final, Protocol

from pydantic import ValidationError

from shared.safefs import Folder, owned_directory, remove_tree
from shared.settings import Settings
from worker.evidence.case import Evidence
from worker.evidence.frozen import (
    MARKER,
    PARTS,
    FrozenEvidenceError,
    PartCache,
    freeze,
    referenced_parts,
    thaw,
)
from worker.pipeline.failures import (
    CaptureBusyError,
    EvidenceLostError,
    describe,
    must_propagate,
)
from worker.pipeline.parts import THAW_CACHE_BYTES, SharedParts, StoredLater, job_parts
from worker.pipeline.store import ObjectMissingError, ObjectStore, download_prefix

__all__ = ["EvidenceStore", "FrozenStore", "clear_prefix", "evidence_prefix", "frozen_now"]

log = logging.getLogger(__name__)

_THAWED_KEPT: Final = 4
_UNCHECKED: Final = ".unchecked"  # a local copy the capture left, not yet checked against S3
_CACHE_MAX_AGE_S: Final = 3600


def evidence_prefix(evidence_id: str) -> str:
    return f"evidence/{evidence_id}/"


def clear_prefix(store: ObjectStore, prefix: str) -> None:
    """Remove what a capture that died left under `prefix`, or a freeze whose parts are gone
    (its marker first), from one listing."""
    marker = prefix + MARKER
    for key in sorted(store.keys(prefix), key=lambda key: key != marker):
        store.delete(key)


def frozen_now(store: ObjectStore, evidence_id: str) -> datetime:
    """The time a frozen evidence was judged as of (its `now`)."""
    try:
        document = json.loads(store.get(evidence_prefix(evidence_id) + MARKER))
    except (ObjectMissingError, ValidationError) as exc:
        raise ObjectMissingError(f"no frozen evidence for {evidence_id}") from exc
    return datetime.fromisoformat(document["now"])


class FrozenStore(Protocol):
    """Where a capture freezes its evidence (`EvidenceStore`; tests give a fake)."""

    def label(self, evidence_id: str) -> str: ...

    def whole(self, evidence_id: str) -> bool: ...

    def discard(self, evidence_id: str) -> None: ...

    def freeze(
        self,
        evidence: Evidence,
        *,
        job_dir: str,
        evidence_id: str,
        live: Path,
        held: Callable[[], bool],
        mark: Callable[[str], None],
    ) -> None: ...


class EvidenceStore:
    """Frozen evidence in S3 and on this worker's disk: freeze, check, thaw."""

    def __init__(self, settings: Settings, store: ObjectStore) -> None:
        self.store = store
        self.bundle_root = settings.bundle_root
        # this process's own (no other user may plant evidence in it), or UnsafeDirectoryError
        root = owned_directory(settings.cache_root())
        self.cache_root = root / "evidence"
        self.parts = SharedParts(store, root / "parts")
        self.part_cache = PartCache(THAW_CACHE_BYTES)
        self._thawed: OrderedDict[str, Evidence] = OrderedDict()

    def label(self, evidence_id: str) -> str:
        """The URI the evidence is frozen at, the label its reports quote."""
        return self.store.uri(evidence_prefix(evidence_id))

    def whole(self, evidence_id: str) -> bool:
        """Whether a marked freeze is there whose every referenced table part is in S3 (a part
        gone makes it lost evidence); the parts are looked up in one listing of the place that
        keeps them, not one request each."""
        try:
            referenced = referenced_parts(self.store.get(evidence_prefix(evidence_id) + MARKER))
        except ObjectMissingError:
            return False
        except FrozenEvidenceError:
            return True  # not ours to remove (another format?): the gates say what is wrong
        places: dict[str, set[str]] = {}
        for key in referenced:
            places.setdefault(key.rpartition("/")[0] + "/", set()).add(key)
        return all(keys <= set(self.store.keys(place)) for place, keys in sorted(places.items()))

    def discard(self, evidence_id: str) -> None:
        """Drop what this worker holds of an evidence about to be captured again, and what a
        capture that died left in S3."""
        self._thawed.pop(evidence_id, None)
        remove_tree(self.cache_root / evidence_id)
        clear_prefix(self.store, evidence_prefix(evidence_id))

    def freeze(
        self,
        evidence: Evidence,
        *,
        job_dir: str,
        evidence_id: str,
        live: Path,
        held: Callable[[], bool],
        mark: Callable[[str], None],
    ) -> None:
        """Freeze `evidence` (with the raw outputs the live probes left in `live`) and store it
        while `held()` says the capture's claim is ours; the freeze stays on this worker's disk
        for its gates. `mark` is told when the phases `freeze` and `store` (the disk copy
        included) end."""
        with tempfile.TemporaryDirectory(prefix="rlhealth-freeze-") as tmp:
            frozen = Path(tmp) / "frozen"
            parts_at = job_parts(self.bundle_root, job_dir)
            with StoredLater(self.store, parts_at) as stored:  # listed while rows hash
                written = _frozen_files(evidence, live, frozen, parts_at, stored)  # marker last
            mark("freeze")
            prefix = evidence_prefix(evidence_id)
            if self._store(frozen, written, parts_at, prefix, held):
                self._keep_local(evidence_id, frozen)  # a fresh capture's evidence id
            mark("store")

    def _store(
        self,
        frozen: Path,
        written: list[Path],
        parts_at: str,
        prefix: str,
        held: Callable[[], bool],
    ) -> bool:
        """Store the files of a freeze: its new table parts a few at once (content-addressed,
        so their order does not matter), then the others one by one with the claim checked
        before each, the marker last. True when this call wrote every file under `prefix`."""
        new_parts = [path for path in written if path.relative_to(frozen).parts[0] == PARTS]
        _check_held(held, prefix)
        self.parts.keep_all(parts_at, new_parts)
        ours = True
        for path in written:
            if path.relative_to(frozen).parts[0] != PARTS:
                _check_held(held, prefix)
                relative = path.relative_to(frozen).as_posix()
                ours = self.store.put_once(prefix + relative, path.read_bytes()) and ours
        return ours

    def _keep_local(self, evidence_id: str, frozen: Path) -> None:
        """Leave the freeze just stored where this worker's gates look for their local copy
        (`_local_copy`), as a download would give it (its new parts are on the disk already,
        `SharedParts`), marked to be checked against S3 once before it is used. A disk that
        fails costs the copy: the gates download it."""
        target = self.cache_root / evidence_id
        staging: Path | None = None
        try:
            made = owned_directory(self.cache_root)
            staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=made))
            shutil.copytree(frozen, staging, dirs_exist_ok=True, ignore=_top_parts(frozen))
            (staging / _UNCHECKED).touch()
            _replace_dir(staging, target)
        except OSError as exc:
            log.warning("the freeze of %s is not kept on this disk: %s", evidence_id, exc)
            if staging is not None:
                remove_tree(staging)

    def thaw(self, evidence_id: str) -> Evidence:
        """The frozen evidence, thawed once per process and kept for the next gate; raises
        `EvidenceLostError` when it is gone or cannot be read."""
        if evidence_id in self._thawed:
            self._thawed.move_to_end(evidence_id)
            return self._thawed[evidence_id]
        directory = self._local_copy(evidence_id)
        cache, started = self.part_cache, time.perf_counter()
        hits, misses = cache.hits, cache.misses
        try:
            evidence = thaw(directory, fetch=self.parts.fetch, cache=cache)
        except Exception as exc:
            if must_propagate(exc):
                raise
            remove_tree(directory)
            raise EvidenceLostError(
                f"the frozen evidence of {evidence_id} cannot be read: {describe(exc)}"
            ) from exc
        log.info(
            "thawed %s in %.2fs: %d parts from this process's cache, %d read",
            evidence_id,
            time.perf_counter() - started,
            cache.hits - hits,
            cache.misses - misses,
        )
        self._thawed[evidence_id] = evidence
        while len(self._thawed) > _THAWED_KEPT:
            self._thawed.popitem(last=False)
        return evidence

    def _local_copy(self, evidence_id: str) -> Path:
        """The frozen evidence on this worker's disk: left by the capture (checked once that
        S3 still holds its marker) or downloaded."""
        target, prefix = self.cache_root / evidence_id, evidence_prefix(evidence_id)
        if (target / MARKER).is_file():
            if (target / _UNCHECKED).exists():
                if not self.store.exists(prefix + MARKER):
                    remove_tree(target)
                    raise EvidenceLostError(f"the frozen evidence of {evidence_id} is gone from S3")
                (target / _UNCHECKED).unlink(missing_ok=True)
            return target
        if not self.store.exists(prefix + MARKER):
            raise EvidenceLostError(f"the frozen evidence of {evidence_id} is gone from S3")
        self.prune()
        staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=owned_directory(self.cache_root)))
        download_prefix(self.store, prefix, staging)
        if not (staging / MARKER).is_file():  # objects vanished while we downloaded them
            remove_tree(staging)
            raise EvidenceLostError(f"the frozen evidence of {evidence_id} is gone from S3")
        try:
            staging.rename(target)  # atomic: other processes see all of it or none
        except OSError:
            remove_tree(staging)  # another process got there first
        return target

    def prune(self) -> None:
        """Remove local copies unused for `_CACHE_MAX_AGE_S`, through the directory's descriptor
        (a symlink in it is removed, never followed)."""
        self.parts.prune()
        root = Folder.existing(self.cache_root)
        if root is None:
            return
        cutoff = time.time() - _CACHE_MAX_AGE_S
        with root:
            for entry in root.entries():
                if entry.mtime < cutoff:
                    root.remove(entry.name)


def _check_held(held: Callable[[], bool], prefix: str) -> None:
    if not held():
        raise CaptureBusyError(f"lost the capture claim on {prefix} (too slow)")


def _top_parts(top: Path) -> Callable[[str, list[str]], list[str]]:
    """A `copytree` filter leaving out the `parts/` folder at the top of `top`."""
    return lambda folder, names: [PARTS] if Path(folder) == top and PARTS in names else []


def _replace_dir(staging: Path, target: Path) -> None:
    """Put `staging` where `target` is, whole (a process reading the old one keeps its files)."""
    old = target.with_name(f".old-{target.name}-{uuid.uuid4().hex[:8]}")
    with suppress(FileNotFoundError):
        target.rename(old)
    staging.rename(target)
    remove_tree(old)


def _frozen_files(
    evidence: Evidence, live: Path, directory: Path, parts_at: str, stored: Mapping[str, str]
) -> list[Path]:
    """Freeze `evidence` under `directory` (its tables' parts kept at `parts_at`, those
    `stored` there already not written again), with the raw outputs the live probes left in
    `live` (the commands' outputs that `probes.json` names) beside the probe files the freeze
    writes from the model, so `probes/` is the whole recorded layout; the marker stays last."""
    written = freeze(evidence, directory, parts_at=parts_at, stored=stored)
    if evidence.probes is None or not live.is_dir():
        return written
    marker, extra = written[-1], []
    for path in sorted(live.rglob("*")):
        target = directory / "probes" / path.relative_to(live)
        if path.is_file() and not path.is_symlink() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            extra.append(target)
    return [*written[:-1], *extra, marker]
