"""Trainer–trial agreement by evidence (docs/domain.md#agreement): do the trials show, over the
trainer's window, the collapse the trainer shows?

An agentic learning-quality KILL needs the two sides to agree on the mechanism. Labels are not the
evidence: the rollouts gate may pass (no trial raised) while the trials' own rewards collapsed, or
fail on a sandbox exception that the trainer's per-step lines name too — one mechanism seen from
both sides. So the verdict asks this module what the trials finished over the trainer's newest
MIN_WINDOW_STEPS steps show.

The window: trials finished after the trainer logged the step before its newest MIN_WINDOW_STEPS
steps (the rollouts of those steps were generated after it), up to `now`; every trial so far when
the window opens the run. At least MIN_WINDOW_STEPS trials must have finished in it to call.

Which trainer mechanisms the trials can show (TRIAL_COUNTERPARTS): a reward collapse predicts
trials whose rewards collapsed the same way, and is explained by trials that stop after about one
turn or fail on an exception the trainer names. Entropy, TIS and response-length collapses are
properties of the policy's token distribution that a trial's result does not show (an entropy
collapse can leave rewards intact or push turns to the cap): they have no counterpart and stay
unconfirmed unless the rollouts gate fails on the same `kind`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

import polars as pl

from shared.models import Quote
from worker.evidence.case import Evidence
from worker.gates.progress import minute_utc
from worker.gates.rollouts.agentic import SANDBOX, trial_quotes, with_cause
from worker.gates.rollouts.trainer import names, window_start

__all__ = ["TRIAL_COUNTERPARTS", "TrialSide", "trial_agreement"]

TRIAL_COUNTERPARTS: Final[dict[str, tuple[str, ...]]] = {
    "reward_collapse": ("rewards", "turns", "exceptions"),
}
"""The trial-side signs that show each trainer-side mechanism (by `GateResult.kind`)."""


@dataclass(frozen=True)
class TrialSide:
    """What the trials over the trainer's window show: whether it agrees, what (or why not), and
    the quotes that show it."""

    agrees: bool
    sign: str
    quotes: tuple[Quote, ...] = ()


@dataclass(frozen=True)
class _Window:
    evidence: Evidence
    since: datetime | None
    trials: pl.DataFrame  # finished in the window, `with_cause`
    finished: pl.DataFrame  # every finished trial up to now, `with_cause`

    @property
    def where(self) -> str:
        opened = f"since {minute_utc(self.since)}" if self.since else "since the run began"
        size = self.evidence.thresholds.min_window_steps
        return (
            f"the {self.trials.height} trials finished over the trainer's newest {size} steps "
            f"({opened})"
        )


def _window(evidence: Evidence) -> _Window:
    table = evidence.trials
    trials = table.trials if table is not None else pl.DataFrame()
    if trials.is_empty():
        empty = pl.DataFrame()
        return _Window(evidence, None, empty, empty)
    finished = trials.filter(
        (pl.col("status") == "finished") & (pl.col("finished_at") <= evidence.now)
    )
    finished = with_cause(finished).sort("finished_at")
    since = window_start(evidence.logs, evidence.thresholds)
    inside = finished if since is None else finished.filter(pl.col("finished_at") > since)
    return _Window(evidence, since, inside, finished)


def _rewards(w: _Window) -> TrialSide | None:
    """Trial rewards collapsed the same way: every reward in the window null or zero, or the
    window's mean under COLLAPSE_RATIO of the best MIN_WINDOW_STEPS-trial window's mean."""
    t = w.evidence.thresholds
    rewards = w.trials["reward"].fill_nan(None).fill_null(0.0)
    quotes = trial_quotes(w.trials)
    if bool((rewards == 0).all()):
        return TrialSide(True, f"{w.where} all scored zero or no reward", quotes)
    every = w.finished["reward"].fill_nan(None).fill_null(0.0)
    best = every.rolling_mean(t.min_window_steps).max()
    mean = float(rewards.mean() or 0.0)  # type: ignore[arg-type]
    if not isinstance(best, (int, float)) or best <= 0 or mean >= t.collapse_ratio * best:
        return None
    line = t.collapse_ratio * best
    return TrialSide(
        True,
        f"{w.where} have a mean reward {mean:.3f}, under {line:.3f} ({t.collapse_ratio:.0%} of "
        f"the best {t.min_window_steps}-trial window's {best:.3f})",
        quotes,
    )


def _turns(w: _Window) -> TrialSide | None:
    """Turn counts collapsed: the median turns of the window's trials that reached the agent at
    or under ONE_TURN_MEDIAN (a dead engine or a broken agent loop earns nothing)."""
    t = w.evidence.thresholds
    agent = w.trials.filter(
        pl.col("n_turns").is_not_null() & (pl.col("cause") != SANDBOX).fill_null(value=True)
    )
    median = agent["n_turns"].median()
    if agent.height < t.min_window_steps or not isinstance(median, (int, float)):
        return None
    if median > t.one_turn_median:
        return None
    sign = f"{w.where}: median {median:g} turns over the {agent.height} that reached the agent"
    return TrialSide(True, sign, trial_quotes(agent.sort("n_turns")))


def _exceptions(w: _Window) -> TrialSide | None:
    """The trials fail on an exception the trainer's own per-step lines name over the same window,
    on more than 1 - COLLAPSE_RATIO of the window's trials: enough failing trials, each earning
    nothing, to pull the mean under COLLAPSE_RATIO of what the others earn — one mechanism."""
    t = w.evidence.thresholds
    failed = w.trials.filter(pl.col("failure").is_not_null())
    if failed.is_empty():
        return None
    top = failed.group_by("failure").len().sort("len", descending=True).row(0)
    failure, count = str(top[0]), int(top[1])
    if count / w.trials.height <= 1 - t.collapse_ratio:
        return None
    naming = names(w.evidence.logs, failure, w.since, w.evidence.now)
    if not naming.named:
        return None
    sign = (
        f"{count} of {w.trials.height} trials over the trainer's window failed with {failure}, "
        f"which the trainer's own per-step lines name on {naming.naming} of {naming.lines}"
    )
    example = failed.filter(pl.col("failure") == failure)
    return TrialSide(True, sign, trial_quotes(example, limit=2) + naming.quotes)


_SIGNS: Final = {"rewards": _rewards, "turns": _turns, "exceptions": _exceptions}


def _healthy(w: _Window) -> str:
    stats = w.trials.select(
        mean=pl.col("reward").fill_nan(None).fill_null(0.0).mean(),
        turns=pl.col("n_turns").median(),
        failed=pl.col("failure").is_not_null().sum(),
    ).row(0, named=True)
    mean = "n/a" if stats["mean"] is None else f"{stats['mean']:.3f}"
    turns = "n/a" if stats["turns"] is None else f"{stats['turns']:g}"
    return (
        f"{w.where} do not show it: mean reward {mean}, median turns {turns}, "
        f"{stats['failed']} failed"
    )


def trial_agreement(evidence: Evidence, kind: str | None) -> TrialSide:
    """Whether the trials finished over the trainer's window show the trainer's mechanism `kind`
    (TRIAL_COUNTERPARTS): the first sign that holds, else why they do not agree."""
    counterparts = TRIAL_COUNTERPARTS.get(kind or "", ())
    if not counterparts:
        return TrialSide(False, f"a trial's result cannot show {kind or 'this mechanism'}")
    w = _window(evidence)
    t = evidence.thresholds
    if w.trials.height < t.min_window_steps:
        return TrialSide(
            False,
            f"only {w.trials.height} trials finished over the trainer's newest "
            f"{t.min_window_steps} steps (< {t.min_window_steps}): too few to agree",
            trial_quotes(w.trials) if not w.trials.is_empty() else (),
        )
    for name in counterparts:
        found = _SIGNS[name](w)
        if found is not None:
            return found
    return TrialSide(False, _healthy(w), trial_quotes(w.trials, limit=2))
