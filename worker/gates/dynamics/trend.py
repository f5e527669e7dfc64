"""Trends of the reward and entropy series: collapse held over the window, and recovery.

A learning-quality failure must hold over the whole configured window (MIN_WINDOW_STEPS) and show
no recovery in the newest steps *for its own mechanism*: recovery is the least-squares trend of the
signal over the newest window reaching the healthy line again within one more window
(`recovers`). The same test serves reward, entropy, TIS and response length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from shared.models import Quote
from worker.gates.dynamics.series import (
    Finding,
    Signals,
    as_float,
    metric_quote,
    num,
    row_quote,
    signal_quotes,
    to_int,
)
from worker.gates.metric_keys import WEIGHT_SYNC_PHASE
from worker.gates.rules import rule

__all__ = [
    "RewardTrend",
    "entropy_collapse",
    "projection",
    "recovers",
    "reward_collapse",
    "reward_trend",
]


def projection(tail: pl.DataFrame, column: str, size: int) -> float:
    """Least-squares trend of `column` over `tail`, evaluated one window after its newest step."""
    x = pl.col("step").cast(pl.Float64) - pl.col("step").cast(pl.Float64).mean()
    y = pl.col(column) - pl.col(column).mean()
    denominator = (x * x).sum()
    slope = pl.when(denominator > 0).then((x * y).sum() / denominator).otherwise(0.0)
    projected = pl.col(column).mean() + slope * (x.last() + size)
    value = tail.select(projected).item()
    return float(value) if value is not None else math.nan


def recovers(tail: pl.DataFrame, column: str, line: float, *, healthy_above: bool) -> bool:
    """Whether the window's trend reaches the healthy side of `line` within one more window."""
    projected = projection(tail, column, tail.height)
    if math.isnan(projected):
        return False
    return projected >= line if healthy_above else projected <= line


# --- the reward trend ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RewardTrend:
    """The reward series summarised for the collapse, entropy and PASS judgements."""

    key: str
    first_mean: float
    first_noise: float  # step-to-step noise of the first window: std of differences / sqrt(2)
    last_mean: float
    best_mean: float
    best_end: int  # last step of the best window
    line: float  # COLLAPSE_RATIO x best window mean
    last_healthy: int | None  # newest step at or above the line
    below_since: int | None  # first step after it
    below_steps: int  # steps since the last healthy step
    projected: float  # the window's trend line one window after the newest step

    @property
    def improving(self) -> bool:
        return self.last_mean > self.first_mean + self.first_noise

    @property
    def recovering(self) -> bool:
        return self.projected >= self.line


def reward_trend(sig: Signals) -> RewardTrend | None:
    """The reward trend, when the reward series covers at least a window."""
    reward = sig.column("reward")
    if reward.height < sig.size:
        return None
    best_index = reward["reward"].rolling_mean(sig.size).arg_max()
    best = reward.slice((best_index or 0) - sig.size + 1, sig.size)
    best_mean = as_float(best["reward"].mean()) or 0.0
    line = sig.limits.collapse_ratio * best_mean
    last_healthy = to_int(reward.filter(pl.col("reward") >= line)["step"].max())
    below = reward.filter(pl.col("step") > (last_healthy if last_healthy is not None else -1))
    first, last = reward.head(sig.size)["reward"], reward.tail(sig.size)["reward"]
    return RewardTrend(
        key=sig.key("reward"),
        first_mean=as_float(first.mean()) or 0.0,
        first_noise=(as_float(first.diff().std()) or 0.0) / math.sqrt(2),
        last_mean=as_float(last.mean()) or 0.0,
        best_mean=best_mean,
        best_end=int(best["step"][-1]),
        line=line,
        last_healthy=last_healthy,
        below_since=to_int(below["step"].min()),
        below_steps=below.height,
        projected=projection(reward.tail(sig.size), "reward", sig.size),
    )


def _collapsed(trend: RewardTrend | None, size: int) -> bool:
    """Collapsed from a positive best window, below the line a full window, not recovering."""
    if trend is None or trend.best_mean <= 0 or trend.below_since is None:
        return False
    sustained = trend.below_steps >= size and trend.last_mean < trend.line
    return sustained and not trend.recovering


# --- what happened at the collapse ---------------------------------------------------------------


def _attempt_change(sig: Signals, before: int, at: int) -> tuple[str, Quote] | None:
    key = sig.key("reward")
    rows = sig.metrics.filter((pl.col("key") == key) & pl.col("step").is_in([before, at]))
    attempts = rows.sort("step")["attempt"].to_list()
    if len(attempts) != 2 or attempts[0] == attempts[1]:
        return None
    found = metric_quote(sig, key, at)
    text = f"an attempt change ({attempts[0]} → {attempts[1]}) at step {at}"
    return (text, found) if found is not None else None


def _resume_near(sig: Signals, before: int, at: int) -> tuple[str, Quote] | None:
    resumes = sig.logs.resumes
    stamps = sig.metrics.filter(
        (pl.col("key") == sig.key("reward")) & pl.col("step").is_in([before, at])
    )["timestamp"]
    in_steps = pl.col("step").is_between(before - sig.size, at)
    in_time = pl.col("timestamp").is_between(stamps.min(), stamps.max())
    near = resumes.filter((in_steps | in_time).fill_null(False)).sort("line")
    if near.is_empty():
        return None
    row = near.row(0, named=True)
    return f"a resume ({row['text']})", row_quote(row, str(row["text"]))


def _sync_spike(sig: Signals, before: int, at: int) -> tuple[str, Quote] | None:
    syncs = sig.phases.filter(pl.col("phase") == WEIGHT_SYNC_PHASE)
    median = as_float(syncs["seconds"].median())
    if median is None or median <= 0:
        return None
    limit = sig.limits.phase_inflation * median
    spikes = syncs.filter(pl.col("step").is_between(before, at) & (pl.col("seconds") > limit))
    if spikes.is_empty():
        return None
    row = spikes.sort("seconds").row(-1, named=True)
    seconds = f"{num(row['seconds'])} s vs run median {num(median)} s"
    text = f"weight sync at step {row['step']} ({seconds})"
    return text, row_quote(row, f"step {row['step']} {WEIGHT_SYNC_PHASE} {row['seconds']:.2f} s")


def _collapse_context(sig: Signals, before: int, at: int) -> list[tuple[str, Quote]]:
    """Events between the last healthy step and the collapse that may explain it."""
    probes = (_sync_spike, _resume_near, _attempt_change)
    return [found for probe in probes if (found := probe(sig, before, at)) is not None]


# --- the rules -----------------------------------------------------------------------------------


@rule("dynamics.trend")
def reward_collapse(sig: Signals, trend: RewardTrend | None) -> Finding | None:
    """Reward fell under COLLAPSE_RATIO of its best window and stayed there a whole window, and its
    trend over the newest window does not reach the line again within one more: a collapse, not
    noise or a dip that is recovering."""
    if trend is None or not _collapsed(trend, sig.size):
        return None
    at, before = int(trend.below_since or 0), int(trend.last_healthy or trend.best_end)
    context = _collapse_context(sig, before, at)
    cause = f" after {context[0][0]}" if context else " (no resume, attempt change or weight-sync"
    cause += "" if context else " spike next to it)"
    newest = int(sig.window["step"][-1])
    evidence = signal_quotes(sig, "reward", [before, at, newest]) + tuple(q for _, q in context)
    ratio = sig.limits.collapse_ratio
    return Finding(
        summary=f"reward collapse at step {at}: {trend.key} last-window mean "
        f"{num(trend.last_mean)} < {num(trend.line)} ({ratio:.0%} of best window "
        f"{num(trend.best_mean)}) for {trend.below_steps} steps; its trend reaches "
        f"{num(trend.projected)} within {sig.size} steps: not recovering",
        mechanism=f"reward collapse at step {at}{cause}",
        evidence=evidence,
        next_action=f"learning-quality KILL candidate: confirm with rollout/trial evidence, then "
        f"inspect what changed at step {at} (weight sync, resume, config, data)",
        flip_signal=f"{trend.key} back above {num(trend.line)} ({ratio:.0%} of best window "
        f"{num(trend.best_mean)}) for a {sig.size}-step window",
        learning_quality=True,
        rule="reward_collapse",
        kind="reward_collapse",
        established_at=sig.stamp("reward", newest),
    )


@rule("dynamics.trend")
def entropy_collapse(sig: Signals, trend: RewardTrend | None) -> Finding | None:
    """Entropy under ENTROPY_COLLAPSE_RATIO of its early median on every step of the newest window,
    not trending back within one more window, while reward is not improving: the policy has
    collapsed onto a few outputs (a slow fall while reward improves is expected)."""
    entropy = sig.column("entropy")
    if trend is None or trend.improving or entropy.height < sig.size:
        return None
    early = as_float(entropy.head(sig.size)["entropy"].median())
    if early is None or early <= 0:
        return None
    line = sig.limits.entropy_collapse_ratio * early
    tail = entropy.tail(sig.size)
    if not bool((tail["entropy"] < line).all()):
        return None
    if recovers(tail, "entropy", line, healthy_above=True):
        return None
    since = int(entropy.filter(pl.col("entropy") < line)["step"][0])
    newest = int(entropy["step"][-1])
    key = sig.key("entropy")
    late = as_float(tail["entropy"].median())
    return Finding(
        summary=f"entropy collapse: {key} under {num(line)} "
        f"({sig.limits.entropy_collapse_ratio:.0%} of early median {num(early)}) on every step "
        f"of the newest window (median {num(late)}) since step {since}, not trending back, while "
        f"{trend.key} is not improving ({num(trend.first_mean)} → {num(trend.last_mean)})",
        mechanism=f"entropy collapse from step {since} with reward not improving",
        evidence=signal_quotes(sig, "entropy", [since, newest])
        + signal_quotes(sig, "reward", [newest]),
        next_action="learning-quality KILL candidate: confirm with rollout evidence (repetitive or "
        "degenerate samples), then check the entropy/KL settings and the learning rate",
        flip_signal=f"{key} back above {num(line)} or {trend.key} improving past "
        f"{num(trend.first_mean + trend.first_noise)} over a {sig.size}-step window",
        learning_quality=True,
        rule="entropy_collapse",
        kind="entropy_collapse",
        established_at=sig.stamp("entropy", newest),
    )
