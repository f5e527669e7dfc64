"""The meaning of a log's failure rows: exception, catalogue entry and class, component, signature.

The parser (`worker.evidence.logs.errors`) keeps each failure's candidate row with the texts it
needs (its `RAW_ERRORS` columns); `annotate` gives a whole file's rows their meaning in one
vectorised pass (the catalogue's expressions evaluated once per file, not per chunk). Each row
gets the exception type (the inner type of a Ray wrapper) and message of its final line, the
catalogue entry and class the failure matches (its final line first, then the wrapper, then its
first line), the component (the entry's, else the `ray::Class` the text names, else the process
prefix, else `engine` for a line with vLLM's logger header, else the driver) and a signature
(`signature`). Rows that are no failure (no block, no literal rule, no catalogue entry, no final
`Type: message` line) are dropped.

Credentials are redacted (`shared.redact.redact_frame`) from a row's texts before anything is read
from them: the quoted text, the message and the signature never hold one, and normalising (which
replaces the digits inside a token) never runs on a credential, so two lines that differ only in a
secret have one signature.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from shared.redact import redact_frame
from worker.evidence import schema
from worker.evidence.failures.catalogue import catalogue
from worker.evidence.failures.signature import signature_expr, specific_expr

__all__ = ["annotate"]

_EXCEPTION: Final = (
    r"^((?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure)"
    r"|(?:errors|exceptions)\.[A-Z]\w*))(?:\(([A-Za-z_][\w.]*)\))?(:)?(?:\s+(.*))?$"
)
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
