"""Truncated importance sampling out of its healthy range: rollout and trainer disagree."""

from __future__ import annotations

from typing import Final

import polars as pl

from shared.models import Handoff
from shared.settings import Thresholds
from worker.gates.dynamics.series import Finding, Signals, as_float, num, signal_quotes
from worker.gates.dynamics.trend import recovers
from worker.gates.rules import rule

__all__ = ["TIS_RULES", "tis"]

TIS_HANDOFF: Final = {
    "likely_cause": (
        "rollout and trainer log-probabilities disagree (off-policy mismatch): sampling settings, "
        "dtype or a stale/partial weight sync between trainer and vLLM"
    ),
    "component": "rollout/trainer log-prob agreement: vLLM sampling config and the weight sync",
    "proposed_behavior": "trainer and rollout log-probabilities agree within the TIS healthy range",
}

TIS_RULES: Final = (
    # signal, label, lower bound field, upper bound field (on Thresholds)
    ("tis_ratio", "importance-ratio mean", "tis_ratio_mean_min", "tis_ratio_mean_max"),
    ("tis_log_abs", "mean |log ratio|", None, "tis_log_ratio_abs_max"),
    ("tis_capped", "capped fraction", None, "tis_capped_fraction_max"),
    ("tis_exact", "exact-match fraction", "tis_exact_match_min", None),
)


def _mask(signal: str, low: float | None, high: float | None) -> pl.Expr:
    column = pl.col(signal)
    out = pl.lit(False)
    if low is not None:
        out |= column < low
    if high is not None:
        out |= column > high
    return out.fill_null(False)


def _bound(limits: Thresholds, name: str | None) -> float | None:
    return None if name is None else float(getattr(limits, name))


def _healthy_range(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"{num(low)}–{num(high)}"
    return f"≥ {num(low)}" if low is not None else f"≤ {num(high)}"


def _recovering(window: pl.DataFrame, signal: str, low: float | None, high: float | None) -> bool:
    """The metric's trend over the window re-enters the healthy range within one more window."""
    tail = window.select("step", signal).drop_nulls()
    if tail.height < 2:
        return False
    median = as_float(tail[signal].median())
    if low is not None and median is not None and median < low:
        return recovers(tail, signal, low, healthy_above=True)
    if high is not None:
        return recovers(tail, signal, high, healthy_above=False)
    return False


def _violations(sig: Signals) -> list[tuple[str, str]]:
    """(signal, description) of each TIS metric out of range on every step of the window and not
    trending back into range."""
    window, found = sig.window, []
    for signal, label, low_name, high_name in TIS_RULES:
        low, high = _bound(sig.limits, low_name), _bound(sig.limits, high_name)
        if not sig.has(signal) or not window.select(_mask(signal, low, high).all()).item():
            continue
        if _recovering(window, signal, low, high):
            continue
        median = as_float(window[signal].median())
        found.append(
            (signal, f"{label} median {num(median)} (healthy {_healthy_range(low, high)})")
        )
    return found


@rule("dynamics.tis")
def tis(sig: Signals) -> Finding | None:
    """A TIS metric (importance-ratio mean, mean |log ratio|, capped or exact-match fraction)
    outside its healthy range on every step of the window, not trending back into it: the rollouts
    are off-policy for the trainer."""
    violations = _violations(sig)
    if sig.window.is_empty() or not violations:
        return None
    first, newest = int(sig.window["step"][0]), int(sig.window["step"][-1])
    evidence = tuple(q for name, _ in violations for q in signal_quotes(sig, name, [newest]))
    described = "; ".join(text for _, text in violations)
    keys = ", ".join(sig.key(name) for name, _ in violations)
    handoff = Handoff(
        evidence=evidence,
        test=f"a short run with the same config keeps {keys} within the healthy range "
        "on every step",
        **TIS_HANDOFF,
    )
    return Finding(
        summary=f"TIS out of the healthy range on every step {first}–{newest}, not trending "
        f"back: {described}",
        mechanism=f"off-policy mismatch between rollout and trainer ({keys} out of range)",
        evidence=evidence,
        next_action="learning-quality KILL candidate: confirm with rollout evidence, then check "
        "the weight sync and vLLM sampling settings against the trainer's",
        flip_signal=f"{keys} back within the healthy range for a {sig.size}-step window",
        learning_quality=True,
        handoff=handoff,
        rule="off_policy",
        kind="off_policy",
        established_at=sig.stamp(violations[0][0], newest),
    )
