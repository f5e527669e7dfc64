"""The Iris backend replayed on recorded outputs: preemption and worker loss (not stageable)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from worker.backends import ClusterConnection, JobRef, Recorder
from worker.backends.base import ProbePlan, probe_job
from worker.backends.iris import IrisBackend
from worker.backends.recorded import RecordedRunner, read_recorded
from worker.evidence.probes import write_probes

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "iris" / "recorded"


def _replay(scenario: str, job_id: str, out: Path) -> RecordedRunner:
    runner = RecordedRunner(RECORDED / scenario)
    connection = ClusterConnection(iris_controller_url="http://controller.test")
    backend = IrisBackend.connect(JobRef(job_id, connection=connection))
    rec = Recorder(runner, timeout_s=60)
    clock = lambda: datetime(2026, 7, 30, 21, 0, tzinfo=UTC)  # noqa: E731
    write_probes(probe_job(backend, rec, ProbePlan(), job_id=job_id, clock=clock), rec.outputs, out)
    assert rec.failures == []
    return runner


@pytest.mark.parametrize(
    ("scenario", "job_id", "first_state"),
    [
        ("preempted", "/ops/rl-preempt", "preempted"),
        ("worker_lost", "/ops/rl-lost", "worker_failed"),
    ],
)
def test_replay_reproduces_the_recorded_attempts(
    scenario: str, job_id: str, first_state: str, tmp_path: Path
) -> None:
    """Replaying recorded outputs gives the same attempts as the recording: lost, then running."""
    runner = _replay(scenario, job_id, tmp_path)
    replayed, original = read_recorded(tmp_path), read_recorded(RECORDED / scenario)
    assert replayed.attempts == original.attempts
    assert replayed.attempts is not None
    assert [a.state for a in replayed.attempts] == [first_state, "running"]
    assert replayed.controller == original.controller
    assert [c.argv for c in replayed.commands] == [c.argv for c in original.commands]
    assert len(runner.calls) == len(original.commands)


def test_unrecorded_command_fails_like_a_missing_cli(tmp_path: Path) -> None:
    """A command the recording lacks is answered with exit 127, never run."""
    runner = RecordedRunner(RECORDED / "preempted")
    result = runner(("iris", "job", "list"), 5)
    assert result.exit_code == 127 and "not recorded" in result.stderr
