"""The duty-cycle gate: where agentic trial time goes, and whether sandboxes churn."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import polars as pl
import pytest

from shared.models import GateResult, GateStatus, Mode
from tests import factories as f
from worker.gates import duty_cycle

ATTEMPT_START_MIN = 120  # the newest attempt began two hours before NOW


def timed_trial(
    i: int, started_min_ago: float, setup_s: float, execution_s: float
) -> dict[str, Any]:
    """A finished Harbor trial with phase timings; llm takes half of agent execution."""
    wall = setup_s + 5.0 + execution_s + 10.0
    started = f.at(started_min_ago)
    return {
        "trial_name": f"t{i:03d}",
        "status": "finished",
        "reward": 1.0,
        "n_turns": 12,
        "environment_setup_s": setup_s,
        "agent_setup_s": 5.0,
        "agent_execution_s": execution_s,
        "verifier_s": 10.0,
        "llm_request_s": execution_s / 2,
        "started_at": started,
        "finished_at": started + timedelta(seconds=wall),
        "format": "harbor",
        "source": f"trace_jobs/job/t{i:03d}/result.json",
    }


def run_logs() -> Any:
    """Logs of an attempt that started two hours ago and has finished steps."""
    timer = {
        "event": "started",
        "phase": "step",
        "source": "finelog.log",
        "line": 1,
        "timestamp": f.at(ATTEMPT_START_MIN),
        "attempt": 0,
    }
    return f.logs(timers=[timer], metrics=f.metric_rows({"reward/avg_raw_reward": [0.2, 0.3]}))


def check(rows: list[dict[str, Any]], mode: Mode = Mode.AGENTIC) -> GateResult:
    ev = f.evidence(mode=mode, log_tables=run_logs(), trial_tables=f.trials(rows))
    return duty_cycle.check(ev)


LATE_CHURN = [timed_trial(i, 60 - i, setup_s=45.0, execution_s=60.0) for i in range(20)]
HEALTHY_LATE = [timed_trial(100 + i, 60 - i, setup_s=3.0, execution_s=300.0) for i in range(20)]
START_BURST = [
    timed_trial(200 + i, ATTEMPT_START_MIN - 1 - i / 2, setup_s=60.0, execution_s=60.0)
    for i in range(15)
]


def test_sandbox_churn_after_the_grace_period_fails() -> None:
    """Sandbox set-up over the share and p90 limits after the first 15 minutes is churn."""
    result = check(LATE_CHURN)
    assert result.status is GateStatus.FAIL
    assert result.mechanism == "sandbox churn"
    assert not result.hard_failure and not result.learning_quality
    assert "p90 45.0s" in result.summary
    assert result.evidence and all(q.source.endswith("result.json") for q in result.evidence)
    assert all(q.timestamp is not None for q in result.evidence)
    assert any(row[0] == "sandbox" for table in result.tables for row in table.rows)


def test_start_up_burst_is_not_churn() -> None:
    """Slow set-ups only in the first 15 minutes of the attempt pass as a start-up burst."""
    result = check(START_BURST + HEALTHY_LATE)
    assert result.status is GateStatus.PASS
    assert result.summary.startswith("start-up burst, not churn: 15 trials")


def test_healthy_duty_cycle_passes_with_a_share_table() -> None:
    """Short set-ups pass, and the details tabulate every phase's share."""
    result = check(HEALTHY_LATE)
    assert result.status is GateStatus.PASS
    (table,) = result.tables
    phases = [row[0] for row in table.rows]
    assert phases == ["llm", "tools", "sandbox", "agent_setup", "verifier", "unattributed"]
    llm = next(row for row in table.rows if row[0] == "llm")
    assert llm[2] == pytest.approx(150.0)  # p50 seconds of LLM time


def test_duty_shares_are_time_weighted() -> None:
    """Shares divide summed phase seconds by summed wall seconds."""
    trials = f.trials(HEALTHY_LATE).trials.with_columns(wall_s=pl.lit(318.0))
    shares = duty_cycle.duty_shares(trials)
    assert shares["sandbox"] == pytest.approx(3.0 / 318.0)
    assert shares["llm"] == pytest.approx(150.0 / 318.0)
    assert shares["unattributed"] == pytest.approx(0.0, abs=1e-9)


def test_too_few_timed_trials_are_not_measured() -> None:
    """With fewer timed trials than the minimum the optional gate passes as not measured."""
    result = check(LATE_CHURN[:3])
    assert result.status is GateStatus.PASS
    assert result.summary == "not measured: 3 trials with phase timings"


def test_standard_runs_are_not_applicable() -> None:
    """A standard run's duty cycle is N/A; its phases belong to dynamics."""
    result = check(LATE_CHURN, mode=Mode.STANDARD)
    assert result.status is GateStatus.NA
    assert result.summary == duty_cycle.NA_SUMMARY


def test_undeclared_mode_is_an_error() -> None:
    """With no declared mode the gate errors and names what is missing."""
    result = check(LATE_CHURN, mode=Mode.UNDECLARED)
    assert result.status is GateStatus.ERROR
    assert result.missing == ("declared mode",)
    assert result.evidence and result.evidence[0].source == "manifest.json"
