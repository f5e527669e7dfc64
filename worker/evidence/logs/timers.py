"""Phase timers (TIMERS), progress counters (PROGRESS), resume markers (RESUMES), and agentic
batch lines (BATCHES) joined with the same actor's `Exception breakdown` printed before them."""

from __future__ import annotations

from typing import Final

import polars as pl

from worker.evidence import schema
from worker.evidence.logs.state import ParserState

__all__ = [
    "batch_metrics",
    "batch_rows",
    "progress_parsed",
    "progress_rows",
    "progress_steps",
    "resume_rows",
    "resume_steps",
    "timer_rows",
]

_TIMER: Final = r"^(Started|Finished): '([^']+)'(?:, time cost: ([-+\d.eE]+)s)?"
_PROGRESS: Final = r"Progress:\s*(?:\d+%\|[^|]*\|\s*)?(\d+)\s*/\s*(\d+)(?:\s*\[([\d:]+)<)?"
_ELAPSED: Final = r"^(?:(\d+):)?(\d+):(\d+)$"
_RESUMED: Final = r"Resuming from global_step:?\s*(\d+)"
_PROV: Final = ("line", "ts", "attempt")
_PROGRESS_KIND: Final = {"step_progress": "training_step", "buffer_progress": "generation_buffer"}
_RESUME_KIND: Final = {
    "boundary": "attempt_boundary",
    "scratch": "scratch",
    "checkpoint_loaded": "checkpoint_loaded",
    "resumed": "resumed",
}


def timer_rows(ev: pl.DataFrame) -> pl.DataFrame:
    """TIMERS rows (without `source`): event, phase, seconds, step and provenance."""
    rows = ev.select("kind", "msg", *_PROV, "step_ctx").filter(pl.col("kind") == "timer")
    parsed = pl.col("msg").str.extract_groups(_TIMER).struct
    rows = rows.with_columns(
        event=parsed.field("1").str.to_lowercase(),
        phase=parsed.field("2"),
        seconds=parsed.field("3").cast(pl.Float64, strict=False),
    ).filter(pl.col("phase").is_not_null())
    return rows.select("event", "phase", "seconds", *_PROV, step="step_ctx")


def _elapsed(text: pl.Expr) -> pl.Expr:
    parts = text.str.extract_groups(_ELAPSED).struct
    hours = parts.field("1").cast(pl.Float64, strict=False).fill_null(0.0)
    minutes = parts.field("2").cast(pl.Float64, strict=False)
    seconds = parts.field("3").cast(pl.Float64, strict=False)
    return hours * 3600 + minutes * 60 + seconds


def progress_parsed(ev: pl.DataFrame) -> pl.DataFrame:
    """The progress lines of `ev` read once: `idx`, `pkind`, `done`, `total`, `elapsed_s`."""
    rows = ev.select("idx", "kind", "msg").filter(pl.col("kind").is_in(list(_PROGRESS_KIND)))
    # tqdm rewrites the bar with carriage returns: the last update on the line counts.
    last = pl.col("msg").str.extract_all(_PROGRESS).list.last()
    parsed = last.str.extract_groups(_PROGRESS).struct
    return (
        rows.with_columns(
            pkind=pl.col("kind").replace_strict(_PROGRESS_KIND, return_dtype=pl.String),
            done=parsed.field("1").cast(pl.Int64, strict=False),
            total=parsed.field("2").cast(pl.Int64, strict=False),
            elapsed_s=_elapsed(parsed.field("3")),
        )
        .filter(pl.col("done").is_not_null())
        .select("idx", "pkind", "done", "total", "elapsed_s")
    )


def progress_steps(parsed: pl.DataFrame) -> pl.DataFrame:
    """`idx` and `set_step` of the training step counters (N / M sets N completed steps), from
    `progress_parsed`."""
    rows = parsed.filter(pl.col("pkind") == "training_step")
    return rows.select("idx", set_step="done")


def progress_rows(parsed: pl.DataFrame, ev: pl.DataFrame) -> pl.DataFrame:
    """PROGRESS rows (without `source`) of `progress_parsed`, with the provenance in `ev`."""
    rows = parsed.join(ev.select("idx", *_PROV), on="idx", how="left", maintain_order="left")
    return rows.select(*_PROV, kind="pkind", done="done", total="total", elapsed_s="elapsed_s")


def resume_steps(ev: pl.DataFrame) -> pl.DataFrame:
    """`idx` and `set_step` of resume markers: resumed N sets N, scratch and boundaries set 0."""
    rows = ev.filter(pl.col("kind").is_in(["boundary", "scratch", "resumed"]))
    resumed = pl.col("msg").str.extract(_RESUMED, 1).cast(pl.Int64, strict=False)
    step = pl.when(pl.col("kind") == "resumed").then(resumed).otherwise(pl.lit(0, pl.Int64))
    return rows.select("idx", set_step=step).filter(pl.col("set_step").is_not_null())


def resume_rows(ev: pl.DataFrame) -> pl.DataFrame:
    """RESUMES rows (without `source`), and an `attempt_boundary` row at each in-log restart
    (before the line's own row)."""
    rows = ev.filter(pl.col("kind").is_in(list(_RESUME_KIND)) | pl.col("restart"))
    resumed = pl.col("msg").str.extract(_RESUMED, 1).cast(pl.Int64, strict=False)
    kind = pl.col("kind").replace_strict(_RESUME_KIND, default=None, return_dtype=pl.String)
    found = rows.select(*_PROV, "restart", kind=kind, step=resumed, text="text")
    starts = found.filter("restart").with_columns(
        kind=pl.lit("attempt_boundary"), step=pl.lit(None, dtype=pl.Int64)
    )
    own = found.filter(pl.col("kind").is_not_null())
    if starts.is_empty():
        return own.drop("restart")
    both = pl.concat([starts, own]).with_columns(_second=pl.col("kind") != "attempt_boundary")
    return both.sort("line", "_second", maintain_order=True).drop("restart", "_second")


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
