"""Every failure a log shows as an ERRORS row, with its exception, component and signature.

Rows come from:
- **blocks**: a `Traceback (most recent call last)` line or Ray's `Unhandled error (suppress
  with ...)` line gives one row whose end is the first later line of the same actor that is neither
  indented, blank, nor a chaining or traceback header, within WINDOW_LINES lines and the same
  attempt (a block cut by a restart has no final line; each part of a chained traceback is its
  own block). When that end is a Ray wrapper (`RayTaskError(X): ray::...`,
  `ActorDiedError: ... ray::...`) the block goes on to the wrapped exception's own final line.
- **known lines**: the parser's literal rules (`kind` from ERROR_RULES) and the failure catalogue.
- **final exception lines**: `package.Type: message` (`Type(Inner): message` for Ray wrappers)
  that lie in no block of this chunk.

Each row has the exception type (the inner type of a wrapper) and message of its final line, the
catalogue entry and class the failure matches (its final line first, then the wrapper, then its
first line), the component (the entry's, else the `ray::Class` the text names, else the process
prefix, else `engine` for a line with vLLM's logger header, else the driver), its first (`line`) and
last line, and a signature (see `worker.evidence.failures.signature`).

Credentials are redacted (`shared.redact.redact_frame`) from a row's texts before anything is read
from them: the quoted text, the message and the signature never hold one, and normalising (which
replaces the digits inside a token) never runs on a credential, so two lines that differ only in a
secret have one signature.

Two stages keep the cost off the lines: each chunk keeps its few candidate rows with the texts
they need (RAW_ERRORS, cheap); `annotate` gives a whole file's rows their meaning in one
vectorised pass (the catalogue's ~60 expressions evaluated once per file, not per chunk).
"""

from __future__ import annotations

from typing import Final

import polars as pl

from shared.redact import redact_frame
from worker.evidence import schema
from worker.evidence.failures import catalogue, signature_expr, specific_expr
from worker.evidence.logs.rules import UNHANDLED, WINDOW_LINES

__all__ = ["RAW_ERRORS", "annotate", "error_rows", "open_tracebacks", "with_traceback_ends"]

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
_EXCEPTION: Final = (
    r"^((?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure)"
    r"|(?:errors|exceptions)\.[A-Z]\w*))(?:\(([A-Za-z_][\w.]*)\))?(:)?(?:\s+(.*))?$"
)
_VLLM_HEADER: Final = r"^(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d"
_SYSTEM_PREFIX: Final = r"^\((?:raylet|gcs_server|autoscaler|monitor|dashboard|log_monitor)"
# Process or Ray class names, by component (first that matches wins).
_NAMED: Final[tuple[tuple[str, str], ...]] = (
    (
        "engine",
        r"(?i)vllm|enginecore|inferenceengine|llmrayactor|apiserver|rayworkerwrapper|asyncllm"
        r"|llm_?engine|sglang",
    ),
    ("sandbox", r"(?i)sandbox|daytona|harbor|generator"),
    (
        "policy",
        r"(?i)policy|fsdp|megatron|deepspeed|refrayactor|critic|reward|workerdict|trainingworker"
        r"|\[rank\d+\]",
    ),
    ("controller", r"(?i)raylet|gcs_server|autoscaler|log_monitor|dashboard|slurm|kubelet"),
    ("driver", r"(?i)entrypoint|taskrunner|main_task|driver"),
)


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
    """Add to the block starts of `ev` (sorted by idx) `tb_end`/`tb_end_idx` (the final line,
    past a Ray wrapper), `tb_wrap_idx` (the wrapper passed) and `tb_open` (a wrapper whose
    wrapped exception is not in `ev`, or not within WINDOW_LINES).

    A block ends within its attempt (`attempt_starts`: the lines that start one): a process
    killed while it printed a traceback leaves it without a final line, and the next attempt's
    process may have the same pid, so the same prefix; its lines are never the block's end."""
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


# --- meaning, once per file ---------------------------------------------------------------


def _exception_fields(msg: pl.Expr) -> dict[str, pl.Expr]:
    """exc_type (last dotted name; a wrapper's inner type), message, `_colon` (`Type:` form)."""
    groups = msg.str.extract_groups(_EXCEPTION)
    name = groups.struct.field("1").str.split(".").list.last()
    inner = groups.struct.field("2").str.split(".").list.last()
    exc_type = pl.coalesce(inner, name)
    text = groups.struct.field("4").fill_null("")
    message = pl.when(exc_type.is_not_null()).then(text).otherwise(msg.str.strip_chars())
    return {
        "exc_type": exc_type,
        "message": message,
        "_colon": groups.struct.field("3").is_not_null(),
    }


def _named(text: pl.Expr) -> pl.Expr:
    """The component a process or `ray::Class` name in `text` says, else null."""
    found = pl.lit(None, dtype=pl.String)
    for component, pattern in reversed(_NAMED):
        found = pl.when(text.str.contains(pattern)).then(pl.lit(component)).otherwise(found)
    return found


def _component() -> pl.Expr:
    """The entry's component, else a `ray::Class` named, else the process prefix, else driver."""
    ray_class = [
        pl.col(c).str.extract(r"ray::[A-Za-z_]\w*", 0)
        for c in ("final_msg", "wrap_msg", "first_msg")
    ]
    prefix = pl.col("prefix").fill_null("")
    system = pl.when(prefix.str.contains(_SYSTEM_PREFIX)).then(pl.lit("controller"))
    # vLLM's own logger header (`ERROR 04-28 02:37:03 [core.py:398] `) marks an engine line
    vllm = pl.when(pl.col("vllm_header")).then(pl.lit("engine"))
    return pl.coalesce(
        pl.col("entry_component"),
        *(_named(name) for name in ray_class),
        system,
        _named(prefix),
        vllm,
        pl.lit("driver"),
    )


def _entries(raw: pl.DataFrame) -> pl.DataFrame:
    """`entry` (final line first, then the wrapper, then the first line) and `_first_entry`.

    The three texts of every row are matched in one pass over a stacked frame, so the catalogue's
    expressions are evaluated once per file, whatever the number of rows.
    """
    texts = pl.concat(
        [
            raw.select(_row="_row", _rank=pl.lit(rank, pl.Int8), _t=pl.col(column))
            for rank, column in enumerate(("final_msg", "wrap_msg", "first_msg"))
        ]
    )
    found = texts.filter(pl.col("_t").is_not_null()).with_columns(
        _e=catalogue().match_expr(pl.col("_t"))
    )
    best = found.filter(pl.col("_e").is_not_null()).sort("_row", "_rank")
    entry = best.group_by("_row").agg(entry=pl.col("_e").first())
    first = found.filter(pl.col("_rank") == 2).select("_row", _first_entry="_e")
    raw = raw.join(entry, on="_row", how="left", maintain_order="left")
    return raw.join(first, on="_row", how="left", maintain_order="left")


def _is_failure() -> pl.Expr:
    """Rows kept: a block, a literal rule, a catalogue entry, or a final `Type: message` line."""
    exception_line = pl.col("exc_type").is_not_null() & pl.col("_colon")
    return (
        pl.col("err").is_not_null()
        | pl.col("block")
        | pl.col("entry").is_not_null()
        | (exception_line)
    )


_TEXTS: Final = ("text", "first_msg", "final_msg", "wrap_msg", "prefix")


def redacted(raw: pl.DataFrame) -> pl.DataFrame:
    """`raw` with its texts redacted (`redact_frame`: a vectorised prefilter picks the few cells
    that may hold a credential, and only those go through `redact_text`)."""
    return raw.with_columns(redact_frame(raw.select(_TEXTS)))


def annotate(raw: pl.DataFrame) -> pl.DataFrame:
    """ERRORS rows (schema.ERRORS) from a file's RAW_ERRORS rows: the rows that are failures,
    with exception, catalogue entry and class, kind, component and signature, every text
    redacted first (`redacted`)."""
    if raw.is_empty():
        return schema.empty(schema.ERRORS)
    cat = catalogue()
    rows = _entries(redacted(raw).with_row_index("_row"))
    rows = rows.with_columns(**_exception_fields(pl.col("final_msg")))
    rows = rows.filter(_is_failure())
    table = cat.table()
    first_kinds = table.select(_first_entry="entry", _first_kind="entry_kind")
    rows = rows.join(table, on="entry", how="left", maintain_order="left")
    rows = rows.join(first_kinds, on="_first_entry", how="left", maintain_order="left")
    kind = pl.coalesce(
        pl.col("err"), pl.col("_first_kind"), pl.col("entry_kind"), pl.lit("exception")
    )
    signature = signature_expr(pl.col("exc_type"), pl.col("message"), pl.col("final_msg"))
    rows = rows.with_columns(kind=kind, component=_component(), signature=signature)
    specific = specific_expr(pl.col("signature")) & ~pl.col("generic").fill_null(False)
    return rows.select(
        pl.col(name).cast(dtype) if name != "specific" else specific.alias("specific")
        for name, dtype in schema.ERRORS.items()
    )
