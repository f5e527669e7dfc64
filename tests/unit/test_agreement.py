"""Trainer–trial agreement is judged on the evidence (docs/domain.md#agreement), not on gate labels:
an agentic learning-quality KILL needs the trials finished over the trainer's window to show the
same collapse — their rewards, their turn counts, or an exception the trainer's own per-step
lines name — and trials healthy over that window are a disagreement (ERROR)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.models import GateName, GateResult, GateStatus, Handoff, Mode, Report, Verdict
from tests import factories as f
from tests.unit.test_verdict import RESTARTS_NONE, Q, gate, gates, learning
from worker.evidence.case import Evidence
from worker.gates.rollouts import agentic
from worker.gates.rollouts.agreement import trial_agreement
from worker.verdict import decide

STEPS = 30
"""The trainer logs one step a minute ending at NOW: steps 1–18 at 0.5, then 0.02 (collapsed)."""
WINDOW_OPENS = 11.0
"""Minutes before NOW at which step 20 (the one before the newest 10) was logged."""


def trainer_rewards(collapsed_from: int = 19) -> list[dict[str, Any]]:
    """The trainer's reward metric: 0.5 before `collapsed_from`, 0.02 from it on."""
    values = [0.5 if step < collapsed_from else 0.02 for step in range(1, STEPS + 1)]
    return f.metric_rows({"reward/avg_raw_reward": values})


def trial(minutes_ago: float, i: int, **fields: Any) -> dict[str, Any]:
    """A finished Harbor trial, finished `minutes_ago` before NOW."""
    name = f"fix-git__{i:07x}"
    return {
        "trial_name": name,
        "status": "finished",
        "reward": 0.5,
        "n_turns": 6,
        "finished_at": f.at(minutes_ago),
        "format": "harbor",
        "source": f"trace_jobs/{name}/result.json",
    } | fields


def history(n: int = 30) -> list[dict[str, Any]]:
    """Trials before the trainer's window, alternating rewards 1 and 0 (mean 0.5)."""
    return [trial(29.5 - 0.5 * i, i, reward=float(i % 2)) for i in range(n)]


def window(n: int = 20, **fields: Any) -> list[dict[str, Any]]:
    """Trials finished over the trainer's newest 10 steps, with the given fields."""
    return [trial(WINDOW_OPENS - 0.5 - 0.5 * i, 100 + i, **fields) for i in range(n)]


def batches(exceptions: dict[str, int], successful: int = 3) -> list[dict[str, Any]]:
    """The trainer's batch lines over its newest 10 steps, naming `exceptions`."""
    return [
        {
            "step": step,
            "successful": successful,
            "total": 32,
            "failed": 32 - successful,
            "masked": 0,
            "exceptions": json.dumps(exceptions),
            "source": "finelog.log",
            "line": 5000 + step,
            "timestamp": f.at(STEPS - step + 1),
            "attempt": 0,
        }
        for step in range(21, STEPS + 1)
    ]


def evidence(
    trials: list[dict[str, Any]], batch_lines: list[dict[str, Any]] | None = None
) -> Evidence:
    """Agentic evidence: the collapsing trainer reward, its batch lines, these trials."""
    tables = f.logs(metrics=trainer_rewards(), batches=batch_lines or [])
    return f.evidence(mode=Mode.AGENTIC, log_tables=tables, trial_tables=f.trials(trials))


def judge(
    ev: Evidence, rollouts: GateResult | None = None, kind: str = "reward_collapse"
) -> Report:
    """The verdict with the dynamics gate failing on `kind` and the given rollouts gate."""
    return decide(ev, RESTARTS_NONE, gates(dynamics=learning(kind), rollouts=rollouts or gate()))


# --- the trials' rewards --------------------------------------------------------------------------


def test_trials_collapsing_without_any_exception_agree() -> None:
    """Every trial over the trainer's window scored 0 while none raised and the rollouts gate
    passed: the trials show the trainer's collapse, so the learning-quality KILL stands and its
    proof quotes a trial."""
    report = judge(evidence(history() + window(reward=0.0)))
    assert report.verdict is Verdict.KILL, report.reasoning
    assert "The trials agree over the same window" in report.reasoning
    assert "all scored zero or no reward" in report.reasoning
    assert report.kill_proof is not None
    assert any(q.source.startswith("trace_jobs/") for q in report.kill_proof.evidence)


@pytest.mark.parametrize(
    ("reward", "verdict"),
    [(0.09, Verdict.KILL), (0.11, Verdict.ERROR)],
    ids=["mean-0.09-under-the-line", "mean-0.11-over-the-line"],
)
def test_trial_reward_window_against_collapse_ratio(reward: float, verdict: Verdict) -> None:
    """COLLAPSE_RATIO (0.2) on the trial side: the window's mean reward 0.09 under 0.2 × the
    best trial window's 0.5 agrees with the trainer; 0.11 does not (ERROR)."""
    report = judge(evidence(history() + window(reward=reward)))
    assert report.verdict is verdict, report.reasoning


def test_trials_healthy_over_the_window_disagree() -> None:
    """Trials earning as before over the trainer's window while the trainer collapses: the
    sources disagree, ERROR, saying what the trials show."""
    report = judge(evidence(history() + window(reward=1.0)))
    assert report.verdict is Verdict.ERROR
    assert "do not show it" in report.reasoning
    assert report.kill_proof is None


def test_too_few_trials_over_the_window_disagree() -> None:
    """Nine trials over the window (fewer than MIN_WINDOW_STEPS) are too few to agree: ERROR."""
    report = judge(evidence(history() + window(9, reward=0.0)))
    assert report.verdict is Verdict.ERROR
    assert "too few to agree" in report.reasoning


def test_the_window_is_the_trainers() -> None:
    """Zero-reward trials from before the trainer's window (history) while the window's trials
    earn as before do not agree: the trials must show it over the same window."""
    old_zeros = [trial(29.5 - 0.5 * i, i, reward=0.0) for i in range(30)]
    side = trial_agreement(evidence(old_zeros + window(reward=1.0)), "reward_collapse")
    assert not side.agrees
    side = trial_agreement(evidence(history() + window(reward=0.0)), "reward_collapse")
    assert side.agrees and "since 2026-07-30T21:04Z" in side.sign


# --- the trials' turn counts ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("turns", "agrees"), [(1, True), (2, False)], ids=["median-1-turn", "median-2-turns"]
)
def test_turn_counts_collapsing_agree(turns: int, agrees: bool) -> None:
    """ONE_TURN_MEDIAN (1.5) on the window's trials: a median of 1 turn (a dead engine or a broken
    loop earns nothing) agrees with the trainer's reward collapse, even with rewards that did not
    fall; a median of 2 does not."""
    side = trial_agreement(
        evidence(history() + window(reward=0.4, n_turns=turns)), "reward_collapse"
    )
    assert side.agrees is agrees, side.sign
    if agrees:
        assert "median 1 turns" in side.sign


# --- an exception the trainer names -------------------------------------------------------------


def sandbox_window(healthy: int = 3, failing: int = 17) -> list[dict[str, Any]]:
    """Trials over the window: most refused by the sandbox provider, a few earning 1.0 (so the
    window's mean reward, 0.15, stays over the collapse line)."""
    refused = window(failing, reward=None, exception_type="DaytonaValidationError",
                     exception_message="Total disk limit exceeded", n_turns=0)  # fmt: skip
    earned = [trial(0.25 + 0.1 * i, 500 + i, reward=1.0) for i in range(healthy)]
    return refused + earned


SANDBOX_GATE = GateResult(
    status=GateStatus.FAIL,
    summary="17/50 finished trials failed with sandbox errors",
    evidence=(Q,),
    kind="systemic_sandbox",
    mechanism="reward signal invalid: the sandbox provider refuses sandboxes",
    handoff=Handoff(
        likely_cause="the sandbox provider refuses sandboxes",
        component="the sandbox provider's organisation quota; owner: the environment",
        proposed_behavior="raise the quota",
        test="create one sandbox",
    ),
)


@pytest.mark.parametrize(
    ("named", "verdict"),
    [("DaytonaValidationError", Verdict.KILL), ("AgentTimeoutError", Verdict.ERROR)],
    ids=["the-trainer-names-it", "the-trainer-names-another"],
)
def test_an_exception_the_trainer_names_is_one_mechanism(named: str, verdict: Verdict) -> None:
    """17 of 20 trials over the window fail with DaytonaValidationError and the trainer's batch
    lines name it: one mechanism seen from both sides, though the rollouts gate's label
    (systemic_sandbox) differs from the trainer's (reward_collapse) — KILL with the environment's
    handoff. Batch lines naming another exception are no agreement: ERROR."""
    ev = evidence(history() + sandbox_window(), batches({named: 29}))
    report = judge(ev, rollouts=SANDBOX_GATE)
    assert report.verdict is verdict, report.reasoning
    if verdict is Verdict.KILL:
        assert "trainer's own per-step lines name" in report.reasoning
        assert report.handoff is not None and "owner: the environment" in report.handoff.component
        assert report.kill_proof is not None
        assert any("Exception breakdown" in q.text for q in report.kill_proof.evidence)


def test_exceptions_on_too_small_a_share_are_no_agreement() -> None:
    """Failing trials must exceed 1 - COLLAPSE_RATIO (80%) of the window to pull its mean under
    the line: 15 of 20 (75%) named by the trainer do not agree."""
    side = trial_agreement(
        evidence(
            history() + sandbox_window(healthy=5, failing=15),
            batches({"DaytonaValidationError": 29}),
        ),
        "reward_collapse",
    )
    assert not side.agrees


# --- what has no trial-side counterpart -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["entropy_collapse", "off_policy"])
def test_mechanisms_a_trial_cannot_show_stay_unconfirmed(kind: str) -> None:
    """An entropy or TIS collapse is not shown by trial results: even with the trials' rewards at
    zero over the window it is ERROR unless the rollouts gate fails on the same kind."""
    report = judge(evidence(history() + window(reward=0.0)), kind=kind)
    assert report.verdict is Verdict.ERROR
    assert "cannot show" in report.reasoning


def test_equal_labels_keep_agreeing() -> None:
    """The rollouts gate failing on the trainer's own kind agrees without looking further."""
    report = judge(evidence([]), rollouts=learning())
    assert report.verdict is Verdict.KILL
    assert "same mechanism (reward_collapse)" in report.reasoning


# --- the rollouts gate: zero trials against a collapsed trainer -----------------------------------


@pytest.mark.parametrize(
    ("collapsed_from", "status"),
    [(19, GateStatus.FAIL), (STEPS + 1, GateStatus.ERROR)],
    ids=["trainer-collapsed", "trainer-healthy"],
)
def test_zero_trials_against_a_collapsed_trainer_reward_agree(
    collapsed_from: int, status: GateStatus
) -> None:
    """Every trial at zero while the trainer's reward collapsed under COLLAPSE_RATIO of its best
    window is consistent (FAIL, zero reward, the trainer's collapse named); against a healthy
    trainer reward it stays a disagreement (ERROR)."""
    tables = f.logs(metrics=trainer_rewards(collapsed_from))
    trials = f.trials(window(reward=0.0))
    result = agentic.check(f.evidence(mode=Mode.AGENTIC, log_tables=tables, trial_tables=trials))
    assert result.status is status, result.summary
    if status is GateStatus.FAIL:
        assert "collapsed too" in result.summary
        assert result.kind == "zero_reward"


def test_the_report_names_the_gate_of_the_disagreement() -> None:
    """A disagreement's reasoning quotes both gates' summaries."""
    report = judge(evidence(history() + window(reward=1.0)))
    assert report.gates[GateName.ROLLOUTS].status is GateStatus.PASS
    assert "rollouts:" in report.reasoning and "dynamics:" in report.reasoning
