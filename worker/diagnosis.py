"""The in-process diagnosis: evidence → gates → verdict. Used by `rl-health diagnose` and by the
Celery tasks, which split the same steps across workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime
from pathlib import Path

from shared.models import GateName, GateResult, Mode, Report, RestartsResult
from shared.settings import Thresholds, load_thresholds
from worker.evidence.bundle import bundle_discrepancies, read_bundle
from worker.evidence.logs import LogCache, read_job_logs
from worker.evidence.logs.job import Progress
from worker.evidence.model import BundleInfo, Evidence, ProbeEvidence
from worker.evidence.paths import BundleFiles
from worker.evidence.probes import read_probes
from worker.evidence.trials import missing_trials, read_trials
from worker.gates.base import guarded
from worker.gates.registry import GATES, check_restarts
from worker.mode import declare_mode
from worker.verdict import decide

__all__ = ["GATE_NAMES", "collect_evidence", "diagnose", "judge", "run_gate"]

GATE_NAMES: tuple[str, ...] = ("restarts", *(name.value for name in GateName))


def _reference_date(bundle: BundleInfo, job_dir: Path) -> date | None:
    """The date that Iris `[HH:MM:SS]` lines lack: submission, else the finelog's mtime."""
    if bundle.submitted_at is not None:
        return bundle.submitted_at.date()
    finelog = job_dir / "finelog.log"
    if finelog.is_file():
        return datetime.fromtimestamp(finelog.stat().st_mtime, UTC).date()
    return None


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
) -> Evidence:
    """Read everything the gates judge from a job directory (and a probe directory); `progress`
    is told about each log file before it is read; `log_cache` keeps parsed logs between runs."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    limits = thresholds or load_thresholds()
    files = BundleFiles(job_dir)
    bundle = read_bundle(job_dir, moment, limits, files)
    reference = _reference_date(bundle, job_dir)
    logs, log_notes = read_job_logs(
        job_dir, reference_date=reference, files=files, progress=progress, cache=log_cache
    )
    trials = read_trials(job_dir, files=files)
    probes = read_probes(probes_dir) if probes_dir is not None else None
    declared = declare_mode(mode, bundle.entrypoint)
    missing = missing_trials(trials, agentic=declared.mode is Mode.AGENTIC)
    extra = [*(trials.unreadable if trials is not None else ()), *([missing] if missing else [])]
    extra += [*log_notes, *notes]
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
) -> Report:
    """Collect the evidence of one job directory and judge it."""
    evidence = collect_evidence(
        job_dir,
        now=now,
        mode=mode,
        probes_dir=probes_dir,
        thresholds=thresholds,
        evidence_label=evidence_label,
    )
    return judge(evidence, event_id=event_id)
