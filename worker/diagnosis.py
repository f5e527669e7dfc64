"""The in-process diagnosis: evidence → gates → verdict. Used by `rl-health diagnose` and by the
Celery tasks, which split the same steps across workers.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, date, datetime
from pathlib import Path

from shared.models import GateName, GateResult, Mode, Report, RestartsResult
from shared.settings import Thresholds, load_thresholds
from worker.evidence.bundle import bundle_discrepancies, read_bundle
from worker.evidence.case import Evidence
from worker.evidence.layout import SNIFF_BYTES, Layout, discover
from worker.evidence.log_cache import LogCache
from worker.evidence.logdate import LogDate, has_time_only_lines, reference_date
from worker.evidence.logs import LogBudgetError, parse_job_logs
from worker.evidence.logs.job import Progress
from worker.evidence.model import BundleInfo, LogTables, ProbeEvidence, TrialTables
from worker.evidence.paths import BundleFiles
from worker.evidence.probes import read_probes
from worker.evidence.trials import missing_trials, read_trials
from worker.gates.base import guarded
from worker.gates.registry import GATES, check_restarts
from worker.mode import declare_mode
from worker.verdict import decide

__all__ = ["GATE_NAMES", "collect_evidence", "diagnose", "judge", "run_gate"]

GATE_NAMES: tuple[str, ...] = ("restarts", *(name.value for name in GateName))


def _trainer_head(files: BundleFiles) -> tuple[bytes, datetime | None]:
    """The first bytes of the trainer log and when it was modified (b"", None: no such log)."""
    path = files.open_path("finelog.log")
    if path is None or not path.is_file():
        return b"", None
    opened = files.open("finelog.log")
    if opened is None:
        return b"", None
    with opened:
        modified = datetime.fromtimestamp(os.fstat(opened.fileno()).st_mtime, UTC)
        return opened.read(SNIFF_BYTES), modified


def _read_logs(
    root: Path,
    day: date | None,
    files: BundleFiles,
    progress: Progress | None,
    cache: LogCache | None,
) -> tuple[LogTables | None, tuple[str, ...]]:
    """The log tables and what the report must state about them: logs that cannot be read
    within the parse memory budget give no tables (the gates are blind: ERROR) and the reason;
    otherwise the summary's notes (cut lines, compressed files)."""
    try:
        logs = parse_job_logs(root, reference_date=day, files=files, progress=progress, cache=cache)
    except LogBudgetError as exc:
        return None, (str(exc),)
    return logs, (logs.summary.notes if logs is not None else ())


def _log_date(
    layout: Layout, bundle: BundleInfo, now: datetime, given: date | None
) -> tuple[LogDate, str | None]:
    """The reference date for time-only lines (`worker.evidence.logdate`) and the report's line
    about it: stated whenever the trainer log has such lines, or a date was given."""
    head, modified = _trainer_head(layout.files)
    dated = reference_date(
        given=given,
        submitted=bundle.submitted_at,
        head=head,
        trainer=layout.trainer or "the trainer log",
        modified=modified,
        now=now,
    )
    stated = given is not None or has_time_only_lines(head)
    return dated, dated.statement(layout.trainer or "the trainer log") if stated else None


def _trials(layout: Layout, files: BundleFiles) -> TrialTables | None:
    """The trials the layout found: a watcher directory's trace_jobs/, a folder's trial folders;
    none for a single log file."""
    if layout.kind == "single log file" or (layout.kind == "folder of logs" and not layout.trials):
        return None
    where = layout.root / layout.trials if layout.trials else None
    return read_trials(layout.root, where, files=files)


def _discrepancies(
    bundle: BundleInfo, files: BundleFiles, probes: ProbeEvidence | None, extra: Sequence[str]
) -> tuple[str, ...]:
    found = [*bundle_discrepancies(bundle), *files.refused, *extra]
    if probes is not None:
        found.extend(f"probe failed: {failure}" for failure in probes.failures)
    return tuple(dict.fromkeys(found))


def collect_evidence(
    job_dir: Path,
    *,
    now: datetime | None = None,
    mode: Mode | None = None,
    probes_dir: Path | None = None,
    thresholds: Thresholds | None = None,
    evidence_label: str | None = None,
    notes: Sequence[str] = (),
    progress: Progress | None = None,
    log_cache: LogCache | None = None,
    layout: Layout | None = None,
    log_date: date | None = None,
) -> Evidence:
    """Read everything the gates judge from a job directory, a folder of logs or one log file
    (`worker.evidence.layout`; and a probe directory); `progress` is told about each log file
    before it is read; `log_cache` keeps parsed logs between runs; `log_date` dates time-only
    lines (`worker.evidence.logdate`). What was taken, skipped, and where dates came from is in
    `Evidence.inputs`."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    limits = thresholds or load_thresholds()
    layout = layout or discover(job_dir)
    files, root = layout.files, layout.root
    bundle = read_bundle(root, moment, limits, files)
    dated, date_line = _log_date(layout, bundle, moment, log_date)
    logs, log_notes = _read_logs(root, dated.day, files, progress, log_cache)
    trials = _trials(layout, files)
    probes = read_probes(probes_dir) if probes_dir is not None else None
    declared = declare_mode(mode, bundle.entrypoint)
    missing = missing_trials(trials, agentic=declared.mode is Mode.AGENTIC)
    extra = [*(trials.unreadable if trials is not None else ()), *([missing] if missing else [])]
    extra += [*log_notes, *notes]
    inputs = () if layout.quiet() else layout.inputs()
    return Evidence(
        job_dir=evidence_label or str(job_dir),
        now=moment,
        thresholds=limits,
        mode=declared,
        bundle=bundle,
        logs=logs,
        trials=trials,
        probes=probes,
        discrepancies=_discrepancies(bundle, files, probes, extra),
        inputs=(*inputs, *([date_line] if date_line else [])),
    )


def run_gate(name: str, evidence: Evidence) -> GateResult | RestartsResult:
    """Run one gate by name; never raises (a broken gate gives ERROR)."""
    if name == "restarts":
        return check_restarts(evidence)
    return guarded(name, GATES[GateName(name)], evidence)


def judge(
    evidence: Evidence, *, event_id: str | None = None, event_ids: Sequence[str] = ()
) -> Report:
    """All gates on one evidence object, joined into the report."""
    restarts = check_restarts(evidence)
    gates = {name: guarded(name.value, GATES[name], evidence) for name in GateName}
    return decide(evidence, restarts, gates, event_id=event_id, event_ids=event_ids)


def diagnose(
    job_dir: Path,
    *,
    now: datetime | None = None,
    mode: Mode | None = None,
    probes_dir: Path | None = None,
    thresholds: Thresholds | None = None,
    evidence_label: str | None = None,
    event_id: str | None = None,
    log_date: date | None = None,
) -> Report:
    """Collect the evidence of one job directory (or folder of logs, or log file) and judge it."""
    evidence = collect_evidence(
        job_dir,
        now=now,
        mode=mode,
        probes_dir=probes_dir,
        thresholds=thresholds,
        evidence_label=evidence_label,
        log_date=log_date,
    )
    return judge(evidence, event_id=event_id)
