"""Phase times across the window: one phase inflating step over step is a pipeline bubble."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl

from shared.models import Quote, Table
from worker.gates.dynamics.series import Finding, Signals, as_float, num, row_quote
from worker.gates.metric_keys import STEP_PHASE
from worker.gates.rules import rule

__all__ = ["PHASE_MIN_PRESENCE", "PhaseTable", "phase_inflation", "phase_table", "phase_tables"]

PHASE_MIN_PRESENCE: Final = 0.5
"""A phase must appear on this share of the steps of both windows to be compared step over step."""


@dataclass(frozen=True)
class PhaseTable:
    """Median phase seconds in the first and the last window of phase steps."""

    rows: pl.DataFrame  # phase, first_s, first_n, last_s, last_n, ratio, note, judged
    first_steps: tuple[int, int]
    last_steps: tuple[int, int]


def _window_medians(phases: pl.DataFrame, steps: pl.Series, prefix: str) -> pl.DataFrame:
    return (
        phases.filter(pl.col("step").is_in(steps.implode()))
        .group_by("phase")
        .agg(pl.col("seconds").median().alias(f"{prefix}_s"), pl.len().alias(f"{prefix}_n"))
    )


def _phase_note(sig: Signals, step_s: float | None) -> pl.Expr:
    """Why a phase is or is not judged, as the phase table's last column."""
    present = sig.size * PHASE_MIN_PRESENCE
    floor = (step_s or 0.0) * sig.limits.buffer_wait_share
    sparse = (pl.col("first_n") < present) | (pl.col("last_n") < present)
    return (
        pl.when(pl.col("phase") == STEP_PHASE)
        .then(pl.lit("step total, not judged"))
        .when(sparse.fill_null(True))
        .then(pl.lit("not every step, not judged"))
        .when(pl.col("last_s") < floor)
        .then(pl.lit("near zero, not judged"))
        .when(pl.col("ratio") > sig.limits.phase_inflation)
        .then(pl.lit("INFLATED"))
        .otherwise(pl.lit(""))
    )


def phase_table(sig: Signals) -> PhaseTable | None:
    """First- and last-window medians per phase, or None with fewer phase steps than a window."""
    steps = sig.phases["step"].unique().sort()
    if steps.len() < sig.size:
        return None
    first, last = steps.head(sig.size), steps.tail(sig.size)
    table = _window_medians(sig.phases, first, "first").join(
        _window_medians(sig.phases, last, "last"), on="phase", how="full", coalesce=True
    )
    step_last = table.filter(pl.col("phase") == STEP_PHASE)["last_s"]
    step_s = as_float(step_last[0]) if step_last.len() else None
    ratio = pl.when(pl.col("first_s") > 0).then(pl.col("last_s") / pl.col("first_s"))
    rows = (
        table.with_columns(ratio.alias("ratio"))
        .with_columns(_phase_note(sig, step_s).alias("note"))
        .with_columns(pl.col("note").is_in(["", "INFLATED"]).alias("judged"))
    )
    return PhaseTable(
        rows=rows.sort(["ratio", "phase"], descending=[True, False], nulls_last=True),
        first_steps=(int(first[0]), int(first[-1])),
        last_steps=(int(last[0]), int(last[-1])),
    )


def phase_tables(
    table: PhaseTable | None, sig: Signals
) -> tuple[tuple[str, ...], tuple[Table, ...]]:
    """(detail lines, tables): the phase table as data, or a line saying why there is none."""
    if table is None:
        count = sig.phases["step"].n_unique()
        return (
            f"phases: {count} step(s) with phase times < window of {sig.size}: not compared",
        ), ()
    first, last = table.first_steps, table.last_steps
    rows = tuple(
        (row["phase"], row["first_s"], row["last_s"], row["ratio"], row["note"])
        for row in table.rows.iter_rows(named=True)
    )
    return (), (
        Table(
            title=f"phases: first window steps {first[0]}–{first[1]}, last window steps "
            f"{last[0]}–{last[1]}",
            columns=("phase", "first-window median s", "last-window median s", "ratio", "note"),
            rows=rows,
            units=("", "", "", "×", ""),
        ),
    )


def _phase_quotes(sig: Signals, phase: str, table: PhaseTable) -> tuple[Quote, ...]:
    rows = sig.phases.filter(pl.col("phase") == phase)
    first = rows.filter(pl.col("step") <= table.first_steps[1]).head(1)
    newest = rows.filter(pl.col("step") >= table.last_steps[0]).tail(1)
    return tuple(
        row_quote(row, f"step {row['step']} {phase} {row['seconds']:.2f} s")
        for part in (first, newest)
        for row in part.iter_rows(named=True)
    )


@rule("dynamics.phases")
def phase_inflation(sig: Signals, table: PhaseTable | None) -> Finding | None:
    """A phase's last-window median over its first-window median above PHASE_INFLATION (on a phase
    present on most steps of both windows and not near zero) is a pipeline bubble to attribute —
    an inefficiency, never a kill by itself."""
    if table is None:
        return None
    limit = sig.limits.phase_inflation
    inflated = table.rows.filter(pl.col("judged") & (pl.col("ratio") > limit))
    if inflated.is_empty():
        return None
    row = inflated.row(0, named=True)
    phase = str(row["phase"])
    return Finding(
        summary=f"phase {phase} inflated {row['ratio']:.1f}×: median {num(row['first_s'])} s in "
        f"steps {table.first_steps[0]}–{table.first_steps[1]} → {num(row['last_s'])} s in steps "
        f"{table.last_steps[0]}–{table.last_steps[1]} (limit {num(limit)}×)",
        mechanism=f"pipeline bubble: {phase} inflating step over step",
        evidence=_phase_quotes(sig, phase, table),
        next_action=f"attribute the {phase} bubble (engine saturation, weight-sync size, "
        "storage, a starved generation buffer) before any action; not a kill by itself",
        flip_signal=f"{phase} last-window median back under {num(limit * row['first_s'])} s "
        f"({num(limit)}× its first-window median)",
        kind="phase_inflation",
    )
