"""The capture step's live probes on fakeredis and the in-memory store, with a scripted Iris CLI
and a fake clock: which backend, the budget (a case just short of it and one just past), the
refusals, the frozen probe layout, and that nothing but a fresh capture probes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from shared.models import Confidence, Event, Verdict, VerdictEntry
from shared.settings import Settings
from testkit.bundles import write_job_bundle
from testkit.keys import TEST_KEY
from worker.backends import ProbeResult, Toolbox
from worker.backends.allowlist import RefusedCommandError
from worker.diagnosis import collect_evidence, judge
from worker.evidence.probes import read_probes
from worker.pipeline import capture, steps
from worker.pipeline.capture import (
    CaptureBudget,
    CaptureSettingsError,
    LiveCapture,
    budget_misfit,
)
from worker.pipeline.steps import Pipeline
from worker.pipeline.store import MemoryStore, download_prefix

NOW = datetime(2026, 7, 30, 21, 15, tzinfo=UTC)
JOB = "jobs/cw/ops/rl-job"
RL_HEALTH = str(Path(sys.executable).with_name("rl-health"))

_SUMMARY = {
    "job_id": "/ops/rl-job",
    "state": "running",
    "task_count": 1,
    "task_state_counts": {"running": 1},
    "tasks": [{"task_id": "/ops/rl-job/0", "state": "running", "exit_code": None}],
}
_ATTEMPTS = (
    "task_id,attempt_id,state,exit_code,error,started_at_ms,finished_at_ms\n"
    "/ops/rl-job/0,0,3,,,1785445200000,\n"
)
_PS = "  PID  PPID ARGS\n    1     0 /usr/bin/python -m skyrl_train.entrypoints.main_base\n"
_STACK = "Thread 1 (idle)\n    all_reduce (torch/distributed/distributed_c10d.py:2050)\n"


def _answer(argv: Sequence[str]) -> str:
    """What the scripted `iris` CLI prints for one command."""
    words = list(argv)
    if "--help" in words:
        return "Commands:\n  logs\n  summary\n"
    if "summary" in words:
        return json.dumps(_SUMMARY)
    if "query" in words:
        return _ATTEMPTS
    if "py-spy" in words:
        return _STACK
    if "ps" in words:
        return _PS
    if "nvidia-smi" in words:
        return "index, utilization.gpu [%]\n0, 0 %\n"
    return "2026-07-30 21:12:00.000 | INFO | trainer - Finished: 'step'\n"


@dataclass
class ScriptedIris:
    """A runner answering like `iris`; each command takes `cost_s` on a fake monotonic clock
    (stopped at its timeout, as spawn does: exit code None)."""

    cost_s: float = 1.0
    now: float = 0.0
    calls: list[tuple[tuple[str, ...], float]] = field(default_factory=list)
    slept: list[float] = field(default_factory=list)

    def __call__(self, argv: Sequence[str], timeout_s: float) -> ProbeResult:
        self.calls.append((tuple(argv), timeout_s))
        started = NOW
        if self.cost_s > timeout_s:
            self.now += timeout_s
            return ProbeResult(tuple(argv), started, None, "", "timed out")
        self.now += self.cost_s
        return ProbeResult(tuple(argv), started, 0, _answer(argv))

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _settings(tmp_path: Path, **fields: Any) -> Settings:
    base: dict[str, Any] = {
        "bundle_root": tmp_path / "bundles",
        "stream_prefix": "t",
        "cache_dir": tmp_path / "cache",
        "iris_controller_url": "http://controller.test",
        "backend": "iris",
    }
    return Settings(**(base | fields))


def _pipeline(tmp_path: Path, iris: ScriptedIris, **fields: Any) -> Pipeline:
    if not (tmp_path / "bundles").is_dir():
        write_job_bundle(tmp_path / "bundles", "rl-job")
    settings = _settings(tmp_path, **fields)
    pipeline = Pipeline(settings, MemoryStore(), fakeredis.FakeRedis())
    live = LiveCapture(
        settings,
        Toolbox(),
        runner=iris,
        monotonic=iris.monotonic,
        sleep=iris.sleep,
        clock=lambda: NOW,
    )
    pipeline.capturer.__dict__["live"] = live  # the process's live capture, with the scripted CLI
    return pipeline


def _admit(pipeline: Pipeline, event_id: str = "e1", **fields: Any) -> Event:
    event = Event(event_id=event_id, job_dir=JOB, published_at=NOW, now=NOW, **fields)
    pipeline.events.archive(event)
    pipeline.coalescer.admit(event_id, JOB, event_json=event.model_dump_json())
    return event


def _diagnose(pipeline: Pipeline, lead: str = "e1", evidence_id: str | None = None) -> Any:
    evidence_id = evidence_id or lead
    pipeline.capture(lead, evidence_id, claim=f"task-{lead}")
    results = [pipeline.gate(evidence_id, name) for name in steps.GATE_NAMES]
    entry = VerdictEntry.model_validate(pipeline.verdict(results, lead, evidence_id))
    return entry, pipeline.report(results, lead, evidence_id)


def _frozen(pipeline: Pipeline, evidence_id: str, target: Path) -> Path:
    assert isinstance(pipeline.store, MemoryStore)
    download_prefix(pipeline.store, f"evidence/{evidence_id}/", target)
    return target


# --- which backend ------------------------------------------------------------------------------


def test_no_backend_takes_no_probe(tmp_path: Path) -> None:
    """RLHEALTH_BACKEND=none (the default): the bundle alone is judged, nothing is run."""
    iris = ScriptedIris()
    pipeline = _pipeline(tmp_path, iris, backend="none")
    _admit(pipeline)
    _diagnose(pipeline)
    assert iris.calls == []
    assert pipeline.frozen.thaw("e1").probes is None


def test_the_operator_backend_probes_and_the_probes_are_frozen(tmp_path: Path) -> None:
    """RLHEALTH_BACKEND=iris: the attempt history is asked of the controller, and every probe
    file (the raw outputs probes.json names included) lands under evidence/<id>/probes/."""
    iris = ScriptedIris()
    pipeline = _pipeline(tmp_path, iris)
    _admit(pipeline)
    _diagnose(pipeline)
    assert [c for c, _ in iris.calls if "query" in c], iris.calls
    evidence = pipeline.frozen.thaw("e1")
    assert evidence.probes is not None and evidence.probes.attempts is not None
    assert evidence.probes.backend == "iris" and evidence.probes.failures == ()
    assert "live probes: attempt history unavailable locally" in " ".join(evidence.discrepancies)
    frozen = _frozen(pipeline, "e1", tmp_path / "frozen")
    for name in ("probes.json", "controller.json", "attempts.json", "raw/task-attempts.csv"):
        assert (frozen / "probes" / name).is_file(), name
    recorded = read_probes(frozen / "probes")
    assert recorded.failures == () and recorded.attempts == evidence.probes.attempts


def test_the_event_chooses_among_enabled_backends(tmp_path: Path) -> None:
    """An event's "backend" that the operator enabled is used (here: iris among iris,local)."""
    iris = ScriptedIris()
    pipeline = _pipeline(tmp_path, iris, backend="none", backends="local,iris")
    _admit(pipeline, backend="iris")
    _diagnose(pipeline)
    probes = pipeline.frozen.thaw("e1").probes
    assert probes is not None and probes.backend == "iris" and iris.calls


@pytest.mark.parametrize(("enabled", "asked"), [("iris", "kubernetes"), (None, "iris")])
def test_a_backend_the_operator_did_not_enable_is_an_error(
    tmp_path: Path, enabled: str | None, asked: str
) -> None:
    """Not a crash and not a silent fallback: the evidence says the choice was refused, the
    verdict is ERROR, and nothing is probed."""
    iris = ScriptedIris()
    fields = {"backends": enabled} if enabled else {"backend": "none"}
    pipeline = _pipeline(tmp_path, iris, **fields)
    _admit(pipeline, backend=asked)
    entry, report = _diagnose(pipeline)
    assert entry.verdict is Verdict.ERROR
    assert any("live capture refused" in d and asked in d for d in report.discrepancies)
    assert iris.calls == []


def test_recorded_probes_do_not_excuse_a_refused_backend(tmp_path: Path) -> None:
    """An event naming recorded probes and a backend the operator did not enable is refused all
    the same: the choice is checked before anything else."""
    pipeline = _pipeline(tmp_path, ScriptedIris())
    (tmp_path / "bundles" / "recorded").mkdir(parents=True)
    _admit(pipeline, probes="recorded", backend="slurm")
    entry, report = _diagnose(pipeline)
    assert entry.verdict is Verdict.ERROR
    assert any("live capture refused" in d and "slurm" in d for d in report.discrepancies)


def test_recorded_probes_named_by_the_event_win(tmp_path: Path) -> None:
    """An event naming a recorded probe folder is judged on it: no live probe."""
    iris = ScriptedIris()
    pipeline = _pipeline(tmp_path, iris)
    recorded = tmp_path / "bundles" / "recorded"
    (recorded).mkdir(parents=True)
    (recorded / "attempts.json").write_text("[]")
    _admit(pipeline, probes="recorded")
    _diagnose(pipeline)
    assert iris.calls == []
    probes = pipeline.frozen.thaw("e1").probes
    assert probes is not None and probes.attempts == ()


def test_an_unreadable_bundle_is_not_probed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bundle that cannot be read is ERROR already; probing would not change that."""

    def unreadable(*args: Any, **kwargs: Any) -> Any:
        raise OSError("Input/output error")

    iris = ScriptedIris()
    pipeline = _pipeline(tmp_path, iris)
    _admit(pipeline)
    monkeypatch.setattr(capture, "collect_evidence", unreadable)
    entry, report = _diagnose(pipeline)
    assert entry.verdict is Verdict.ERROR and iris.calls == []
    assert any("Input/output error" in d for d in report.discrepancies)


def test_probing_that_breaks_is_an_error_not_a_crash(tmp_path: Path) -> None:
    """A probe refused by the allowlist (or any fault of the probing) answers ERROR, quoted."""

    def refusing(argv: Sequence[str], timeout_s: float) -> ProbeResult:
        raise RefusedCommandError("iris", "job", "not an allowed command")

    pipeline = _pipeline(tmp_path, ScriptedIris())
    pipeline.capturer.__dict__["live"] = LiveCapture(pipeline.settings, Toolbox(), runner=refusing)
    _admit(pipeline)
    entry, report = _diagnose(pipeline)
    assert entry.verdict is Verdict.ERROR
    assert any("live capture failed: RefusedCommandError" in d for d in report.discrepancies)


# --- the budget ---------------------------------------------------------------------------------

# Without stacks the Iris plan is four commands: job --help, job summary, query, job logs.
_COMMANDS = 4


def test_a_capture_just_within_its_budget_runs_every_probe(tmp_path: Path) -> None:
    """Four one-second probes in a 4.001 s budget: all run, each within what was left."""
    iris = ScriptedIris(cost_s=1.0)
    pipeline = _pipeline(tmp_path, iris, capture_budget_s=_COMMANDS + 0.001)
    _admit(pipeline)
    _diagnose(pipeline)
    probes = pipeline.frozen.thaw("e1").probes
    assert probes is not None and probes.failures == ()
    assert all(c.exit_code == 0 for c in probes.commands) and len(probes.commands) == _COMMANDS
    assert [round(t, 3) for _, t in iris.calls] == [4.001, 3.001, 2.001, 1.001]


def test_a_capture_just_past_its_budget_records_the_probe_it_cut(tmp_path: Path) -> None:
    """The same probes in a 3.999 s budget: the last is stopped at what was left, and the
    evidence says the budget was spent (a recorded probe failure, not a silent NO-KILL)."""
    iris = ScriptedIris(cost_s=1.0)
    pipeline = _pipeline(tmp_path, iris, capture_budget_s=_COMMANDS - 0.001)
    _admit(pipeline)
    _, report = _diagnose(pipeline)
    probes = pipeline.frozen.thaw("e1").probes
    assert probes is not None
    assert [c.exit_code for c in probes.commands] == [0, 0, 0, None]
    assert any("job logs" in f and "timed out" in f for f in probes.failures)
    spent = "the capture budget (RLHEALTH_CAPTURE_BUDGET_S=3.999 s) was spent"
    assert f"probe failed: {spent}: 1 probe(s) cut short, 0 not run" in report.discrepancies
    assert report.confidence is not Confidence.HIGH
    frozen = _frozen(pipeline, "e1", tmp_path / "frozen")
    cut = (frozen / "probes" / "failed" / "logs" / "tail.log").read_text()
    assert f"cut short: {spent}" in cut


def test_probes_past_a_spent_budget_are_not_run(tmp_path: Path) -> None:
    """Once the budget is spent nothing more is spawned; the commands are recorded as not run."""
    iris = ScriptedIris(cost_s=1.0)
    pipeline = _pipeline(tmp_path, iris, capture_budget_s=2.5)
    _admit(pipeline)
    _, report = _diagnose(pipeline)
    assert len(iris.calls) == 3  # the third was cut at 0.5 s, the fourth never spawned
    probes = pipeline.frozen.thaw("e1").probes
    assert probes is not None and [c.exit_code for c in probes.commands] == [0, 0, None, None]
    assert len(probes.failures) == 2
    assert any("1 probe(s) cut short, 1 not run" in d for d in report.discrepancies)


def test_the_wait_between_two_dumps_is_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quiet log calls for two stack dumps `probe_interval_s` apart; the wait is cut to what
    is left, and the second dumps are then not run."""
    monkeypatch.setenv("RLHEALTH_STALL_FLOOR_S", "60")  # the toy log is 3 minutes quiet
    iris = ScriptedIris(cost_s=1.0)
    # help, summary, query, logs, ps, dump 1: six seconds; then a 5 s wait in a 7.5 s budget
    pipeline = _pipeline(tmp_path, iris, capture_budget_s=7.5, probe_interval_s=5)
    _admit(pipeline)
    _, report = _diagnose(pipeline)
    assert iris.slept == [1.5]
    probes = pipeline.frozen.thaw("e1").probes
    assert probes is not None and [s.n for s in probes.stacks] == [1]
    assert any("0 probe(s) cut short, 2 not run" in d for d in report.discrepancies)


def test_budget_against_the_capture_time_limits() -> None:
    """The budget must end before the capture's soft limit (80 % of its hard limit): just
    short of it fits, at it or past it is refused with the settings named."""
    assert budget_misfit(Settings(capture_time_limit_s=300, capture_budget_s=239.9)) is None
    message = budget_misfit(Settings(capture_time_limit_s=300, capture_budget_s=240))
    assert message is not None
    assert "RLHEALTH_CAPTURE_BUDGET_S=240" in message and "soft 240 s" in message
    assert "RLHEALTH_CAPTURE_TIME_LIMIT_S" in message
    with pytest.raises(CaptureSettingsError, match="RLHEALTH_CAPTURE_BUDGET_S=241"):
        LiveCapture.start(Settings(backend="iris", capture_budget_s=241))


def test_tools_that_do_not_resolve_are_refused_at_start() -> None:
    """An iris command the allowlist refuses stops the live capture before any task."""
    with pytest.raises(CaptureSettingsError, match="RLHEALTH_IRIS_COMMAND"):
        LiveCapture.start(Settings(backend="iris", iris_command="bash -c id"))


def test_a_budget_past_the_time_limit_answers_error_in_the_pipeline(tmp_path: Path) -> None:
    """A worker started without `rl-health worker` (so unchecked) answers ERROR quoting why."""
    iris = ScriptedIris()
    pipeline = _pipeline(tmp_path, iris, capture_budget_s=500)
    del pipeline.capturer.__dict__["live"]  # made from the settings, as a worker process would
    _admit(pipeline)
    entry, report = _diagnose(pipeline)
    assert entry.verdict is Verdict.ERROR
    assert any("RLHEALTH_CAPTURE_BUDGET_S=500" in d for d in report.discrepancies)


def test_the_worker_refuses_a_budget_that_does_not_fit(tmp_path: Path) -> None:
    """`rl-health worker` with a live backend stops at start-up (exit 2) with the reason."""
    env = {
        "PATH": "/usr/bin:/bin",
        "RLHEALTH_BACKEND": "iris",
        "RLHEALTH_CAPTURE_BUDGET_S": "300",
        "RLHEALTH_REDIS_URL": "redis://127.0.0.1:1/0",
        "RLHEALTH_CACHE_DIR": str(tmp_path),
        "RLHEALTH_VERDICT_KEY": TEST_KEY,  # every pipeline role needs one (issue 28)
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    result = subprocess.run(
        [RL_HEALTH, "worker"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2, result.stderr
    assert "RLHEALTH_CAPTURE_BUDGET_S=300 does not fit" in result.stderr


def test_budget_counts_from_its_start() -> None:
    """What is left is the total less the time spent since the budget began."""
    clock = iter([10.0, 12.5])
    budget = CaptureBudget(4.0, monotonic=lambda: next(clock))
    assert budget.left_s() == 1.5


# --- only the capture probes --------------------------------------------------------------------


def test_gates_and_an_offline_replay_take_no_probe_a_fresh_one_does(tmp_path: Path) -> None:
    """Gates read the frozen evidence only; a replay on the frozen evidence (its own event id,
    the original's evidence id) runs no probe and reaches the same verdict; a fresh capture
    probes again."""
    iris = ScriptedIris()
    pipeline = _pipeline(tmp_path, iris)
    _admit(pipeline)
    first, _ = _diagnose(pipeline)
    taken = len(iris.calls)
    _admit(pipeline, "r1", replay_of="e1")
    again, _ = _diagnose(pipeline, "r1", evidence_id="e1")
    assert len(iris.calls) == taken and (again.verdict, again.confidence) == (
        first.verdict,
        first.confidence,
    )
    _admit(pipeline, "r2", replay_of="e1")
    _diagnose(pipeline, "r2")
    assert len(iris.calls) == 2 * taken


def test_the_frozen_probes_reproduce_the_verdict_offline(tmp_path: Path) -> None:
    """`diagnose --probes` on the frozen probes/ folder (the recorded layout) judges as the
    pipeline did."""
    iris = ScriptedIris()
    pipeline = _pipeline(tmp_path, iris)
    _admit(pipeline)
    _, report = _diagnose(pipeline)
    frozen = _frozen(pipeline, "e1", tmp_path / "frozen")
    offline = judge(
        collect_evidence(
            tmp_path / "bundles" / JOB, now=pipeline.frozen.thaw("e1").now,
            probes_dir=frozen / "probes",
        )
    )  # fmt: skip
    assert (offline.verdict, offline.restarts) == (report.verdict, report.restarts)
