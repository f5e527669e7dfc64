"""A log's failure lines as candidate ERRORS rows (`RAW_ERRORS`), a few per chunk: traceback and Ray
unhandled-error blocks (to their final line, past a Ray wrapper), lines of a literal rule or of
the failure catalogue, and final exception lines outside every block (docs/failures.md).
`worker.evidence.failures.rows.annotate` gives a file's rows their meaning once per file."""

from __future__ import annotations

from typing import Final

import polars as pl

from worker.evidence import schema
from worker.evidence.logs.rules import UNHANDLED, WINDOW_LINES

__all__ = ["RAW_ERRORS", "error_rows", "open_tracebacks", "with_traceback_ends"]

_NOT_ENDS: Final = (
    "Traceback",
    "During handling of the above exception",
    "The above exception was the direct cause",
    ">",
    "│",
    "└",
    "File ",
)
# A final line whose real exception follows, with its own frames.
_WRAPPER: Final = r"^(?:[\w.]+\.)?(?:RayTaskError|ActorDiedError|RayActorError)\b.*ray::"
_VLLM_HEADER: Final = r"^(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d"
# --- blocks ---------------------------------------------------------------------------------


def _end_candidate() -> pl.Expr:
    """A line that may end a block: not blank, not indented, not a frame or chaining header."""
    msg = pl.col("msg")
    candidate = (msg.str.strip_chars_end().str.len_bytes() > 0) & ~msg.str.contains(r"^\s")
    for prefix in _NOT_ENDS:
        candidate = candidate & ~msg.str.starts_with(prefix)
    return candidate


def _opens() -> pl.Expr:
    """A line that starts a block: a traceback, or Ray's unhandled-error report."""
    unhandled = pl.col("msg").str.contains(UNHANDLED, literal=True)
    return (pl.col("err") == "traceback").fill_null(False) | (unhandled & ~pl.col("window_only"))


def with_traceback_ends(ev: pl.DataFrame, attempt_starts: pl.Expr | None = None) -> pl.DataFrame:
    """Add to the block starts of `ev` `tb_end`/`tb_end_idx` (the final line, past a Ray
    wrapper), `tb_wrap_idx` (the wrapper) and `tb_open` (a wrapper whose exception is not in
    `ev`). A block ends within its attempt (`attempt_starts`): a killed process's traceback has
    no final line, and the next attempt's process may have the same prefix."""
    if not ev.select(_opens().any()).item():  # most chunks open no block: nothing to join
        return ev.with_columns(
            tb_end_idx=pl.lit(None, dtype=pl.UInt32),
            tb_wrap_idx=pl.lit(None, dtype=pl.UInt32),
            tb_open=pl.lit(False),
            tb_end=pl.lit(None, dtype=pl.String),
        )
    idx = pl.col("idx")
    segment = pl.lit(0) if attempt_starts is None else attempt_starts.cast(pl.UInt32).cum_sum()
    after = pl.when(_end_candidate()).then(idx).backward_fill().shift(-1).over("actor", "_seg")
    frame = ev.with_columns(_seg=segment).with_columns(_after=after, _opens=_opens())
    ends = frame.select(
        _e=idx, _e_after=pl.col("_after"), _wrapper=pl.col("msg").str.contains(_WRAPPER)
    )
    frame = frame.join(ends, left_on="_after", right_on="_e", how="left", maintain_order="left")
    near = (pl.col("_after") - idx <= WINDOW_LINES).fill_null(False)
    wrapper = pl.col("_wrapper").fill_null(False)
    wrapped = wrapper & (pl.col("_e_after") - idx <= WINDOW_LINES).fill_null(False)
    start = pl.col("_opens") & near
    frame = frame.with_columns(
        tb_end_idx=pl.when(start).then(
            pl.when(wrapped).then(pl.col("_e_after")).otherwise(pl.col("_after"))
        ),
        tb_wrap_idx=pl.when(start & wrapped).then(pl.col("_after")),
        tb_open=pl.col("_opens") & wrapper & ~wrapped,
    )
    texts = frame.select(_i=idx, tb_end=pl.col("text").str.strip_chars())
    frame = frame.join(
        texts, left_on="tb_end_idx", right_on="_i", how="left", maintain_order="left"
    )
    return frame.drop("_seg", "_after", "_opens", "_e_after", "_wrapper")


def open_tracebacks(ev: pl.DataFrame, n_lines: int) -> pl.Series:
    """Indices of blocks whose end may lie after a chunk of `n_lines` lines."""
    still = (
        _opens()
        & (pl.col("tb_end").is_null() | pl.col("tb_open"))
        & (pl.col("idx") >= n_lines - 1 - WINDOW_LINES)
    )
    return ev.filter(still).get_column("idx")


# --- rows -----------------------------------------------------------------------------------

# What a chunk keeps of each candidate row; `annotate` (once per file) gives it its meaning.
RAW_ERRORS: Final[dict[str, pl.DataType]] = {
    "source": pl.String(),
    "line": pl.Int64(),
    "timestamp": schema.TS,
    "attempt": pl.Int32(),
    "err": pl.String(),  # the older literal rule's kind, `traceback`, or null
    "block": pl.Boolean(),  # a traceback or Ray unhandled-error report
    "text": pl.String(),  # the final line, as quoted
    "last_line": pl.Int64(),
    "first_msg": pl.String(),  # messages: prefixes and logger header stripped
    "final_msg": pl.String(),
    "wrap_msg": pl.String(),  # the Ray wrapper a block passed
    "prefix": pl.String(),  # the first line's process prefixes
    "vllm_header": pl.Boolean(),  # the final line carries vLLM's logger header
}


def _candidates(ev: pl.DataFrame) -> pl.DataFrame:
    """Block starts, lines of a literal rule, and failure lines outside every block."""
    idx = pl.col("idx")
    block_end = pl.when(pl.col("tb_end_idx").is_not_null()).then(pl.col("tb_end_idx"))
    inside = (idx <= block_end.forward_fill().over("actor")).fill_null(False)
    loose = pl.col("failure").fill_null(False) & ~inside
    return ev.filter(pl.col("err").is_not_null() | _opens() | loose)


def error_rows(ev: pl.DataFrame) -> pl.DataFrame:
    """The candidate rows of `ev` (which has line, ts and attempt), in RAW_ERRORS (no source)."""
    rows = _candidates(ev)
    if rows.is_empty():
        return schema.empty(RAW_ERRORS).drop("source")
    lines = ev.select("idx", "msg", "text")
    final = pl.coalesce(pl.col("tb_end_idx"), pl.col("idx"))
    rows = rows.with_columns(_fi=final).join(
        lines.rename({"idx": "_fi", "msg": "final_msg", "text": "_final_text"}),
        on="_fi",
        how="left",
        maintain_order="left",
    )
    rows = rows.join(
        lines.select(tb_wrap_idx="idx", wrap_msg="msg"),
        on="tb_wrap_idx",
        how="left",
        maintain_order="left",
    )
    block = pl.col("tb_end_idx").is_not_null() | _opens()
    own = pl.col("text").str.strip_chars()
    span = pl.col("tb_end_idx").cast(pl.Int64) - pl.col("idx").cast(pl.Int64)
    return rows.select(
        "line",
        timestamp="ts",
        attempt="attempt",
        err="err",
        block=block,
        text=pl.coalesce(pl.col("tb_end"), own),
        last_line=pl.col("line") + span.fill_null(0),
        first_msg="msg",
        final_msg=pl.col("final_msg").fill_null(pl.col("msg")),
        wrap_msg="wrap_msg",
        prefix="prefix",
        vllm_header=pl.col("_final_text").fill_null("").str.contains(_VLLM_HEADER),
    )
