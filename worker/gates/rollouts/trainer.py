"""The trainer's side of the rollouts story, read from its own per-step lines: whether it trains on
zeros, whether its reward fell under COLLAPSE_RATIO of its best window, and whether its per-step
lines name a trial exception (`Exception breakdown: {...}` batch lines, `generate/errors/<type>`
metrics). The agentic rules and the verdict's trainer–trial agreement read the trials against it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Final

import polars as pl

from shared.models import Quote
from shared.settings import Thresholds
from worker.evidence.model import LogTables
from worker.evidence.quotes import quote_rows
from worker.gates import metric_keys as mk
from worker.gates.progress import newest_attempt
from worker.gates.rollouts.standard import metric_quotes, reward_rows

__all__ = [
    "Naming",
    "TrainerRewards",
    "batch_quotes",
    "names",
    "reward_collapsed",
    "trainer_rewards",
    "window_start",
]

_IDENTIFIER: Final = re.compile(r"^[A-Za-z_]\w*$")


@dataclass(frozen=True)
class TrainerRewards:
    """The trainer's side of the reward story: True all zero, False positive, None unknown."""

    all_zero: bool | None
    quotes: tuple[Quote, ...] = ()


def batch_quotes(batches: pl.DataFrame, limit: int = 2) -> tuple[Quote, ...]:
    """The newest batch lines, quoted with their breakdown and success counts."""
    texted = batches.with_columns(
        _text=pl.format(
            "Exception breakdown: {}; Batch generation complete: {}/{} successful, {} failed, "
            "{} masked",
            "exceptions",
            "successful",
            "total",
            "failed",
            "masked",
        )
    )
    return quote_rows(texted.tail(limit), text_column="_text", limit=limit)


def _batches(logs: LogTables) -> pl.DataFrame:
    return logs.batches.filter(pl.col("attempt") == newest_attempt(logs)).sort("line")


def trainer_rewards(logs: LogTables | None, steps: int) -> TrainerRewards:
    """Whether the trainer trains on zeros: batch lines first, then the reward metric."""
    if logs is None:
        return TrainerRewards(None)
    batches = _batches(logs)
    if not batches.is_empty():
        newest = batches.tail(steps)
        zero = bool((newest["successful"].fill_null(0) == 0).all())
        if zero:
            return TrainerRewards(True, batch_quotes(newest))
    rewards = reward_rows(logs).tail(steps)
    if rewards.is_empty():
        return TrainerRewards(None)
    zero = bool((rewards["value"].fill_nan(None).fill_null(0.0) == 0).all())
    return TrainerRewards(zero, metric_quotes(rewards))


def _by_step(logs: LogTables) -> pl.DataFrame:
    """The trainer's reward rows, one per step (the newest attempt's value for a repeated one)."""
    return reward_rows(logs).sort("step", "line").unique("step", keep="last").sort("step")


def reward_collapsed(logs: LogTables | None, limits: Thresholds) -> bool:
    """The trainer's newest MIN_WINDOW_STEPS-step reward mean is under COLLAPSE_RATIO of its best
    window's mean (a positive best): its reward is down where all-zero trials are no surprise."""
    if logs is None:
        return False
    size = limits.min_window_steps
    values = _by_step(logs)["value"].fill_nan(None).fill_null(0.0)
    if values.len() < size:
        return False
    rolling = values.rolling_mean(size).drop_nulls()
    best, newest = rolling.max(), rolling[-1]
    if not isinstance(best, (int, float)) or best <= 0:
        return False
    return bool(newest < limits.collapse_ratio * best)


def window_start(logs: LogTables | None, limits: Thresholds) -> datetime | None:
    """When the trainer's newest MIN_WINDOW_STEPS-step window began: the time of the reward row of
    the step before it (its rollouts were generated after that); None when the window opens the
    run (every trial so far belongs to it)."""
    if logs is None:
        return None
    rows = _by_step(logs)
    size = limits.min_window_steps
    if rows.height <= size:
        return None
    before = rows["timestamp"][rows.height - size - 1]
    return before if isinstance(before, datetime) else None


@dataclass(frozen=True)
class Naming:
    """How the trainer's per-step lines of a window name one trial exception type."""

    lines: int  # the window's per-step lines that could name it (batch lines, error metric steps)
    naming: int  # those that name it with a count above 0
    quotes: tuple[Quote, ...] = ()

    @property
    def named(self) -> bool:
        return self.naming > 0

    @property
    def every_line(self) -> bool:
        return self.lines > 0 and self.naming == self.lines


def _in_window(frame: pl.DataFrame, since: datetime | None, until: datetime) -> pl.DataFrame:
    keep = pl.col("timestamp") <= until
    if since is not None:
        keep &= pl.col("timestamp") > since
    return frame.filter(keep.fill_null(value=False))


def _breakdown_count(exception_type: str) -> pl.Expr:
    """The count a batch line's breakdown gives `exception_type` (0 when it names it not)."""
    if not _IDENTIFIER.match(exception_type):
        return pl.lit(0, pl.Int64)
    found = pl.col("exceptions").str.json_path_match(f"$.{exception_type}")
    return found.cast(pl.Int64, strict=False).fill_null(0)


def _named_batches(batches: pl.DataFrame, exception_type: str) -> Naming:
    counted = batches.with_columns(_n=_breakdown_count(exception_type))
    naming = counted.filter(pl.col("_n") > 0)
    return Naming(batches.height, naming.height, batch_quotes(naming))


def _named_metrics(window: pl.DataFrame, exception_type: str, newest: int | None) -> Naming:
    key = f"{mk.GENERATION_ERROR_PREFIX}{exception_type}"
    rows = window.filter(pl.col("key") == key).sort("step")
    rows = rows.tail(newest) if newest is not None else rows
    naming = rows.filter(pl.col("value").fill_nan(None).fill_null(0.0) > 0)
    return Naming(rows.height, naming.height, metric_quotes(naming))


def names(
    logs: LogTables | None,
    exception_type: str | None,
    since: datetime | None,
    until: datetime,
    newest: int | None = None,
) -> Naming:
    """How the trainer's per-step lines logged in `(since, until]` (only the `newest` of them
    when given) name `exception_type`: its batch lines' `Exception breakdown` (the newest
    attempt's), else its `generate/errors/<type>` metric. A type the trainer has no line for is
    named by none."""
    if logs is None or not exception_type:
        return Naming(0, 0)
    batches = _in_window(_batches(logs), since, until)
    if not batches.is_empty():
        return _named_batches(batches.tail(newest) if newest else batches, exception_type)
    return _named_metrics(_in_window(logs.metrics, since, until), exception_type, newest)
