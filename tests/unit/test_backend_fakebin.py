"""The Kubernetes and Slurm backends against fake `kubectl` / `sacct` / `squeue` on PATH."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shared.settings import Settings
from worker.backends import ClusterConnection, JobRef, Recorder, default_runner, resolve_tools
from worker.backends.base import ProbePlan, probe_job
from worker.backends.kubernetes import KubernetesBackend
from worker.backends.slurm import SlurmBackend
from worker.evidence.probes import read_probes, write_probes

FAKEBIN = Path(__file__).resolve().parents[1] / "fixtures" / "fakebin"
STACK = """Process 41: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 41 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2050)
    train (train.py:10)
"""
PODS = {
    "items": [
        {
            "metadata": {"name": "rl-job-0"},
            "spec": {"nodeName": "gpu-node-7"},
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "restartCount": 1,
                        "state": {"running": {}},
                        "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
                    }
                ],
            },
        }
    ]
}
PS = "  PID  PPID COMMAND\n    1     0 bash -c python train.py\n   41     1 python train.py\n"
GPU = "index, utilization.gpu [%], memory.used [MiB], memory.total [MiB], power.draw [W], power.limit [W]\n0, 0 %, 70000 MiB, 81559 MiB, 95.1 W, 700.00 W\n"  # noqa: E501


def _fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, replies: dict[str, object]) -> Path:
    log = tmp_path / "argv.log"
    (tmp_path / "replies.json").write_text(json.dumps(replies))
    monkeypatch.setenv("PATH", f"{FAKEBIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKEBIN_LOG", str(log))
    monkeypatch.setenv("FAKEBIN_REPLIES", str(tmp_path / "replies.json"))
    return log


def _kube_replies() -> dict[str, object]:
    exec_ = "kubectl --context=cw exec rl-job-0 --"
    return {
        "kubectl --context=cw get pods -l job-name=rl-job -o json": {"stdout": json.dumps(PODS)},
        "kubectl --context=cw logs --since=1h --tail=2000 -- rl-job-0": {"stdout": "step 7\n"},
        f"{exec_} ps -ww -eo pid,ppid,args": {"stdout": PS},
        f"{exec_} py-spy dump --pid 41": {"stdout": STACK},
        f"{exec_} nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total,"
        "power.draw,power.limit --format=csv": {"stdout": GPU},
    }


CW = ClusterConnection(kube_context="cw")


def _kube(job: JobRef) -> KubernetesBackend:
    """The Kubernetes backend on the kubectl resolved now (the fake one, first on PATH)."""
    return KubernetesBackend(job, kubectl=resolve_tools(Settings()).argv0("kubectl"))


def _slurm(job: JobRef) -> SlurmBackend:
    tools = resolve_tools(Settings())
    return SlurmBackend(job, sacct=tools.argv0("sacct"), squeue=tools.argv0("squeue"))


def _capture(backend: KubernetesBackend | SlurmBackend, out: Path, stacks: bool) -> Recorder:
    rec = Recorder(default_runner(), timeout_s=10, retry_wait_s=0)
    plan = ProbePlan(stacks=stacks, interval_s=0)
    clock = lambda: datetime.now(UTC)  # noqa: E731
    evidence = probe_job(
        backend, rec, plan, job_id="/ops/rl-job", clock=clock, sleep=lambda _: None
    )
    write_probes(evidence, rec.outputs, out)
    return rec


def test_kubernetes_probes_pods_logs_stacks_and_gpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Pods, restarts, a log tail, two stack dumps and the GPU csv land in the probe layout."""
    log = _fake(monkeypatch, tmp_path, _kube_replies())
    job = JobRef(job_id="/ops/rl-job", connection=CW)
    rec = _capture(_kube(job), tmp_path / "probes", stacks=True)
    assert rec.failures == []
    probes = read_probes(tmp_path / "probes")
    assert probes.controller is not None and probes.controller.state == "running"
    assert probes.attempts is not None
    assert next((a.attempt_id, a.exit_code, a.terminal_reason) for a in probes.attempts) == (
        0,
        137,
        "OOMKilled",
    )
    assert [(s.target, s.pid, s.n) for s in probes.stacks] == [
        ("rl-job-0", 41, 1),
        ("rl-job-0", 41, 2),
    ]
    assert probes.gpus["rl-job-0"][0]["power_draw_w"] == 95.1
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert all(argv[0] == "kubectl" and argv[2] in {"get", "logs", "exec"} for argv in seen)


def test_kubernetes_exec_failure_is_recorded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A failing `kubectl exec` is a recorded command with its exit code, not a crash."""
    replies = _kube_replies()
    replies["kubectl --context=cw exec rl-job-0 -- py-spy dump --pid 41"] = {
        "stderr": "Permission denied (os error 13)",
        "exit": 1,
    }
    _fake(monkeypatch, tmp_path, replies)
    rec = _capture(_kube(JobRef("/ops/rl-job", connection=CW)), tmp_path / "p", True)
    assert any("Permission denied" in f for f in rec.failures)
    probes = read_probes(tmp_path / "p")
    assert probes.stacks == ()
    assert any("exited 1" in f for f in probes.failures)


SACCT = (
    "812|PREEMPTED|0:0|2026-07-30T18:00:00|2026-07-30T19:00:00|jupiter-0042|None\n"
    "812|RUNNING|0:0|2026-07-30T19:05:00|Unknown|jupiter-0107|None\n"
)


def test_slurm_attempts_from_sacct_and_state_from_squeue(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A requeued Slurm job shows a preempted attempt and a running one."""
    fields = "JobID,State,ExitCode,Start,End,NodeList,Reason"
    log = _fake(
        monkeypatch,
        tmp_path,
        {
            f"sacct -j 812 -P -n -X --duplicates --format={fields}": {"stdout": SACCT},
            "squeue -j 812 -h -o %i|%T|%N|%r": {"stdout": "812|RUNNING|jupiter-0107|None\n"},
        },
    )
    _capture(_slurm(JobRef(job_id="/ops/812")), tmp_path / "p", stacks=True)
    probes = read_probes(tmp_path / "p")
    assert probes.controller is not None and probes.controller.state == "running"
    assert probes.attempts is not None
    assert [a.state for a in probes.attempts] == ["preempted", "running"]
    assert probes.attempts[0].node_name == "jupiter-0042"
    assert {json.loads(line)[0] for line in log.read_text().splitlines()} == {"sacct", "squeue"}
