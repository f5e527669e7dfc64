"""The verdict rules join gate results in the precedence order of docs/domain.md#precedence; every
KILL carries a proof that `decide` checks, and blind spots are ERROR."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from shared.models import (
    Confidence,
    GateName,
    GateResult,
    GateStatus,
    Handoff,
    KillProof,
    Mode,
    Quote,
    Report,
    RestartsResult,
    Verdict,
)
from tests import factories as f
from worker.evidence.model import ProbeCommand, ProbeEvidence
from worker.verdict import decide

Q = Quote(
    source="finelog.log",
    line=12,
    timestamp=f.at(5),
    text="torch.OutOfMemoryError: CUDA out of memory",
)


def proof(rule: str = "non_finite", **changes: Any) -> KillProof:
    """A proof of `rule` established five minutes before NOW, quoting Q."""
    base: dict[str, Any] = {
        "rule": rule,
        "mechanism": "the training math diverged",
        "established_at": f.at(5),
        "evidence": (Q,),
    }
    return KillProof(**(base | changes))


def gate(status: str = "PASS", **extra: Any) -> GateResult:
    evidence = (Q,) if status in ("FAIL", "ERROR") else ()
    return GateResult(
        status=GateStatus(status), summary=f"{status.lower()} summary", evidence=evidence, **extra
    )


def hard(rule: str = "non_finite", **changes: Any) -> GateResult:
    """A hard FAIL proposing a proof of `rule`."""
    return gate("FAIL", hard_failure=True, mechanism="diverged", proof=proof(rule, **changes))


def learning(kind: str = "reward_collapse", **extra: Any) -> GateResult:
    """A learning-quality FAIL with a named mechanism and its proof."""
    return gate(
        "FAIL",
        learning_quality=True,
        mechanism="reward collapse after step 41",
        kind=kind,
        proof=proof("reward_collapse", mechanism="reward collapse"),
        **extra,
    )


def gates(**overrides: GateResult) -> dict[GateName, GateResult]:
    base = {name: gate() for name in GateName}
    base[GateName.DUTY_CYCLE] = gate("N/A")
    return base | {GateName(k): v for k, v in overrides.items()}


RESTARTS_NONE = RestartsResult(count=0, same_failure=None, interpretation="no restarts")
ATTEMPT = Quote(
    source="probes/attempts.json", timestamp=f.at(30), text="/ops/rl-job/0:2 state=failed"
)
DOOMED = RestartsResult(
    count=3,
    same_failure=True,
    interpretation="same CUDA OOM on all 3 attempts",
    evidence=(ATTEMPT,),
    doomed=True,
    signatures=("OutOfMemoryError: CUDA out of memory. Tried to allocate <n> GiB",),
    flip_signal="a fourth attempt that passes step 1",
)


def test_all_pass_is_no_kill_with_high_confidence() -> None:
    """Every gate passing gives NO-KILL, high confidence, no kill proof, the liveness flip."""
    flip = "no `Finished: 'step'` in finelog.log by 2026-07-30T21:40Z"
    report = decide(f.evidence(), RESTARTS_NONE, gates(liveness=gate(flip_signal=flip)))
    assert report.verdict is Verdict.NO_KILL
    assert report.confidence is Confidence.HIGH
    assert report.flip_signal == flip
    assert report.kill_proof is None


def test_doomed_crash_loop_kills_with_its_proof_even_with_evidence_gaps() -> None:
    """A doomed crash loop is KILL carrying a crash_loop proof even when other gates lack
    evidence; the gaps lower confidence."""
    report = decide(f.evidence(), DOOMED, gates(resources=gate("ERROR", missing=("engine stats",))))
    assert report.verdict is Verdict.KILL
    assert report.confidence is Confidence.MEDIUM
    assert "Evidence gaps" in report.reasoning
    assert "resources: error summary" in report.reasoning
    assert report.flip_signal == "a fourth attempt that passes step 1"
    assert report.kill_proof is not None and report.kill_proof.rule == "crash_loop"
    assert report.kill_proof.evidence == (ATTEMPT,)


def test_generic_signature_crash_loop_proof_is_refused() -> None:
    """A doomed result whose only signature is `exit code 1` is no crash loop: the proof is
    refused with the reason, and the other gates decide (NO-KILL here)."""
    generic = DOOMED.model_copy(update={"signatures": ("exit code 1",)})
    report = decide(f.evidence(), generic, gates())
    assert report.verdict is Verdict.NO_KILL
    assert "exit code 1" in report.reasoning and "no specific signature" in report.reasoning
    assert any("restarts proof refused" in d for d in report.discrepancies)
    assert not report.restarts.doomed


def test_hard_gate_failure_kills_with_high_confidence_when_nothing_is_missing() -> None:
    """A hard FAIL with a valid proof gives KILL, high confidence, and the proof in the report."""
    report = decide(f.evidence(), RESTARTS_NONE, gates(dynamics=hard()))
    assert report.verdict is Verdict.KILL
    assert report.confidence is Confidence.HIGH
    assert report.kill_proof == proof()
    assert "rule `non_finite`" in report.reasoning
    body = report.contract_dict()
    assert body["kill_proof"]["rule"] == "non_finite"
    assert body["kill_proof"]["established_at"] == "2026-07-30T21:10:00Z"


def test_proof_dated_after_now_is_refused_and_the_gate_becomes_error() -> None:
    """A proof established after `now` is not proof: its gate becomes ERROR, the verdict ERROR."""
    late = hard(established_at=f.NOW + timedelta(hours=1))
    report = decide(f.evidence(), RESTARTS_NONE, gates(dynamics=late))
    assert report.verdict is Verdict.ERROR
    assert report.gates[GateName.DYNAMICS].status is GateStatus.ERROR
    assert "not established" in report.gates[GateName.DYNAMICS].summary
    assert "established after now" in report.reasoning
    assert report.kill_proof is None


def test_proof_quoting_evidence_after_now_is_refused() -> None:
    """A proof whose quote is dated after `now` is refused, whatever its rule."""
    future = Q.model_copy(update={"timestamp": f.NOW + timedelta(minutes=30)})
    report = decide(f.evidence(), RESTARTS_NONE, gates(dynamics=hard(evidence=(future,))))
    assert report.verdict is Verdict.ERROR
    assert "dated after now" in report.reasoning


def test_unknown_proof_rule_is_refused() -> None:
    """A proof naming a rule the verdict does not know is refused."""
    report = decide(f.evidence(), RESTARTS_NONE, gates(dynamics=hard("gut_feeling")))
    assert report.verdict is Verdict.ERROR
    assert "unknown proof rule 'gut_feeling'" in report.reasoning


def test_stall_proof_with_dumps_before_the_newest_progress_is_refused() -> None:
    """A stall proof whose dumps predate the newest logged step is refused: ERROR, with why."""
    dumps = tuple(
        Quote(source=f"probes/stacks/rl-job-0-pid7-{n}.txt", timestamp=f.at(20 - n), text="x")
        for n in (1, 2)
    )
    step = {
        "event": "finished",
        "phase": "step",
        "seconds": 60.0,
        "step": 9,
        "source": "finelog.log",
        "line": 900,
        "timestamp": f.at(2),
        "attempt": 0,
    }
    ev = f.evidence(log_tables=f.logs(timers=[step]))
    stall = hard("stall_stacks", evidence=dumps, established_at=f.at(18))
    report = decide(ev, RESTARTS_NONE, gates(liveness=stall))
    assert report.verdict is Verdict.ERROR
    assert "at or before the newest progress" in report.reasoning


def test_missing_evidence_is_error_not_conservative_no_kill() -> None:
    """A core gate without evidence makes the verdict ERROR when no hard failure is established."""
    missing = gate("ERROR", missing=("py-spy stacks captured while the job exists",))
    report = decide(f.evidence(), RESTARTS_NONE, gates(liveness=missing))
    assert report.verdict is Verdict.ERROR
    assert "py-spy stacks" in report.next_action


def test_non_load_bearing_gaps_lower_confidence() -> None:
    """A PASS with a gap (a failed probe that was not needed) stays NO-KILL at medium."""
    probes = ProbeEvidence(
        directory="probes",
        captured_at=f.at(1),
        commands=(ProbeCommand(argv=("nvidia-smi", "-q"), exit_code=9, output="gpus/p.csv"),),
    )
    report = decide(f.evidence(probes=probes), RESTARTS_NONE, gates())
    assert report.verdict is Verdict.NO_KILL
    assert report.confidence is Confidence.MEDIUM
    assert "`nvidia-smi -q` exited 9" in report.reasoning


def test_identity_disagreement_is_error_even_over_a_kill() -> None:
    """A manifest naming another job than its directory is ERROR: a proof of the wrong job."""
    ev = f.evidence(job_name="some-other-job", job_id="/ops/some-other-job")
    report = decide(ev, RESTARTS_NONE, gates(dynamics=hard()))
    assert report.verdict is Verdict.ERROR
    assert "sources disagree" in report.reasoning
    assert report.kill_proof is None


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
    """A learning-quality FAIL without a named mechanism or proof is not a KILL."""
    report = decide(
        f.evidence(), RESTARTS_NONE, gates(dynamics=gate("FAIL", learning_quality=True))
    )
    assert report.verdict is Verdict.ERROR


def test_learning_quality_kill_in_standard_mode() -> None:
    """A named, proven learning-quality failure kills a standard run, medium confidence."""
    report = decide(f.evidence(), RESTARTS_NONE, gates(dynamics=learning()))
    assert report.verdict is Verdict.KILL
    assert report.confidence is Confidence.MEDIUM
    assert report.kill_proof is not None and report.kill_proof.rule == "reward_collapse"


def test_learning_quality_without_trial_agreement_is_error_in_agentic_mode() -> None:
    """In agentic runs the trainer's collapse must agree with the trials, or sources disagree."""
    report = decide(f.evidence(mode=Mode.AGENTIC), RESTARTS_NONE, gates(dynamics=learning()))
    assert report.verdict is Verdict.ERROR
    assert "disagree" in report.reasoning


def test_agentic_agreement_compares_mechanisms_not_statuses() -> None:
    """A failing rollouts gate on another mechanism (sandbox churn) is no agreement: ERROR."""
    other = gate("FAIL", mechanism="systemic sandbox failure", kind="systemic_sandbox")
    report = decide(
        f.evidence(mode=Mode.AGENTIC), RESTARTS_NONE, gates(dynamics=learning(), rollouts=other)
    )
    assert report.verdict is Verdict.ERROR
    assert "same mechanism" in report.reasoning


def test_agentic_learning_quality_kill_with_trials_on_the_same_mechanism() -> None:
    """Trainer and trials collapsing on the same mechanism make an agentic learning KILL."""
    trials = learning()
    report = decide(
        f.evidence(mode=Mode.AGENTIC), RESTARTS_NONE, gates(dynamics=learning(), rollouts=trials)
    )
    assert report.verdict is Verdict.KILL


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
    """The JSON report carries every key docs/interface.md lists, gates keyed by name."""
    body = decide(f.evidence(), RESTARTS_NONE, gates()).contract_dict()
    for key in (
        "job_id", "event_id", "captured_at", "evidence_dir", "verdict", "confidence", "mode",
        "restarts", "gates", "reasoning", "next_action", "flip_signal", "handoff", "discrepancies",
        "kill_proof",
    ):  # fmt: skip
        assert key in body
    assert set(body["gates"]) == {"liveness", "resources", "rollouts", "dynamics", "duty_cycle"}
    assert body["gates"]["duty_cycle"]["status"] == "N/A"
    assert body["captured_at"] == "2026-07-30T21:15:00Z"
    assert body["kill_proof"] is None


def test_report_cannot_kill_without_a_proof() -> None:
    """A KILL report without `kill_proof` (or a NO-KILL with one) does not validate."""
    report = decide(f.evidence(), RESTARTS_NONE, gates())
    with pytest.raises(ValidationError, match="kill_proof"):
        Report.model_validate(report.model_dump() | {"verdict": Verdict.KILL})
    with pytest.raises(ValidationError, match="kill_proof"):
        Report.model_validate(report.model_dump() | {"kill_proof": proof()})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"status": GateStatus.PASS, "hard_failure": True}, "PASS cannot carry a hard failure"),
        ({"status": GateStatus.PASS, "missing": ("reward series",)}, "PASS cannot miss"),
        ({"status": GateStatus.FAIL, "hard_failure": True}, "a FAIL with a proof"),
        ({"status": GateStatus.ERROR, "hard_failure": True, "proof": proof()}, "a FAIL"),
        ({"status": GateStatus.PASS, "proof": proof()}, "only a FAIL carries a proof"),
    ],
)
def test_gate_result_cannot_express_an_incoherent_verdict(
    fields: dict[str, Any], message: str
) -> None:
    """A PASS with a hard failure or missing inputs, or a hard failure without a proof, is
    refused by the model."""
    with pytest.raises(ValidationError, match=message):
        GateResult(summary="s", **fields)
