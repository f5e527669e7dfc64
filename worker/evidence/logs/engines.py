"""vLLM engine stat lines (`Engine 000: Avg prompt throughput: ...`) as ENGINES rows.

The numbers are read with one `extract_all` of all decimals on the line (their order is fixed by
vLLM's logger); `Swapped:` of older vLLM releases shifts the waiting count by one.
"""

from __future__ import annotations

from typing import Final

import polars as pl

__all__ = ["engine_rows"]

_NUMBER: Final = r"\d+(?:\.\d+)?"
_ENGINE: Final = r"Engine (\d+):"


def engine_rows(ev: pl.DataFrame, source: str) -> pl.DataFrame:
    """ENGINES rows; engine id `<pid>@<ip>/<index>`, `<pid>/<index>` or `<source>/<index>`."""
    rows = ev.filter(
        (pl.col("kind") == "engine") & pl.col("msg").str.contains("Running:", literal=True)
    )
    tail = pl.col("msg").str.replace(r"^.*?Avg prompt throughput", "")
    nums = tail.str.extract_all(_NUMBER)
    shift = pl.col("msg").str.contains("Swapped:", literal=True).cast(pl.Int64)
    index = pl.col("msg").str.extract(_ENGINE, 1).fill_null("0")
    owner = (
        pl.when(pl.col("pid").is_null())
        .then(pl.lit(source))
        .when(pl.col("ip").is_null())
        .then(pl.col("pid"))
        .otherwise(pl.concat_str(pl.col("pid"), pl.lit("@"), pl.col("ip")))
    )

    def num(i: int | pl.Expr) -> pl.Expr:
        return pl.col("_n").list.get(i, null_on_oob=True).cast(pl.Float64, strict=False)

    rows = rows.with_columns(_n=nums, _shift=shift)
    return rows.select(
        timestamp="ts",
        engine=pl.concat_str(owner, pl.lit("/"), index),
        running=num(2).cast(pl.Int64),
        waiting=num(pl.col("_shift") + 3).cast(pl.Int64),
        kv_cache_pct=num(pl.col("_shift") + 4),
        generation_tokens_per_s=num(1),
        prompt_tokens_per_s=num(0),
        prefix_cache_hit_pct=num(pl.col("_shift") + 5),
        line="line",
        attempt="attempt",
    ).filter(pl.col("running").is_not_null() & pl.col("waiting").is_not_null())
