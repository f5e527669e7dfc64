"""Learning quality: collapses the trainer and the trials agree on, disagreements, and the
classic established failures (divergence, all-zero reward, broken router replay), beside the
look-alikes a careful engineer keeps running (a plateau, a spike that recovers, a dip recovering).
"""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

from tests.corpus.cases_stalls import ARGV
from tests.corpus.kit import T0, Labelled, healthy_run, noisy_steps, standard_finish
from tests.scenarios.builder import JobBuilder
from tests.scenarios.catalog import (
    AGENTIC_ARGV,
    Built,
    healthy_metrics,
    run_steps,
    start_attempt,
    with_metrics,
)


def _agentic(
    root: Path,
    name: str,
    reward: dict[int, float],
    trial_reward: float,
    *,
    exception: str | None = None,
    late_trials: float | None = None,
) -> Built:
    """24 steps of an agentic run whose trainer reward follows `reward` (step -> value, the last
    given value holds), with 8 trials per step; trials after step 12 score `late_trials` and
    raise `exception` when given."""

    def metrics(step: int) -> dict[str, float]:
        value = reward[max(k for k in reward if k <= step)]
        return healthy_metrics(step) | {
            "reward/avg_raw_reward": value,
            "reward/avg_pass_at_5": min(1.0, value * 1.6),
        }

    b = JobBuilder(root, name, T0)
    moment = start_attempt(b, T0)
    for step in range(1, 25):
        late = step > 12
        if late and exception:
            b.batch(moment, 4, 32, {exception: 28})
        for i in range(8):
            score = late_trials if late and late_trials is not None else trial_reward
            b.trial(
                f"fix-git-history__{step:03d}{i:04x}",
                moment + timedelta(seconds=20 * i),
                reward=1.0 if (i / 8) < score else 0.0,
                exception=exception if late and exception and i > 0 else None,
                message="Agent timed out after 900.0 seconds"
                if late and exception and i > 0
                else "",
                turns=6,
                agent_s=200.0,
            )
        moment = run_steps(b, moment, range(step, step + 1), metrics, seconds=300)
    return standard_finish(b, root, moment + timedelta(minutes=1), argv=AGENTIC_ARGV)


def agentic_collapse_agree(root: Path) -> Built:
    return _agentic(root, "rl-tasktrove-collapse", {1: 0.45, 13: 0.02}, 0.5, late_trials=0.0)


def agentic_collapse_named_exception(root: Path) -> Built:
    return _agentic(
        root,
        "rl-tasktrove-timeouts",
        {1: 0.45, 13: 0.03},
        0.5,
        exception="AgentTimeoutError",
        late_trials=0.0,
    )


def agentic_collapse_trials_healthy(root: Path) -> Built:
    return _agentic(root, "rl-tasktrove-disagree", {1: 0.45, 13: 0.02}, 0.5, late_trials=0.5)


def agentic_dip_recovering(root: Path) -> Built:
    return _agentic(
        root, "rl-tasktrove-dip", {1: 0.45, 10: 0.08, 17: 0.3, 20: 0.42}, 0.5, late_trials=0.375
    )


# --- standard ---------------------------------------------------------------------------------------


def _standard(root: Path, name: str, metrics: object, steps: int = 20) -> Built:
    b = JobBuilder(root, name, T0)
    end = noisy_steps(b, start_attempt(b, T0), range(1, steps + 1), metrics)  # type: ignore[arg-type]
    return standard_finish(b, root, end + timedelta(minutes=1), argv=ARGV)


def nan_persisting(root: Path) -> Built:
    def metrics(step: int) -> dict[str, float]:
        bad = {
            "policy/policy_loss": math.nan,
            "policy/raw_grad_norm": math.nan,
            "policy/policy_entropy": math.nan,
        }
        return healthy_metrics(step) | (bad if step >= 12 else {})

    return _standard(root, "rl-qwen-nan-weights", metrics, 16)


def nan_spike_recovered(root: Path) -> Built:
    def metrics(step: int) -> dict[str, float]:
        spike = {"policy/raw_grad_norm": math.inf, "policy/policy_loss": math.nan}
        return healthy_metrics(step) | (spike if step == 9 else {})

    return _standard(root, "rl-qwen-inf-spike", metrics, 18)


def zero_reward_from_start(root: Path) -> Built:
    zero = with_metrics(**{"reward/avg_raw_reward": 0.0, "reward/avg_pass_at_5": 0.0})
    return _standard(root, "rl-qwen-zero-reward", zero, 14)


def router_replay_broken(root: Path) -> Built:
    broken = with_metrics(
        **{
            "policy/log_ratio_abs_max": 18.7,
            "policy/policy_loss": 1.1e4,
            "policy/raw_grad_norm": 9.6e4,
            "policy/tis/imp_ratio_mean": 0.37,
            "generate/tis/exact_match_fraction": 0.58,
        }
    )
    return _standard(root, "rl-moe-router-replay-off", broken, 13)


def plateau_long(root: Path) -> Built:
    return _standard(root, "rl-qwen-plateau", with_metrics(**{"reward/avg_raw_reward": 0.38}), 30)


def entropy_cliff(root: Path) -> Built:
    def metrics(step: int) -> dict[str, float]:
        return healthy_metrics(step) | {
            "reward/avg_raw_reward": 0.31,
            "policy/policy_entropy": 1.1 if step <= 6 else 0.02,
        }

    return _standard(root, "rl-qwen-entropy-cliff", metrics, 22)


def too_few_steps(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-six-steps", T0)
    end = healthy_run(b, steps=6)
    return standard_finish(b, root, end + timedelta(minutes=1), argv=ARGV)


CASES: tuple[Labelled, ...] = (
    Labelled(
        "agentic_collapse_trials_agree_without_exceptions",
        agentic_collapse_agree,
        "KILL",
        "trainer reward 0.45 -> 0.02 from step 13 for twelve steps; the trials' own rewards fall "
        "to 0 over the same window, no trial raised: both sides show one collapse",
        {"dynamics": "FAIL"},
        mode="agentic",
    ),
    Labelled(
        "agentic_collapse_trainer_names_trial_exception",
        agentic_collapse_named_exception,
        "KILL",
        "trainer reward collapses from step 13 and its per-step `Exception breakdown` names "
        "AgentTimeoutError, which the trials raise: one mechanism seen from both sides",
        {"dynamics": "FAIL"},
        mode="agentic",
    ),
    Labelled(
        "agentic_trainer_collapse_trials_healthy",
        agentic_collapse_trials_healthy,
        "ERROR",
        "trainer reward collapses while the trials keep scoring 0.5: the sources disagree",
        mode="agentic",
    ),
    Labelled(
        "agentic_reward_dip_recovering",
        agentic_dip_recovering,
        "NO-KILL",
        "reward dipped for seven steps and recovers to 0.42 in the newest steps",
        mode="agentic",
    ),
    Labelled(
        "nan_weights_persisting",
        nan_persisting,
        "KILL",
        "loss, grad norm and entropy NaN on every step from 12 to 16: diverged weights",
        {"dynamics": "FAIL"},
    ),
    Labelled(
        "inf_grad_spike_recovered",
        nan_spike_recovered,
        "NO-KILL",
        "one step with an inf grad norm (an optimizer step skipped), finite since",
        {"dynamics": "PASS"},
    ),
    Labelled(
        "zero_reward_from_first_step",
        zero_reward_from_start,
        "KILL",
        "reward exactly 0 on all 14 steps from step 1: an infrastructure fingerprint",
        {"dynamics": "FAIL"},
    ),
    Labelled(
        "router_replay_fingerprint",
        router_replay_broken,
        "KILL",
        "max log-ratio ~19, loss ~1e4, grad norm ~1e5 on every step: broken router replay",
        {"dynamics": "FAIL"},
    ),
    Labelled(
        "reward_plateau_thirty_steps",
        plateau_long,
        "NO-KILL",
        "reward flat at 0.38 for thirty steps: a plateau alone is never a kill",
        {"dynamics": "PASS"},
    ),
    Labelled(
        "entropy_cliff_reward_flat",
        entropy_cliff,
        "KILL",
        "entropy 1.1 -> 0.02 at step 7 and stays there while reward does not improve",
        {"dynamics": "FAIL"},
    ),
    Labelled(
        "six_steps_too_few_for_dynamics",
        too_few_steps,
        "ERROR",
        "six steps after start-up: the learning window (10 steps) cannot be judged yet",
        {"dynamics": "ERROR"},
    ),
)
