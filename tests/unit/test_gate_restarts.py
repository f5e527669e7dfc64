"""The restarts gate (worker.gates.restarts)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.factories import NOW, at, evidence, logs
from worker.evidence.model import AttemptRecord, ControllerView, ProbeEvidence
from worker.gates.restarts import check, failure_signature

OOM = "Exit code: 3. stderr: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.63 GiB"
NCCL = "RuntimeError: NCCL error in: /opt/torch/c10d/ProcessGroupNCCL.cpp:1970, unhandled error"
MS = 1_000


def record(attempt: int, state: str, error: str | None = None, **extra: Any) -> AttemptRecord:
    """One attempt of task /ops/rl-job/0, ten minutes per attempt ending before NOW."""
    start = int(at(60 - 10 * attempt).timestamp() * MS)
    finished = None if state == "running" else start + 9 * 60 * MS
    return AttemptRecord(
        task_id="/ops/rl-job/0",
        attempt_id=attempt,
        state=state,
        exit_code=3 if state == "failed" else None,
        error=error,
        started_at_ms=start,
        finished_at_ms=finished,
        **extra,
    )


def probes(
    attempts: tuple[AttemptRecord, ...] | None, state: str = "running", **controller: Any
) -> ProbeEvidence:
    """Probe evidence with a controller view and (optionally) the attempt history."""
    view = ControllerView(job_id="/ops/rl-job", state=state, **controller)
    return ProbeEvidence(directory="probes", captured_at=NOW, controller=view, attempts=attempts)


def step_rows(attempt: int, steps: range, first_line: int) -> list[dict[str, Any]]:
    """`Finished: 'step'` timer rows of one attempt."""
    return [
        {
            "event": "finished",
            "phase": "step",
            "seconds": 60.0,
            "step": step,
            "source": "finelog.log",
            "line": first_line + i,
            "timestamp": at(30 - i),
            "attempt": attempt,
        }
        for i, step in enumerate(steps)
    ]


def test_iris_crash_loop_is_doomed() -> None:
    """Three failed attempts with the sample's OOM signature are a doomed crash loop."""
    attempts = tuple(record(i, "failed", OOM) for i in range(3))
    result = check(
        evidence(
            probes=probes(
                attempts, state="failed", failure_count=3, max_retries_failure=2, error=OOM
            )
        )
    )
    assert result.count == 3
    assert result.same_failure is True
    assert result.doomed and not result.recovered
    assert result.retries_left == 0
    assert result.signatures == ("OutOfMemoryError: CUDA out of memory. Tried to allocate <n> GiB",)
    assert "deterministic crash loop" in result.interpretation
    sources = {q.source for q in result.evidence}
    assert {"probes/attempts.json", "probes/controller.json"} <= sources
    assert all(
        q.timestamp is not None for q in result.evidence if q.source.endswith("attempts.json")
    )
    assert result.flip_signal


def test_preemption_then_recovered_past_checkpoint() -> None:
    """A preempted attempt followed by one that steps past its resumed checkpoint is benign."""
    attempts = (record(0, "preempted"), record(1, "running"))
    tables = logs(
        timers=step_rows(0, range(38, 43), 100) + step_rows(1, range(41, 47), 500),
        resumes=[
            {
                "kind": "resumed",
                "step": 40,
                "text": "Resuming from global_step: 40",
                "source": "finelog.log",
                "line": 480,
                "timestamp": at(25),
                "attempt": 1,
            }
        ],
    )
    result = check(evidence(log_tables=tables, probes=probes(attempts, preemption_count=1)))
    assert result.count == 1
    assert result.recovered and not result.doomed
    assert result.same_failure is False
    assert "recovered" in result.interpretation
    assert any(q.source == "finelog.log" and q.line == 480 for q in result.evidence)


def test_worker_failure_is_transient_and_not_doomed() -> None:
    """A worker_failed attempt is transient: one real failure cannot make a same-failure loop."""
    attempts = (
        record(0, "worker_failed", "worker lost"),
        record(1, "failed", OOM),
        record(2, "running"),
    )
    result = check(evidence(probes=probes(attempts, failure_count=2, max_retries_failure=3)))
    assert result.count == 2
    assert result.same_failure is False
    assert not result.doomed
    assert result.retries_left == 1


def test_different_signatures_are_not_the_same_failure() -> None:
    """Two failures with different exceptions are not a deterministic loop."""
    attempts = (record(0, "failed", OOM), record(1, "failed", NCCL), record(2, "running"))
    result = check(evidence(probes=probes(attempts, failure_count=2)))
    assert result.count == 2
    assert result.same_failure is False
    assert not result.doomed
    assert len(result.signatures) == 2
    assert result.retries_left is None
    assert "retry budget unknown" in result.interpretation


def test_same_failure_then_newest_attempt_passes_prior_peak_recovers() -> None:
    """After two identical crashes, an attempt that steps past every earlier peak has recovered."""
    attempts = (record(0, "failed", OOM), record(1, "failed", OOM), record(2, "running"))
    tables = logs(timers=step_rows(0, range(1, 10), 100) + step_rows(2, range(1, 12), 500))
    result = check(evidence(log_tables=tables, probes=probes(attempts, failure_count=2)))
    assert result.same_failure is True
    assert result.recovered and not result.doomed


def test_no_attempt_information_is_unknown() -> None:
    """Without an attempt history, counters or boundaries the count is unknown, not zero."""
    result = check(evidence(log_tables=logs(timers=step_rows(0, range(1, 5), 10))))
    assert result.count is None
    assert result.same_failure is None
    assert "attempt history was not captured" in result.interpretation
    assert not result.doomed


def test_controller_counters_without_history() -> None:
    """Only the controller's counters give a count but leave the signatures unknown."""
    view = ControllerView(job_id="/ops/rl-job", state="running", failure_count=2, error=OOM)
    result = check(evidence(probes=ProbeEvidence(directory="probes", controller=view)))
    assert result.count == 2
    assert result.same_failure is None
    assert "not captured" in result.interpretation
    assert result.evidence[0].source == "probes/controller.json"


def test_log_attempt_boundaries_with_one_traceback_are_doomed() -> None:
    """Attempts read from log boundaries, each ending on the same traceback, are doomed."""
    boundaries = [
        {
            "kind": "attempt_boundary",
            "text": "task=/ops/rl-job/0 | [iris setup] step 1/2",
            "source": "finelog.log",
            "line": 1 + 100 * i,
            "timestamp": at(40 - 10 * i),
            "attempt": i,
        }
        for i in range(3)
    ]
    errors = [
        {
            "kind": "traceback",
            "text": f"ValueError: bad shard index {7 + i} in /data/shard-{i}.parquet",
            "source": "finelog.log",
            "line": 50 + 100 * i,
            "timestamp": at(35 - 10 * i),
            "attempt": i,
        }
        for i in range(3)
    ]
    tables = logs(resumes=boundaries, errors=errors)
    result = check(evidence(log_tables=tables, state="failed"))
    assert result.count == 3
    assert result.same_failure is True and result.doomed
    assert result.signatures == ("ValueError: bad shard index <n> in <path>",)
    assert all(q.source == "finelog.log" and q.line for q in result.evidence)


@pytest.mark.parametrize(
    ("text", "signature"),
    [
        (OOM, "OutOfMemoryError: CUDA out of memory. Tried to allocate <n> GiB"),
        ("Exit code: 137", "exit code 137"),
        (
            "ray.exceptions.ActorDiedError: actor 0x7f3a died at 2026-07-30 21:00:01 on 10.0.0.4",
            "ActorDiedError: actor <hex> died at <time> on <ip>",
        ),
        (
            "Could not override 'trainer.policy.lr'. Key 'lr' is not in struct",
            "Could not override 'trainer.policy.lr'. Key 'lr' is not in struct",
        ),
        (None, None),
    ],
)
def test_failure_signature_normalises_volatile_parts(
    text: str | None, signature: str | None
) -> None:
    """Numbers, addresses, times and paths are replaced so repeated crashes compare equal."""
    assert failure_signature(text) == signature


@pytest.mark.parametrize(
    ("signature", "specific"),
    [
        ("exit code 1", False),
        ("exit code 137", False),
        ("FAILED", False),
        ("exit code 1; FAILED", False),
        ("Job failed with exit code 2", False),
        ("OOM Killed", False),
        ("OutOfMemoryError: CUDA out of memory. Tried to allocate <n> GiB", True),
        ("KeyError", True),
        ("StopIteration", True),  # an exception name alone says which failure it was
        ("Could not override '<path>'.", True),
        ("Segmentation fault in libnccl at <hex>", True),
        (None, False),
    ],
)
def test_is_specific_signature(signature: str | None, specific: bool) -> None:
    """Exit codes and bare states are no signature; an exception type or a word of message beyond
    them is (docs/domain.md#failure-signatures), judged by the log parser's predicate."""
    from worker.gates.restarts import is_specific_signature

    assert is_specific_signature(signature) is specific


@pytest.mark.parametrize("error", ["Exit code: 1", "FAILED", None])
def test_attempts_with_only_generic_errors_are_never_doomed(error: str | None) -> None:
    """Three failed attempts that share only a generic error (or an exit code) are no crash
    loop: same_failure is unknown, nothing is doomed, and the reason is named."""
    attempts = tuple(record(i, "failed", error) for i in range(3))
    result = check(evidence(probes=probes(attempts, state="failed", failure_count=3)))
    assert result.same_failure is None
    assert not result.doomed
    assert "no specific signature" in result.interpretation


def test_doomed_signature_is_the_repeated_one_first() -> None:
    """A transient worker failure before the loop does not become the loop's named signature."""
    attempts = (
        record(0, "worker_failed", "RuntimeError: node lost heartbeat to the controller"),
        *(record(i, "failed", OOM) for i in (1, 2, 3)),
    )
    result = check(evidence(probes=probes(attempts, state="failed")))
    assert result.doomed
    assert result.signatures[0].startswith("OutOfMemoryError")
