"""End to end on a real LocalCluster: bundle from Iris, live probes, verdict, and replay."""

from __future__ import annotations

import shlex
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shared.models import Verdict
from shared.settings import Settings, Thresholds
from tests.integration.iris_jobdir import SHIM_COMMAND, TOYS, IrisTestCluster, build_job_dir
from tests.integration.test_iris_backend import iris_cluster  # noqa: F401  (module fixture)
from worker.capture import capture_live
from worker.diagnosis import collect_evidence, judge

pytestmark = pytest.mark.integration

PY = sys.executable


def test_crash_loop_is_killed_and_replay_agrees(
    iris_cluster: IrisTestCluster,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three identical CUDA OOM attempts give KILL with same_failure, live and on replay."""
    job_id = iris_cluster.submit(
        "e2e-crash", [PY, str(TOYS / "crash_loop.py")], max_retries_failure=2
    )
    iris_cluster.wait_for(job_id, ["failed", "succeeded"])
    job_dir = build_job_dir(iris_cluster, job_id, tmp_path, entrypoint=[PY, "crash_loop.py"])
    now, limits = datetime.now(UTC), Thresholds()
    first = collect_evidence(job_dir, now=now, thresholds=limits)
    monkeypatch.setenv("RLHEALTH_IRIS_COMMAND", shlex.join(SHIM_COMMAND))
    settings = Settings(iris_controller_url=iris_cluster.url)
    probe_dir, notes = capture_live(first, "iris", tmp_path / "probes", settings)
    assert probe_dir is not None, notes
    report = judge(collect_evidence(job_dir, now=now, thresholds=limits, probes_dir=probe_dir))
    assert report.verdict == Verdict.KILL, report
    assert report.restarts.same_failure is True
    replay = judge(collect_evidence(job_dir, now=now, thresholds=limits, probes_dir=probe_dir))
    assert (replay.verdict, replay.restarts.same_failure) == (Verdict.KILL, True)


def test_hung_trainer_is_killed_on_live_stacks_and_replay_agrees(
    iris_cluster: IrisTestCluster,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A trainer hung in all_reduce gives KILL quoting two live stacks; replaying them agrees."""
    job_id = iris_cluster.submit("e2e-hung", [PY, str(TOYS / "hung_trainer.py")])
    iris_cluster.wait_for(job_id, ["running"])
    deadline = datetime.now(UTC) + timedelta(seconds=90)
    while "Finished: 'step'" not in iris_cluster.cli("job", "logs", job_id).stdout:
        assert datetime.now(UTC) < deadline, "the hung toy never started its step"
        time.sleep(1)
    job_dir = build_job_dir(iris_cluster, job_id, tmp_path / "bundle", entrypoint=[PY])
    now = datetime.now(UTC) + timedelta(seconds=5)
    limits = Thresholds(stall_floor_s=2)
    first = collect_evidence(job_dir, now=now, thresholds=limits)
    monkeypatch.setenv("RLHEALTH_IRIS_COMMAND", shlex.join(SHIM_COMMAND))
    settings = Settings(iris_controller_url=iris_cluster.url)
    probe_dir, _ = capture_live(
        first,
        "iris",
        tmp_path / "probes",
        settings,
        stack_interval_s=2.0,
        process_match="hung_trainer",
    )
    assert probe_dir is not None
    live = judge(collect_evidence(job_dir, now=now, thresholds=limits, probes_dir=probe_dir))
    assert live.verdict == Verdict.KILL, live
    quoted = [q.source for q in live.gates["liveness"].evidence]
    assert any(source.startswith("probes/stacks/") for source in quoted), quoted
    replay = judge(collect_evidence(job_dir, now=now, thresholds=limits, probes_dir=probe_dir))
    assert replay.verdict == live.verdict
