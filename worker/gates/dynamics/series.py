"""The run's training signals shaped once for every dynamics rule: one row per step, one column per
canonical signal (`worker.gates.metric_keys`), the phase rows, and the helpers that quote them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import polars as pl

from shared.models import Handoff, KillProof, Quote
from shared.settings import Thresholds
from worker.evidence.model import LogTables
from worker.evidence.quotes import quote
from worker.gates.metric_keys import (
    CANDIDATES,
    PHASE_PREFIX,
    STEP_PHASE,
    ResolvedKeys,
    present_keys,
    resolve,
)

__all__ = [
    "SIGNALS",
    "Finding",
    "Signals",
    "as_float",
    "metric_quote",
    "num",
    "quoted_value",
    "row_quote",
    "signal_quotes",
    "signals",
    "to_int",
]

SIGNALS: Final = (*CANDIDATES, "pass_at_k")
"""The canonical signal columns of the per-step series."""

PHASE_COLUMNS: Final = ("step", "phase", "seconds", "source", "line", "timestamp", "attempt")


@dataclass(frozen=True)
class Signals:
    """The run's canonical per-step series and the rows to quote them by."""

    keys: ResolvedKeys
    series: pl.DataFrame  # step, one Float64 column per SIGNALS name, step_s; one row per step
    metrics: pl.DataFrame  # long METRICS rows (all keys), for quoting
    phases: pl.DataFrame  # PHASE_COLUMNS, one row per (step, phase), newest attempt
    logs: LogTables
    limits: Thresholds

    @property
    def size(self) -> int:
        return self.limits.min_window_steps

    @property
    def steps(self) -> int:
        return self.series.height

    @property
    def short(self) -> bool:
        return self.steps < self.size

    @property
    def window(self) -> pl.DataFrame:
        return self.series.tail(self.size)

    def has(self, signal: str) -> bool:
        return self.keys.get(signal) is not None

    def key(self, signal: str) -> str:
        return self.keys.get(signal) or signal

    def column(self, signal: str) -> pl.DataFrame:
        """`step` and the signal's values, nulls and non-finite values dropped."""
        return self.series.select("step", signal).drop_nulls().filter(pl.col(signal).is_finite())

    def stamp(self, signal: str, step: int) -> datetime | None:
        """When the signal's row at `step` was logged."""
        rows = self.metrics.filter((pl.col("key") == self.key(signal)) & (pl.col("step") == step))
        value = rows["timestamp"].max() if not rows.is_empty() else None
        return value if isinstance(value, datetime) else None


@dataclass(frozen=True)
class Finding:
    """One FAIL condition, with everything the GateResult needs for it.

    A hard or learning-quality finding names its proof `rule` and when it was `established_at`;
    `kind` names the mechanism so the verdict can ask another gate for the same one.
    """

    summary: str
    mechanism: str
    evidence: tuple[Quote, ...]
    next_action: str
    flip_signal: str
    hard: bool = False
    learning_quality: bool = False
    handoff: Handoff | None = None
    rule: str | None = None
    kind: str | None = None
    established_at: datetime | None = None

    def proof(self, fallback: datetime) -> KillProof | None:
        """The proof this finding proposes (hard or learning-quality findings with a rule)."""
        if self.rule is None or not (self.hard or self.learning_quality) or not self.evidence:
            return None
        return KillProof(
            rule=self.rule,
            mechanism=self.mechanism,
            established_at=self.established_at or fallback,
            evidence=self.evidence,
        )


# --- building ------------------------------------------------------------------------------------


def _phase_rows(logs: LogTables) -> pl.DataFrame:
    """Phase durations, one row per (step, phase), the newest attempt's when a step repeats."""
    if not logs.phases.is_empty():
        rows = logs.phases.select(PHASE_COLUMNS)
    else:
        rows = logs.metrics.filter(pl.col("key").str.starts_with(PHASE_PREFIX)).select(
            "step",
            pl.col("key").str.strip_prefix(PHASE_PREFIX).alias("phase"),
            pl.col("value").alias("seconds"),
            *PHASE_COLUMNS[3:],
        )
    rows = rows.drop_nulls(["step", "phase", "seconds"])
    ordered = rows.sort(["step", "phase", "attempt", "line"], nulls_last=False)
    return ordered.unique(["step", "phase"], keep="last", maintain_order=True)


def _signal_column(wide: pl.DataFrame, key: str | None) -> pl.Expr:
    return pl.col(key) if key is not None and key in wide.columns else pl.lit(None)


def _series(logs: LogTables, keys: ResolvedKeys, phases: pl.DataFrame) -> pl.DataFrame:
    wide = logs.metrics_wide(k for name in SIGNALS if (k := keys.get(name)) is not None)
    columns = [
        _signal_column(wide, keys.get(name)).cast(pl.Float64).alias(name) for name in SIGNALS
    ]
    series = wide.select(pl.col("step"), *columns).filter(
        pl.any_horizontal(pl.col(name).is_not_null() for name in SIGNALS)
    )
    step_s = phases.filter(pl.col("phase") == STEP_PHASE).select(
        "step", pl.col("seconds").alias("step_s")
    )
    return series.join(step_s, on="step", how="left").sort("step")


def signals(logs: LogTables, limits: Thresholds) -> Signals:
    """The run's signals, resolved and shaped once."""
    keys = resolve(present_keys(logs.metrics))
    phases = _phase_rows(logs)
    return Signals(
        keys=keys,
        series=_series(logs, keys, phases),
        metrics=logs.metrics,
        phases=phases,
        logs=logs,
        limits=limits,
    )


# --- quoting -------------------------------------------------------------------------------------


def num(value: float | None) -> str:
    """A compact number for summaries."""
    if value is None:
        return "-"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}"


def quoted_value(value: float | None) -> str:
    """A metric value as quoted evidence: four decimals unless that would hide it."""
    if value is None or not math.isfinite(value):
        return num(value)
    if value != 0 and abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:.1f}" if abs(value) >= 1e4 else f"{value:.4f}"


def as_float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def to_int(value: object) -> int | None:
    return value if isinstance(value, int) else None


def row_quote(row: dict[str, Any], text: str) -> Quote:
    line = row.get("line")
    stamp = row.get("timestamp")
    return quote(
        source=str(row.get("source") or "?"),
        text=text,
        line=line if isinstance(line, int) else None,
        timestamp=stamp if isinstance(stamp, datetime) else None,
    )


def metric_quote(sig: Signals, key: str, step: int) -> Quote | None:
    """The METRICS row of `key` at `step`, quoted as `step N key=value`."""
    rows = sig.metrics.filter((pl.col("key") == key) & (pl.col("step") == step))
    if rows.is_empty():
        return None
    row = rows.row(-1, named=True)
    return row_quote(row, f"step {step} {key}={quoted_value(as_float(row['value']))}")


def signal_quotes(sig: Signals, signal: str, steps: Iterable[int | None]) -> tuple[Quote, ...]:
    """Quotes of one canonical signal at the given steps (absent rows and steps skipped)."""
    key = sig.keys.get(signal)
    if key is None:
        return ()
    found = (metric_quote(sig, key, step) for step in dict.fromkeys(steps) if step is not None)
    return tuple(q for q in found if q is not None)
