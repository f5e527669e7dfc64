"""The second look's adapter (`worker.pipeline.second_look.observe_again`) with a fake runner at
the edge: the bundle read again, the local backend's plan run with the stacks forced even when the
log is not quiet, and no probe (saying why) when no backend is enabled or the event's is refused."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import pytest

from shared.models import Event
from shared.settings import Settings
from worker.backends import resolve_tools
from worker.backends.spawn import ProbeResult
from worker.diagnosis import collect_evidence
from worker.evidence.case import Evidence
from worker.pipeline.second_look import NO_BACKEND, Live, observe_again
from worker.second_look import observe

PID = 4242
NOW = datetime.now(UTC).replace(microsecond=0)
DUMP = f"""\
Process {PID}: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread {PID} (idle): "MainThread"
    all_reduce (train.py:14)
    <module> (train.py:23)
"""


class FakeRunner:
    """Answers the local backend's commands as a live sleeping process would; runs nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> ProbeResult:
        command = tuple(argv)
        self.calls.append(command)
        words = " ".join(command)
        if words.endswith(f"/proc/{PID}/status"):
            return ProbeResult(command, NOW, 0, "Name:\tpython\nState:\tS (sleeping)\n")
        if words.endswith(f"/proc/{PID}/cmdline"):
            return ProbeResult(command, NOW, 0, "python\0train.py\0")
        if "py-spy" in words:
            return ProbeResult(command, NOW, 0, DUMP)
        return ProbeResult(command, NOW, 127, "", "not found")


def _bundle(root: Path) -> str:
    """A local job whose log advanced a second ago: the capture policy alone takes no stacks."""
    job_dir = root / "jobs" / "local" / "local" / str(PID)
    job_dir.mkdir(parents=True)
    stamp = (NOW - timedelta(seconds=1)).strftime("%Y-%m-%d %H:%M:%S.000")
    line = f"{stamp} | INFO | skyrl_train.trainer:train:210 - Finished: 'step', time cost: 1.00s\n"
    (job_dir / "finelog.log").write_text(line, encoding="utf-8")
    manifest = {"bundle_format": 1, "cluster": "local", "job_id": f"/local/{PID}", "kind": "rl",
                "synced_at": NOW.isoformat(), "job": {"job_id": f"/local/{PID}",
                "state": "running", "entrypoint": json.dumps({"argv": ["python"]})},
                "artifacts": {"finelog": "1 lines"}}  # fmt: skip
    (job_dir / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return job_dir.relative_to(root).as_posix()


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Event]:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    relative = _bundle(tmp_path)
    return tmp_path, Event(event_id="e1", job_dir=relative, published_at=NOW)


def _look(
    root: Path, event: Event, runner: FakeRunner, backend: Literal["local", "none"] = "none"
) -> Evidence:
    base = Settings(bundle_root=root, probe_interval_s=1, backend=backend)
    first = collect_evidence(root / event.job_dir, now=NOW, evidence_label="s3://b/evidence/e1/")
    live = Live(clock=lambda: NOW, runner=runner, tools=resolve_tools(base), sleep=lambda s: None)
    return observe_again(event, first, base, live)


def test_the_second_look_forces_the_stacks_through_the_local_backend(
    job: tuple[Path, Event],
) -> None:
    """The log is fresh, yet the look takes two dumps of the process and reads its state; it
    asks for no GPU state (not part of the look)."""
    root, event = job
    runner = FakeRunner()
    second = _look(root, event, runner, backend="local")
    assert second.job_dir == "s3://b/evidence/e1/second_look/"
    assert second.probes is not None and second.probes.controller is not None
    assert second.probes.controller.state == "running"
    assert [(d.pid, d.n) for d in second.probes.stacks] == [(PID, 1), (PID, 2)]
    assert sum("py-spy" in " ".join(c) for c in runner.calls) == 2
    assert not any("nvidia-smi" in " ".join(c) for c in runner.calls)
    seen = observe(second, prefix="second_look/")
    assert seen.blind == () and seen.stacks[0].newest[0] == "all_reduce (train.py:14)"


def test_no_backend_enabled_takes_no_probe_and_says_why(job: tuple[Path, Event]) -> None:
    root, event = job
    runner = FakeRunner()
    second = _look(root, event, runner)  # RLHEALTH_BACKEND=none
    assert second.probes is None and runner.calls == []
    assert NO_BACKEND in second.discrepancies
    assert "no live probe was taken" in observe(second).blind[0]


def test_a_backend_the_operator_did_not_enable_is_refused(job: tuple[Path, Event]) -> None:
    root, event = job
    runner = FakeRunner()
    asking = event.model_copy(update={"backend": "iris"})
    second = _look(root, asking, runner, backend="local")
    assert second.probes is None and runner.calls == []
    assert any("live probes refused" in d and "'iris'" in d for d in second.discrepancies)
