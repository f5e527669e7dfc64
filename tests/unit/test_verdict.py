"""The verdict rules join gate results in the precedence order of DOMAIN.md section 6."""

from __future__ import annotations

from typing import Any

import pytest

from shared.models import (
    Confidence,
    GateName,
    GateResult,
    GateStatus,
    Handoff,
    Mode,
    Quote,
    RestartsResult,
    Verdict,
)
from tests import factories as f
from worker.verdict import decide

Q = Quote(source="finelog.log", line=12, text="torch.OutOfMemoryError: CUDA out of memory")


def gate(status: str = "PASS", **extra: Any) -> GateResult:
    evidence = (Q,) if status in ("FAIL", "ERROR") else ()
    return GateResult(
        status=GateStatus(status), summary=f"{status.lower()} summary", evidence=evidence, **extra
    )


def gates(**overrides: GateResult) -> dict[GateName, GateResult]:
    base = {name: gate() for name in GateName}
    base[GateName.DUTY_CYCLE] = gate("N/A")
    return base | {GateName(k): v for k, v in overrides.items()}


RESTARTS_NONE = RestartsResult(count=0, same_failure=None, interpretation="no restarts")
DOOMED = RestartsResult(
    count=3,
    same_failure=True,
    interpretation="same CUDA OOM on all 3 attempts",
    evidence=(Q,),
    doomed=True,
    flip_signal="a fourth attempt that passes step 1",
)


def test_all_pass_is_no_kill_with_high_confidence() -> None:
    """Every gate passing gives NO-KILL, high confidence, and the liveness flip signal."""
    flip = "no `Finished: 'step'` in finelog.log by 2026-07-30T21:40Z"
    report = decide(f.evidence(), RESTARTS_NONE, gates(liveness=gate(flip_signal=flip)))
    assert report.verdict is Verdict.NO_KILL
    assert report.confidence is Confidence.HIGH
    assert report.flip_signal == flip


def test_hard_failure_kills_even_with_evidence_gaps() -> None:
    """A doomed crash loop is KILL even when other gates lack evidence; gaps lower confidence."""
    report = decide(f.evidence(), DOOMED, gates(resources=gate("ERROR", missing=("engine stats",))))
    assert report.verdict is Verdict.KILL
    assert report.confidence is Confidence.MEDIUM
    assert "Evidence gaps" in report.reasoning
    assert "resources: error summary" in report.reasoning
    assert report.flip_signal == "a fourth attempt that passes step 1"


def test_hard_gate_failure_kills_with_high_confidence_when_nothing_is_missing() -> None:
    """A stall proven by stacks (a hard liveness FAIL) gives KILL, high confidence."""
    stall = gate("FAIL", hard_failure=True, mechanism="every policy rank parked in all_reduce")
    report = decide(f.evidence(), RESTARTS_NONE, gates(liveness=stall))
    assert report.verdict is Verdict.KILL
    assert report.confidence is Confidence.HIGH
    assert "all_reduce" in report.reasoning


def test_missing_evidence_is_error_not_conservative_no_kill() -> None:
    """A core gate without evidence makes the verdict ERROR when no hard failure is established."""
    missing = gate("ERROR", missing=("py-spy stacks captured while the job exists",))
    report = decide(f.evidence(), RESTARTS_NONE, gates(liveness=missing))
    assert report.verdict is Verdict.ERROR
    assert "py-spy stacks" in report.next_action


def test_undeclared_mode_duty_cycle_error_counts() -> None:
    """With an undeclared mode the mode-specific gates' ERROR makes the verdict ERROR."""
    undeclared = gate("ERROR", missing=("declared mode",))
    report = decide(
        f.evidence(mode=Mode.UNDECLARED),
        RESTARTS_NONE,
        gates(rollouts=undeclared, duty_cycle=undeclared),
    )
    assert report.verdict is Verdict.ERROR
    assert report.mode is Mode.UNDECLARED


def test_learning_quality_kill_needs_a_mechanism() -> None:
    """A learning-quality FAIL without a named mechanism is not a KILL."""
    report = decide(
        f.evidence(), RESTARTS_NONE, gates(dynamics=gate("FAIL", learning_quality=True))
    )
    assert report.verdict is Verdict.ERROR


def test_learning_quality_kill_in_standard_mode() -> None:
    """A named learning-quality failure over the window kills a standard run, medium confidence."""
    collapse = gate("FAIL", learning_quality=True, mechanism="reward collapse after step 41")
    report = decide(f.evidence(), RESTARTS_NONE, gates(dynamics=collapse))
    assert report.verdict is Verdict.KILL
    assert report.confidence is Confidence.MEDIUM


def test_learning_quality_without_trial_agreement_is_error_in_agentic_mode() -> None:
    """In agentic runs the trainer's collapse must agree with the trials, or sources disagree."""
    collapse = gate("FAIL", learning_quality=True, mechanism="reward collapse after step 41")
    report = decide(f.evidence(mode=Mode.AGENTIC), RESTARTS_NONE, gates(dynamics=collapse))
    assert report.verdict is Verdict.ERROR
    assert "disagree" in report.reasoning


def test_soft_failure_is_no_kill_with_handoff() -> None:
    """An inefficiency (sandbox churn) is NO-KILL with the gate's handoff and flip signal."""
    handoff = Handoff(
        likely_cause="sandbox create per trial",
        component="harbor environment pool",
        proposed_behavior="reuse sandboxes",
        test="env setup p90 under 10 s",
    )
    churn = gate("FAIL", mechanism="sandbox churn", handoff=handoff, flip_signal="setup p90 < 10 s")
    report = decide(f.evidence(mode=Mode.AGENTIC), RESTARTS_NONE, gates(duty_cycle=churn))
    assert report.verdict is Verdict.NO_KILL
    assert report.handoff == handoff
    assert report.flip_signal == "setup p90 < 10 s"


def test_initializing_job_is_no_kill_with_low_confidence() -> None:
    """A job inside its initialization grace: NO-KILL, low confidence, the first-step deadline."""
    flip = "no `Finished: 'step'` by 2026-07-30T21:50Z"
    init = gate(initializing=True, flip_signal=flip)
    report = decide(
        f.evidence(), RESTARTS_NONE, gates(liveness=init, dynamics=gate(initializing=True))
    )
    assert report.verdict is Verdict.NO_KILL
    assert report.confidence is Confidence.LOW
    assert report.flip_signal == flip


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bucket/tmp/ttl=14d/job/trace_jobs", "14 days"),
        ("s3://bucket/tmp/ttl=36h/job/trace_jobs", "1.5 days"),
    ],
)
def test_retention_consequence_is_surfaced_without_changing_a_kill(uri: str, expected: str) -> None:
    """The ttl= segment of trials_uri is read and its consequence named; a KILL stays a KILL."""
    report = decide(f.evidence(trials_uri=uri), DOOMED, gates())
    assert report.verdict is Verdict.KILL
    assert expected in report.reasoning
    assert "Retention" in report.reasoning


def test_report_json_has_the_contract_keys() -> None:
    """The JSON report carries every key CONTRACT.md lists, gates keyed by name."""
    body = decide(f.evidence(), RESTARTS_NONE, gates()).contract_dict()
    for key in (
        "job_id", "event_id", "captured_at", "evidence_dir", "verdict", "confidence", "mode",
        "restarts", "gates", "reasoning", "next_action", "flip_signal", "handoff", "discrepancies",
    ):  # fmt: skip
        assert key in body
    assert set(body["gates"]) == {"liveness", "resources", "rollouts", "dynamics", "duty_cycle"}
    assert body["gates"]["duty_cycle"]["status"] == "N/A"
    assert body["captured_at"] == "2026-07-30T21:15:00Z"
