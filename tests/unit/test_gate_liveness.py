"""The liveness gate (worker.gates.liveness)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from shared.models import GateResult, GateStatus, Verdict
from tests.factories import NOW, at, evidence, logs, trials
from worker.diagnosis import judge
from worker.evidence.model import (
    ArtifactState,
    ArtifactStatus,
    AttemptRecord,
    ClockSkew,
    ControllerView,
    ParseSummary,
    ProbeCommand,
    ProbeEvidence,
    ProcessRecord,
    StackDump,
)
from worker.gates.liveness import STACKS_NEEDED, check

WEDGED = """\
Process {pid}: ray::PolicyWorker.train
Python v3.12.3 (/usr/bin/python3.12)

Thread {pid} (active): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2501)
    ppo_train (skyrl_train/workers/worker.py:655)
"""


def timer(
    event: str,
    phase: str,
    minutes_ago: float,
    line: int,
    *,
    seconds: float | None = None,
    step: int | None = None,
    attempt: int = 0,
) -> dict[str, Any]:
    """One TIMERS row in finelog.log."""
    return {
        "event": event,
        "phase": phase,
        "seconds": seconds,
        "step": step,
        "source": "finelog.log",
        "line": line,
        "timestamp": at(minutes_ago),
        "attempt": attempt,
    }


def steady_steps(last_minutes_ago: float, n: int = 8, every: float = 1.0) -> list[dict[str, Any]]:
    """`Finished: 'step'` rows every `every` minutes, the newest `last_minutes_ago` before NOW."""
    return [
        timer(
            "finished",
            "step",
            last_minutes_ago + every * (n - 1 - i),
            100 + 10 * i,
            seconds=every * 60,
            step=i + 1,
        )
        for i in range(n)
    ]


def controller_probe(state: str = "running", **extra: Any) -> ProbeEvidence:
    """A fresh controller probe, optionally with stacks or attempts."""
    view = ControllerView(job_id="/ops/rl-job", state=state, error=extra.pop("error", None))
    return ProbeEvidence(directory="probes", captured_at=NOW, controller=view, **extra)


def wedged_dumps(pid: int = 4242) -> tuple[StackDump, ...]:
    """Two dumps of one rank, ten seconds apart, both in all_reduce."""
    return tuple(
        StackDump(
            target="rl-job-0",
            pid=pid,
            n=n,
            source=f"probes/stacks/rl-job-0-pid{pid}-{n}.txt",
            captured_at=NOW - timedelta(seconds=40 - 10 * n),
            text=WEDGED.format(pid=pid),
        )
        for n in (1, 2)
    )


def assert_quoted(result: GateResult) -> None:
    """A FAIL or ERROR quotes evidence with a source, and some quote has a line."""
    assert result.evidence
    assert all(q.source for q in result.evidence)
    assert any(q.line is not None for q in result.evidence)


def test_advancing_run_passes() -> None:
    """A step finished a minute ago on a one-minute cadence passes, not initialising."""
    result = check(evidence(log_tables=logs(timers=steady_steps(1)), probes=controller_probe()))
    assert result.status is GateStatus.PASS
    assert not result.initializing
    assert "advancing" in result.summary
    assert result.flip_signal and result.flip_signal.endswith("Z")


def test_initialisation_grace_passes_with_deadline() -> None:
    """No step yet, twenty minutes into the attempt: initialising with the first-step deadline."""
    tables = logs(timers=[timer("started", "generate", 20, 10, step=1)])
    result = check(evidence(log_tables=tables, probes=controller_probe()))
    assert result.status is GateStatus.PASS
    assert result.initializing
    assert result.flip_signal is not None and "2026-07-30T21:40Z" in result.flip_signal


def test_initialisation_grace_exceeded_is_not_initialising() -> None:
    """Sixty quiet minutes without a first step exceed INIT_GRACE_S and are no longer init."""
    tables = logs(timers=[timer("started", "generate", 60, 10, step=1)])
    result = check(evidence(log_tables=tables, probes=controller_probe()))
    assert not result.initializing
    assert result.status is GateStatus.ERROR
    assert STACKS_NEEDED in result.missing
    assert_quoted(result)


def test_quiet_beyond_cadence_with_wedged_stacks_fails_hard() -> None:
    """Quiet 29 min on a 1-min cadence with two all_reduce dumps is a proven stall."""
    rows = [*steady_steps(30), timer("started", "policy_train", 29, 900, step=9)]
    rows += [timer("finished", "policy_train", 40 - i, 200 + i, seconds=20.0) for i in range(3)]
    probe = controller_probe(stacks=wedged_dumps())
    result = check(evidence(log_tables=logs(timers=rows), probes=probe))
    assert result.status is GateStatus.FAIL
    assert result.hard_failure
    assert result.mechanism is not None and "all_reduce" in result.mechanism
    assert_quoted(result)
    stack_quotes = [q for q in result.evidence if q.source.startswith("probes/stacks/")]
    assert len(stack_quotes) == 2
    assert all(q.line == 5 and q.timestamp is not None for q in stack_quotes)


def test_quiet_beyond_cadence_without_stacks_is_error() -> None:
    """Quiet beyond the threshold without live stacks is ERROR: a stall needs stacks."""
    result = check(evidence(log_tables=logs(timers=steady_steps(30)), probes=controller_probe()))
    assert result.status is GateStatus.ERROR
    assert "stall suspected, live stacks needed" in result.summary
    assert result.missing == (STACKS_NEEDED,)
    assert not result.hard_failure
    assert_quoted(result)


def test_quiet_with_replayed_lines_says_they_are_no_progress() -> None:
    """Lines the shipper re-sent are out of the tables: the quiet time runs from the newest
    consistent step, and the ERROR says why the re-sent lines do not shorten it."""
    summary = ParseSummary(clock=ClockSkew(replayed=3, replayed_examples=("finelog.log:9: x",)))
    tables = logs(timers=steady_steps(30), summary=summary)
    result = check(evidence(log_tables=tables, probes=controller_probe()))
    assert result.status is GateStatus.ERROR
    assert "stall suspected, live stacks needed: quiet 30 min" in result.summary
    assert "3 log line(s) re-sent by the log shipper" in result.summary
    quiet = check(evidence(log_tables=logs(timers=steady_steps(30)), probes=controller_probe()))
    assert "re-sent" not in quiet.summary


def test_long_checkpoint_save_within_its_own_cadence_passes() -> None:
    """A save open for 40 min passes when past saves took up to 28 min (4 x p90 > 40 min)."""
    saves = [
        timer("finished", "save_checkpoints", 300 - 60 * i, 50 + i, seconds=s)
        for i, s in enumerate((1500.0, 1600.0, 1700.0))
    ]
    rows = [*steady_steps(41), *saves, timer("started", "save_checkpoints", 40, 990)]
    result = check(evidence(log_tables=logs(timers=rows), probes=controller_probe()))
    assert result.status is GateStatus.PASS
    assert "save_checkpoints" in result.summary


def test_busy_colocated_engines_do_not_prove_a_live_trainer() -> None:
    """Fresh vLLM stats while the trainer is quiet beyond cadence never make liveness PASS."""
    engines = [
        {
            "timestamp": at(1),
            "engine": "287294@10.128.26.194/000",
            "running": 64,
            "waiting": 12,
            "kv_cache_pct": 88.0,
            "generation_tokens_per_s": 2400.0,
            "source": "ray_vllm_logs/pod-0/worker-1.out",
            "line": 4410,
            "attempt": 0,
        }
    ]
    tables = logs(timers=steady_steps(30), engines=engines)
    result = check(evidence(log_tables=tables, probes=controller_probe()))
    assert result.status is not GateStatus.PASS
    assert "vLLM engine" in result.summary
    assert any(q.source.startswith("ray_vllm_logs/") and q.line == 4410 for q in result.evidence)


def test_terminal_controller_with_fresh_log_is_error() -> None:
    """Controller failed 10 min ago but the log advanced 2 min ago: the sources disagree."""
    finished = int(at(10).timestamp() * 1000)
    attempts = (
        AttemptRecord(
            task_id="/ops/rl-job/0", attempt_id=0, state="failed", finished_at_ms=finished
        ),
    )
    probe = controller_probe("failed", attempts=attempts, error="Exit code: 1")
    result = check(evidence(log_tables=logs(timers=steady_steps(2)), probes=probe))
    assert result.status is GateStatus.ERROR
    assert "disagree" in result.summary
    assert_quoted(result)


def test_running_controller_without_pods_is_error() -> None:
    """The controller says running but the manifest has had no pod for two hours."""
    pods = ArtifactStatus(name="pod_logs", raw="no pod yet", state=ArtifactState.WAITING)
    result = check(
        evidence(
            log_tables=logs(timers=steady_steps(1)),
            probes=controller_probe(),
            statuses={"pod_logs": pods},
            submitted_at=at(120),
        )
    )
    assert result.status is GateStatus.ERROR
    assert "no pod yet" in result.summary
    assert any(q.source == "manifest.json" and "pod_logs" in q.text for q in result.evidence)


def test_stale_manifest_without_probes_is_error() -> None:
    """A manifest synced two hours ago, no probe and an old log: stale evidence."""
    result = check(evidence(log_tables=logs(timers=steady_steps(125)), synced_at=at(120)))
    assert result.status is GateStatus.ERROR
    assert "stale evidence" in result.summary
    assert_quoted(result)


def test_succeeded_job_passes_as_completed() -> None:
    """A succeeded controller state whose log stopped before it is a completed job."""
    result = check(
        evidence(log_tables=logs(timers=steady_steps(5)), probes=controller_probe("succeeded"))
    )
    assert result.status is GateStatus.PASS
    assert "job completed" in result.summary


def test_failed_job_with_controller_and_log_errors_fails_hard() -> None:
    """A failed job whose controller error and log traceback agree is an established failure."""
    errors = [
        {
            "kind": "cuda_oom",
            "text": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.63 GiB",
            "source": "finelog.log",
            "line": 777,
            "timestamp": at(6),
            "attempt": 0,
        }
    ]
    tables = logs(timers=steady_steps(7), errors=errors)
    probe = controller_probe("failed", error="Exit code: 3. stderr: torch.OutOfMemoryError")
    result = check(evidence(log_tables=tables, probes=probe))
    assert result.status is GateStatus.FAIL
    assert result.hard_failure
    assert any(q.line == 777 for q in result.evidence)


def test_run_past_max_steps_is_complete() -> None:
    """A resumed run whose global step passed max_steps is complete even if it then failed."""
    progress = [
        {
            "kind": "training_step",
            "done": 22,
            "total": 20,
            "source": "finelog.log",
            "line": 5000,
            "timestamp": at(50),
            "attempt": 1,
        }
    ]
    tables = logs(timers=steady_steps(50), progress=progress)
    result = check(evidence(log_tables=tables, probes=controller_probe("failed")))
    assert result.status is GateStatus.PASS
    assert "run complete" in result.summary


def test_actor_death_after_last_advancement_fails_hard() -> None:
    """An ActorDiedError logged after the trainer went quiet beyond cadence is death."""
    errors = [
        {
            "kind": "actor_died",
            "text": "ray.exceptions.ActorDiedError: The actor died unexpectedly",
            "source": "finelog.log",
            "line": 1500,
            "timestamp": at(25),
            "attempt": 0,
        }
    ]
    tables = logs(timers=steady_steps(30), errors=errors)
    result = check(evidence(log_tables=tables, probes=controller_probe()))
    assert result.status is GateStatus.FAIL
    assert result.hard_failure
    assert any(q.line == 1500 for q in result.evidence)


def test_lone_watchdog_line_is_not_proof() -> None:
    """One NCCL watchdog line without a following death stays ERROR, not FAIL."""
    errors = [
        {
            "kind": "nccl_watchdog_timeout",
            "text": "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9) ran for 6e5",
            "source": "finelog.log",
            "line": 1400,
            "timestamp": at(20),
            "attempt": 0,
        }
    ]
    tables = logs(timers=steady_steps(30), errors=errors)
    result = check(evidence(log_tables=tables, probes=controller_probe()))
    assert result.status is GateStatus.ERROR
    assert STACKS_NEEDED in result.missing


# --- issue 8: proofs, time, blind spots ----------------------------------------------------------


def wedged_rows() -> list[dict[str, Any]]:
    rows = [*steady_steps(30), timer("started", "policy_train", 29, 900, step=9)]
    return rows + [
        timer("finished", "policy_train", 40 - i, 200 + i, seconds=20.0) for i in range(3)
    ]


def test_a_proven_stall_carries_its_proof() -> None:
    """The stall FAIL proposes a `stall_stacks` proof dated by its newer dump, quoting both."""
    probe = controller_probe(stacks=wedged_dumps())
    result = check(evidence(log_tables=logs(timers=wedged_rows()), probes=probe))
    assert result.proof is not None and result.proof.rule == "stall_stacks"
    assert result.proof.established_at == NOW - timedelta(seconds=20)
    assert sum(q.source.startswith("probes/stacks/") for q in result.proof.evidence) == 2


def test_dumps_before_the_newest_progress_do_not_prove_a_stall() -> None:
    """A trial finished after both dumps: they predate the newest progress, so they are stale
    and the stall is not proven (ERROR saying why)."""
    trial = {"trial_name": "t", "status": "finished", "finished_at": NOW - timedelta(seconds=10),
             "source": "trace_jobs/t/result.json"}  # fmt: skip
    probe = controller_probe(stacks=wedged_dumps())
    ev = evidence(log_tables=logs(timers=wedged_rows()), probes=probe, trial_tables=trials([trial]))
    result = check(ev)
    assert result.status is GateStatus.ERROR
    assert "stale (dump taken" in result.summary and "before the newest progress" in result.summary


def test_a_trainer_line_dated_after_now_is_error() -> None:
    """A timer row an hour after `now` is no fresh progress: liveness ERROR, quoting it."""
    rows = [*steady_steps(30), timer("finished", "step", -60, 999, seconds=60.0, step=99)]
    result = check(evidence(log_tables=logs(timers=rows), probes=controller_probe()))
    assert result.status is GateStatus.ERROR
    assert result.summary.startswith("evidence dated after now")
    assert result.evidence[0].line == 999


def test_a_failed_pyspy_probe_is_error_quoting_command_and_exit() -> None:
    """Quiet beyond the limit and a py-spy probe that failed: ERROR with the command."""
    command = ProbeCommand(
        argv=("iris", "task", "exec", "/ops/rl-job/0", "--", "py-spy", "dump", "--pid", "7"),
        exit_code=1,
        output="stacks/rl-job-0-pid7-1.txt",
    )
    probe = controller_probe(stacks=wedged_dumps(), commands=(command,))
    result = check(evidence(log_tables=logs(timers=wedged_rows()), probes=probe))
    assert result.status is GateStatus.ERROR
    assert "py-spy dump --pid 7` exited 1" in result.summary
    assert result.evidence[0].source == "probes/probes.json"


@pytest.mark.parametrize(
    ("role", "verdict"),
    [("native", Verdict.KILL), ("helper", Verdict.KILL), ("rank", Verdict.ERROR)],
)
def test_a_failed_dump_is_a_hole_only_for_a_process_the_proof_needs(
    role: str, verdict: Verdict
) -> None:
    """The rank parked in both dumps and a py-spy dump of pid 7 failed: recorded in
    processes.json as native or a helper it is noted (an evidence gap) and the KILL stands
    (decide's proof check agrees); recorded as a rank it is a hole, ERROR."""
    command = ProbeCommand(
        argv=("iris", "task", "exec", "/ops/rl-job/0", "--", "py-spy", "dump", "--pid", "7"),
        exit_code=1,
        output="failed/stacks/rl-job-0-pid7-1.txt",
    )
    record = ProcessRecord(target="rl-job-0", pid=7, args="/opt/bin/x", role=role, why="test")
    probe = controller_probe(stacks=wedged_dumps(), commands=(command,), processes=(record,))
    judged = evidence(log_tables=logs(timers=wedged_rows()), probes=probe)
    result = check(judged)
    report = judge(judged)
    assert report.verdict is verdict, report.reasoning
    if verdict is Verdict.KILL:
        assert result.status is GateStatus.FAIL and f"pid 7 ({role}): failed" in result.summary
        assert "gaps" in report.reasoning and "py-spy dump --pid 7` exited 1" in report.reasoning
    else:
        assert result.status is GateStatus.ERROR
        assert "py-spy dump --pid 7` exited 1" in result.summary


def test_unschedulable_is_terminal_not_initialising() -> None:
    """Unschedulable is one of the terminal states (one enum): a FAIL, not a waiting PASS."""
    result = check(evidence(log_tables=logs(timers=steady_steps(5)), probes=controller_probe(
        "unschedulable")))  # fmt: skip
    assert result.status is GateStatus.FAIL
    assert not result.hard_failure and not result.initializing


def test_a_failed_controller_probe_is_quoted_when_the_evidence_is_stale() -> None:
    """A stale manifest and a controller probe that timed out: ERROR quoting the command."""
    command = ProbeCommand(argv=("iris", "job", "summary", "/ops/rl-job", "--json"), exit_code=None)
    probe = ProbeEvidence(directory="probes", captured_at=NOW, commands=(command,))
    result = check(evidence(log_tables=logs(timers=steady_steps(125)), synced_at=at(120),
                            probes=probe))  # fmt: skip
    assert result.status is GateStatus.ERROR
    assert "the controller probe failed: `iris job summary /ops/rl-job --json` timed out" in (
        result.summary
    )
