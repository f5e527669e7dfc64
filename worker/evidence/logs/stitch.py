"""From the raw rows of one or more files to the final tables (docs/parsing.md, "Stitching")."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import polars as pl

from worker.evidence import schema
from worker.evidence.logs.timers import batch_metrics
from worker.evidence.parsed import LogTables, ParseSummary

__all__ = ["Stitched", "build_tables", "phases", "restitch", "stitch", "unchanged_rows"]

EXPLICIT_ORIGINS: Final = ("mirror", "console")
_ATTEMPT_WEIGHT: Final = 2**40  # lines stay below this
_EXPLICIT_WEIGHT: Final = 2**62
_STEPPED: Final = ("metrics", "batches", "timers")  # the raw tables METRICS and PHASES come from


def _newest(frame: pl.DataFrame, keys: list[str], explicit: pl.Expr | None = None) -> pl.DataFrame:
    """The row of each key with the highest (explicit, attempt, line), ties the later, sorted by
    `keys`: the last row of each run after one stable sort (only the keys copied)."""
    rank = pl.col("attempt").cast(pl.Int64) * _ATTEMPT_WEIGHT + pl.col("line")
    if explicit is not None:
        rank = rank + explicit.cast(pl.Int64) * _EXPLICIT_WEIGHT
    order = frame.select(pl.arg_sort_by(*keys, rank, maintain_order=True)).to_series()
    last = pl.int_range(pl.len()) == pl.len() - 1
    for key in keys:
        last = last | pl.col(key).ne_missing(pl.col(key).shift(-1))
    runs = frame.select(pl.col(keys).gather(order)).select(last).to_series()
    return frame.select(pl.all().gather(order.filter(runs)))


def stitch_metrics(raw: pl.DataFrame) -> pl.DataFrame:
    """One row per (step, key), sorted by step and key."""
    known = (
        raw if not raw.get_column("step").has_nulls() else raw.filter(pl.col("step").is_not_null())
    )
    explicit = pl.col("origin").is_in(list(EXPLICIT_ORIGINS))
    return _newest(known, ["step", "key"], explicit).select(list(schema.METRICS))


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
    rows: dict[str, pl.DataFrame], name: str, columns: dict[str, pl.DataType], *, lines: bool = True
) -> pl.DataFrame:
    """Table `name` of `rows` sorted by source and line (with `lines`; else only by source: the
    rows of one line keep their order either way)."""
    frame = rows.get(name)
    if frame is None or frame.is_empty():
        return schema.empty(columns)
    single = frame.get_column("source").n_unique() == 1
    if single and (not lines or frame.get_column("line").is_sorted()):
        return frame
    return frame.sort("source", "line", maintain_order=True)


@dataclass(frozen=True)
class Stitched:
    """The stitched METRICS and PHASES of some raw rows."""

    metrics: pl.DataFrame
    phases: pl.DataFrame


def stitch(rows: dict[str, pl.DataFrame]) -> Stitched:
    """METRICS and PHASES from raw rows (of one file or several)."""
    batches = _table(rows, "batches", schema.BATCHES)
    raw = _table(rows, "metrics", schema.METRICS, lines=False)
    metrics = stitch_metrics(with_batch_metrics(raw, batches))
    return Stitched(metrics, phases(_table(rows, "timers", schema.TIMERS), metrics))


def _touched_steps(fresh: Iterable[dict[str, pl.DataFrame]]) -> pl.Series:
    steps = [part[name].get_column("step") for part in fresh for name in _STEPPED if name in part]
    if not steps:
        return pl.Series("step", [], dtype=pl.Int64)
    return pl.concat(steps).drop_nulls().unique()


def _merged(kept: pl.DataFrame, redone: pl.DataFrame, touched: pl.Series) -> pl.DataFrame:
    """`kept` without the touched steps, merged with `redone` (both sorted by step)."""
    steps = kept.get_column("step")
    first, last = touched.min(), touched.max()
    assert isinstance(first, int) and isinstance(last, int)
    low = int(steps.search_sorted(first, side="left"))
    high = int(steps.search_sorted(last, side="right"))
    if steps.slice(low, high - low).is_in(touched.implode()).all():
        # The touched steps are one run of `kept`: splice `redone` in by slices, without copying.
        return pl.concat([kept.slice(0, low), redone, kept.slice(high)])
    others = kept.filter(~pl.col("step").is_in(touched.implode()))
    return others.merge_sorted(redone, key="step")


def restitch(
    known: Stitched, rows: dict[str, pl.DataFrame], fresh: Iterable[dict[str, pl.DataFrame]]
) -> Stitched:
    """`stitch(rows)`, given `known = stitch(rows without fresh)` (a single source only)."""
    touched = _touched_steps(fresh)
    if touched.is_empty():
        return known
    inside = pl.col("step").is_in(touched.implode())
    redone = stitch({name: rows[name].filter(inside) for name in _STEPPED if name in rows})
    return Stitched(
        metrics=_merged(known.metrics, redone.metrics, touched),
        phases=_merged(known.phases, redone.phases, touched),
    )


def unchanged_rows(known: Stitched, fresh: Iterable[dict[str, pl.DataFrame]]) -> dict[str, int]:
    """How many first rows of `known`'s metrics and phases `restitch(known, ..., fresh)` keeps as
    they are: those of the steps before the first step `fresh` touches (both sorted by step)."""
    touched = _touched_steps(fresh)
    first = touched.min() if not touched.is_empty() else None
    assert first is None or isinstance(first, int)
    found = {}
    for name in ("metrics", "phases"):
        frame: pl.DataFrame = getattr(known, name)
        if first is None:
            found[name] = frame.height
        else:
            found[name] = int(frame.get_column("step").search_sorted(first, side="left"))
    return found


def build_tables(
    rows: dict[str, pl.DataFrame], summary: ParseSummary, stitched: Stitched | None = None
) -> LogTables:
    """The final tables from raw rows (of one file or several); `stitched` when known already."""
    found = stitched if stitched is not None else stitch(rows)
    return LogTables(
        metrics=found.metrics,
        timers=_table(rows, "timers", schema.TIMERS),
        phases=found.phases,
        engines=_table(rows, "engines", schema.ENGINES),
        progress=_table(rows, "progress", schema.PROGRESS),
        batches=_table(rows, "batches", schema.BATCHES),
        errors=_table(rows, "errors", schema.ERRORS),
        resumes=_table(rows, "resumes", schema.RESUMES),
        summary=summary,
    )
