"""Running the capture policy (`worker.capture_policy`): a targeted refresh when the bundle is
stale, live probes only for the reasons the policy names.

1. When the bundle is stale, the configured watcher refresh (`RLHEALTH_REFRESH_COMMAND`, with
   `{job_id}` and `{cluster}`, checked values only) runs through the spawn module behind the
   allowlist, which checked its template at start-up; without one the stale evidence stays stale
   and a note says so.
2. Stacks (two dumps of each process, `stack_interval_s` apart) and GPU state are taken only for
   the quiet-log reason; every probe has the `probe_timeout_s` budget; a failed probe is recorded
   in probes.json and explained in the notes.

In the pipeline, `LiveCapture` (made once per worker process: settings checked, tools resolved)
runs this policy in the capture task within `RLHEALTH_CAPTURE_BUDGET_S` (`CaptureBudget`): every
probe's timeout, and the wait between two dumps, is bounded by what is left of the budget; a probe
the budget no longer allows is not run, and the budget's end is a recorded probe failure. The
budget must end before the capture task's soft time limit (`budget_misfit`).

`CaptureService` is the capture step whole: the bundle first, its logs through one log cache
(`worker.pipeline.logcache.JobLogs`), live probes when the backend choice and the policy call for
them, the evidence frozen through one storage adapter
(`worker.pipeline.evidence_store.FrozenStore`). Nothing else reaches into either for a capture.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

from shared.models import Event
from shared.settings import Settings
from worker.backends import (
    ProbeResult,
    RefusedValueError,
    Toolbox,
    ToolSettingsError,
    job_ref,
    make_backend,
    resolve_tools,
    run_refresh,
)
from worker.backends.base import ProbePlan, Recorder, Runner, probe_job
from worker.capture_policy import (
    BackendChoiceError,
    choose_backend,
    needs_live_probes,
    quiet_reason,
    stale_reason,
)
from worker.diagnosis import collect_evidence
from worker.evidence.case import Evidence
from worker.evidence.probes import write_probes
from worker.pipeline.evidence_store import FrozenStore
from worker.pipeline.failed import FAILED_NOTE, failure_evidence
from worker.pipeline.failures import describe, must_propagate
from worker.pipeline.logcache import JobLogs
from worker.pipeline.metrics import probes_ran

__all__ = [
    "CaptureBudget",
    "CaptureService",
    "CaptureSettingsError",
    "LiveCapture",
    "LiveProbes",
    "budget_misfit",
    "capture_live",
]

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


class CaptureSettingsError(ValueError):
    """Live-capture settings that cannot work; the message names the setting."""


def budget_misfit(settings: Settings) -> str | None:
    """Why RLHEALTH_CAPTURE_BUDGET_S does not fit the capture task's time limits (None: it
    fits). The probing must end before the soft limit, which leaves the rest of the task's time
    to read the bundle again with the probes and freeze it."""
    from worker.pipeline.app import limits  # the Celery app: only where the pipeline runs

    soft, hard = limits(settings)["rlhealth.capture"]
    budget = settings.capture_budget_s
    if budget < soft:
        return None
    return (
        f"RLHEALTH_CAPTURE_BUDGET_S={budget:g} does not fit the capture task's time limits "
        f"(soft {soft:g} s, hard RLHEALTH_CAPTURE_TIME_LIMIT_S={hard:g} s): the live probes must "
        f"end before the soft limit; lower the budget below {soft:g} s or raise "
        f"RLHEALTH_CAPTURE_TIME_LIMIT_S above {budget * hard / soft:g} s"
    )


def _not_run(argv: Sequence[str], started: datetime, why: str) -> ProbeResult:
    """The result of a probe the budget no longer allows: nothing was spawned."""
    return ProbeResult(tuple(argv), started, None, "", f"not run: {why}")


@dataclass
class CaptureBudget:
    """The total time one capture may spend probing; each probe gets at most what is left."""

    total_s: float
    monotonic: Callable[[], float] = time.monotonic
    not_run: int = 0
    cut_short: int = 0
    _started: float = field(init=False)

    def __post_init__(self) -> None:
        self._started = self.monotonic()

    def left_s(self) -> float:
        return self.total_s - (self.monotonic() - self._started)

    @property
    def name(self) -> str:
        return f"the capture budget (RLHEALTH_CAPTURE_BUDGET_S={self.total_s:g} s)"

    def runner(self, inner: Runner, clock: Callable[[], datetime]) -> Runner:
        """`inner` with every timeout bounded by what is left; nothing runs once it is spent."""

        def run(argv: Sequence[str], timeout_s: float) -> ProbeResult:
            left = self.left_s()
            if left <= 0:
                self.not_run += 1
                return _not_run(argv, clock(), f"{self.name} was spent")
            result = inner(argv, min(timeout_s, left))
            if result.exit_code is not None or left >= timeout_s:
                return result
            self.cut_short += 1
            return replace(result, stderr=f"{result.stderr}\ncut short: {self.name} was spent")

        return run

    def sleep(self, inner: Callable[[float], None]) -> Callable[[float], None]:
        """`inner` waiting at most what is left of the budget."""
        return lambda seconds: inner(max(0.0, min(seconds, self.left_s())))

    def failure(self) -> str | None:
        """The recorded probe failure when the budget cut or stopped a probe, else None."""
        if not (self.not_run or self.cut_short):
            return None
        return f"{self.name} was spent: {self.cut_short} probe(s) cut short, {self.not_run} not run"


def _refresh(
    evidence: Evidence, settings: Settings, tools: Toolbox, clock: Callable[[], datetime]
) -> str:
    """Run the watcher refresh for a stale bundle (its template checked by the allowlist)."""
    return run_refresh(tools, settings, evidence.job_id, evidence.bundle.cluster, clock)


def _reread(evidence: Evidence, clock: Callable[[], datetime]) -> Evidence:
    """The bundle read again after a refresh."""
    return collect_evidence(Path(evidence.job_dir), now=clock(), thresholds=evidence.thresholds)


def _bounded(settings: Settings, budget: CaptureBudget | None) -> Settings:
    """The settings with the probe timeout bounded by what is left of the budget (the refresh
    reads its timeout from there)."""
    if budget is None:
        return settings
    timeout = max(0.001, min(settings.probe_timeout_s, budget.left_s()))
    return settings.model_copy(update={"probe_timeout_s": timeout})


def capture_live(
    evidence: Evidence,
    backend: str,
    out_dir: Path,
    settings: Settings,
    *,
    clock: Callable[[], datetime] = _now,
    runner: Runner | None = None,
    stack_interval_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    process_match: str | None = None,
    tools: Toolbox | None = None,
    budget: CaptureBudget | None = None,
    force_stacks: bool = False,
) -> tuple[Path | None, tuple[str, ...]]:
    """Apply the capture policy: the probe directory written (None: no probe needed), notes.

    `tools` are resolved from `settings` when not given (diagnose resolves them at start-up).
    With a `budget`, every probe (the refresh included) runs within what is left of it;
    `force_stacks` takes the stacks whatever the log says, and neither the log tail nor the GPU
    state (the second look before a stall KILL compares stacks, the log and the controller).
    """
    notes: list[str] = []
    tools = tools or resolve_tools(settings)
    if stale_reason(evidence) is not None:
        notes.append(_refresh(evidence, _bounded(settings, budget), tools, clock))
        if notes[-1].startswith("watcher refresh ran"):
            evidence = _reread(evidence, clock)
    reasons = needs_live_probes(evidence) or (("stacks asked for",) if force_stacks else ())
    if not reasons:
        return None, (*notes, "no live probe needed: the bundle is fresh and consistent")
    notes.extend(f"live probes: {reason}" for reason in reasons)
    try:  # the bundle's values only select: a job id or cluster that does not fit is refused
        job = job_ref(evidence.bundle, settings, process_match)
    except RefusedValueError as exc:
        return None, (*notes, f"live probes refused: {exc}")
    chosen = make_backend(backend, job, settings, tools)
    interval = stack_interval_s if stack_interval_s is not None else settings.probe_interval_s
    stacks = force_stacks or quiet_reason(evidence) is not None
    plan = ProbePlan(stacks=stacks, interval_s=interval, context=not force_stacks)
    run = runner or tools.runner()
    if budget is not None:
        run, sleep = budget.runner(run, clock), budget.sleep(sleep)
    rec = Recorder(run, settings.probe_timeout_s)
    probes = probe_job(chosen, rec, plan, job_id=job.job_id, clock=clock, sleep=sleep)
    spent = budget.failure() if budget is not None else None
    if spent is not None:  # a recorded probe failure: the evidence says so
        probes = probes.model_copy(update={"failures": (*probes.failures, spent)})
    write_probes(probes, rec.outputs, out_dir)
    probes_ran(backend, [command.exit_code for command in rec.commands])
    notes.extend(f"probe failed: {failure}" for failure in probes.failures)
    return out_dir, tuple(notes)


class LiveProbes(NamedTuple):
    """What one live capture left: the probe directory (None: no probe ran) and its notes."""

    directory: Path | None
    notes: tuple[str, ...]


@dataclass(frozen=True)
class LiveCapture:
    """The capture policy as the pipeline's capture task runs it: settings checked and tools
    resolved once per worker process (`start`), each capture within its own budget."""

    settings: Settings
    tools: Toolbox
    runner: Runner | None = None  # None: `spawn.run_probe` behind the tools' allowlist
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], datetime] = _now

    @classmethod
    def start(cls, settings: Settings) -> LiveCapture:
        """Check the budget against the capture's time limits and resolve the tools;
        `CaptureSettingsError` naming the setting when either cannot work."""
        misfit = budget_misfit(settings)
        if misfit is not None:
            raise CaptureSettingsError(misfit)
        try:
            tools = resolve_tools(settings)
        except ToolSettingsError as exc:
            raise CaptureSettingsError(f"settings refused: {exc}") from exc
        return cls(settings, tools)

    def probe(self, evidence: Evidence, backend: str, out_dir: Path) -> LiveProbes:
        """The capture policy on `evidence` through `backend`, within RLHEALTH_CAPTURE_BUDGET_S."""
        budget = CaptureBudget(self.settings.capture_budget_s, self.monotonic)
        probe_dir, notes = capture_live(
            evidence,
            backend,
            out_dir,
            self.settings,
            clock=self.clock,
            runner=self.runner,
            sleep=self.sleep,
            tools=self.tools,
            budget=budget,
        )
        return LiveProbes(probe_dir, notes)


# --- the capture step ---------------------------------------------------------------------------
class CaptureService:
    """An event in, its evidence frozen: the bundle first, live probes when the policy says so,
    the logs through one log cache, the freeze through one storage adapter."""

    def __init__(self, settings: Settings, logs: JobLogs, frozen: FrozenStore) -> None:
        self.settings = settings
        self.logs = logs
        self.frozen = frozen

    @cached_property
    def live(self) -> LiveCapture:
        """The live capture of this process: settings checked and tools resolved once."""
        return LiveCapture.start(self.settings)

    def captured(self, evidence_id: str) -> bool:
        """Whether the evidence is frozen whole (a part gone: captured again)."""
        return self.frozen.whole(evidence_id)

    def capture(self, event: Event, held: Callable[[], bool]) -> None:
        """Capture `event` afresh under its own id: what an earlier attempt left is discarded,
        the evidence collected, probed and frozen while `held()` (the capture's claim), and the
        log cache's S3 copy, written meanwhile, waited for; logs the time of each phase."""
        self.frozen.discard(event.event_id)
        label, took = self.frozen.label(event.event_id), _Phases()
        with tempfile.TemporaryDirectory(prefix="rlhealth-live-") as tmp:
            try:
                live = Path(tmp) / "live"
                evidence = self._probed(event, label, self._collect(event, label), live)
                took.mark("collect")
                self.frozen.freeze(
                    evidence,
                    job_dir=event.job_dir,
                    evidence_id=event.event_id,
                    live=live,
                    held=held,
                    mark=took.mark,
                )
            finally:
                self.logs.settle()
                took.mark("share")
        log.info("captured %s: %s", event.event_id, took)

    def _collect(self, event: Event, label: str, live: LiveProbes | None = None) -> Evidence:
        """The bundle read (with the live probes' directory and notes, once they ran); a
        bundle that cannot be read is the evidence of a failure (ERROR through the gates)."""
        root = self.settings.bundle_root
        probes = root / event.probes if event.probes else None
        if live is not None:  # the live capture's probe directory, and what it noted
            probes = live.directory
        try:
            return self.logs.read(
                event.job_dir,
                lambda cache: collect_evidence(
                    root / event.job_dir,
                    now=event.now,
                    mode=event.mode,
                    notes=live.notes if live is not None else (),
                    probes_dir=probes,
                    evidence_label=label,
                    log_cache=cache,
                ),
            )
        except Exception as exc:
            if must_propagate(exc):
                raise
            return failure_evidence(event, label, describe(exc))

    def _probed(self, event: Event, label: str, first: Evidence, out: Path) -> Evidence:
        """The evidence with live probes when the backend choice and the capture policy call for
        them (read again with the probe directory, as `diagnose --backend` does). A backend the
        event may not choose, or probing that breaks, answers ERROR through the gates."""
        if _unread(first):  # a bundle that could not be read is ERROR already
            return first
        try:
            backend = choose_backend(event.backend, self.settings)
        except BackendChoiceError as exc:
            return failure_evidence(event, label, f"live capture refused: {exc}")
        if backend is None or event.probes:  # no live backend, or recorded probes named
            return first
        try:
            live = self.live.probe(first, backend, out)
        except Exception as exc:
            if must_propagate(exc):
                raise
            return failure_evidence(event, label, f"live capture failed: {describe(exc)}")
        return self._collect(event, label, live)


def _unread(evidence: Evidence) -> bool:
    """True for the evidence of a bundle that could not be read at all (`failure_evidence`)."""
    return any(note.startswith(FAILED_NOTE) for note in evidence.discrepancies)


@dataclass
class _Phases:
    """The seconds each phase of a capture took, for its log line."""

    seconds: dict[str, float] = field(default_factory=dict)
    since: float = field(default_factory=time.perf_counter)

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.since
        self.since = now

    def __str__(self) -> str:
        return ", ".join(f"{phase} {seconds:.2f}s" for phase, seconds in self.seconds.items())
