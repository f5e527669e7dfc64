"""The dynamics gate, judged on hand-built evidence (one table of cases, one assertion body)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.models import GateResult, GateStatus
from tests.factories import at, evidence, logs, metric_rows, phase_rows
from worker.evidence.case import Evidence
from worker.evidence.model import ParseSummary
from worker.gates import dynamics
from worker.gates.metric_keys import resolve

N = 30
REWARD = "reward/avg_raw_reward"
ENTROPY = "policy/policy_entropy"
LOSS = "policy/policy_loss"
GRAD = "policy/raw_grad_norm"
PHASE_HEADER = "first-window median s"


def line_of(step: int) -> int:
    """The METRICS line `metric_rows` gives a step (first step 1)."""
    return 1000 + 10 * (step - 1)


def rising(n: int = N, low: float = 0.1, high: float = 0.6) -> list[float | None]:
    return [low + (high - low) * i / (n - 1) for i in range(n)]


def healthy(
    n: int = N, overrides: Mapping[str, Sequence[float | None]] | None = None
) -> dict[str, Sequence[float | None]]:
    """An improving run with healthy entropy, TIS, loss and grad norm, then the overrides."""
    base: dict[str, Sequence[float | None]] = {
        REWARD: rising(n),
        ENTROPY: [1.2 - 0.3 * i / (n - 1) for i in range(n)],
        LOSS: [0.01] * n,
        GRAD: [1.0] * n,
        "policy/tis/imp_ratio_mean": [0.95] * n,
        "policy/tis/log_ratio_abs_mean": [0.07] * n,
        "generate/tis/exact_match_fraction": [0.99] * n,
    }
    return base | dict(overrides or {})


def steady_phases(n: int = N, **overrides: Sequence[float | None]) -> list[dict[str, object]]:
    return phase_rows(
        {"generate": [30.0] * n, "sync_weights": [2.0] * n, "step": [40.0] * n} | overrides
    )


def run(
    series: Mapping[str, Sequence[float | None]],
    phases: list[dict[str, object]] | None = None,
    **tables: object,
) -> Evidence:
    """Evidence whose logs hold these metric series (and phases, when given)."""
    n = len(next(iter(series.values())))
    return evidence(
        log_tables=logs(
            metrics=metric_rows(series),
            phases=phases if phases is not None else steady_phases(n),
            **tables,  # type: ignore[arg-type]
        )
    )


def collapse_then(tail: list[float | None]) -> list[float | None]:
    return [0.6] * 20 + tail


def flat(n: int = N, level: float = 0.3) -> list[float | None]:
    return [level + 0.01 * (-1) ** i for i in range(n)]


NOISE_SUMMARY = ParseSummary(
    files=("finelog.log",),
    lines=120,
    head=("INFO trainer starting, config loaded", "garbage {not a metric"),
    serializations=(),
    malformed=2,
    malformed_examples=('finelog.log:17: WANDB_MIRROR kind=train step=1 metrics={"rew',),
)


@dataclass(frozen=True)
class Case:
    id: str
    doc: str
    build: Callable[[], Evidence]
    status: GateStatus
    hard: bool = False
    learning_quality: bool = False
    initializing: bool = False
    summary: tuple[str, ...] = ()
    mechanism: str | None = None
    quotes: tuple[tuple[str, int | None], ...] = ()
    handoff: bool = False
    table: bool = True


CASES = (
    Case(
        "healthy",
        "An improving run with healthy entropy and TIS passes and says it is improving.",
        lambda: run(healthy()),
        GateStatus.PASS,
        summary=("improving",),
    ),
    Case(
        "plateau",
        "A flat reward with healthy entropy and TIS passes as a plateau.",
        lambda: run(healthy(N, {REWARD: flat(level=0.5)})),
        GateStatus.PASS,
        summary=("plateau at 0.5", "a plateau alone is not a kill condition"),
    ),
    Case(
        "all_zero",
        "All-zero reward from step 1 is a hard infrastructure failure, not learning quality.",
        lambda: run(healthy(20, {REWARD: [0.0] * 20})),
        GateStatus.FAIL,
        hard=True,
        summary=("all-zero reward/avg_raw_reward from step 1 through step 20",),
        mechanism="all-zero reward since step 1: infrastructure fingerprint",
        quotes=(("finelog.log", line_of(1)), ("finelog.log", line_of(20))),
    ),
    Case(
        "collapse",
        "A reward collapse from a plateau fails at its step, next to its weight-sync spike.",
        lambda: run(
            healthy(35, {REWARD: collapse_then([0.01] * 15)}),
            steady_phases(35, sync_weights=[2.0] * 20 + [30.0] + [2.0] * 14),
        ),
        GateStatus.FAIL,
        learning_quality=True,
        summary=("reward collapse at step 21", "not recovering"),
        mechanism="reward collapse at step 21 after weight sync at step 21",
        quotes=(("finelog.log", line_of(20)), ("finelog.log", line_of(21)), ("finelog.log", 5201)),
    ),
    Case(
        "collapse_recovering",
        "A collapse whose last window trends back up to the collapse line passes as recovering.",
        lambda: run(
            healthy(
                30,
                {REWARD: collapse_then([0, 0, 0.01, 0.02, 0.03, 0.05, 0.06, 0.08, 0.09, 0.11])},
            )
        ),
        GateStatus.PASS,
        summary=("since step 21 but recovering",),
    ),
    Case(
        "entropy_collapse",
        "Entropy under 5% of its early median while reward is flat fails as an entropy collapse.",
        lambda: run(healthy(N, {REWARD: flat(), ENTROPY: [1.0] * 10 + [0.01] * 20})),
        GateStatus.FAIL,
        learning_quality=True,
        summary=("entropy collapse", "since step 11"),
        mechanism="entropy collapse from step 11",
        quotes=(("finelog.log", line_of(11)), ("finelog.log", line_of(30))),
    ),
    Case(
        "entropy_slow_fall",
        "Entropy falling slowly while reward improves passes.",
        lambda: run(healthy(N, {ENTROPY: [1.0 - 0.6 * i / (N - 1) for i in range(N)]})),
        GateStatus.PASS,
        summary=("improving",),
    ),
    Case(
        "tis_out_of_range",
        "An importance-ratio mean under the healthy range on every window step fails, handed off.",
        lambda: run(healthy(N, {"policy/tis/imp_ratio_mean": [0.5] * N})),
        GateStatus.FAIL,
        learning_quality=True,
        summary=("TIS out of the healthy range", "importance-ratio mean median 0.5"),
        mechanism="off-policy mismatch",
        quotes=(("finelog.log", line_of(30)),),
        handoff=True,
    ),
    Case(
        "router_replay",
        "The broken router replay fingerprint fails hard with a handoff to its owner.",
        lambda: run(
            healthy(
                N,
                {
                    REWARD: flat(),
                    "policy/log_ratio_abs_max": [19.0] * N,
                    LOSS: [1e4] * N,
                    GRAD: [1e5] * N,
                },
            )
        ),
        GateStatus.FAIL,
        hard=True,
        summary=("broken router replay fingerprint on every step 21–30",),
        mechanism="broken router replay",
        quotes=(("finelog.log", line_of(30)), ("finelog.log", line_of(21))),
        handoff=True,
    ),
    Case(
        "nan_loss",
        "A NaN policy loss in the window fails hard, quoting its first step.",
        lambda: run(healthy(N, {LOSS: [0.01] * 24 + [math.nan] * 6})),
        GateStatus.FAIL,
        hard=True,
        summary=("non-finite policy/policy_loss from step 25", "newest 6 steps"),
        mechanism="non-finite policy/policy_loss from step 25, persisting",
        quotes=(("finelog.log", line_of(25)), ("finelog.log", line_of(30))),
    ),
    Case(
        "phase_inflation",
        "A phase whose last-window median is over 3x its first-window median fails, named.",
        lambda: run(
            healthy(),
            steady_phases(sync_weights=[2.0] * 15 + [10.0] * 15, step=[40.0] * 15 + [48.0] * 15),
        ),
        GateStatus.FAIL,
        summary=("phase sync_weights inflated 5.0×",),
        mechanism="pipeline bubble: sync_weights",
        quotes=(("finelog.log", 5001), ("finelog.log", 5291)),
    ),
    Case(
        "short_quiet",
        "Fewer steps than the window past the grace is an ERROR naming the missing window.",
        lambda: run(healthy(5)),
        GateStatus.ERROR,
        summary=("5 steps < window of 10 past the initialization grace",),
    ),
    Case(
        "short_nan_spike",
        "One inf grad norm followed by finite steps is a spike: the short run is ERROR, not hard.",
        lambda: run(healthy(5, {GRAD: [1.0, 1.0, math.inf, 1.0, 1.0]})),
        GateStatus.ERROR,
        summary=("5 steps < window of 10",),
    ),
    Case(
        "short_nan_persisting",
        "NaN on the newest three steps fails hard even before a full window exists.",
        lambda: run(healthy(5, {GRAD: [1.0, 1.0, math.inf, math.inf, math.nan]})),
        GateStatus.FAIL,
        hard=True,
        summary=("non-finite policy/raw_grad_norm from step 3",),
        quotes=(("finelog.log", line_of(3)), ("finelog.log", line_of(5))),
    ),
    Case(
        "short_all_zero",
        "Fewer steps than the window with all-zero reward so far is an ERROR, not a PASS.",
        lambda: run(healthy(5, {REWARD: [0.0] * 5})),
        GateStatus.ERROR,
        summary=("5 steps < window of 10 and already anomalous", "all-zero reward/avg_raw_reward"),
        quotes=(("finelog.log", line_of(1)),),
    ),
    Case(
        "no_usable_metrics",
        "A log with only timing keys is an ERROR quoting the log's head and malformed lines.",
        lambda: evidence(
            log_tables=logs(
                metrics=metric_rows({"timing/generate": [30.0] * 3}), summary=NOISE_SUMMARY
            )
        ),
        GateStatus.ERROR,
        summary=("no usable metrics", "serializations seen none", "2 malformed", "timing/generate"),
        quotes=(("finelog.log", None), ("finelog.log", 17)),
        table=False,
    ),
    Case(
        "no_metrics_at_all",
        "A log with no metric at all is an ERROR quoting what the log begins with.",
        lambda: evidence(log_tables=logs(summary=NOISE_SUMMARY)),
        GateStatus.ERROR,
        summary=("log begins 'INFO trainer starting",),
        quotes=(("finelog.log", None),),
        table=False,
    ),
    Case(
        "no_step_past_grace",
        "Past the initialization grace with no step and no metric record, dynamics is ERROR.",
        lambda: evidence(
            log_tables=logs(
                timers=[
                    {
                        "event": "started",
                        "phase": "generate",
                        "source": "finelog.log",
                        "line": 40,
                        "timestamp": at(120),
                        "attempt": 0,
                    }
                ]
            )
        ),
        GateStatus.ERROR,
        summary=("no finished step and no metric record", "past its initialization grace"),
        table=False,
    ),
    Case(
        "no_log",
        "No trainer log at all is an ERROR quoting the manifest's finelog status.",
        lambda: evidence(log_tables=None),
        GateStatus.ERROR,
        summary=("no trainer log",),
        quotes=(("manifest.json", None),),
        table=False,
    ),
    Case(
        "initializing",
        "A newest attempt with phases started but no step finished passes as initializing.",
        lambda: evidence(
            log_tables=logs(
                timers=[
                    {
                        "event": "started",
                        "phase": "generate",
                        "source": "finelog.log",
                        "line": 40,
                        "timestamp": at(5),
                        "attempt": 0,
                    }
                ]
            )
        ),
        GateStatus.PASS,
        initializing=True,
        summary=("no window yet",),
        table=False,
    ),
    Case(
        "complete",
        "A run that resumed past max_steps is complete: findings are noted, not judged.",
        lambda: run(
            healthy(22, {REWARD: [0.0] * 22}),
            progress=[
                {
                    "kind": "training_step",
                    "done": 22,
                    "total": 20,
                    "source": "finelog.log",
                    "line": 9,
                }
            ],
        ),
        GateStatus.PASS,
        summary=("run complete: step 22 reached max_steps 20 (resumed past the end)",),
    ),
    Case(
        "benign_prob_diff",
        "A huge policy/rollout_train_prob_diff_mean is noise and does not fail the gate.",
        lambda: run(healthy(N, {"policy/rollout_train_prob_diff_mean": [1e6] * N})),
        GateStatus.PASS,
    ),
    Case(
        "earlier_nan",
        "A NaN loss before the window, finite since, passes with a note.",
        lambda: run(healthy(N, {LOSS: [0.01, 0.01, math.nan] + [0.01] * (N - 3)})),
        GateStatus.PASS,
    ),
    Case(
        "newer_is_ratio_key",
        "Newer SkyRL's policy/loss_metrics/is_ratio_mean stands for the TIS ratio when alone.",
        lambda: run(
            {
                k: v
                for k, v in healthy(N, {"policy/loss_metrics/is_ratio_mean": [1.5] * N}).items()
                if k != "policy/tis/imp_ratio_mean"
            }
        ),
        GateStatus.FAIL,
        learning_quality=True,
        summary=("importance-ratio mean median 1.5",),
        mechanism="policy/loss_metrics/is_ratio_mean",
        quotes=(("finelog.log", line_of(30)),),
        handoff=True,
    ),
    Case(
        "prefixed_entropy_wins",
        "policy/policy_entropy wins over a collapsed unprefixed policy_entropy.",
        lambda: run(healthy(N, {REWARD: flat(), "policy_entropy": [1.0] * 10 + [0.01] * 20})),
        GateStatus.PASS,
        summary=("plateau",),
    ),
    Case(
        "unprefixed_entropy_alone",
        "An unprefixed policy_entropy is judged when it is the only entropy key.",
        lambda: run(
            {
                k: v
                for k, v in healthy(
                    N, {REWARD: flat(), "policy_entropy": [1.0] * 10 + [0.01] * 20}
                ).items()
                if k != ENTROPY
            }
        ),
        GateStatus.FAIL,
        learning_quality=True,
        summary=("entropy collapse: policy_entropy",),
    ),
    Case(
        "raw_reward_wins",
        "reward/avg_raw_reward wins over an all-zero loss/avg_final_rewards.",
        lambda: run(healthy(N, {"loss/avg_final_rewards": [0.0] * N})),
        GateStatus.PASS,
        summary=("reward/avg_raw_reward improving",),
    ),
    Case(
        "final_rewards_fallback",
        "loss/avg_final_rewards is judged when it is the only reward key.",
        lambda: run(
            {
                k: v
                for k, v in healthy(N, {"loss/avg_final_rewards": [0.0] * N}).items()
                if k != REWARD
            }
        ),
        GateStatus.FAIL,
        summary=("all-zero loss/avg_final_rewards",),
        mechanism="infrastructure fingerprint",
        hard=True,
    ),
)


def assert_quotes(result: GateResult, expected: tuple[tuple[str, int | None], ...]) -> None:
    """Each expected (source, line) is among the result's quotes, each quote has text."""
    got = {(q.source, q.line) for q in result.evidence}
    assert all(q.text for q in result.evidence)
    for where in expected:
        assert where in got, f"{where} not quoted; got {sorted(got, key=str)}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_dynamics_case(case: Case) -> None:
    """Each case gets its status, flags, summary, mechanism, quotes and window table."""
    result = dynamics.check(case.build())
    assert result.status is case.status, result.summary
    assert (result.hard_failure, result.learning_quality, result.initializing) == (
        case.hard,
        case.learning_quality,
        case.initializing,
    )
    for text in case.summary:
        assert text in result.summary
    if case.mechanism is not None:
        assert result.mechanism is not None and case.mechanism in result.mechanism
    if case.status is not GateStatus.PASS:
        assert result.evidence, "every FAIL and ERROR quotes evidence"
    assert_quotes(result, case.quotes)
    assert (result.handoff is not None) is case.handoff
    assert any(t.title.startswith("window:") for t in result.tables) is case.table
    assert "\n" not in result.summary


def test_window_table_rows() -> None:
    """The window table (data) has one row per window step with the reward and step seconds."""
    result = dynamics.check(run(healthy()))
    window = next(t for t in result.tables if t.title.startswith("window:"))
    assert window.title.startswith("window: last 10 of 30 steps (21–30)")
    assert [row[0] for row in window.rows] == list(range(21, 31))
    assert window.columns[1] == "reward" and window.rows[-1][1] == pytest.approx(0.6)
    assert window.columns[-1] == "step s" and window.rows[-1][-1] == 40.0


def test_phase_table_lists_each_phase() -> None:
    """The phase table gives each phase's first- and last-window medians and their ratio."""
    result = dynamics.check(run(healthy(), steady_phases(sync_weights=[2.0] * 15 + [10.0] * 15)))
    table = next(t for t in result.tables if PHASE_HEADER in t.columns)
    sync = next(row for row in table.rows if row[0] == "sync_weights")
    assert sync == ("sync_weights", 2.0, 10.0, 5.0, "INFLATED")
    assert table.units[3] == "×"


def test_collapse_flip_signal_names_the_line() -> None:
    """A collapse's flip signal names the reward key, the collapse line and the best window."""
    result = dynamics.check(run(healthy(35, {REWARD: collapse_then([0.01] * 15)})))
    assert result.flip_signal == (
        "reward/avg_raw_reward back above 0.12 (20% of best window 0.6) for a 10-step window"
    )
    assert result.mechanism is not None and "no resume, attempt change" in result.mechanism


def test_collapse_names_an_attempt_change() -> None:
    """A collapse that starts with a new attempt names the attempt change in its mechanism."""
    rows = metric_rows(healthy(35, {REWARD: collapse_then([0.01] * 15)}))
    for row in rows:
        row["attempt"] = 1 if row["step"] > 20 else 0
    result = dynamics.check(evidence(log_tables=logs(metrics=rows, phases=steady_phases(35))))
    assert result.status is GateStatus.FAIL
    assert (
        result.mechanism == "reward collapse at step 21 after an attempt change (0 → 1) at step 21"
    )


def test_collapse_names_a_resume() -> None:
    """A collapse next to a checkpoint resume names the resume and quotes its line."""
    resume = {
        "kind": "resumed",
        "step": 20,
        "text": "Resuming from global_step: 20",
        "source": "finelog.log",
        "line": 1195,
        "timestamp": at(15),
        "attempt": 0,
    }
    ev = run(healthy(35, {REWARD: collapse_then([0.01] * 15)}), resumes=[resume])
    result = dynamics.check(ev)
    assert (
        result.mechanism is not None
        and "a resume (Resuming from global_step: 20)" in result.mechanism
    )
    assert ("finelog.log", 1195) in {(q.source, q.line) for q in result.evidence}


def test_earlier_nan_is_noted() -> None:
    """A non-finite value before the window is written into the details, not failed."""
    result = dynamics.check(run(healthy(N, {LOSS: [0.01, 0.01, math.nan] + [0.01] * (N - 3)})))
    assert any(
        line.startswith("note: non-finite policy/policy_loss last at step 3")
        for line in result.details
    )


def test_thresholds_come_from_settings() -> None:
    """A campaign's larger window turns a 30-step run into a short one."""
    ev = run(healthy())
    wider = evidence(
        log_tables=ev.logs, thresholds=ev.thresholds.model_copy(update={"min_window_steps": 40})
    )
    result = dynamics.check(wider)
    assert result.status is GateStatus.ERROR
    assert result.summary.startswith("30 steps < window of 40")


@pytest.mark.parametrize(
    ("present", "signal", "expected"),
    [
        ({"policy/policy_entropy", "policy_entropy"}, "entropy", "policy/policy_entropy"),
        ({"policy_entropy"}, "entropy", "policy_entropy"),
        ({"reward/avg_raw_reward", "loss/avg_final_rewards"}, "reward", "reward/avg_raw_reward"),
        ({"loss/avg_final_rewards"}, "reward", "loss/avg_final_rewards"),
        ({"policy/loss_metrics/is_ratio_mean"}, "tis_ratio", "policy/loss_metrics/is_ratio_mean"),
        (
            {"policy/tis/imp_ratio_mean", "policy/loss_metrics/is_ratio_mean"},
            "tis_ratio",
            "policy/tis/imp_ratio_mean",
        ),
        ({"tis/imp_ratio_mean"}, "tis_ratio", "tis/imp_ratio_mean"),
        (
            {"grad_norm", "policy/grad_norm", "policy/raw_grad_norm"},
            "grad_norm",
            "policy/raw_grad_norm",
        ),
        ({"grad_norm", "policy/grad_norm"}, "grad_norm", "policy/grad_norm"),
        ({"reward/avg_pass_at_8", "reward/avg_pass_at_5"}, "pass_at_k", "reward/avg_pass_at_5"),
        ({"policy/rollout_train_prob_diff_mean"}, "reward", None),
    ],
)
def test_first_present_wins(present: set[str], signal: str, expected: str | None) -> None:
    """The first candidate key present names the signal."""
    assert resolve(present).get(signal) == expected


def test_resolution_ignores_all_null_keys() -> None:
    """A key whose every value is null is not present, so the next candidate wins."""
    rows = metric_rows({REWARD: [None] * 12, "loss/avg_final_rewards": rising(12)})
    result = dynamics.check(evidence(log_tables=logs(metrics=rows)))
    assert "loss/avg_final_rewards improving" in result.summary


values = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from([0.0, 0.6, 1e5]),
)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=25),
    data=st.data(),
)
def test_never_raises_and_quotes_every_fail(n: int, data: st.DataObject) -> None:
    """On any series of rewards, entropies, losses and grad norms the gate answers and quotes."""
    series = {
        key: data.draw(st.lists(values, min_size=n, max_size=n), label=key)
        for key in (REWARD, ENTROPY, LOSS, GRAD, "policy/log_ratio_abs_max")
    }
    result = dynamics.check(run(series))
    assert isinstance(result, GateResult)
    assert "could not be computed" not in result.summary, result.summary
    if result.status is not GateStatus.PASS:
        assert result.evidence and all(q.source for q in result.evidence)


def test_non_finite_on_fewer_newest_steps_than_the_persistence_is_error() -> None:
    """NaN on the newest 2 steps (persistence 3) is too few to tell spike from divergence."""
    result = dynamics.check(run(healthy(N, {LOSS: [0.01] * (N - 2) + [math.nan] * 2})))
    assert result.status is GateStatus.ERROR
    assert "fewer than NON_FINITE_PERSIST_STEPS 3" in result.summary


def test_persistence_is_a_threshold() -> None:
    """A campaign may ask for five persisting steps; three then are not yet divergence."""
    ev = run(healthy(N, {LOSS: [0.01] * (N - 3) + [math.nan] * 3}))
    assert dynamics.check(ev).hard_failure
    stricter = evidence(
        log_tables=ev.logs,
        thresholds=ev.thresholds.model_copy(update={"non_finite_persist_steps": 5}),
    )
    assert dynamics.check(stricter).status is GateStatus.ERROR


def test_hard_and_learning_quality_fails_carry_their_proofs() -> None:
    """A hard FAIL proposes its proof (`non_finite`), a learning-quality FAIL its own."""
    nan = dynamics.check(run(healthy(N, {LOSS: [0.01] * 24 + [math.nan] * 6})))
    assert nan.proof is not None and nan.proof.rule == "non_finite"
    assert nan.proof.established_at == at(1)
    tis = dynamics.check(run(healthy(N, {"policy/tis/imp_ratio_mean": [0.5] * N})))
    assert tis.proof is not None and (tis.proof.rule, tis.kind) == ("off_policy", "off_policy")
