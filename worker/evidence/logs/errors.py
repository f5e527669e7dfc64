"""Hard-error and notable lines as ERRORS rows, tracebacks closed by their exception line.

A traceback gives one row at its `Traceback (most recent call last)` line whose text is the line
that ends it: the first later line of the same actor that is neither indented, blank, nor a
chaining or traceback header, within WINDOW_LINES lines.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from worker.evidence.logs.lines import WINDOW_LINES

__all__ = ["error_rows", "open_tracebacks", "with_traceback_ends"]

_NOT_ENDS: Final = (
    "Traceback",
    "During handling of the above exception",
    "The above exception was the direct cause",
    ">",
    "│",
    "└",
    "File ",
)


def with_traceback_ends(ev: pl.DataFrame) -> pl.DataFrame:
    """Add `tb_end` (text) and `tb_end_idx` to traceback rows of `ev` (sorted by idx)."""
    text = pl.col("text")
    stripped = text.str.strip_chars_end()
    candidate = (
        (stripped.str.len_bytes() > 0)
        & ~text.str.contains(r"^\s")
        & ~text.str.starts_with(_NOT_ENDS[0])
    )
    for prefix in _NOT_ENDS[1:]:
        candidate = candidate & ~text.str.starts_with(prefix)
    end_text = pl.when(candidate).then(stripped).backward_fill().over("actor")
    end_idx = pl.when(candidate).then(pl.col("idx")).backward_fill().over("actor")
    frame = ev.with_columns(_end=end_text, _end_idx=end_idx)
    ok = (pl.col("err") == "traceback") & (pl.col("_end_idx") - pl.col("idx") <= WINDOW_LINES)
    return frame.with_columns(
        tb_end=pl.when(ok).then(pl.col("_end")), tb_end_idx=pl.when(ok).then(pl.col("_end_idx"))
    ).drop("_end", "_end_idx")


def open_tracebacks(ev: pl.DataFrame, n_lines: int) -> pl.Series:
    """Indices of tracebacks whose end may lie after a chunk of `n_lines` lines."""
    still = (
        (pl.col("err") == "traceback")
        & pl.col("tb_end").is_null()
        & (pl.col("idx") >= n_lines - 1 - WINDOW_LINES)
    )
    return ev.filter(still).get_column("idx")


def error_rows(ev: pl.DataFrame) -> pl.DataFrame:
    """ERRORS rows (without `source`)."""
    rows = ev.filter(pl.col("err").is_not_null())
    text = (
        pl.when(pl.col("err") == "traceback")
        .then(pl.coalesce(pl.col("tb_end"), pl.col("text").str.strip_chars()))
        .otherwise(pl.col("text").str.strip_chars())
    )
    return rows.select("line", timestamp="ts", kind="err", text=text, attempt="attempt")
