"""What a line inherits from the lines before it: timestamp, replay, attempt and step context
(docs/parsing.md, "Context carried from line to line").

All are cumulative expressions over a chunk's classified lines, seeded from the carried
`ParserState`. `add_line_context` adds what needs no cut (timestamps, replays, attempt starts);
`add_attempts` and `add_step_context` then run on the committed lines."""

from __future__ import annotations

from datetime import date, datetime
from typing import Final

import polars as pl

from worker.evidence.logs import attempts, replays
from worker.evidence.logs.state import ParserState

__all__ = [
    "PREFIX_SKEW_TOLERANCE_S",
    "add_attempts",
    "add_line_context",
    "add_step_context",
    "advance_state",
    "note_timestamps",
]

_HALF_DAY: Final = 43_200
PREFIX_SKEW_TOLERANCE_S: Final = 60.0
"""Own time vs Iris prefix time beyond this is a clock disagreement (collection lag is shorter)."""


def add_line_context(frame: pl.DataFrame, state: ParserState) -> pl.DataFrame:
    """Add `ts`, `replayed` and `_start`/`restart` to a chunk's lines before it is cut (`state`
    is `advance_state`'s to move, but its attempt task is fixed when first seen)."""
    frame = replays.add_replayed(add_timestamps(frame, state), state)
    return attempts.with_starts(frame, state)


def add_attempts(frame: pl.DataFrame, state: ParserState) -> pl.DataFrame:
    """Add `attempt` (Int32) from the attempt starts (`_start`) of `add_line_context`."""
    attempt = pl.lit(state.attempt) + pl.col("_start").cast(pl.Int32).cum_sum()
    return frame.with_columns(attempt=attempt.cast(pl.Int32))


def add_step_context(frame: pl.DataFrame, state: ParserState) -> pl.DataFrame:
    """Add `step_ctx`: the step an undated-step line belongs to (needs `set_step`)."""
    msg = pl.col("msg")
    # window-only lines have no kind; a replayed line is a copy of one counted already
    timer = (pl.col("kind") == "timer").fill_null(False) & ~pl.col("replayed")
    finished = timer & msg.str.starts_with("Finished: 'step'")
    started = timer & msg.str.starts_with("Started: 'step'")
    add = finished.cast(pl.Int64).cum_sum()
    fresh = pl.when(~pl.col("replayed")).then(pl.col("set_step"))
    set_step = pl.coalesce(fresh, pl.when(pl.col("restart")).then(pl.lit(0, pl.Int64)))
    frame = frame.with_columns(_set=set_step)
    is_set = pl.col("_set").is_not_null()
    base = pl.col("_set").forward_fill()
    add_at = pl.when(is_set).then(add).forward_fill()
    after = pl.when(base.is_null()).then(state.completed + add).otherwise(base + add - add_at)
    before = after.shift(1).fill_null(state.completed)
    post = (
        pl.when(finished)
        .then(True)
        .when(started | (pl.col("kind") == "boundary") | pl.col("restart"))
        .then(False)
        .otherwise(None)
    )
    post_before = post.forward_fill().shift(1).fill_null(state.post_finish)
    marker = started | finished
    step = pl.when(marker | ~post_before).then(before + 1).otherwise(before)
    return frame.with_columns(
        step_ctx=step, _completed=after, _post=post.forward_fill().fill_null(state.post_finish)
    ).drop("_set")


def _anchor_day() -> pl.Expr:
    ldt = pl.col("ldt")
    shifted = ldt - pl.duration(seconds=pl.col("tod")) + pl.duration(hours=12)
    with_tod = shifted.dt.truncate("1d").dt.date()
    return pl.when(pl.col("tod").is_not_null()).then(with_tod).otherwise(ldt.dt.date())


def add_timestamps(frame: pl.DataFrame, state: ParserState) -> pl.DataFrame:
    """Add `ts` (UTC) and the helper columns `_day`, `_aday`, `_rolls`, `_anchor_rolls`, `_own`
    (the line's own time), `_prefix` (its Iris prefix time) and `_skew` (own minus prefix, s)."""
    tod = pl.col("tod")
    prev = tod.forward_fill().shift(1)
    if state.last_tod is not None:
        prev = prev.fill_null(state.last_tod)
    roll = (tod < prev - _HALF_DAY).fill_null(False).cast(pl.Int32).cum_sum()
    anchor = pl.col("ldt").is_not_null()
    frame = frame.with_columns(_rolls=roll)
    anchor_rolls = pl.when(anchor).then(pl.col("_rolls")).forward_fill()
    seed_day = pl.lit(state.anchor_day, dtype=pl.Date)
    seeded = seed_day + pl.duration(days=pl.col("_rolls") + state.rolls)
    frame = frame.with_columns(_aday=_anchor_day().forward_fill(), _anchor_rolls=anchor_rolls)
    later = pl.col("_aday") + pl.duration(days=pl.col("_rolls") - pl.col("_anchor_rolls"))
    day = pl.when(pl.col("_anchor_rolls").is_null()).then(seeded).otherwise(later)
    frame = frame.with_columns(_day=day.cast(pl.Date))
    frame = frame.with_columns(_own=_own_time(), _prefix=_prefix_time())
    skew = (pl.col("_own") - pl.col("_prefix")).dt.total_seconds(fractional=True)
    frame = frame.with_columns(_skew=skew)
    disagree = (pl.col("_skew").abs() > PREFIX_SKEW_TOLERANCE_S).fill_null(False)
    ts = pl.when(disagree).then(pl.col("_prefix")).otherwise(pl.coalesce("_own", "_prefix"))
    return frame.with_columns(ts=ts)


def _prefix_time() -> pl.Expr:
    day = pl.col("_day")
    iris = day.cast(pl.Datetime("us")) + pl.duration(seconds=pl.col("tod"))
    return iris.dt.replace_time_zone("UTC")


def _own_time() -> pl.Expr:
    day = pl.col("_day")
    vllm_text = pl.concat_str(day.dt.year().cast(pl.String), pl.lit("-"), pl.col("vts"))
    vllm = vllm_text.str.to_datetime("%Y-%m-%d %H:%M:%S", strict=False, time_unit="us")
    return pl.coalesce(pl.col("ldt"), vllm.dt.replace_time_zone("UTC"))


def _last(frame: pl.DataFrame, column: str) -> object:
    values = frame.get_column(column).drop_nulls()
    return values[-1] if len(values) else None


def advance_state(frame: pl.DataFrame, state: ParserState) -> None:
    """Move the carried context past the rows of `frame` (as built by the functions above)."""
    if frame.is_empty():
        return
    state.attempt = int(frame.get_column("attempt")[-1])
    state.completed = int(frame.get_column("_completed")[-1])
    state.post_finish = bool(frame.get_column("_post")[-1])
    last_tod = _last(frame, "tod")
    state.last_tod = int(last_tod) if isinstance(last_tod, int) else state.last_tod
    rolls = int(frame.get_column("_rolls")[-1])
    anchor_rolls = _last(frame, "_anchor_rolls")
    anchor_day = _last(frame, "_aday")
    if isinstance(anchor_rolls, int) and isinstance(anchor_day, date):
        state.anchor_day = anchor_day
        state.rolls = rolls - anchor_rolls
    else:
        state.rolls += rolls
    note_timestamps(frame.get_column("ts"), state)
    _note_skew(frame, state)
    replays.advance(frame, state)
    attempts.advance(frame, state)


def _note_skew(frame: pl.DataFrame, state: ParserState) -> None:
    """Widen the state's own-time vs prefix-time statistics (lines with both times; a replayed
    line is counted apart, `replays.note_replayed`)."""
    both = frame.select("_skew", "line", "replayed").filter(
        pl.col("_skew").is_not_null() & ~pl.col("replayed")
    )
    if both.is_empty():
        return
    skew = both.get_column("_skew")
    low, high = float(skew.min()), float(skew.max())  # type: ignore[arg-type]
    state.skew_lines += both.height
    state.skew_min_s = low if state.skew_min_s is None else min(state.skew_min_s, low)
    state.skew_max_s = high if state.skew_max_s is None else max(state.skew_max_s, high)
    off = both.filter(pl.col("_skew").abs() > PREFIX_SKEW_TOLERANCE_S)
    state.skew_off_lines += off.height
    if state.skew_first_line is None and not off.is_empty():
        state.skew_first_line = int(off.get_column("line")[0])


def note_timestamps(stamps: pl.Series, state: ParserState) -> None:
    """Widen the state's first/last timestamp to cover `stamps`."""
    ts = stamps.drop_nulls()
    if ts.is_empty():
        return
    low, high = ts.min(), ts.max()
    if isinstance(low, datetime) and (state.first_ts is None or low < state.first_ts):
        state.first_ts = low
    if isinstance(high, datetime) and (state.last_ts is None or high > state.last_ts):
        state.last_ts = high
