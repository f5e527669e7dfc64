"""Agentic batch lines joined with the same actor's `Exception breakdown` printed before them."""

from __future__ import annotations

from typing import Final

import polars as pl

from worker.evidence import schema
from worker.evidence.logs.state import ParserState

__all__ = ["batch_metrics", "batch_rows"]

_BATCH: Final = (
    r"Batch generation \w+: (\d+)/(\d+) successful, (\d+) failed instances?, (\d+) masked"
)
_CONSUMED: Final = ""
# built without running a query: no polars thread pool before a fork (test_failure_catalogue)
_NO_BATCHES: Final = pl.DataFrame(
    schema={
        ("ts" if k == "timestamp" else k): v for k, v in schema.BATCHES.items() if k != "source"
    }
)


def _joined(ev: pl.DataFrame, state: ParserState) -> pl.DataFrame:
    rows = ev.filter(pl.col("kind").is_in(["breakdown", "batch"]))
    breakdown = pl.col("msg").str.extract(r"Exception breakdown: (\{.*\})", 1)
    event = (
        pl.when(pl.col("kind") == "breakdown")
        .then(breakdown.fill_null("{}"))
        .otherwise(pl.lit(_CONSUMED))
    )
    carried = pl.col("actor").replace_strict(state.breakdowns, default=None, return_dtype=pl.String)
    prev = event.forward_fill().shift(1).over("actor")
    rows = rows.with_columns(_event=event, _prev=pl.coalesce(prev, carried))
    _carry(rows, state)
    return rows.filter(pl.col("kind") == "batch")


def _carry(rows: pl.DataFrame, state: ParserState) -> None:
    last = rows.group_by("actor").agg(pl.col("_event").last())
    for actor, event in last.iter_rows():
        if event == _CONSUMED:
            state.breakdowns.pop(actor, None)
        else:
            state.breakdowns[actor] = event


def batch_rows(ev: pl.DataFrame, state: ParserState) -> pl.DataFrame:
    """BATCHES rows (without `source`); advances `state.breakdowns`."""
    if ev.filter(pl.col("kind").is_in(["breakdown", "batch"])).is_empty():
        return _NO_BATCHES  # most logs print none: skip the joins
    rows = _joined(ev, state)
    parsed = pl.col("msg").str.extract_groups(_BATCH).struct
    exceptions = pl.col("_prev").fill_null("{}").replace(_CONSUMED, "{}")
    return rows.select(
        step="step_ctx",
        successful=parsed.field("1").cast(pl.Int64, strict=False),
        total=parsed.field("2").cast(pl.Int64, strict=False),
        failed=parsed.field("3").cast(pl.Int64, strict=False),
        masked=parsed.field("4").cast(pl.Int64, strict=False),
        exceptions=exceptions.str.replace_all("'", '"'),
        line="line",
        ts="ts",
        attempt="attempt",
    ).filter(pl.col("total").is_not_null())


def batch_metrics(batches: pl.DataFrame) -> pl.DataFrame:
    """Per-step `batch_errors/*` totals of a BATCHES table as METRICS rows (origin `batch`)."""
    sums = {
        "batch_errors/total_batches": pl.len().cast(pl.Float64),
        "batch_errors/total_instances": pl.col("total").sum().cast(pl.Float64),
        "batch_errors/total_successful": pl.col("successful").sum().cast(pl.Float64),
        "batch_errors/total_failed": pl.col("failed").sum().cast(pl.Float64),
        "batch_errors/total_masked": pl.col("masked").sum().cast(pl.Float64),
    }
    known = batches.filter(pl.col("step").is_not_null())
    per_step = known.group_by("step", "attempt").agg(
        pl.col("line").last(), pl.col("timestamp").last(), **sums
    )
    long = per_step.unpivot(
        index=["step", "attempt", "line", "timestamp"], variable_name="key", value_name="value"
    )
    return long.with_columns(origin=pl.lit("batch"))
