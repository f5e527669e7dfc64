"""Small factories that build evidence by hand, so a gate can be tested without files."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from shared.models import Mode
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

NOW = datetime(2026, 7, 30, 21, 15, tzinfo=UTC)


def frame(table: Mapping[str, pl.DataType], rows: Sequence[Mapping[str, Any]]) -> pl.DataFrame:
    """A frame with exactly the schema of `table`; missing columns are null."""
    full = [{name: row.get(name) for name in table} for row in rows]
    if not full:
        return schema.empty(dict(table))
    return pl.DataFrame(full, schema=dict(table), orient="row")


def at(minutes_before_now: float) -> datetime:
    """A timestamp the given number of minutes before NOW."""
    return NOW - timedelta(minutes=minutes_before_now)


def metric_rows(
    series: Mapping[str, Sequence[float | None]], *, first_step: int = 1, origin: str = "mirror"
) -> list[dict[str, Any]]:
    """Long metric rows for `{key: [value per step]}`, one step a minute ending at NOW."""
    rows: list[dict[str, Any]] = []
    for key, values in series.items():
        n = len(values)
        for i, value in enumerate(values):
            rows.append(
                {
                    "step": first_step + i,
                    "key": key,
                    "value": value,
                    "origin": origin,
                    "source": "finelog.log",
                    "line": 1000 + 10 * i,
                    "timestamp": at(n - i),
                    "attempt": 0,
                }
            )
    return rows


def logs(**tables: Sequence[Mapping[str, Any]] | ParseSummary) -> LogTables:
    """LogTables from row lists keyed by table name (metrics, timers, phases, engines, ...)."""
    built: dict[str, Any] = {}
    for name, rows in tables.items():
        if name == "summary":
            built[name] = rows
        else:
            assert not isinstance(rows, ParseSummary)
            built[name] = frame(getattr(schema, name.upper()), rows)
    return LogTables(**built)


def trials(rows: Sequence[Mapping[str, Any]], directory: str = "trace_jobs") -> TrialTables:
    return TrialTables(trials=frame(schema.TRIALS, rows), directory=directory)


def bundle(job_dir: str = "/bundles/jobs/cw/ops/rl-job", **fields: Any) -> BundleInfo:
    base: dict[str, Any] = {
        "job_dir": Path(job_dir),
        "manifest": {},
        "generation": "newest",
        "job_id": "/ops/rl-job",
        "cluster": "cw",
        "user": "ops",
        "job_name": "rl-job",
        "state": "running",
        "synced_at": NOW - timedelta(minutes=1),
    }
    return BundleInfo(**(base | fields))


def evidence(
    *,
    mode: Mode = Mode.STANDARD,
    log_tables: LogTables | None = None,
    trial_tables: TrialTables | None = None,
    probes: ProbeEvidence | None = None,
    thresholds: Thresholds | None = None,
    now: datetime = NOW,
    **bundle_fields: Any,
) -> Evidence:
    """An Evidence object for a gate test; unspecified parts are absent."""
    return Evidence(
        job_dir="/bundles/jobs/cw/ops/rl-job",
        now=now,
        thresholds=thresholds or Thresholds(),
        mode=ModeDecision(mode=mode, reason="set by the test"),
        bundle=bundle(**bundle_fields),
        logs=log_tables,
        trials=trial_tables,
        probes=probes,
    )


def phase_rows(
    series: Mapping[str, Sequence[float | None]], *, first_step: int = 1
) -> list[dict[str, Any]]:
    """PHASES rows for `{phase: [seconds per step]}`, one step a minute ending at NOW."""
    rows: list[dict[str, Any]] = []
    for offset, (phase, values) in enumerate(series.items()):
        n = len(values)
        for i, seconds in enumerate(values):
            rows.append(
                {
                    "step": first_step + i,
                    "phase": phase,
                    "seconds": seconds,
                    "source": "finelog.log",
                    "line": 5000 + 10 * i + offset,
                    "timestamp": at(n - i),
                    "attempt": 0,
                }
            )
    return rows
