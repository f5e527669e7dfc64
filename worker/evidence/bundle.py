"""Read a watcher bundle: `manifest.json` of any generation, artifact statuses, freshness per class.

Three watcher generations write `manifest.json` (docs/domain.md#the-bundle). The reader accepts all
of them and never trusts a missing key: it becomes None or `ArtifactState.UNKNOWN`. A manifest that
is missing or does not parse gives `manifest=None` and `manifest_error`, not an exception. Freshness
of each artifact class comes from the modification time of its newest file, read through
`BundleFiles` so that nothing outside the job directory is opened; `bundle_discrepancies` lists
where the files on disk and the manifest's claims disagree. It reports; it repairs nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from shared.times import as_utc, duration_text
from worker.evidence.layout import MANIFEST
from worker.evidence.model import ArtifactState, ArtifactStatus, BundleInfo, ClassFreshness
from worker.evidence.paths import BundleFiles
from worker.evidence.values import integer, read_json, text

if TYPE_CHECKING:
    from shared.settings import Thresholds

__all__ = [
    "ARTIFACT_CLASSES",
    "CLASS_PATHS",
    "bundle_discrepancies",
    "claims_files",
    "detect_generation",
    "mtime_utc",
    "parse_artifact_status",
    "parse_timestamp",
    "read_bundle",
]

ARTIFACT_CLASSES: Final = ("finelog", "pod_logs", "ray_logs", "traces", "slurm_logs")
# Where each class lives in the job directory; slurm logs have no place in the bundle layout.
CLASS_PATHS: Final[dict[str, str]] = {
    "finelog": "finelog.log",
    "pod_logs": "pod_logs",
    "ray_logs": "ray_vllm_logs",
    "traces": "trace_jobs",
}

_N = r"\d[\d,]*"
_COUNT_RE: Final = re.compile(
    rf"^(?P<n>{_N}) (?P<unit>lines?|files?|directory|directories|pod\(s\)|pods?)\b(?P<rest>.*)$"
)
_TAIL_RE: Final = re.compile(rf"^current tail \((?P<n>{_N}) lines?\)$")
_TRACES_RE: Final = re.compile(
    rf"^(?P<fleet>fleet )?newest (?P<sel>{_N})(?:/(?P<avail>{_N}))? (?P<word>selected|traces)"
    rf"(?: \((?P<fsel>{_N})/(?P<ftotal>{_N}) total\))?"
    rf"(?:; (?P<copied>{_N}) copied, (?P<skipped>{_N}) skipped)?$"
)
_OLDEST_TRACES_RE: Final = re.compile(rf"^newest {_N}/{_N} traces\b")
_KEYWORD_STATES: Final = (
    ("partial", ArtifactState.PARTIAL),
    ("unavailable", ArtifactState.UNAVAILABLE),
    ("not requested", ArtifactState.NOT_REQUESTED),
    ("not applicable", ArtifactState.NOT_APPLICABLE),
    ("no pod yet", ArtifactState.WAITING),
    ("awaiting", ArtifactState.WAITING),
)
_MISSING: Final = object()


# --- small readers of untrusted JSON values -------------------------------------------------------


def _dig(data: object, *keys: str) -> object:
    """`data[k1][k2]...`, or `_MISSING` when any level is not a mapping or lacks the key."""
    for key in keys:
        if not isinstance(data, Mapping) or key not in data:
            return _MISSING
        data = data[key]
    return data


def _count(text: str | None) -> int | None:
    return int(text.replace(",", "")) if text else None


def parse_timestamp(value: object) -> datetime | None:
    """An ISO-8601 string as an aware UTC datetime (naive taken as UTC), else None."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _from_ms(value: object) -> datetime | None:
    millis = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if millis is None:
        return None
    try:
        return datetime.fromtimestamp(millis / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def mtime_utc(path: Path) -> datetime:
    """The modification time of `path` as an aware UTC datetime (microsecond precision); of a
    symlink itself, not of what it points to (a listed file swapped for one since)."""
    nanos = path.lstat().st_mtime_ns
    return datetime.fromtimestamp(nanos // 1000 / 1_000_000, tz=UTC)


# --- artifact status strings ----------------------------------------------------------------------


def _status(name: str, raw: str, state: ArtifactState, **fields: Any) -> ArtifactStatus:
    return ArtifactStatus(name=name, raw=raw, state=state, **fields)


def _keyword_status(name: str, raw: str) -> ArtifactStatus | None:
    lowered = raw.strip().lower()
    for keyword, state in _KEYWORD_STATES:
        if lowered.startswith(keyword):
            detail = raw.strip()[len(keyword) :].strip(" :()")
            return _status(name, raw, state, detail=detail)
    return None


def _count_status(name: str, raw: str) -> ArtifactStatus | None:
    match = _COUNT_RE.match(raw.strip())
    if match is None:
        return None
    detail = f"{match['unit']}{match['rest']}".strip()
    return _status(name, raw, ArtifactState.PRESENT, count=_count(match["n"]), detail=detail)


def _synced_status(name: str, raw: str) -> ArtifactStatus | None:
    text = raw.strip().lower()
    if text == "synced":
        return _status(name, raw, ArtifactState.PRESENT)
    match = _TAIL_RE.match(text)
    if match is None:
        return None
    detail = "status-only sweep: current tail"
    return _status(name, raw, ArtifactState.PRESENT, count=_count(match["n"]), detail=detail)


def _selection_detail(match: re.Match[str]) -> str:
    notes: list[str] = []
    selected, available = _count(match["sel"]), _count(match["avail"])
    if available is not None and selected is not None and selected < available:
        notes.append(f"selection: newest {selected} of {available} available")
    if match["ftotal"]:
        notes.append(f"fleet: {_count(match['fsel'])} of {_count(match['ftotal'])} total")
    if match["skipped"] and _count(match["skipped"]):
        notes.append(f"{_count(match['skipped'])} skipped")
    return "; ".join(notes)


def _traces_status(name: str, raw: str) -> ArtifactStatus | None:
    match = _TRACES_RE.match(raw.strip())
    if match is None:
        return None
    return _status(
        name,
        raw,
        ArtifactState.PRESENT,
        count=_count(match["sel"]),
        available=_count(match["avail"]),
        copied=_count(match["copied"]),
        skipped=_count(match["skipped"]),
        detail=_selection_detail(match),
    )


_STATUS_PARSERS: Final[tuple[Callable[[str, str], ArtifactStatus | None], ...]] = (
    _keyword_status,
    _synced_status,
    _count_status,
    _traces_status,
)


def parse_artifact_status(name: str, value: object = _MISSING) -> ArtifactStatus:
    """One `artifacts.<name>` value of the manifest, structured (UNKNOWN when unclear)."""
    if value is _MISSING:
        return ArtifactStatus(
            name=name, raw=None, state=ArtifactState.UNKNOWN, detail="key missing in manifest"
        )
    if not isinstance(value, str):
        raw = json.dumps(value, default=str)
        return _status(name, raw, ArtifactState.UNKNOWN, detail="not a status string")
    for parse in _STATUS_PARSERS:
        status = parse(name, value)
        if status is not None:
            return status
    return _status(name, value, ArtifactState.UNKNOWN, detail="unrecognised status string")


# --- the manifest ---------------------------------------------------------------------------------


def _load_manifest(files: BundleFiles) -> tuple[dict[str, Any] | None, str | None]:
    path = files.open_path(MANIFEST)
    if path is None:
        return None, f"{MANIFEST} refused: it leaves the job directory"
    if not path.is_file():
        return None, f"{MANIFEST} is missing"
    try:
        handle = files.open(MANIFEST)
        if handle is None:
            return None, f"{MANIFEST} refused: it changed while it was read"
        with handle:
            data = read_json(handle)
    except (OSError, ValueError) as exc:
        return None, f"{MANIFEST} does not parse: {exc}"
    if not isinstance(data, dict):
        return None, f"{MANIFEST} is not a JSON object but {type(data).__name__}"
    return data, None


def detect_generation(manifest: Mapping[str, Any]) -> str:
    """`newest`, `intermediate`, `oldest` or `unknown`, from which keys the manifest carries."""
    job, artifacts = manifest.get("job"), manifest.get("artifacts")
    job_keys = set(job) if isinstance(job, Mapping) else set()
    artifact_keys = set(artifacts) if isinstance(artifacts, Mapping) else set()
    if "task_state" in job_keys or "trace_selected" in artifact_keys:
        return "newest"
    if "finished_at_ms" in job_keys:
        return "intermediate"
    traces = text(_dig(artifacts, "traces"))
    if (traces and _OLDEST_TRACES_RE.match(traces)) or job_keys:
        return "oldest"
    return "unknown"


def _split_job_id(job_id: str | None) -> tuple[str | None, str | None]:
    """`/<user>/<job>` into user and job name (nested job names keep their slashes)."""
    if not job_id or not job_id.startswith("/"):
        return None, None
    parts = [part for part in job_id.split("/") if part]
    if len(parts) < 2:
        return None, None
    return parts[0], "/".join(parts[1:])


def _entrypoint(value: object) -> str | None:
    if isinstance(value, str):
        return value or None
    if isinstance(value, dict | list):
        return json.dumps(value)
    return None


def _state_text(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    return value.strip().lower() or None


def _identity(manifest: Mapping[str, Any]) -> dict[str, Any]:
    job_id = text(manifest.get("job_id")) or text(_dig(manifest, "job", "job_id"))
    user, job_name = _split_job_id(job_id)
    cluster = text(manifest.get("cluster")) or text(_dig(manifest, "job", "cluster", "name"))
    return {"job_id": job_id, "user": user, "job_name": job_name, "cluster": cluster}


def _job_fields(manifest: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "state": _state_text(_dig(manifest, "job", "state")),
        "task_state": _state_text(_dig(manifest, "job", "task_state")),
        "synced_at": parse_timestamp(manifest.get("synced_at")),
        "submitted_at": _from_ms(_dig(manifest, "job", "submitted_at_ms")),
        "finished_at": _from_ms(_dig(manifest, "job", "finished_at_ms")),
        "entrypoint": _entrypoint(_dig(manifest, "job", "entrypoint")),
        "trials_uri": text(manifest.get("trials_uri")),
    }


def _errors(value: object) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(item if isinstance(item, str) else json.dumps(item) for item in value)
    if isinstance(value, str) and value:
        return (value,)
    return ()


def _artifact_fields(manifest: Mapping[str, Any]) -> dict[str, Any]:
    artifacts = manifest.get("artifacts")
    return {
        "statuses": {
            name: parse_artifact_status(name, _dig(artifacts, name)) for name in ARTIFACT_CLASSES
        },
        "trace_started": integer(_dig(artifacts, "trace_started")),
        "trace_completed": integer(_dig(artifacts, "trace_completed")),
        "trace_selected": integer(_dig(artifacts, "trace_selected")),
        "errors": _errors(_dig(artifacts, "errors")),
    }


def _manifest_fields(manifest: Mapping[str, Any] | None) -> dict[str, Any]:
    if manifest is None:
        missing = {name: parse_artifact_status(name) for name in ARTIFACT_CLASSES}
        return {"statuses": missing}
    return {
        "generation": detect_generation(manifest),
        **_identity(manifest),
        **_job_fields(manifest),
        **_artifact_fields(manifest),
    }


# --- freshness ------------------------------------------------------------------------------------


def _class_files(files: BundleFiles, relative: str) -> list[Path]:
    path = files.open_path(relative)
    if path is None:
        return []
    if path.is_file():
        return [path]
    return list(files.walk(relative))


def claims_files(status: ArtifactStatus) -> bool:
    """True when the status says files were synced (a positive count or an explicit success)."""
    if status.state is not ArtifactState.PRESENT:
        return False
    return status.count is None or status.count > 0


def _age_reason(age_s: float, limit: float, status: ArtifactStatus) -> str:
    if age_s < 0:
        return f"newest file is {duration_text(age_s)} after now (clock skew?)"
    old = f"newest file {duration_text(age_s)} old (limit {duration_text(limit)})"
    reason = old if age_s > limit else ""
    if status.state is ArtifactState.NOT_REQUESTED:
        reason = "; ".join(filter(None, [reason, "the last sweep did not refresh this class"]))
    return reason


def _refreshed_at(
    name: str, newest: datetime, status: ArtifactStatus, synced_at: datetime | None
) -> datetime:
    """When the class was last refreshed. Every sweep, status-only ones included, refreshes the
    finelog; an unchanged log (a quiet job) keeps its old mtime, so the manifest's `synced_at`
    counts for it when the sweep reported the log present."""
    if name != "finelog" or synced_at is None or status.state is not ArtifactState.PRESENT:
        return newest
    return max(newest, synced_at)


def _freshness(
    files: BundleFiles,
    name: str,
    status: ArtifactStatus,
    now: datetime,
    limit: float,
    synced_at: datetime | None = None,
) -> ClassFreshness:
    relative = CLASS_PATHS[name]
    found = _class_files(files, relative)
    if not found:
        claimed = claims_files(status)
        reason = f"status {status.raw!r} claims files but {relative} has none" if claimed else ""
        return ClassFreshness(
            name=name, newest_mtime=None, age_s=None, stale=claimed, reason=reason or "no files"
        )
    newest = max(mtime_utc(path) for path in found)
    age_s = (now - _refreshed_at(name, newest, status, synced_at)).total_seconds()
    return ClassFreshness(
        name=name,
        newest_mtime=newest,
        age_s=age_s,
        stale=age_s > limit,
        reason=_age_reason(age_s, limit, status),
        n_files=len(found),
    )


def read_bundle(
    job_dir: Path, now: datetime, thresholds: Thresholds, files: BundleFiles | None = None
) -> BundleInfo:
    """The manifest of `job_dir` and the freshness of each artifact class as of `now`."""
    files = files if files is not None else BundleFiles(job_dir)
    manifest, error = _load_manifest(files)
    fields = _manifest_fields(manifest)
    statuses: dict[str, ArtifactStatus] = fields["statuses"]
    now = as_utc(now)
    freshness = {
        name: _freshness(
            files, name, statuses[name], now, thresholds.max_evidence_age_s, fields.get("synced_at")
        )
        for name in CLASS_PATHS
    }
    return BundleInfo(
        job_dir=job_dir,
        manifest=manifest,
        manifest_error=error,
        freshness=freshness,
        refused_paths=tuple(files.refused),
        **fields,
    )


# --- discrepancies --------------------------------------------------------------------------------


def _count_mismatch(status: ArtifactStatus, fresh: ClassFreshness) -> str | None:
    match = _COUNT_RE.match(status.raw or "")
    if match is None or status.count is None or fresh.n_files == 0:
        return None
    unit = match["unit"]
    if not (unit.startswith(("pod", "file"))) or fresh.n_files == status.count:
        return None
    return (
        f"artifacts.{status.name} says {status.raw!r} but {CLASS_PATHS[status.name]}/ "
        f"holds {fresh.n_files} file(s)"
    )


def _class_discrepancies(info: BundleInfo) -> Iterable[str]:
    for name, fresh in info.freshness.items():
        status = info.statuses.get(name)
        if status is None:
            continue
        if fresh.n_files == 0 and claims_files(status):
            yield f"artifacts.{name} says {status.raw!r} but {CLASS_PATHS[name]} holds no file"
        mismatch = _count_mismatch(status, fresh)
        if mismatch:
            yield mismatch


def _identity_discrepancies(info: BundleInfo) -> Iterable[str]:
    if info.manifest_error:
        yield info.manifest_error
    elif info.generation == "unknown":
        yield f"{MANIFEST}: watcher generation not recognised"
    if info.job_name and info.job_name.rsplit("/", 1)[-1] != info.job_dir.name:
        yield (
            f"manifest job_id {info.job_id!r} does not match the directory name "
            f"{info.job_dir.name!r}"
        )


def _status_discrepancies(info: BundleInfo) -> Iterable[str]:
    for status in info.statuses.values():
        if status.state is ArtifactState.UNKNOWN and status.raw is not None:
            yield f"artifacts.{status.name}: status {status.raw!r} not recognised"
    for error in info.errors:
        yield f"watcher reported: {error}"


def bundle_discrepancies(info: BundleInfo) -> tuple[str, ...]:
    """What the bundle holds against what its manifest claims, one readable line each."""
    lines = [
        *_identity_discrepancies(info),
        *info.refused_paths,
        *_class_discrepancies(info),
        *_status_discrepancies(info),
    ]
    return tuple(dict.fromkeys(lines))
