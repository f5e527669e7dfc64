"""Freeze the evidence of a diagnosis to files, and thaw it back, so a replay judges the same thing.

Layout of a frozen directory (format 2; uploaded to S3 `evidence/<event_id>/`):

```
parts/<digest>-<sha256>.parquet   the table parts this freeze wrote (see below)
probes/...               the probe files in docs/probes.md's layout (probes.json, controller.json,
                         attempts.json, processes.json, stacks/, gpus/), readable by the
                         `recorded` backend
evidence.json            everything else as JSON, written last: its presence marks a whole freeze;
                         it lists the parts of every table in order
```

Each table (every LogTables frame, empty ones included, and the trial table) of at most PART_ROWS
rows is one part (an empty table is one part of no rows); a longer one is cut into parts of
PART_ROWS rows from its first row, and the rows after the last of them into parts of PART_ROWS //
TAIL_PARTS rows (so a grown table rewrites at most a quarter part of its earlier rows). A part
is named by `<digest>-<sha256>`: the digest (32 hex) is a SHA-256 of the redactor's rules
(`shared.redact.RULES_DIGEST`: a part redacted under older rules is not reused under newer ones,
it is written again), the table's name, its schema and the 64-bit hash of every row
(`DataFrame.hash_rows`; a changed row keeps its part's digest only if its hash collides with the
old row's, about 1 in 2^64), so a part holding the same rows has the same
digest (within one polars version: another one may hash differently, and then writes every part
again); the SHA-256 is that of the Parquet file as written (redacted), checked when it is
read back. When a job's log grows, its tables grow at the end: every full part before the new rows
keeps its digest, and a freeze given the parts stored already (`stored`) writes only the others —
the last, partial part and the new ones (and, once a table's rows after its last full part fill a
whole PART_ROWS, that full part once). `parts_at` says where the parts are kept (the pipeline:
S3 `evidence-parts/<job>/`, shared by the diagnoses of one job); without it they stay in the
freeze's own `parts/`. Format 1 (`logs/<table>.parquet`, `trials/trials.parquet`, one file a
table) is still thawed.

`thaw` reads `evidence.json` and the parts it lists (from `parts/`, or through `fetch` for parts
kept elsewhere), through an optional `PartCache`: a bounded LRU of parts read, by bytes, so a
process that thawed a job's earlier diagnosis reads only the new parts. A part that is missing,
does not match its SHA-256, or does not read back with its rows and columns raises
`FrozenEvidenceError`: the evidence is never thawed with a table cut short. The probe layout is a
by-product for people and for the `recorded` backend, while `evidence.json` keeps the exact probe
model, so the thawed `Evidence` equals the frozen one field for field, as of the same `now` —
except that every file written here passed the redactor (`shared.redact`): credentials in the
manifest, log heads, tables and probe outputs never reach the frozen copy (or S3). A part is
redacted before it is written, so every part stored (and re-used by a later freeze) is
redaction-clean.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import polars as pl

from shared.redact import RULES_DIGEST, cut_bytes, redact_data, redact_frame
from shared.settings import Thresholds
from worker.evidence import schema
from worker.evidence.case import Evidence
from worker.evidence.model import (
    BundleInfo,
    LogTables,
    ModeDecision,
    ParseSummary,
    ProbeEvidence,
    TrialTables,
)
from worker.evidence.probes import write_probes
from worker.evidence.values import JSON_MAX_DEPTH, loads_json

__all__ = [
    "FORMAT",
    "MARKER",
    "PARTS",
    "PART_ROWS",
    "TAIL_PARTS",
    "Fetch",
    "FrozenEvidenceError",
    "PartCache",
    "PartRef",
    "freeze",
    "referenced_parts",
    "thaw",
]

FORMAT: Final = 2  # 2: tables in content-addressed parts; 1: one Parquet file a table
_THAWED_FORMATS: Final = (1, 2)
MARKER: Final = "evidence.json"
PARTS: Final = "parts"
PART_ROWS: Final = 65536
TAIL_PARTS: Final = 4  # a large table's rows after its last full part: parts of PART_ROWS // 4
QUOTED_LINE_MAX_BYTES: Final = 16 * 1024
_PART_TAG: Final = b"rlhealth frozen part 1\0"
_SEED: Final = 0
_LOG_FRAMES: Final = tuple(f.name for f in dataclasses.fields(LogTables) if f.name != "summary")
_TRIALS: Final = "trials"
# Tables that gained columns since format 1 was written: an older freeze thaws with them as nulls.
_GROWN: Final[dict[str, dict[str, pl.DataType]]] = {
    "errors": schema.ERRORS,
    _TRIALS: schema.TRIALS,
}

Fetch = Callable[[str, str], bytes]
"""The bytes of a part kept elsewhere: `(parts_at, part file name)`; raises `KeyError` or
`FileNotFoundError` when it is gone."""


class FrozenEvidenceError(ValueError):
    """A frozen directory that is incomplete, damaged or of another format."""


@dataclass(frozen=True)
class PartRef:
    """One part of a table: the digest of its rows, the SHA-256 of its file, its row count."""

    digest: str
    sha256: str
    rows: int

    @property
    def name(self) -> str:
        return f"{self.digest}-{self.sha256}.parquet"

    def as_json(self) -> list[Any]:
        return [self.digest, self.sha256, self.rows]

    @classmethod
    def from_json(cls, data: Any) -> PartRef:
        if not (isinstance(data, list) and len(data) == 3):
            raise FrozenEvidenceError(f"a part reference is not [digest, sha256, rows]: {data!r}")
        digest, sha, rows = data
        hexes = all(isinstance(v, str) and _is_hex(v) for v in (digest, sha))
        if not hexes or len(digest) != 32 or len(sha) != 64:
            raise FrozenEvidenceError(f"a part reference has no digest or SHA-256: {data!r}")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            raise FrozenEvidenceError(f"a part reference has no row count: {data!r}")
        return cls(digest, sha, rows)


def _is_hex(text: str) -> bool:
    return all(ch in "0123456789abcdef" for ch in text)


class PartCache:
    """A bounded LRU of thawed parts, by their estimated bytes (`max_bytes`); the parts of one
    process's thaws, so a later thaw of the same job reads only the parts it lacks."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._frames: OrderedDict[str, tuple[pl.DataFrame, int]] = OrderedDict()

    def get(self, name: str) -> pl.DataFrame | None:
        found = self._frames.get(name)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self._frames.move_to_end(name)
        return found[0]

    def put(self, name: str, frame: pl.DataFrame) -> None:
        size = int(frame.estimated_size())
        if name in self._frames or size > self.max_bytes:
            return
        self._frames[name] = (frame, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self._frames.popitem(last=False)
            self.bytes -= dropped

    def __len__(self) -> int:
        return len(self._frames)


# --- freezing -------------------------------------------------------------------------------------


def _write_json(path: Path, data: Any) -> Path:
    """Write JSON with every string redacted and every value under a credential's key hidden."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(redact_data(data), indent=1, sort_keys=True), encoding="utf-8")
    return path


def _spans(height: int) -> list[tuple[int, int]]:
    """`(offset, length)` of each part of a table of `height` rows: one part when it has at most
    PART_ROWS rows (an empty table is one part of no rows); else parts of PART_ROWS rows from its
    first row, and the rows after the last of them in parts of PART_ROWS // TAIL_PARTS, so a
    table that grew rewrites at most that many of its earlier rows, not up to PART_ROWS."""
    if height <= PART_ROWS:
        return [(0, height)]
    full = height - height % PART_ROWS
    tail = max(PART_ROWS // TAIL_PARTS, 1)
    spans = [(start, PART_ROWS) for start in range(0, full, PART_ROWS)]
    return spans + [(start, min(tail, height - start)) for start in range(full, height, tail)]


def _digests(name: str, frame: pl.DataFrame) -> list[str]:
    """The digest of each part of `frame`: its rows' hashes under the table's name and schema."""
    hashes = [frame.hash_rows(_SEED).to_numpy()] if frame.width else []
    head = _PART_TAG + f"{RULES_DIGEST}\0{name}\0{list(frame.schema.items())!r}\0".encode()
    digests = []
    for start, length in _spans(frame.height):
        digest = hashlib.sha256(head + str(length).encode() + b"\0")
        for column in hashes:
            digest.update(column[start : start + length].tobytes())
        digests.append(digest.hexdigest()[:32])
    return digests


@dataclass
class _Freezer:
    """Writes the parts of one freeze under `directory/parts/`, but those `stored` already.

    `stored` is looked up only once every table's digests are known, so a mapping that lists the
    stored parts meanwhile is not waited for before the rows are hashed; the parts to write are
    then written in table order, each once (two spans of a table with the same rows share one)."""

    directory: Path
    stored: Mapping[str, str]  # digest -> SHA-256 of the parts kept already
    written: list[Path] = dataclasses.field(default_factory=list)

    def tables(self, frames: Mapping[str, pl.DataFrame]) -> dict[str, list[list[Any]]]:
        """The references of the parts of each frame, in order, by table name."""
        layout = {
            name: list(zip(_spans(frame.height), _digests(name, frame), strict=True))
            for name, frame in frames.items()
        }  # every table hashed before `stored` is asked
        wanted: dict[str, pl.DataFrame] = {}
        for name, spans in layout.items():
            for (start, length), digest in spans:
                if digest not in self.stored:
                    wanted.setdefault(digest, frames[name].slice(start, length))
        shas = {digest: self._write(digest, part) for digest, part in wanted.items()}
        return {
            name: [
                PartRef(digest, shas.get(digest) or self.stored[digest], length).as_json()
                for (_, length), digest in spans
            ]
            for name, spans in layout.items()
        }

    def _write(self, digest: str, part: pl.DataFrame) -> str:
        """Write one part, redacted (vectorised prefilter, `redact_frame`); its SHA-256."""
        buffer = io.BytesIO()
        redact_frame(part).write_parquet(buffer)
        body = buffer.getvalue()
        sha = hashlib.sha256(body).hexdigest()
        path = self.directory / PARTS / PartRef(digest, sha, part.height).name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        self.written.append(path)
        return sha


def _freeze_probes(probes: ProbeEvidence, directory: Path) -> list[Path]:
    """The probe files in docs/probes.md's layout, written by the probe module itself."""
    root = directory / "probes"
    write_probes(probes, {}, root)
    return sorted(path for path in root.rglob("*") if path.is_file())


def _trials_meta(trials: TrialTables, refs: dict[str, list[list[Any]]]) -> dict[str, Any]:
    return {
        "parts": refs[_TRIALS],
        "directory": trials.directory,
        "sync_selection": trials.sync_selection,
        "skipped_objects": list(trials.skipped_objects),
        "unreadable": list(trials.unreadable),
    }


def _summary(summary: ParseSummary) -> dict[str, Any]:
    """The parse summary; its quoted lines cut to QUOTED_LINE_MAX_BYTES (a log line may be 300
    MB)."""
    data = summary.to_json()
    for name in ("head", "malformed_examples"):
        data[name] = [cut_bytes(line, QUOTED_LINE_MAX_BYTES) for line in data.get(name) or ()]
    return data


def _frames(evidence: Evidence) -> dict[str, pl.DataFrame]:
    """Every table to freeze, by name: the log tables, then the trial table."""
    logs, trials = evidence.logs, evidence.trials
    frames = {} if logs is None else {name: getattr(logs, name) for name in _LOG_FRAMES}
    return frames if trials is None else {**frames, _TRIALS: trials.trials}


def _document(evidence: Evidence, freezer: _Freezer, parts_at: str | None) -> dict[str, Any]:
    logs, trials, probes = evidence.logs, evidence.trials, evidence.probes
    refs = freezer.tables(_frames(evidence))
    return {
        "format": FORMAT,
        "parts_at": parts_at,
        "job_dir": evidence.job_dir,
        "now": evidence.now.isoformat(),
        "thresholds": evidence.thresholds.model_dump(mode="json"),
        "mode": evidence.mode.model_dump(mode="json"),
        "bundle": evidence.bundle.model_dump(mode="json"),
        "discrepancies": list(evidence.discrepancies),
        "inputs": list(evidence.inputs),
        "logs": None if logs is None else _logs_meta(logs, refs),
        "trials": None if trials is None else _trials_meta(trials, refs),
        "probes": None if probes is None else probes.model_dump(mode="json"),
    }


def _logs_meta(logs: LogTables, refs: dict[str, list[list[Any]]]) -> dict[str, Any]:
    tables = {name: refs[name] for name in _LOG_FRAMES}
    return {"summary": _summary(logs.summary), "tables": tables}


def freeze(
    evidence: Evidence,
    directory: Path,
    *,
    parts_at: str | None = None,
    stored: Mapping[str, str] | None = None,
) -> list[Path]:
    """Write `evidence` under `directory`; returns the files written: the new parts first,
    `evidence.json` last. `stored` maps the digest of each part kept at `parts_at` already to
    its SHA-256 (those are referenced, not written); the parts written go under `parts/`, for
    the caller to keep at `parts_at` (without `parts_at`, they stay there)."""
    directory.mkdir(parents=True, exist_ok=True)
    freezer = _Freezer(directory, stored if parts_at is not None and stored is not None else {})
    document = _document(evidence, freezer, parts_at)
    written = list(freezer.written)
    if evidence.probes is not None:
        written += _freeze_probes(evidence.probes, directory)
    written.append(_write_json(directory / MARKER, document))
    return written


# --- thawing --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Thawer:
    """Reads the parts a document lists: from `directory/parts/`, else through `fetch`."""

    directory: Path
    parts_at: str | None
    fetch: Fetch | None
    cache: PartCache | None

    def table(self, refs: Any, name: str) -> pl.DataFrame:
        if not isinstance(refs, list) or not refs:
            raise FrozenEvidenceError(f"frozen evidence lists no parts for {name}")
        frames = [self.part(PartRef.from_json(ref)) for ref in refs]
        if len(frames) == 1:
            return frames[0]
        try:
            return pl.concat(frames, how="vertical", rechunk=False)
        except pl.exceptions.PolarsError as exc:
            raise FrozenEvidenceError(f"the parts of {name} do not have one schema") from exc

    def part(self, ref: PartRef) -> pl.DataFrame:
        cached = self.cache.get(ref.name) if self.cache is not None else None
        if cached is not None:
            return cached
        body = self._bytes(ref)
        if hashlib.sha256(body).hexdigest() != ref.sha256:
            raise FrozenEvidenceError(f"the part {ref.name} does not match its SHA-256")
        try:
            frame = pl.read_parquet(io.BytesIO(body))
        except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
            raise FrozenEvidenceError(f"the part {ref.name} does not read: {exc}") from exc
        if frame.height != ref.rows:
            raise FrozenEvidenceError(
                f"the part {ref.name} holds {frame.height} rows, not {ref.rows}"
            )
        if self.cache is not None:
            self.cache.put(ref.name, frame)
        return frame

    def _bytes(self, ref: PartRef) -> bytes:
        local = self.directory / PARTS / ref.name
        if local.is_file():
            return local.read_bytes()
        if self.parts_at is None or self.fetch is None:
            raise FrozenEvidenceError(f"frozen evidence lacks its part {ref.name}")
        try:
            return self.fetch(self.parts_at, ref.name)
        except (KeyError, FileNotFoundError) as exc:
            raise FrozenEvidenceError(f"the part {ref.name} is gone from {self.parts_at}") from exc


def _read_frame(path: Path) -> pl.DataFrame:
    if not path.is_file():
        raise FrozenEvidenceError(f"frozen evidence lacks {path.name}")
    return pl.read_parquet(path)


def _with_new_columns(name: str, frame: pl.DataFrame) -> pl.DataFrame:
    wanted = _GROWN.get(name, {})
    missing = [pl.lit(None, dtype=t).alias(c) for c, t in wanted.items() if c not in frame.columns]
    return frame.with_columns(missing) if missing else frame


def _log_frames(meta: dict[str, Any], directory: Path, thawer: _Thawer | None) -> dict[str, Any]:
    """The frames of `LogTables`: from the parts listed (format 2) or one file each (format 1)."""
    if thawer is None:
        return {name: _read_frame(directory / "logs" / f"{name}.parquet") for name in _LOG_FRAMES}
    tables = meta.get("tables")
    if not isinstance(tables, dict):
        raise FrozenEvidenceError("frozen evidence lists no log tables")
    return {name: thawer.table(tables.get(name), name) for name in _LOG_FRAMES}


def _thaw_logs(
    meta: dict[str, Any] | None, directory: Path, thawer: _Thawer | None
) -> LogTables | None:
    if meta is None:
        return None
    frames = _log_frames(meta, directory, thawer)
    grown = {name: _with_new_columns(name, frame) for name, frame in frames.items()}
    return LogTables(summary=ParseSummary.from_json(meta["summary"]), **grown)


def _thaw_trials(
    meta: dict[str, Any] | None, directory: Path, thawer: _Thawer | None
) -> TrialTables | None:
    if meta is None:
        return None
    if thawer is None:
        trials = _read_frame(directory / "trials" / "trials.parquet")
    else:
        trials = thawer.table(meta.get("parts"), _TRIALS)
    return TrialTables(
        trials=_with_new_columns(_TRIALS, trials),
        directory=meta["directory"],
        sync_selection=meta["sync_selection"],
        skipped_objects=tuple(meta["skipped_objects"]),
        unreadable=tuple(meta["unreadable"]),
    )


def _read_document(directory: Path) -> dict[str, Any]:
    try:
        # the document nests the manifest and probe files a few levels down
        document = loads_json((directory / MARKER).read_bytes(), 2 * JSON_MAX_DEPTH)
    except FileNotFoundError as exc:
        raise FrozenEvidenceError(f"{directory} holds no {MARKER}: not a frozen evidence") from exc
    except ValueError as exc:  # bounded JSON: too deep, a huge integer, or no JSON at all
        raise FrozenEvidenceError(f"{directory}/{MARKER} does not parse: {exc}") from exc
    if not isinstance(document, dict):
        raise FrozenEvidenceError(f"{directory}/{MARKER} is not a JSON object")
    if document.get("format") not in _THAWED_FORMATS:
        raise FrozenEvidenceError(f"{directory}: frozen format {document.get('format')!r}")
    return document


def referenced_parts(body: bytes) -> frozenset[str]:
    """The parts an `evidence.json` references kept elsewhere, as `parts_at` + part file name
    (none for format 1, or for a freeze that keeps its parts in its own `parts/`); raises
    `FrozenEvidenceError` for a document that does not read."""
    try:
        document = loads_json(body, 2 * JSON_MAX_DEPTH)
    except ValueError as exc:
        raise FrozenEvidenceError(f"{MARKER} does not parse: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") not in _THAWED_FORMATS:
        raise FrozenEvidenceError(f"{MARKER} is not a frozen evidence of a known format")
    place = document.get("parts_at")
    if document["format"] < 2 or not isinstance(place, str):
        return frozenset()
    logs, trials = document.get("logs") or {}, document.get("trials") or {}
    lists = [*(logs.get("tables") or {}).values(), trials.get("parts") or []]
    return frozenset(place + PartRef.from_json(ref).name for refs in lists for ref in refs)


def thaw(
    directory: Path, *, fetch: Fetch | None = None, cache: PartCache | None = None
) -> Evidence:
    """The Evidence `freeze` wrote under `directory`; parts kept elsewhere are read through
    `fetch`, and through `cache` when one is given."""
    document = _read_document(directory)
    thawer = None
    if document["format"] >= 2:
        place = document.get("parts_at")
        thawer = _Thawer(directory, place if isinstance(place, str) else None, fetch, cache)
    probes = document["probes"]
    return Evidence(
        job_dir=document["job_dir"],
        now=datetime.fromisoformat(document["now"]),
        # every field is in the document, so none falls back to the environment of the replay
        thresholds=Thresholds.model_validate(document["thresholds"]),
        mode=ModeDecision.model_validate(document["mode"]),
        bundle=BundleInfo.model_validate(document["bundle"]),
        logs=_thaw_logs(document["logs"], directory, thawer),
        trials=_thaw_trials(document["trials"], directory, thawer),
        probes=None if probes is None else ProbeEvidence.model_validate(probes),
        discrepancies=tuple(document["discrepancies"]),
        inputs=tuple(document.get("inputs", ())),  # frozen before inputs were kept: none
    )
