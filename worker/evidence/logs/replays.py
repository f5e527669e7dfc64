"""Replayed lines: a log shipper that re-sends a chunk it had sent before (docs/parsing.md).

Hypothesis: own time minus Iris prefix time (the *skew*) is the log's lag, the same on every line;
a re-sent line was written long before it is collected again. A line is *replayed* when its skew
is below the usual one (the median of the file's first LAG_SAMPLE skews) by more than
REPLAY_TOLERANCE_S, or its own time is older by more than that than the newest own time of the
consistent lines before it. Replayed lines have no progress rows (ERRORS keeps them) and are
counted in the summary. Cumulative from the chunk's first line, seeded from the carried state."""

from __future__ import annotations

from datetime import datetime
from typing import Final

import polars as pl

from worker.evidence.logs.state import MAX_EXAMPLES, ParserState

__all__ = [
    "LAG_SAMPLE",
    "REPLAY_TOLERANCE_S",
    "add_replayed",
    "advance",
    "note_replayed",
    "usual_skew",
]

LAG_SAMPLE: Final = 64
"""Lines (with an own and a prefix time) whose median skew is the log's usual skew: enough that a
few odd lines among the first do not move it, few enough to be known within the first minutes."""
REPLAY_TOLERANCE_S: Final = 60.0
"""A replay is older than the usual skew, or than the lines before it, by more than this: the
parser's prefix tolerance (collection lag and interleaved writers stay well within it)."""
_EXAMPLE_CHARS: Final = 160


def usual_skew(frame: pl.DataFrame, state: ParserState) -> pl.Series:
    """For each row with a skew (`_skew`), the usual skew before it: the median of the file's
    first min(n, LAG_SAMPLE) skews, n those before the row; null elsewhere."""
    skews = frame.get_column("_skew")
    have = skews.is_not_null()
    values = skews.filter(have)
    sample = state.lag_sample
    room = max(LAG_SAMPLE - len(sample), 0)
    head = pl.Series([*sample, *values.head(room).to_list()], dtype=pl.Float64)
    medians = head.rolling_median(window_size=LAG_SAMPLE, min_samples=1)
    seen = pl.int_range(0, len(values), dtype=pl.Int64, eager=True) + len(sample)
    at = seen.clip(upper_bound=LAG_SAMPLE) - 1
    usual = medians.gather(at.clip(lower_bound=0)) if len(medians) else values.clear()
    usual = pl.select(pl.when(pl.lit(at) >= 0).then(pl.lit(usual))).to_series()
    full = pl.repeat(None, frame.height, dtype=pl.Float64, eager=True)
    return full.scatter(have.arg_true(), usual) if len(values) else full


def add_replayed(frame: pl.DataFrame, state: ParserState) -> pl.DataFrame:
    """Add `replayed` (Boolean), `_usual` (the usual skew, seconds) and `_consistent` to `frame`,
    which has `_own` (the line's own time) and `_skew` (own minus prefix, seconds)."""
    frame = frame.with_columns(_usual=usual_skew(frame, state))
    own, skew, usual = pl.col("_own"), pl.col("_skew"), pl.col("_usual")
    late = (skew < usual - REPLAY_TOLERANCE_S).fill_null(False)
    near = skew.is_null() | usual.is_null() | ((skew - usual).abs() <= REPLAY_TOLERANCE_S)
    consistent = own.is_not_null() & ~late & near
    frame = frame.with_columns(_consistent=consistent.fill_null(False), _late=late)
    newest = pl.when(pl.col("_consistent")).then(own).cum_max().forward_fill().shift(1)
    if state.newest_own is not None:
        newest = pl.max_horizontal(newest, pl.lit(state.newest_own, dtype=frame.schema["_own"]))
    older = (own < newest - pl.duration(seconds=REPLAY_TOLERANCE_S)).fill_null(False)
    return frame.with_columns(replayed=pl.col("_late") | older).drop("_late")


def advance(frame: pl.DataFrame, state: ParserState) -> None:
    """Move the lag sample and the newest consistent own time past the rows of `frame`."""
    room = LAG_SAMPLE - len(state.lag_sample)
    if room > 0:
        skews = frame.get_column("_skew").drop_nulls().head(room)
        state.lag_sample.extend(float(v) for v in skews.to_list())
    newest = frame.select(pl.col("_own").filter(pl.col("_consistent")).max()).item()
    if isinstance(newest, datetime) and (state.newest_own is None or newest > state.newest_own):
        state.newest_own = newest


def note_replayed(frame: pl.DataFrame, state: ParserState, source: str) -> pl.Series:
    """Count the replayed rows of `frame` (which has `line`), quote the first few, and return
    their line numbers (the rows the tables leave out)."""
    rows = frame.filter(pl.col("replayed"))
    if rows.is_empty():
        return rows.get_column("line")
    state.replayed_lines += rows.height
    room = max(MAX_EXAMPLES - len(state.replayed_examples), 0)
    for row in rows.head(room).iter_rows(named=True):
        state.replayed_examples.append(_example(row, source))
    return rows.get_column("line")


def _example(row: dict[str, object], source: str) -> str:
    own, collected = row.get("_own"), row.get("_prefix")
    when = f"own time {own:%Y-%m-%d %H:%M:%S}" if isinstance(own, datetime) else "own time ?"
    if isinstance(collected, datetime):
        when += f", collected {collected:%Y-%m-%d %H:%M:%S}"
    text = str(row.get("msg") or row.get("text") or "")[:_EXAMPLE_CHARS]
    return f"{source}:{row['line']}: {when}: {text}"
