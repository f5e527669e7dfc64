"""Phase timers (TIMERS), progress counters (PROGRESS) and resume markers (RESUMES)."""

from __future__ import annotations

from typing import Final

import polars as pl

__all__ = [
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
    """RESUMES rows (without `source`): Iris boundaries and resume lines, and an
    `attempt_boundary` row at each in-log restart (`attempts`; a restart on a resume line gives
    that line both rows, the boundary first)."""
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
