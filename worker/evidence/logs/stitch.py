"""From the raw rows of one or more files to the final tables.

METRICS keeps one row per (step, key): explicit-step sources (mirror, console) win over inferred
ones (policy dict, reward line, batch); among equals the newest attempt, then the latest line wins.
PHASES are finished timers (one per step and phase, same rule) plus `timing/<phase>` metric keys for
the steps and phases no timer line covered.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from worker.evidence import schema
from worker.evidence.logs.batches import batch_metrics
from worker.evidence.model import LogTables, ParseSummary

__all__ = ["EXPLICIT_ORIGINS", "build_tables", "phases", "stitch_metrics", "with_batch_metrics"]

EXPLICIT_ORIGINS: Final = ("mirror", "console")
_ATTEMPT_WEIGHT: Final = 2**40  # lines stay below this
_EXPLICIT_WEIGHT: Final = 2**62


def _newest(frame: pl.DataFrame, keys: list[str], explicit: pl.Expr | None = None) -> pl.DataFrame:
    """The row of each key with the highest (explicit, attempt, line); ties keep the later row."""
    rank = pl.col("attempt").cast(pl.Int64) * _ATTEMPT_WEIGHT + pl.col("line")
    if explicit is not None:
        rank = rank + explicit.cast(pl.Int64) * _EXPLICIT_WEIGHT
    ordered = frame.with_columns(_rank=rank).sort("_rank", maintain_order=True)
    # `keep="last"` keeps the last row of each key in `ordered`, whatever the output order.
    return ordered.unique(keys, keep="last", maintain_order=False).drop("_rank")


def stitch_metrics(raw: pl.DataFrame) -> pl.DataFrame:
    """One row per (step, key), sorted by step and key."""
    known = raw.filter(pl.col("step").is_not_null())
    explicit = pl.col("origin").is_in(list(EXPLICIT_ORIGINS))
    best = _newest(known, ["step", "key"], explicit)
    return best.sort("step", "key").select(list(schema.METRICS))


def with_batch_metrics(raw_metrics: pl.DataFrame, batches: pl.DataFrame) -> pl.DataFrame:
    """`raw_metrics` plus the per-step batch totals (newest attempt of each step)."""
    if batches.is_empty():
        return raw_metrics
    totals = batch_metrics(batches).with_columns(source=pl.lit(batches.get_column("source")[-1]))
    totals = totals.select(pl.col(n).cast(t) for n, t in schema.METRICS.items())
    return pl.concat([raw_metrics, totals])


def phases(timers: pl.DataFrame, metrics: pl.DataFrame) -> pl.DataFrame:
    """PHASES from finished timers and `timing/<phase>` keys."""
    finished = timers.filter(
        (pl.col("event") == "finished")
        & pl.col("step").is_not_null()
        & pl.col("seconds").is_not_null()
    )
    timed = _newest(finished, ["step", "phase"]).select(list(schema.PHASES))
    keyed = metrics.filter(pl.col("key").str.starts_with("timing/")).select(
        "step",
        phase=pl.col("key").str.strip_prefix("timing/"),
        seconds="value",
        source="source",
        line="line",
        timestamp="timestamp",
        attempt="attempt",
    )
    extra = keyed.join(timed, on=["step", "phase"], how="anti")
    return pl.concat([timed, extra.select(list(schema.PHASES))]).sort("step", "phase", "line")


def _table(
    rows: dict[str, pl.DataFrame], name: str, columns: dict[str, pl.DataType]
) -> pl.DataFrame:
    frame = rows.get(name)
    if frame is None or frame.is_empty():
        return schema.empty(columns)
    single = frame.get_column("source").n_unique() == 1
    if single and frame.get_column("line").is_sorted():
        return frame
    return frame.sort("source", "line", maintain_order=True)


def build_tables(rows: dict[str, pl.DataFrame], summary: ParseSummary) -> LogTables:
    """The final tables from raw rows (of one file or several)."""
    batches = _table(rows, "batches", schema.BATCHES)
    raw_metrics = _table(rows, "metrics", schema.METRICS)
    metrics = stitch_metrics(with_batch_metrics(raw_metrics, batches))
    timers = _table(rows, "timers", schema.TIMERS)
    return LogTables(
        metrics=metrics,
        timers=timers,
        phases=phases(timers, metrics),
        engines=_table(rows, "engines", schema.ENGINES),
        progress=_table(rows, "progress", schema.PROGRESS),
        batches=batches,
        errors=_table(rows, "errors", schema.ERRORS),
        resumes=_table(rows, "resumes", schema.RESUMES),
        summary=summary,
    )
