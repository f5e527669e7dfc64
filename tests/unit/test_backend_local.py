"""The local backend on a real sleeping Python process started by the test."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shared.settings import Settings
from worker.backends import JobRef, Recorder, default_runner, resolve_tools
from worker.backends.base import ProbePlan, probe_job
from worker.backends.local import LocalBackend, proc_state
from worker.evidence.probes import read_probes, write_probes

SLEEPER = (
    "import time\ndef all_reduce():\n    time.sleep(60)\nprint('up', flush=True)\nall_reduce()\n"
)


@pytest.fixture
def sleeper(monkeypatch: pytest.MonkeyPatch) -> Iterator[subprocess.Popen[str]]:
    """A Python process parked in `all_reduce`, stopped after the test (py-spy on PATH)."""
    venv_bin = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", f"{venv_bin}{os.pathsep}{os.environ['PATH']}")
    process = subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "up\n"
    yield process
    process.kill()
    process.wait()


def test_local_process_stacks_taken_twice(sleeper: subprocess.Popen[str], tmp_path: Path) -> None:
    """/proc status and two py-spy dumps of a live process land in the probe layout."""
    tools = resolve_tools(Settings())
    backend = LocalBackend(JobRef(job_id=f"/local/{sleeper.pid}"), tools=dict(tools.paths))
    rec = Recorder(default_runner(), timeout_s=30, retry_wait_s=0)
    plan = ProbePlan(stacks=True, interval_s=1.0)
    evidence = probe_job(
        backend, rec, plan, job_id=backend.job.job_id, clock=lambda: datetime.now(UTC)
    )
    write_probes(evidence, rec.outputs, tmp_path)
    probes = read_probes(tmp_path)
    assert probes.controller is not None and probes.controller.state == "running"
    assert [f for f in rec.failures if "nvidia-smi" not in f] == []  # no GPU on this host
    assert [(s.pid, s.n) for s in probes.stacks] == [(sleeper.pid, 1), (sleeper.pid, 2)]
    assert all("all_reduce" in s.text for s in probes.stacks)
    first, second = (s.captured_at for s in probes.stacks)
    assert first and second and (second - first).total_seconds() >= 1


def test_gone_process_is_missing(tmp_path: Path) -> None:
    """A pid that no longer exists gives state `missing` and no stacks."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    tools = resolve_tools(Settings())
    backend = LocalBackend(JobRef(job_id=f"/local/{process.pid}"), tools=dict(tools.paths))
    rec = Recorder(default_runner(), timeout_s=10, retry_wait_s=0)
    evidence = probe_job(
        backend,
        rec,
        ProbePlan(stacks=True, interval_s=0),
        job_id="j",
        clock=lambda: datetime.now(UTC),
    )
    assert evidence.controller is not None and evidence.controller.state == "missing"
    assert any("no running task" in f for f in rec.failures)


def test_proc_state_reads_the_state_letter() -> None:
    """Sleeping is running; a zombie has failed."""
    assert proc_state("Name:\tpython\nState:\tS (sleeping)\n") == "running"
    assert proc_state("State:\tZ (zombie)\n") == "failed"
