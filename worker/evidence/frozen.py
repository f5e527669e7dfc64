"""Freeze the evidence of a diagnosis to files, and thaw it back, so a replay judges the same thing.

Layout of a frozen directory (uploaded as-is to S3 `evidence/<event_id>/`):

```
logs/<table>.parquet     every LogTables frame (metrics, timers, phases, ...), empty ones included
trials/trials.parquet    the trial table, when the job had a trials directory
probes/...               the probe files in CONTRACT.md's layout (probes.json, controller.json,
                         attempts.json, stacks/, gpus/), readable by the `recorded` backend
evidence.json            everything else as JSON, written last: its presence marks a whole freeze
```

`thaw` reads `evidence.json` and the Parquet tables; the probe layout is a by-product for people and
for the `recorded` backend, while `evidence.json` keeps the exact probe model, so the thawed
`Evidence` equals the frozen one field for field, as of the same `now` — except that every file
written here passed the redactor (`shared.redact`): credentials in the manifest, log heads, tables
and probe outputs never reach the frozen copy (or S3).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import polars as pl

from shared.redact import cut_bytes, redact_data, redact_frame
from shared.settings import Thresholds
from worker.evidence import schema
from worker.evidence.model import (
    BundleInfo,
    Evidence,
    LogTables,
    ModeDecision,
    ParseSummary,
    ProbeEvidence,
    TrialTables,
)
from worker.evidence.probes import write_probes
from worker.evidence.values import JSON_MAX_DEPTH, loads_json

__all__ = ["FORMAT", "MARKER", "FrozenEvidenceError", "freeze", "thaw"]

FORMAT: Final = 1
MARKER: Final = "evidence.json"
LINE_MAX_BYTES: Final = 16 * 1024
_LOG_FRAMES: Final = tuple(f.name for f in dataclasses.fields(LogTables) if f.name != "summary")
# Tables that gained columns since format 1 was written: an older freeze thaws with them as nulls.
_GROWN: Final[dict[str, dict[str, pl.DataType]]] = {"errors": schema.ERRORS}


class FrozenEvidenceError(ValueError):
    """A frozen directory that is incomplete or of another format."""


def _write_json(path: Path, data: Any) -> Path:
    """Write JSON with every string redacted and every value under a credential's key hidden."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(redact_data(data), indent=1, sort_keys=True), encoding="utf-8")
    return path


def _write_frame(path: Path, frame: pl.DataFrame) -> Path:
    """Write a table with its string columns redacted (vectorised prefilter, `redact_frame`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    redact_frame(frame).write_parquet(path)
    return path


def _freeze_logs(logs: LogTables, directory: Path) -> list[Path]:
    return [
        _write_frame(directory / "logs" / f"{name}.parquet", getattr(logs, name))
        for name in _LOG_FRAMES
    ]


def _freeze_trials(trials: TrialTables, directory: Path) -> list[Path]:
    return [_write_frame(directory / "trials" / "trials.parquet", trials.trials)]


def _freeze_probes(probes: ProbeEvidence, directory: Path) -> list[Path]:
    """The probe files in CONTRACT.md's layout, written by the probe module itself."""
    root = directory / "probes"
    write_probes(probes, {}, root)
    return sorted(path for path in root.rglob("*") if path.is_file())


def _trials_meta(trials: TrialTables) -> dict[str, Any]:
    return {
        "directory": trials.directory,
        "sync_selection": trials.sync_selection,
        "skipped_objects": list(trials.skipped_objects),
        "unreadable": list(trials.unreadable),
    }


def _summary(summary: ParseSummary) -> dict[str, Any]:
    """The parse summary; its quoted lines cut to LINE_MAX_BYTES (a log line may be 300 MB)."""
    data = summary.model_dump(mode="json")
    for name in ("head", "malformed_examples"):
        data[name] = [cut_bytes(line, LINE_MAX_BYTES) for line in data.get(name) or ()]
    return data


def _document(evidence: Evidence) -> dict[str, Any]:
    logs, trials, probes = evidence.logs, evidence.trials, evidence.probes
    return {
        "format": FORMAT,
        "job_dir": evidence.job_dir,
        "now": evidence.now.isoformat(),
        "thresholds": evidence.thresholds.model_dump(mode="json"),
        "mode": evidence.mode.model_dump(mode="json"),
        "bundle": evidence.bundle.model_dump(mode="json"),
        "discrepancies": list(evidence.discrepancies),
        "logs": None if logs is None else {"summary": _summary(logs.summary)},
        "trials": None if trials is None else _trials_meta(trials),
        "probes": None if probes is None else probes.model_dump(mode="json"),
    }


def freeze(evidence: Evidence, directory: Path) -> list[Path]:
    """Write `evidence` under `directory`; returns the files written, `evidence.json` last."""
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if evidence.logs is not None:
        written += _freeze_logs(evidence.logs, directory)
    if evidence.trials is not None:
        written += _freeze_trials(evidence.trials, directory)
    if evidence.probes is not None:
        written += _freeze_probes(evidence.probes, directory)
    written.append(_write_json(directory / MARKER, _document(evidence)))
    return written


def _read_frame(path: Path) -> pl.DataFrame:
    if not path.is_file():
        raise FrozenEvidenceError(f"frozen evidence lacks {path.name}")
    return pl.read_parquet(path)


def _with_new_columns(name: str, frame: pl.DataFrame) -> pl.DataFrame:
    wanted = _GROWN.get(name, {})
    missing = [pl.lit(None, dtype=t).alias(c) for c, t in wanted.items() if c not in frame.columns]
    return frame.with_columns(missing) if missing else frame


def _thaw_logs(meta: dict[str, Any] | None, directory: Path) -> LogTables | None:
    if meta is None:
        return None
    frames = {
        name: _with_new_columns(name, _read_frame(directory / "logs" / f"{name}.parquet"))
        for name in _LOG_FRAMES
    }
    return LogTables(summary=ParseSummary.model_validate(meta["summary"]), **frames)


def _thaw_trials(meta: dict[str, Any] | None, directory: Path) -> TrialTables | None:
    if meta is None:
        return None
    return TrialTables(
        trials=_read_frame(directory / "trials" / "trials.parquet"),
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
    if document.get("format") != FORMAT:
        raise FrozenEvidenceError(f"{directory}: frozen format {document.get('format')!r}")
    return document


def thaw(directory: Path) -> Evidence:
    """The Evidence `freeze` wrote under `directory`."""
    document = _read_document(directory)
    probes = document["probes"]
    return Evidence(
        job_dir=document["job_dir"],
        now=datetime.fromisoformat(document["now"]),
        # every field is in the document, so none falls back to the environment of the replay
        thresholds=Thresholds.model_validate(document["thresholds"]),
        mode=ModeDecision.model_validate(document["mode"]),
        bundle=BundleInfo.model_validate(document["bundle"]),
        logs=_thaw_logs(document["logs"], directory),
        trials=_thaw_trials(document["trials"], directory),
        probes=None if probes is None else ProbeEvidence.model_validate(probes),
        discrepancies=tuple(document["discrepancies"]),
    )
