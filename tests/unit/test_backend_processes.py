"""The processes a live backend dumps and the roles it records (worker.backends.processes and
the shared plan of worker.backends.base): Ray's renamed workers count as Python, ranks are chosen
before helpers, and each probed process lands in processes.json with its role."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tests.ray_node import AGENT, DRIVER, LOG_MONITOR, RANK, RAYLET_FAILED
from worker.backends.base import ProbePlan, Recorder, probe_job
from worker.backends.processes import PS_ARGV, TaskProcess, task_processes
from worker.backends.spawn import ProbeResult
from worker.evidence.model import AttemptRecord, ControllerView
from worker.evidence.probes import read_probes, write_probes

RAY = "/usr/local/lib/python3.12/site-packages/ray"
NOW = datetime(2026, 7, 30, 22, 0, tzinfo=UTC)
LISTING = f"""\
  PID  PPID COMMAND
    1     0 /usr/bin/dumb-init -- bash -c python -m skyrl_train.entrypoints.main_base
    7     1 python -m skyrl_train.entrypoints.main_base trainer.epochs=20
   20     1 {RAY}/core/src/ray/gcs/gcs_server --log_dir=/tmp/ray/session_latest/logs
   21     1 {RAY}/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/ray/raylet
   22    21 /usr/bin/python3 -u {RAY}/_private/log_monitor.py --session-dir=/tmp/ray
   23    21 /usr/bin/python3 -u {RAY}/dashboard/agent.py --node-ip-address=10.0.0.7
   30    21 ray::PolicyWorker.ppo_train
   31    21 ray::PolicyWorker.ppo_train
   40    21 ray::IDLE
   41    21 VLLM::EngineCore_0
   50     1 /usr/bin/python3 /opt/venv/bin/torchrun --nproc-per-node=2 train.py
   51    50 /usr/bin/python3 train.py
   99     1 {" ".join(PS_ARGV)}
"""


def test_ray_and_vllm_workers_renamed_by_their_runtime_are_python_processes() -> None:
    """`ray::...` and `VLLM::...` titles are dumped; native binaries, shells and the probe are
    not; a child keeps its parent's command line for the classifier."""
    found = {p.pid: p for p in task_processes(LISTING)}
    assert sorted(found) == [7, 22, 23, 30, 31, 40, 41, 50, 51]
    assert found[51].parent_args is not None and "torchrun" in found[51].parent_args


@dataclass
class FakeNode:
    """A backend over one pod holding `processes`; dumps come from `dumps`, others fail."""

    found: tuple[TaskProcess, ...]
    name: str = "kubernetes"

    def controller(self, rec: Recorder) -> ControllerView | None:
        return ControllerView(job_id="/ops/rl-job", state="running")

    def attempts(
        self, rec: Recorder, controller: ControllerView | None
    ) -> tuple[AttemptRecord, ...] | None:
        return ()

    def logs_tail(self, rec: Recorder, controller: ControllerView | None) -> None:
        return None

    def targets(self, controller: ControllerView | None) -> tuple[str, ...]:
        return ("rl-job-0",)

    def processes(self, rec: Recorder, target: str) -> tuple[TaskProcess, ...]:
        return self.found

    def stack(self, rec: Recorder, target: str, pid: int, n: int) -> None:
        rec.run(("py-spy", "dump", "--pid", str(pid)), f"stacks/{target}-pid{pid}-{n}.txt")

    def gpus(self, rec: Recorder, target: str) -> None:
        return None


DUMPS = {30: RANK.dump(30), 7: DRIVER.dump(7, 290), 22: LOG_MONITOR.dump(22, 520)}


def _runner(argv: Sequence[str], timeout_s: float) -> ProbeResult:
    pid = int(argv[-1])
    if pid in DUMPS:
        return ProbeResult(tuple(argv), NOW, 0, DUMPS[pid])
    return ProbeResult(tuple(argv), NOW, 1, "", RAYLET_FAILED)


def _probe(found: Sequence[TaskProcess], tmp_path: Path, max_pids: int = 8) -> Recorder:
    rec = Recorder(_runner, timeout_s=5, retry_wait_s=0)
    plan = ProbePlan(stacks=True, interval_s=0, max_pids=max_pids)
    evidence = probe_job(
        FakeNode(tuple(found)), rec, plan, job_id="/ops/rl-job", clock=lambda: NOW,
        sleep=lambda _: None,
    )  # fmt: skip
    write_probes(evidence, rec.outputs, tmp_path)
    return rec


def test_each_probed_process_is_recorded_with_its_role(tmp_path: Path) -> None:
    """processes.json holds every probed process, its command line and the role decided from
    its dumps: a rank, the driver, a helper, and a native process whose dump found no Python."""
    found = [
        TaskProcess(7, 1, DRIVER.args),
        TaskProcess(22, 21, LOG_MONITOR.args),
        TaskProcess(30, 21, RANK.args),
        TaskProcess(60, 1, "/opt/bin/sidecar --port 9"),
    ]
    _probe(found, tmp_path)
    records = {p.pid: p for p in read_probes(tmp_path).processes}
    assert {pid: p.role for pid, p in records.items()} == {
        7: "driver", 22: "helper", 30: "rank", 60: "native"
    }  # fmt: skip
    assert records[30].args == RANK.args and records[30].ppid == 21
    assert "Python interpreter" in records[60].why


def test_ranks_and_the_driver_are_dumped_before_helpers_when_a_task_holds_too_many(
    tmp_path: Path,
) -> None:
    """With room for three of five processes, the two ranks and the driver are dumped and the
    log monitor and agent are not; with room for all five, all are."""
    found = [
        TaskProcess(5, 1, LOG_MONITOR.args),
        TaskProcess(6, 1, AGENT.args),
        TaskProcess(7, 1, DRIVER.args),
        TaskProcess(30, 21, RANK.args),
        TaskProcess(31, 21, RANK.args),
    ]
    few = _probe(found, tmp_path / "few", max_pids=3)
    assert sorted(p.pid for p in few.processes) == [7, 30, 31]
    every = _probe(found, tmp_path / "every", max_pids=5)
    assert sorted(p.pid for p in every.processes) == [5, 6, 7, 30, 31]


def test_the_dumps_of_one_round_run_together_and_are_recorded_in_order(tmp_path: Path) -> None:
    """Three dumps of a round are in flight at once (each waits for the other two) and
    probes.json lists them by file name, whatever order they finished in."""
    arrived = threading.Barrier(3, timeout=30)

    def together(argv: Sequence[str], timeout_s: float) -> ProbeResult:
        arrived.wait()  # raises BrokenBarrierError when the dumps run one after another
        return _runner(argv, timeout_s)

    found = [TaskProcess(pid, 21, RANK.args) for pid in (31, 30, 7)]
    rec = Recorder(together, timeout_s=5, retry_wait_s=0)
    plan = ProbePlan(stacks=True, interval_s=0)
    probe_job(FakeNode(tuple(found)), rec, plan, job_id="/ops/rl-job", clock=lambda: NOW,
              sleep=lambda _: None)  # fmt: skip
    outputs = [(c.output or "").removeprefix("failed/") for c in rec.commands]
    assert outputs[:3] == [f"stacks/rl-job-0-pid{pid}-1.txt" for pid in ("30", "31", "7")]
    assert outputs[3:] == [f"stacks/rl-job-0-pid{pid}-2.txt" for pid in ("30", "31", "7")]
