"""vLLM engine stat lines (`Engine 000: Avg prompt throughput: ...`) as ENGINES rows; the attempt
and the date come from the nearest earlier classified line (an as-of join)."""

from __future__ import annotations

from typing import Final

import polars as pl

from worker.evidence.logs.state import ParserState

__all__ = ["engine_fields", "engine_owner", "engine_rows", "worker_pid"]

_NUMBER: Final = r"\d+(?:\.\d+)?"
_HALF_DAY: Final = 43_200
_FIELDS: Final = ("prompt", "generation", "running", "waiting", "kv", "hit")
_LITERAL: Final = "Avg prompt throughput"
_CLOCK: Final = r"^\[\d\d:\d\d:\d\d"
RAY_WORKER_PID: Final = r"(?:^|/)worker-[0-9a-f]+-[0-9a-f]+-(\d+)\.(?:out|err)$"
"""Ray names a worker's log `worker-<worker id>-<job id>-<pid>.out|.err`: the file is one process's
own output, whose lines carry no `(Actor pid=N, ip=X)` prefix (the driver adds that when it
forwards them), so the pid in the name says whose they are."""


def worker_pid(source: pl.Expr) -> pl.Expr:
    """The pid a Ray worker log's name carries (null for any other file)."""
    return source.str.extract(RAY_WORKER_PID, 1)


def engine_owner(engine: pl.Expr) -> pl.Expr:
    """The process part of an ENGINES id (`<pid>@<ip>`, `<pid>` or `<source>`), without the
    engine index."""
    return engine.str.replace(r"/[^/]*$", "")


def _numbers(frame: pl.DataFrame) -> pl.DataFrame:
    """The six numbers of `frame`'s `_tail`, by their order (`Swapped:` of older vLLM shifts the
    last three)."""
    found = frame.with_columns(_n=pl.col("_tail").str.extract_all(_NUMBER))
    shift = pl.col("_tail").str.contains("Swapped:", literal=True).cast(pl.Int64)

    def num(i: int | pl.Expr) -> pl.Expr:
        return pl.col("_n").list.get(i, null_on_oob=True).cast(pl.Float64, strict=False)

    positions: tuple[int | pl.Expr, ...] = (0, 1, 2, shift + 3, shift + 4, shift + 5)
    found = found.with_columns(
        num(at).alias(name) for name, at in zip(_FIELDS, positions, strict=True)
    )
    return found.drop("_n", "_tail")


def _split(stats: pl.DataFrame) -> pl.DataFrame:
    """`idx`, `_head` (the line before the stat literal) and `_tail` (from the literal on)."""
    head = pl.col("raw").str.split_exact(_LITERAL, 1).struct.field("field_0")
    return stats.select("idx", _head=head, _tail=pl.col("raw").str.slice(head.str.len_chars()))


def engine_fields(stats: pl.DataFrame) -> pl.DataFrame:
    """The fields of each stat line (`idx`, `raw`): its six numbers, engine index, pid, ip,
    vLLM time and Iris time of day."""
    frame = _split(stats)
    head = pl.col("_head")
    # Whole matches (no capture groups, the regex engine's fast path), then fixed slices of them.
    owner = head.str.extract(r"pid=\d+(?:, ip=[^\s()]+)?", 0).str.split_exact(", ip=", 1).struct
    vllm = head.str.extract(r"(?:INFO|WARNING|DEBUG|ERROR) \d\d-\d\d \d\d:\d\d:\d\d", 0)
    clock = pl.when(head.str.contains(_CLOCK))

    def part(start: int, most: int) -> pl.Expr:
        value = head.str.slice(start, 2).cast(pl.Int64, strict=False)
        return pl.when(value < most).then(value)

    tod = clock.then(part(1, 24) * 3600 + part(4, 60) * 60 + part(7, 60))
    fields = frame.select(
        "idx",
        "_tail",
        index=head.str.extract(r"Engine \d+: $", 0).str.slice(7).str.head(-2).fill_null("0"),
        pid=owner.field("field_0").str.slice(4),
        ip=owner.field("field_1"),
        vts=vllm.str.slice(-14),
        tod=tod,
    )
    return _numbers(fields)


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

    return rows.select(
        timestamp="ts",
        engine=pl.concat_str(owner, pl.lit("/"), pl.col("index")),
        running=pl.col("running").cast(pl.Int64, strict=False),
        waiting=pl.col("waiting").cast(pl.Int64, strict=False),
        kv_cache_pct="kv",
        generation_tokens_per_s="generation",
        prompt_tokens_per_s="prompt",
        prefix_cache_hit_pct="hit",
        line=pl.col("idx").cast(pl.Int64) + line_base + 1,
        attempt="attempt",
    ).filter(pl.col("running").is_not_null() & pl.col("waiting").is_not_null())
