"""Every failure a log shows as an ERRORS row, with its exception, component and signature.

Rows come from:
- **blocks**: a `Traceback (most recent call last)` line or Ray's `Unhandled error (suppress
  with ...)` line gives one row whose end is the first later line of the same actor that is neither
  indented, blank, nor a chaining or traceback header, within WINDOW_LINES lines (each part of a
  chained traceback is its own block). When that end is a Ray wrapper (`RayTaskError(X): ray::...`,
  `ActorDiedError: ... ray::...`) the block goes on to the wrapped exception's own final line.
- **known lines**: the parser's literal rules (`kind` from ERROR_RULES) and the failure catalogue.
- **final exception lines**: `package.Type: message` (`Type(Inner): message` for Ray wrappers)
  that lie in no block of this chunk.

Each row has the exception type (the inner type of a wrapper) and message of its final line, the
catalogue entry and class the failure matches (its final line first, then the wrapper, then its
first line), the component (the entry's, else the `ray::Class` the text names, else the process
prefix, else `engine` for a line with vLLM's logger header, else the driver), its first (`line`) and
last line, and a signature (see `worker.evidence.failures.signature`). Work runs on the few
candidate rows of a chunk, never per line in Python.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from worker.evidence.failures import catalogue, signature_expr, specific_expr
from worker.evidence.logs.detect import UNHANDLED
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


def with_traceback_ends(ev: pl.DataFrame) -> pl.DataFrame:
    """Add to the block starts of `ev` (sorted by idx) `tb_end`/`tb_end_idx` (the final line,
    past a Ray wrapper), `tb_wrap_idx` (the wrapper passed) and `tb_open` (a wrapper whose
    wrapped exception is not in `ev`, or not within WINDOW_LINES)."""
    idx = pl.col("idx")
    after = pl.when(_end_candidate()).then(idx).backward_fill().shift(-1).over("actor")
    frame = ev.with_columns(_after=after, _opens=_opens())
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
    return frame.drop("_after", "_opens", "_e_after", "_wrapper")


def open_tracebacks(ev: pl.DataFrame, n_lines: int) -> pl.Series:
    """Indices of blocks whose end may lie after a chunk of `n_lines` lines."""
    still = (
        _opens()
        & (pl.col("tb_end").is_null() | pl.col("tb_open"))
        & (pl.col("idx") >= n_lines - 1 - WINDOW_LINES)
    )
    return ev.filter(still).get_column("idx")


# --- rows -----------------------------------------------------------------------------------


def _candidates(ev: pl.DataFrame) -> pl.DataFrame:
    """Block starts, lines of a literal rule, and failure lines outside every block."""
    idx = pl.col("idx")
    block_end = pl.when(pl.col("tb_end_idx").is_not_null()).then(pl.col("tb_end_idx"))
    inside = (idx <= block_end.forward_fill().over("actor")).fill_null(False)
    loose = pl.col("failure").fill_null(False) & ~inside
    return ev.filter(pl.col("err").is_not_null() | _opens() | loose)


def _with_lines(rows: pl.DataFrame, ev: pl.DataFrame) -> pl.DataFrame:
    """`_final` and `_wrap`: the messages of a row's final line and of the wrapper it passed."""
    msgs = ev.select("idx", "msg")
    final = pl.coalesce(pl.col("tb_end_idx"), pl.col("idx"))
    rows = rows.with_columns(_fi=final)
    rows = rows.join(
        msgs.rename({"idx": "_fi", "msg": "_final"}), on="_fi", how="left", maintain_order="left"
    )
    rows = rows.join(
        msgs.rename({"idx": "tb_wrap_idx", "msg": "_wrap"}),
        on="tb_wrap_idx",
        how="left",
        maintain_order="left",
    )
    return rows.with_columns(_final=pl.col("_final").fill_null(pl.col("msg")))


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
    ray_class = [pl.col(c).str.extract(r"ray::[A-Za-z_]\w*", 0) for c in ("_final", "_wrap", "msg")]
    prefix = pl.col("prefix").fill_null("")
    system = pl.when(prefix.str.contains(_SYSTEM_PREFIX)).then(pl.lit("controller"))
    # vLLM's own logger header (`ERROR 04-28 02:37:03 [core.py:398] `) marks an engine line
    vllm = pl.when(pl.col("text").str.contains(_VLLM_HEADER)).then(pl.lit("engine"))
    return pl.coalesce(
        pl.col("entry_component"),
        *(_named(name) for name in ray_class),
        system,
        _named(prefix),
        vllm,
        pl.lit("driver"),
    )


def _with_meaning(rows: pl.DataFrame) -> pl.DataFrame:
    """Catalogue entry and class, kind, exception, component and signature of each row."""
    cat = catalogue()
    final, wrap, first = pl.col("_final"), pl.col("_wrap"), pl.col("msg")
    rows = rows.with_columns(
        entry=pl.coalesce(cat.match_expr(final), cat.match_expr(wrap), cat.match_expr(first)),
        _first_entry=cat.match_expr(first),
        **_exception_fields(final),
    )
    table = cat.table()
    first_kinds = table.select(_first_entry="entry", _first_kind="entry_kind")
    rows = rows.join(table, on="entry", how="left", maintain_order="left")
    rows = rows.join(first_kinds, on="_first_entry", how="left", maintain_order="left")
    kind = pl.coalesce(
        pl.col("err"), pl.col("_first_kind"), pl.col("entry_kind"), pl.lit("exception")
    )
    sig = signature_expr(pl.col("exc_type"), pl.col("message"), final)
    return rows.with_columns(kind=kind, component=_component(), signature=sig)


def _is_failure() -> pl.Expr:
    """Rows kept: a block, a literal rule, a catalogue entry, or a final `Type: message` line."""
    exception_line = pl.col("exc_type").is_not_null() & pl.col("_colon")
    return pl.col("err").is_not_null() | _opens() | pl.col("entry").is_not_null() | exception_line


def error_rows(ev: pl.DataFrame) -> pl.DataFrame:
    """ERRORS rows (without `source`) of `ev` (which has line, ts and attempt)."""
    rows = _with_meaning(_with_lines(_candidates(ev), ev)).filter(_is_failure())
    block = pl.col("tb_end_idx").is_not_null()
    own = pl.col("text").str.strip_chars()
    text = pl.when(block).then(pl.coalesce(pl.col("tb_end"), own)).otherwise(own)
    span = pl.when(block).then(pl.col("tb_end_idx").cast(pl.Int64) - pl.col("idx")).otherwise(0)
    specific = specific_expr(pl.col("signature")) & ~pl.col("generic").fill_null(False)
    return rows.select(
        "line",
        timestamp="ts",
        kind="kind",
        text=text,
        attempt="attempt",
        exc_type="exc_type",
        message="message",
        component="component",
        last_line=pl.col("line") + span,
        entry="entry",
        failure_class="failure_class",
        signature="signature",
        specific=specific,
    )
