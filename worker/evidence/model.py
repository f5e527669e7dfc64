"""The evidence of one job, as the gates see it: typed, frozen, no I/O.

Builders live beside this module (`bundle`, `logs`, `trials`, `probes`); gates read only these
types, so a gate can be tested with an `Evidence` made by hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
from pydantic import BaseModel, ConfigDict

from shared.models import Mode, UtcDatetime
from worker.evidence import schema

if TYPE_CHECKING:
    # an annotation only (of a dataclass): the settings (pydantic-settings, ~0.1 s to import) are
    # not loaded by a parse that never reads them
    from shared.settings import Thresholds
    from worker.evidence.facts import Facts

__all__ = [
    "ArtifactState",
    "ArtifactStatus",
    "AttemptRecord",
    "BundleInfo",
    "ClassFreshness",
    "ClockSkew",
    "ControllerView",
    "Evidence",
    "LogTables",
    "ModeDecision",
    "ParseSummary",
    "ProbeCommand",
    "ProbeEvidence",
    "StackDump",
    "TrialTables",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


# --- the bundle -------------------------------------------------------------------------------


class ArtifactState(StrEnum):
    """What an artifact status string of the manifest says, structured."""

    PRESENT = "present"  # a count or an explicit success ("412,877 lines", "synced")
    PARTIAL = "partial"  # "partial: ..." or a selection smaller than what is available
    UNAVAILABLE = "unavailable"
    NOT_REQUESTED = "not_requested"  # the last sweep did not touch this class
    NOT_APPLICABLE = "not_applicable"
    WAITING = "waiting"  # "no pod yet", "awaiting host"
    UNKNOWN = "unknown"  # key missing (older watcher) or a string we do not recognise


class ArtifactStatus(_Frozen):
    name: str  # finelog | pod_logs | ray_logs | traces | slurm_logs
    raw: str | None  # the manifest's string, None when the key is missing
    state: ArtifactState
    count: int | None = None  # lines, pods, files, or selected traces
    available: int | None = None  # traces available, when stated
    copied: int | None = None
    skipped: int | None = None
    detail: str = ""


class ClassFreshness(_Frozen):
    """Freshness of one artifact class: newest file's mtime and its age at `now`."""

    name: str
    newest_mtime: UtcDatetime | None
    age_s: float | None
    stale: bool  # older than MAX_EVIDENCE_AGE_S, or no file at all while the status claims some
    reason: str = ""
    n_files: int = 0  # regular files found for the class (to compare with the status's count)


class BundleInfo(_Frozen):
    """The manifest and what it says about each artifact class."""

    job_dir: Path
    manifest: dict[str, Any] | None  # the raw manifest, None when missing or unreadable
    manifest_error: str | None = None
    generation: str = "unknown"  # newest | intermediate | oldest | unknown
    job_id: str | None = None
    cluster: str | None = None
    user: str | None = None
    job_name: str | None = None
    state: str | None = None  # controller state as the watcher last saw it (lower-case)
    task_state: str | None = None
    synced_at: UtcDatetime | None = None
    submitted_at: UtcDatetime | None = None
    finished_at: UtcDatetime | None = None
    entrypoint: str | None = None  # the launched command, a JSON string
    trials_uri: str | None = None
    statuses: dict[str, ArtifactStatus] = {}
    trace_started: int | None = None
    trace_completed: int | None = None
    trace_selected: int | None = None
    errors: tuple[str, ...] = ()
    freshness: dict[str, ClassFreshness] = {}
    refused_paths: tuple[str, ...] = ()  # paths that tried to leave the bundle root


# --- logs ---------------------------------------------------------------------------------------


class ClockSkew(_Frozen):
    """A log's own line times against the Iris prefix times (collection time, UTC).

    `min_s`/`max_s` are own time minus prefix time over the `lines` that carry both; `off_lines`
    differ by more than the parser's tolerance, the first of them at `source`:`first_line`.
    """

    lines: int = 0
    min_s: float | None = None
    max_s: float | None = None
    off_lines: int = 0
    first_line: int | None = None
    source: str | None = None


class ParseSummary(_Frozen):
    files: tuple[str, ...] = ()
    lines: int = 0
    bytes: int = 0
    records: dict[str, int] = {}  # serialization -> count of records read
    malformed: int = 0
    malformed_examples: tuple[str, ...] = ()  # "source:line: text", the first few
    serializations: tuple[str, ...] = ()
    first_timestamp: UtcDatetime | None = None
    last_timestamp: UtcDatetime | None = None  # newest timestamp of any line
    head: tuple[str, ...] = ()  # the first non-empty lines, to show what the log looks like
    head_lines: tuple[int, ...] = ()  # their 1-based line numbers, when the parser kept them
    head_source: str | None = None  # the file they come from (default: the first of `files`)
    clock: ClockSkew = ClockSkew()  # own line times against the Iris prefix times
    cut_lines: int = 0  # lines longer than the parser's cap (LINE_MAX_BYTES), cut with a marker
    cut_examples: tuple[str, ...] = ()  # "source:line: N bytes", the first few
    notes: tuple[str, ...] = ()  # what the report must state about reading the logs


@dataclass(frozen=True)
class LogTables:
    """The tables read from the job's logs (schemas in `worker.evidence.schema`)."""

    metrics: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.METRICS))
    timers: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.TIMERS))
    phases: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.PHASES))
    engines: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.ENGINES))
    progress: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.PROGRESS))
    batches: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.BATCHES))
    errors: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.ERRORS))
    resumes: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.RESUMES))
    summary: ParseSummary = field(default_factory=ParseSummary)

    def metrics_wide(self, keys: Iterable[str] | None = None) -> pl.DataFrame:
        """`step` then one column per metric key, sorted by step: only the `keys` given (a gate
        names the few it reads; a key with no rows has no column), else every key.

        Each set of keys is pivoted once per `LogTables` (the gates ask again and again): a log
        with hundreds of thousands of distinct keys costs a filter, not a pivot of every key.
        """
        wanted = None if keys is None else tuple(sorted(set(keys)))
        pivots: dict[tuple[str, ...] | None, pl.DataFrame] = self.__dict__.setdefault("_wide", {})
        if wanted not in pivots:
            pivots[wanted] = _pivot(self.metrics, wanted)
        return pivots[wanted]


def _pivot(metrics: pl.DataFrame, keys: tuple[str, ...] | None) -> pl.DataFrame:
    rows = metrics if keys is None else metrics.filter(pl.col("key").is_in(list(keys)))
    if rows.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64()})
    wide = rows.pivot(on="key", index="step", values="value", aggregate_function="last")
    return wide.sort("step")


# --- trials -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialTables:
    trials: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.TRIALS))
    directory: str | None = None  # the trials directory relative to the job directory
    sync_selection: dict[str, Any] | None = None
    skipped_objects: tuple[Any, ...] = ()
    unreadable: tuple[str, ...] = ()  # "path: reason" for result files that did not parse


# --- live probes (the recorded layout of CONTRACT.md) ---------------------------------------------


class ProbeCommand(_Frozen):
    argv: tuple[str, ...]
    started_at: UtcDatetime | None = None
    exit_code: int | None = None  # None: timed out
    output: str | None = None  # file relative to the probe directory


class AttemptRecord(_Frozen):
    task_id: str
    attempt_id: int
    state: str  # lower-case name
    exit_code: int | None = None
    error: str | None = None
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    worker_id: str | None = None
    pod_name: str | None = None
    node_name: str | None = None
    terminal_reason: str | None = None


class ControllerView(_Frozen):
    """The controller's view of the job, with the keys of `iris job summary --json`."""

    job_id: str
    state: str  # lower-case name
    exit_code: int | None = None
    error: str | None = None
    failure_count: int | None = None
    preemption_count: int | None = None
    task_count: int | None = None
    completed_count: int | None = None
    task_state_counts: dict[str, int] = {}
    tasks: tuple[dict[str, Any], ...] = ()
    max_retries_failure: int | None = None  # when the backend knows the budget


class StackDump(_Frozen):
    """One `py-spy dump` of one process."""

    target: str  # task or pod
    pid: int
    n: int  # dump index for this process, 1-based
    source: str  # path relative to the evidence dir, e.g. probes/stacks/x-pid12-1.txt
    captured_at: UtcDatetime | None
    text: str


class ProbeEvidence(_Frozen):
    """What live probes returned, read back from (or written as) the probe directory."""

    directory: str  # as quoted in evidence sources, e.g. "probes"
    captured_at: UtcDatetime | None = None
    backend: str | None = None
    job_id: str | None = None
    commands: tuple[ProbeCommand, ...] = ()
    controller: ControllerView | None = None
    attempts: tuple[AttemptRecord, ...] | None = None
    stacks: tuple[StackDump, ...] = ()
    gpus: dict[str, tuple[dict[str, float | None], ...]] = {}  # pod -> rows of the nvidia-smi csv
    failures: tuple[str, ...] = ()  # probes that failed or timed out, with why


# --- the whole ----------------------------------------------------------------------------------


class ModeDecision(_Frozen):
    mode: Mode
    reason: str


@dataclass(frozen=True)
class Evidence:
    """Everything one diagnosis judges, as of `now`."""

    job_dir: str  # as given (a path, or an s3:// URI in the pipeline)
    now: datetime
    thresholds: Thresholds
    mode: ModeDecision
    bundle: BundleInfo
    logs: LogTables | None = None  # None: no log file at all
    trials: TrialTables | None = None  # None: no trials directory
    probes: ProbeEvidence | None = None  # None: no live probe available
    discrepancies: tuple[str, ...] = ()

    @cached_property
    def facts(self) -> Facts:
        """The facts derived from this evidence (`worker.evidence.facts`), computed once."""
        from worker.evidence.facts import derive

        return derive(self)

    @property
    def job_id(self) -> str:
        if self.bundle.job_id:
            return self.bundle.job_id
        if self.probes and self.probes.job_id:
            return self.probes.job_id
        return Path(self.job_dir).name
