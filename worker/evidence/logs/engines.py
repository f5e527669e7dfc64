"""vLLM engine stat lines (`Engine 000: Avg prompt throughput: ...`) as ENGINES rows.

Stat lines are most of a busy log, so they skip the generic prefix stripping: a few whole-line
extractions read the pid, ip, vLLM time and Iris time, and one `extract_all` reads the numbers
(their order is fixed by vLLM's logger; `Swapped:` of older releases shifts the waiting count).
The attempt and the date come from the nearest earlier classified line (an as-of join).
"""

from __future__ import annotations

from typing import Final

import polars as pl

from worker.evidence.logs.state import ParserState

__all__ = ["engine_fields", "engine_rows"]

_NUMBER: Final = r"\d+(?:\.\d+)?"
_HALF_DAY: Final = 43_200


def engine_fields(stats: pl.LazyFrame) -> pl.LazyFrame:
    """The fields of each stat line (`idx`, `raw`): numbers, index, pid, ip, vLLM and Iris time."""
    parts = pl.col("raw").str.split_exact("Avg prompt throughput", 1).struct
    frame = stats.select("idx", _head=parts.field("field_0"), _tail=parts.field("field_1"))
    head, tail = pl.col("_head"), pl.col("_tail")
    # Whole matches (no capture groups, the regex engine's fast path), then fixed slices of them.
    owner = head.str.extract(r"pid=\d+(?:, ip=[^\s()]+)?", 0).str.split_exact(", ip=", 1).struct
    vllm = head.str.extract(r"(?:INFO|WARNING|DEBUG|ERROR) \d\d-\d\d \d\d:\d\d:\d\d", 0)
    clock = pl.when(head.str.starts_with("[")).then(head.str.slice(1, 8))
    return frame.select(
        "idx",
        _n=tail.str.extract_all(_NUMBER),
        _shift=tail.str.contains("Swapped:", literal=True).cast(pl.Int64),
        index=head.str.extract(r"Engine \d+: $", 0).str.slice(7).str.head(-2).fill_null("0"),
        pid=owner.field("field_0").str.slice(4),
        ip=owner.field("field_1"),
        vts=vllm.str.slice(-14),
        tod=clock.str.to_time("%H:%M:%S", strict=False).cast(pl.Int64) // 1_000_000_000,
    )


def _context(frame: pl.DataFrame, ev: pl.DataFrame, state: ParserState) -> pl.DataFrame:
    known = ev.select(
        "idx",
        c_attempt="attempt",
        c_day="_day",
        c_tod=pl.col("tod").forward_fill().cast(pl.Int64),
    )
    joined = frame.join_asof(known, on="idx", strategy="backward")
    seed = pl.lit(state.anchor_day, dtype=pl.Date) + pl.duration(days=state.rolls)
    day = pl.coalesce(pl.col("c_day"), seed)
    last_tod = pl.lit(state.last_tod, dtype=pl.Int64)
    rolled = (pl.col("tod") < pl.col("c_tod").fill_null(last_tod) - _HALF_DAY).fill_null(False)
    iris_day = day + pl.duration(days=rolled.cast(pl.Int64))
    vllm = pl.concat_str(day.dt.year().cast(pl.String), pl.lit("-"), pl.col("vts"))
    vllm_ts = vllm.str.to_datetime("%Y-%m-%d %H:%M:%S", strict=False, time_unit="us")
    iris_ts = iris_day.cast(pl.Datetime("us")) + pl.duration(seconds=pl.col("tod"))
    return joined.with_columns(
        ts=pl.coalesce(vllm_ts, iris_ts).dt.replace_time_zone("UTC"),
        attempt=pl.col("c_attempt").fill_null(state.attempt),
    )


def engine_rows(
    stats: pl.DataFrame, ev: pl.DataFrame, state: ParserState, line_base: int, source: str
) -> pl.DataFrame:
    """ENGINES rows of `engine_fields`; engine id `<pid>@<ip>/<index>`, `<pid>/<index>` or
    `<source>/<index>`."""
    rows = _context(stats, ev, state)
    owner = (
        pl.when(pl.col("pid").is_null())
        .then(pl.lit(source))
        .when(pl.col("ip").is_null())
        .then(pl.col("pid"))
        .otherwise(pl.concat_str(pl.col("pid"), pl.lit("@"), pl.col("ip")))
    )

    def num(i: int | pl.Expr) -> pl.Expr:
        return pl.col("_n").list.get(i, null_on_oob=True).cast(pl.Float64, strict=False)

    return rows.select(
        timestamp="ts",
        engine=pl.concat_str(owner, pl.lit("/"), pl.col("index")),
        running=num(2).cast(pl.Int64),
        waiting=num(pl.col("_shift") + 3).cast(pl.Int64),
        kv_cache_pct=num(pl.col("_shift") + 4),
        generation_tokens_per_s=num(1),
        prompt_tokens_per_s=num(0),
        prefix_cache_hit_pct=num(pl.col("_shift") + 5),
        line=pl.col("idx").cast(pl.Int64) + line_base + 1,
        attempt="attempt",
    ).filter(pl.col("running").is_not_null() & pl.col("waiting").is_not_null())
