"""The evidence of one job, as the gates see it: typed, frozen, no I/O.

Builders live beside this module (`bundle`, `logs`, `trials`, `probes`); gates read only these
types, so a gate can be tested with an `Evidence` made by hand.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from shared.models import Mode, UtcDatetime
from worker.evidence.parsed import ClockSkew, LogTables, ParseSummary, TrialTables

__all__ = [
    "ArtifactState",
    "ArtifactStatus",
    "AttemptRecord",
    "BundleInfo",
    "ClassFreshness",
    "ClockSkew",
    "ControllerView",
    "LogTables",
    "ModeDecision",
    "ParseSummary",
    "ProbeCommand",
    "ProbeEvidence",
    "ProcessRecord",
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


# --- logs and trials: ClockSkew, ParseSummary, LogTables, TrialTables (`worker.evidence.parsed`) --


# --- live probes (the recorded layout of docs/probes.md) ------------------------------------------


_STACK_OUTPUT: Final = re.compile(r"(^|/)stacks/(?P<target>.+)-pid(?P<pid>\d+)-\d+\.txt$")


class ProbeCommand(_Frozen):
    argv: tuple[str, ...]
    started_at: UtcDatetime | None = None
    exit_code: int | None = None  # None: timed out
    output: str | None = None  # file relative to the probe directory
    why: str | None = None  # a failed command's reason (its last error line), read back from
    # its `failed/` output; not written to probes.json (the output file holds it)

    def dumped(self) -> tuple[int | None, str | None]:
        """The pid (`--pid N`) and target (from the output's name) of a py-spy command."""
        argv = list(self.argv)
        after = argv[argv.index("--pid") + 1] if "--pid" in argv[:-1] else ""
        named = _STACK_OUTPUT.search(self.output or "")
        pid = int(after) if after.isdigit() else (int(named["pid"]) if named else None)
        return pid, named["target"] if named else None


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


class ProcessRecord(_Frozen):
    """One probed process of a task or pod as the `ps` listing showed it, and its role
    (`worker.evidence.roles`) decided once its dumps were taken (`processes.json`)."""

    target: str  # as in the stack file names (task id or pod, `/` -> `_`)
    pid: int
    ppid: int | None = None
    args: str = ""
    role: str | None = None  # rank | driver | coordinator | engine | helper | native | unknown
    why: str = ""


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
    processes: tuple[ProcessRecord, ...] = ()  # processes.json: who each probed process is
    gpus: dict[str, tuple[dict[str, float | None], ...]] = {}  # pod -> rows of the nvidia-smi csv
    failures: tuple[str, ...] = ()  # probes that failed or timed out, with why


# --- the whole ----------------------------------------------------------------------------------


class ModeDecision(_Frozen):
    mode: Mode
    reason: str
