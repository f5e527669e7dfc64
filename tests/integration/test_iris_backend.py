"""The Iris backend against a real marin-iris LocalCluster started by this module."""

from __future__ import annotations

import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shared.settings import Settings, Thresholds
from testkit.iris_cluster import (
    SHIM_COMMAND,
    IrisTestCluster,
    build_job_dir,
    start_cluster,
    toy_argv,
)
from worker.backends import ClusterConnection, JobRef, Recorder, make_backend, resolve_tools
from worker.backends.base import ProbePlan, probe_job
from worker.diagnosis import collect_evidence
from worker.evidence.probes import read_probes, write_probes
from worker.pipeline.capture import capture_live

pytestmark = pytest.mark.integration

PY = sys.executable


@pytest.fixture(scope="module")
def iris_cluster() -> Iterator[IrisTestCluster]:
    """One LocalCluster for the module; a cluster that cannot start fails the tests with why."""
    try:
        cluster = start_cluster()
    except Exception as exc:  # the reason must reach the test report, whatever it is
        pytest.fail(f"marin-iris LocalCluster could not start on this machine: {exc!r}")
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def marker_dir() -> Iterator[Path]:
    """A directory outside /tmp (the LocalCluster maps /tmp paths into each task's own TMPDIR)."""
    path = Path(tempfile.mkdtemp(prefix="rlhealth-iris-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def jobs(iris_cluster: IrisTestCluster, marker_dir: Path) -> dict[str, str]:
    """The module's toy jobs, submitted together so they run side by side."""
    marker = marker_dir / "first-attempt"
    submit = iris_cluster.submit
    return {
        "crash": submit("crashloop", toy_argv("crash_loop"), max_retries_failure=2),
        "transient": submit(
            "transient", toy_argv("transient_once", str(marker)), max_retries_failure=1
        ),
        "skyrl": submit("skyrl", toy_argv("skyrl_trainer", "3")),
        "hung": submit("hung", toy_argv("hung_trainer")),
    }


def _settings(cluster: IrisTestCluster) -> Settings:
    return Settings(iris_controller_url=cluster.url, probe_timeout_s=60)


def _probe(cluster: IrisTestCluster, job_id: str, plan: ProbePlan, out: Path) -> Recorder:
    settings = _settings(cluster)
    tools = resolve_tools(settings, iris_command=SHIM_COMMAND)
    connection = ClusterConnection(iris_controller_url=cluster.url)
    job = JobRef(job_id=job_id, connection=connection, process_match="hung_trainer")
    backend = make_backend("iris", job, settings, tools)
    rec = Recorder(tools.runner(), timeout_s=60)
    evidence = probe_job(backend, rec, plan, job_id=job_id, clock=lambda: datetime.now(UTC))
    write_probes(evidence, rec.outputs, out)
    return rec


def test_crash_loop_attempts_repeat_the_same_failure(
    iris_cluster: IrisTestCluster, jobs: dict[str, str], tmp_path: Path
) -> None:
    """A job failing the same way three times shows three failed attempts with one error."""
    assert iris_cluster.wait_for(jobs["crash"], ["failed", "succeeded"]) == "failed"
    _probe(iris_cluster, jobs["crash"], ProbePlan(), tmp_path)
    probes = read_probes(tmp_path)
    assert probes.controller is not None and probes.controller.state == "failed"
    assert probes.controller.failure_count == 3
    assert probes.attempts is not None and [a.attempt_id for a in probes.attempts] == [0, 1, 2]
    assert {a.state for a in probes.attempts} == {"failed"}
    assert all("CUDA out of memory" in (a.error or "") for a in probes.attempts)
    argvs = [c.argv for c in probes.commands]
    assert any("job" in a and "summary" in a for a in argvs), argvs
    assert "CUDA out of memory" in (tmp_path / "logs" / "tail.log").read_text()
    assert probes.failures == ()


def test_transient_first_attempt_then_recovery(
    iris_cluster: IrisTestCluster, jobs: dict[str, str], tmp_path: Path
) -> None:
    """A first attempt lost to a transient is followed by a succeeding attempt."""
    assert iris_cluster.wait_for(jobs["transient"], ["failed", "succeeded"]) == "succeeded"
    _probe(iris_cluster, jobs["transient"], ProbePlan(), tmp_path)
    attempts = read_probes(tmp_path).attempts
    assert attempts is not None
    assert [(a.attempt_id, a.state) for a in attempts] == [(0, "failed"), (1, "succeeded")]
    assert "Resuming from global_step: 1" in (tmp_path / "logs" / "tail.log").read_text()


def test_skyrl_trainer_log_tail_holds_timers_and_metrics(
    iris_cluster: IrisTestCluster, jobs: dict[str, str], tmp_path: Path
) -> None:
    """The log tail of a SkyRL-format toy holds its phase timers and WANDB_MIRROR records."""
    assert iris_cluster.wait_for(jobs["skyrl"], ["failed", "succeeded"]) == "succeeded"
    job_dir = build_job_dir(
        iris_cluster, jobs["skyrl"], tmp_path, entrypoint=[PY, "skyrl_trainer.py"]
    )
    text = (job_dir / "finelog.log").read_text()
    assert "Finished: 'step', time cost: 1.00s" in text
    assert "WANDB_MIRROR kind=train step=3 metrics=" in text
    evidence = collect_evidence(job_dir)
    assert evidence.bundle.state == "succeeded"
    assert evidence.logs is not None and evidence.logs.metrics.height > 0


def _wait_for_line(cluster: IrisTestCluster, job_id: str, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in cluster.cli("job", "logs", job_id).stdout:
            return
        time.sleep(1)
    raise AssertionError(f"{job_id} never logged {text!r}")


def test_hung_trainer_stacks_captured_live_twice(
    iris_cluster: IrisTestCluster,
    jobs: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A trainer hung in all_reduce is dumped twice, seconds apart, through `iris task exec`."""
    iris_cluster.wait_for(jobs["hung"], ["running"])
    _wait_for_line(iris_cluster, jobs["hung"], "Finished: 'step'", 60)
    job_dir = build_job_dir(iris_cluster, jobs["hung"], tmp_path / "bundle", entrypoint=[PY])
    later = datetime.now(UTC) + timedelta(seconds=5)
    evidence = collect_evidence(job_dir, now=later, thresholds=Thresholds(stall_floor_s=1))
    out = tmp_path / "probes"
    monkeypatch.setenv("RLHEALTH_IRIS_COMMAND", shlex.join(SHIM_COMMAND))
    probe_dir, notes = capture_live(
        evidence,
        "iris",
        out,
        _settings(iris_cluster),
        stack_interval_s=2.0,
        process_match="hung_trainer",
    )
    assert probe_dir == out
    assert any("quiet" in note for note in notes), notes
    stacks = read_probes(out).stacks
    assert [s.n for s in stacks] == [1, 2], notes
    assert len({s.pid for s in stacks}) == 1
    assert all("all_reduce" in s.text for s in stacks)
    first, second = (s.captured_at for s in stacks)
    assert first is not None and second is not None
    assert (second - first).total_seconds() >= 2
