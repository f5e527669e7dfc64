"""The rollouts gate: trial results in agentic mode, trainer reward metrics in standard mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.models import GateResult, GateStatus, Mode
from tests import factories as f
from worker.evidence.model import LogTables, ParseSummary
from worker.evidence.trials import terminal_bench_row
from worker.gates import rollouts

TB_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "terminal-bench"
QUOTA = "Failed to create sandbox: Snapshot quota exceeded. Maximum allowed: 100"


def trial(
    i: int,
    *,
    exception: str | None = None,
    message: str | None = None,
    reward: float | None = 1.0,
    turns: int | None = 8,
    status: str = "finished",
) -> dict[str, Any]:
    """One Harbor trial row, finished i minutes after the first."""
    return {
        "trial_name": f"task-{i}__abc{i:04d}",
        "task_name": f"task-{i}",
        "status": status,
        "reward": reward,
        "exception_type": exception,
        "exception_message": message,
        "n_turns": turns,
        "started_at": f.at(60 - i),
        "finished_at": f.at(50 - i) if status == "finished" else None,
        "format": "harbor",
        "source": f"trace_jobs/job/task-{i}__abc{i:04d}/result.json",
    }


def batch_rows(
    successful: int, total: int, exceptions: dict[str, int], steps: int = 3
) -> list[dict[str, Any]]:
    """`Batch generation complete` rows with their exception breakdown, one per step."""
    return [
        {
            "step": step,
            "successful": successful,
            "total": total,
            "failed": total - successful,
            "masked": 0,
            "exceptions": json.dumps(exceptions),
            "source": "finelog.log",
            "line": 300 + step,
            "timestamp": f.at(10 - step),
            "attempt": 0,
        }
        for step in range(1, steps + 1)
    ]


def agentic(trial_rows: list[dict[str, Any]], log_tables: LogTables | None = None) -> GateResult:
    tables = log_tables or f.logs(metrics=f.metric_rows({"timing/step": [100.0, 100.0]}))
    ev = f.evidence(mode=Mode.AGENTIC, log_tables=tables, trial_tables=f.trials(trial_rows))
    return rollouts.check(ev)


def standard(series: dict[str, list[float | None]], **tables: Any) -> GateResult:
    log_tables = f.logs(metrics=f.metric_rows(series), **tables)
    return rollouts.check(f.evidence(mode=Mode.STANDARD, log_tables=log_tables))


def assert_quoted(result: GateResult) -> None:
    """A FAIL or ERROR quotes evidence, each quote with a source and text."""
    assert result.evidence, result.summary
    assert all(q.source and q.text for q in result.evidence)


DAYTONA = [
    trial(i, exception="DaytonaValidationError", message=QUOTA, reward=None, turns=0)
    for i in range(20)
]


def test_all_daytona_quota_failures_are_a_hard_fail_with_a_quota_handoff() -> None:
    """Every trial refused by Daytona while the trainer's batches all fail is a hard FAIL."""
    tables = f.logs(batches=batch_rows(0, 32, {"DaytonaValidationError": 32}))
    result = agentic(DAYTONA, tables)
    assert result.status is GateStatus.FAIL
    assert result.hard_failure
    assert not result.learning_quality
    assert "20/20" in result.summary and "DaytonaValidationError" in result.summary
    assert result.handoff is not None
    assert "quota" in result.handoff.component.lower()
    assert_quoted(result)
    trial_quote = result.evidence[0]
    assert trial_quote.source.endswith("result.json") and trial_quote.timestamp is not None
    assert any(q.source == "finelog.log" and q.line == 302 for q in result.evidence)


def test_systemic_sandbox_failure_without_trainer_evidence_is_not_hard() -> None:
    """The same sandbox failure with no trainer side to confirm zeros is a FAIL but not hard."""
    result = agentic(DAYTONA)
    assert result.status is GateStatus.FAIL
    assert not result.hard_failure
    assert result.handoff is not None


def test_occasional_agent_timeouts_are_benign() -> None:
    """Two AgentTimeoutError trials among twenty pass and are named as benign noise."""
    rows = [trial(i, reward=float(i % 2)) for i in range(18)]
    rows += [trial(18 + i, exception="AgentTimeoutError", reward=0.0) for i in range(2)]
    result = agentic(rows)
    assert result.status is GateStatus.PASS
    assert "2 agent-budget: benign" in result.summary
    assert "20 finished trials" in result.summary


def test_one_turn_median_fails() -> None:
    """A median of one turn per trial is a dead engine or broken agent loop."""
    rows = [trial(i, turns=1, reward=0.0) for i in range(20)]
    result = agentic(rows)
    assert result.status is GateStatus.FAIL
    assert "median 1 turns" in result.summary
    assert result.mechanism and "one turn" in result.mechanism
    assert_quoted(result)


def test_all_null_rewards_fail_when_the_trainer_agrees() -> None:
    """Twenty finished trials without a reward, with the trainer logging zero reward, fail."""
    rows = [trial(i, reward=None) for i in range(20)]
    tables = f.logs(metrics=f.metric_rows({"reward/avg_raw_reward": [0.0, 0.0, 0.0]}))
    result = agentic(rows, tables)
    assert result.status is GateStatus.FAIL
    assert "20 null" in result.summary and "trainer agrees" in result.summary
    assert not result.hard_failure
    assert_quoted(result)
    assert any(q.source == "finelog.log" and q.line is not None for q in result.evidence)


def test_zero_trials_against_positive_trainer_rewards_is_an_error() -> None:
    """Trials all at zero while the trainer logs positive rewards is an unresolved disagreement."""
    rows = [trial(i, reward=0.0) for i in range(20)]
    tables = f.logs(metrics=f.metric_rows({"reward/avg_raw_reward": [0.4, 0.5]}))
    result = agentic(rows, tables)
    assert result.status is GateStatus.ERROR
    assert_quoted(result)


def test_too_few_trials_with_a_warning_sign_is_an_error() -> None:
    """Five trials all refused by Daytona are too few to call systemic."""
    result = agentic(DAYTONA[:5])
    assert result.status is GateStatus.ERROR
    assert "too few" in result.summary
    assert_quoted(result)


@pytest.mark.parametrize(
    "trial_tables",
    [None, f.trials([trial(i, status="running") for i in range(3)])],
    ids=["no trials directory", "only running trials"],
)
def test_no_finished_trial_is_an_error(trial_tables: Any) -> None:
    """An agentic run past initialization without a finished trial lacks trial outputs."""
    tables = f.logs(metrics=f.metric_rows({"reward/avg_raw_reward": [0.4, 0.5]}))
    ev = f.evidence(mode=Mode.AGENTIC, log_tables=tables, trial_tables=trial_tables)
    result = rollouts.check(ev)
    assert result.status is GateStatus.ERROR
    assert result.missing == ("trial outputs",)
    assert_quoted(result)


def test_initialising_agentic_run_without_trials_passes() -> None:
    """Before the first step, missing trials are initialization, not an error."""
    timers = [
        {
            "event": "started",
            "phase": "step",
            "source": "finelog.log",
            "line": 5,
            "timestamp": f.at(10),
            "attempt": 0,
        }
    ]
    ev = f.evidence(mode=Mode.AGENTIC, log_tables=f.logs(timers=timers))
    result = rollouts.check(ev)
    assert result.status is GateStatus.PASS
    assert result.initializing


def test_undeclared_mode_is_an_error() -> None:
    """With no entrypoint and no explicit mode the gate errors naming the undeclared mode."""
    result = rollouts.check(f.evidence(mode=Mode.UNDECLARED, trial_tables=f.trials(DAYTONA)))
    assert result.status is GateStatus.ERROR
    assert "mode undeclared" in result.summary
    assert result.missing == ("declared mode",)
    assert_quoted(result)


def test_terminal_bench_samples_classify_their_failure_modes() -> None:
    """The real terminal-bench results map agent_timeout to budget and test_timeout to verifier."""
    rows = []
    for path in sorted(TB_FIXTURES.glob("*.results.json")):
        row = terminal_bench_row(json.loads(path.read_text()), path.parent.name)
        rows.append(row | {"source": f"trace_jobs/{path.name}"})
    causes = {r["exception_type"]: rollouts.cause_of(r["exception_type"]) for r in rows}
    assert causes == {
        "agent_timeout": "agent budget",
        "test_timeout": "verifier",
        "parse_error": "verifier",
        None: None,
    }
    result = agentic(rows)
    assert result.status is GateStatus.PASS
    assert "4 finished trials" in result.summary
    assert "benign" in result.summary


@pytest.mark.parametrize(
    ("exception", "cause"),
    [
        ("DaytonaNotFoundError", "sandbox"),
        ("EnvironmentStartTimeoutError", "sandbox"),
        ("ContextLengthExceededError", "agent budget"),
        ("RewardFileNotFoundError", "verifier"),
        ("KeyError", "other"),
        (None, None),
    ],
)
def test_exception_causes(exception: str | None, cause: str | None) -> None:
    """Harbor exception types fall into Harbor's causes."""
    assert rollouts.cause_of(exception) == cause


def test_systemic_verifier_failure_names_the_verifier() -> None:
    """Every trial failing its verifier is a systemic FAIL with a verifier handoff."""
    rows = [trial(i, exception="RewardFileNotFoundError", reward=None) for i in range(20)]
    result = agentic(rows)
    assert result.status is GateStatus.FAIL
    assert result.handoff is not None and "verifier" in result.handoff.component


# --- standard -----------------------------------------------------------------------------------


def test_standard_rewards_present_pass_without_trials() -> None:
    """A standard run with reward metrics passes and needs no trial artifacts."""
    result = standard(
        {
            "reward/avg_raw_reward": [0.1 * i for i in range(12)],
            "generate/avg_num_tokens": [300.0] * 12,
            "generate/max_num_tokens": [1024.0] * 12,
        }
    )
    assert result.status is GateStatus.PASS
    assert "reward/avg_raw_reward logged at 12 steps" in result.summary


def test_standard_every_response_at_max_length_fails() -> None:
    """avg_num_tokens equal to max_num_tokens over the window is a FAIL with a handoff (the cap),
    not a learning-quality kill."""
    result = standard(
        {
            "reward/avg_raw_reward": [0.2] * 12,
            "generate/avg_num_tokens": [300.0] * 2 + [4096.0] * 10,
            "generate/max_num_tokens": [4096.0] * 12,
        }
    )
    assert result.status is GateStatus.FAIL
    assert not result.learning_quality
    assert not result.hard_failure
    assert result.handoff is not None and "max_generate_length" in result.handoff.component
    assert "4096" in result.summary
    assert_quoted(result)
    assert all(q.line is not None for q in result.evidence)


def test_standard_length_collapse_fails() -> None:
    """Response length falling to near zero after a healthy start is a learning-quality FAIL."""
    result = standard(
        {"reward/avg_raw_reward": [0.2] * 20, "generate/avg_num_tokens": [500.0] * 10 + [3.0] * 10}
    )
    assert result.status is GateStatus.FAIL
    assert result.learning_quality
    assert "collapsed" in result.summary


def test_standard_zero_rewards_with_verifier_errors_fail() -> None:
    """Zero reward at every step, with verifier exceptions in the log, fails and quotes them."""
    errors = [
        {
            "source": "finelog.log",
            "line": 77,
            "timestamp": f.at(3),
            "kind": "verifier_error",
            "text": "RewardFileNotFoundError: /logs/verifier/reward.txt",
            "attempt": 0,
        }
    ]
    result = standard({"loss/avg_final_rewards": [0.0] * 12}, errors=errors)
    assert result.status is GateStatus.FAIL
    assert "1 verifier exception" in result.summary
    assert any(q.line == 77 for q in result.evidence)


def test_standard_without_reward_metrics_is_an_error_quoting_the_log() -> None:
    """No reward metric at all is ERROR quoting what the log looks like."""
    summary = ParseSummary(files=("finelog.log",), head=("INFO starting trainer",))
    tables = f.logs(metrics=f.metric_rows({"policy/policy_loss": [0.1, 0.2]}), summary=summary)
    result = rollouts.check(f.evidence(mode=Mode.STANDARD, log_tables=tables))
    assert result.status is GateStatus.ERROR
    assert result.evidence[0].text == "INFO starting trainer"
    assert result.missing == ("trainer reward metrics",)


# --- issue 8: collapse held over a window, recovery per mechanism ---------------------------------


def _agentic(rewards: list[float]) -> GateResult:
    rows = [trial(i, reward=r) | {"finished_at": f.at(50 - i * 0.5)} for i, r in enumerate(rewards)]
    return rollouts.check(f.evidence(mode=Mode.AGENTIC, trial_tables=f.trials(rows)))


def test_trial_rewards_collapsed_over_a_window_fail_as_learning_quality() -> None:
    """Every newest 10-trial window under 20% of the best window's reward, flat: a learning-
    quality FAIL on the `reward_collapse` mechanism, with its proof."""
    result = _agentic([1.0, 0.0] * 15 + [0.0] * 20)
    assert result.status is GateStatus.FAIL and result.learning_quality
    assert (result.kind, result.proof.rule if result.proof else None) == (
        "reward_collapse",
        "trial_reward_collapse",
    )


def test_trial_rewards_with_one_recent_success_do_not_collapse() -> None:
    """A success inside the newest window keeps some window above the line: no collapse."""
    result = _agentic([1.0, 0.0] * 15 + [0.0] * 14 + [1.0] + [0.0] * 5)
    assert result.status is GateStatus.PASS


def _standard(tokens: list[float]) -> GateResult:
    n = len(tokens)
    rows = f.metric_rows(
        {
            "reward/avg_raw_reward": [0.3] * n,
            "generate/avg_num_tokens": tokens,
            "generate/max_num_tokens": [1024.0] * n,
        }
    )
    return rollouts.check(f.evidence(log_tables=f.logs(metrics=rows)))


def test_length_collapse_on_every_window_step_fails_with_its_proof() -> None:
    """Response length under 20% of the earlier median on all 10 window steps: learning-quality
    FAIL (`length_collapse`)."""
    result = _standard([400.0] * 14 + [60.0] * 10)
    assert result.status is GateStatus.FAIL and result.learning_quality
    assert result.proof is not None and result.proof.rule == "length_collapse"


def test_length_collapse_dragging_the_median_is_not_held_over_the_window() -> None:
    """Six collapsed steps drag the window's median but do not hold over it: PASS."""
    assert _standard([400.0] * 18 + [60.0] * 6).status is GateStatus.PASS


def test_length_collapse_trending_back_is_recovering() -> None:
    """Every window step under the line but climbing back within a window: PASS."""
    assert _standard([400.0] * 14 + [5.0 + 8.0 * k for k in range(10)]).status is GateStatus.PASS


def test_a_reward_file_missing_quotes_the_verifier_output_that_names_why() -> None:
    """Every trial raising Harbor's RewardFileNotFoundError, whose verifier output says the test
    file is missing, while the trainer trains on zeros: a hard FAIL whose evidence and handoff
    quote that verifier line and name the test path, for the environment owner."""
    line = "ERROR: file or directory not found: /tests/test_outputs.py"
    rows = [
        trial(i, exception="RewardFileNotFoundError", reward=None)
        | {"verifier_error": line, "verifier_source": f"trace_jobs/t{i}/verifier/test-stdout.txt"}
        for i in range(20)
    ]
    tables = f.logs(metrics=f.metric_rows({"reward/avg_raw_reward": [0.0] * 10}))
    result = agentic(rows, tables)
    assert result.status is GateStatus.FAIL and result.hard_failure
    assert result.mechanism is not None
    assert result.mechanism.startswith("reward signal invalid: the verifier could not run")
    assert any(
        q.source.endswith("verifier/test-stdout.txt") and q.text == line for q in result.evidence
    )
    handoff = result.handoff
    assert handoff is not None
    assert (
        "`/tests/test_outputs.py`" in handoff.component
        and "owner: the environment" in handoff.component
    )
    assert line in handoff.likely_cause


@pytest.mark.parametrize(
    ("message", "who"),
    [
        ("Failed to create sandbox: Total CPU limit exceeded. Maximum allowed: 4500.", "provider"),
        ("Environment start timed out after 600 s", "never come up"),
    ],
    ids=["provider-quota", "start-timeout"],
)
def test_a_systemic_sandbox_failure_names_its_owner(message: str, who: str) -> None:
    """A sandbox error naming a quota or limit (daytona#3304) is the sandbox provider's; one that
    does not (a start timeout) is sandboxes never coming up: both read "reward signal invalid"."""
    rows = [trial(i, exception="DaytonaError", message=message, reward=None) for i in range(20)]
    result = agentic(rows)
    assert result.mechanism is not None and result.mechanism.startswith("reward signal invalid")
    assert who in result.mechanism
    assert result.handoff is not None and "owner: the environment" in result.handoff.component
