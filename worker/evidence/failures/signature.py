"""Failure signatures that work on text never seen before.

A signature is the exception type (the last dotted name, the inner type of a Ray wrapper) plus the
message with every run-specific token replaced by a placeholder: uuids, urls, timestamps, hex
addresses, ip addresses and ports, host names, pids, paths, long hex ids, and any other number.
Without an exception type it is the normalised line. The same failure in three attempts then has
one signature even when no catalogue entry knows it.

A signature is *specific* when a word of four letters or more is left once placeholders and the
words every exit record uses ("exit", "code", "failed", "killed", a signal name...) are removed
(a redaction marker such as `<redacted:hf-token>` counts as a placeholder):
`exit code <n>` or Slurm's bare `FAILED` never count on their own.

Each rule is one polars expression, so a table of rows is signed without a Python loop; the Python
functions below run the same expressions on one value.

A signature must be made from redacted text (`shared.redact`): normalising replaces the digits
inside a token, which would hide the rest of it from the redactor. The log parser redacts a row's
texts before it signs them (`worker.evidence.failures.rows.annotate`); `normalise` and `signature`
redact the one value they are given.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from shared.redact import redact_text

__all__ = [
    "GENERIC_WORDS",
    "MAX_SIGNATURE",
    "is_specific",
    "normalise",
    "normalise_expr",
    "signature",
    "signature_expr",
    "specific_expr",
]

MAX_SIGNATURE: Final = 200

# Applied in order; each placeholder holds no digit, so later rules leave it alone.
_RULES: Final[tuple[tuple[str, str], ...]] = (
    (r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", "<uuid>"),
    (r"\b[a-zA-Z][a-zA-Z0-9+.-]*://\S+", "<url>"),
    (
        r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d:?\d\d)?",
        "<time>",
    ),
    (r"\b\d{1,2}:\d\d:\d\d(?:[.,]\d+)?", "<time>"),
    (r"\b0x[0-9a-fA-F]+\b", "<hex>"),
    (r"\b\d{1,3}(?:\.\d{1,3}){3}\b", "<ip>"),
    (
        r"\b(?:[a-zA-Z0-9-]+\.)+(?:com|net|org|io|ai|dev|local|internal|cluster|svc)\b",
        "<host>",
    ),
    (r"(<ip>|<host>|localhost)(?::\d+|<\d+>)", "$1:<port>"),
    (r"\b(?i:port)[=: ]+\d+", "port=<port>"),
    (r"\b(?i:pid)[=: ]+\d+", "pid=<pid>"),
    (r"(?:[\w.-]*/)+[\w.-]+", "<path>"),
    (r"\b[0-9a-fA-F]{12,}\b", "<id>"),
    (r"\d+(?:\.\d+)*", "<n>"),
    (r"\s+", " "),
)

GENERIC_WORDS: Final[tuple[str, ...]] = (
    # how a process ended, said by any scheduler or launcher
    "exit", "exited", "exits", "exiting", "exitcode", "code", "codes", "status", "return",
    "returned", "returncode", "signal", "sigkill", "sigterm", "sigint", "sigabrt", "sigsegv",
    "sigbus", "sighup", "killed", "kill", "terminated", "terminate", "terminating", "failed",
    "failure", "fail", "fails", "error", "errors", "err", "fatal", "abort", "aborted", "crash",
    "crashed", "cancelled", "canceled", "completed", "finished", "stopped", "done", "received",
    "non", "zero", "nonzero", "none", "null", "unknown",
    # who ended
    "process", "job", "jobs", "task", "tasks", "step", "srun", "slurmstepd", "sbatch", "pod",
    "container", "node", "worker", "rank", "local_rank", "pid", "binary", "python", "state",
    "reason",
    # glue
    "the", "and", "was", "has", "had", "been", "for", "with", "due", "not", "from", "this",
)  # fmt: skip


def normalise_expr(text: pl.Expr) -> pl.Expr:
    """`text` with run-specific tokens replaced by placeholders, spaces collapsed, truncated."""
    for pattern, placeholder in _RULES:
        text = text.str.replace_all(pattern, placeholder)
    return text.str.strip_chars().str.slice(0, MAX_SIGNATURE)


def signature_expr(exc_type: pl.Expr, message: pl.Expr, text: pl.Expr) -> pl.Expr:
    """`Type: normalised message`, `Type` alone, or the normalised `text` without a type."""
    norm = normalise_expr(message.fill_null(""))
    typed = pl.when(norm.str.len_chars() > 0).then(pl.format("{}: {}", exc_type, norm))
    with_type = typed.otherwise(exc_type)
    plain = normalise_expr(text)
    found = pl.when(exc_type.is_not_null()).then(with_type).otherwise(plain)
    found = found.str.slice(0, MAX_SIGNATURE)
    return pl.when(found.str.len_chars() > 0).then(found).otherwise(pl.lit(None, pl.String))


def specific_expr(sig: pl.Expr) -> pl.Expr:
    """True when `sig` says more than how a process ended (Boolean, False for null)."""
    words = (
        sig.str.replace_all(r"<[\w:-]+>", " ")
        .str.to_lowercase()
        .str.extract_all(r"[a-z][a-z_]{3,}")
    )
    meaningful = words.list.eval(pl.element().filter(~pl.element().is_in(list(GENERIC_WORDS))))
    return (meaningful.list.len() > 0).fill_null(False)


def _one(expr: pl.Expr, **values: str | None) -> object:
    frame = pl.DataFrame(
        {k: [v] for k, v in values.items()}, schema=dict.fromkeys(values, pl.String)
    )
    return frame.select(expr).item()


def normalise(text: str) -> str:
    """One line redacted and normalised (see `normalise_expr`)."""
    return str(_one(normalise_expr(pl.col("text")), text=redact_text(text)))


def signature(exc_type: str | None, message: str | None, text: str | None = None) -> str | None:
    """The signature of one failure, its texts redacted first (see `signature_expr`)."""
    expr = signature_expr(pl.col("exc_type"), pl.col("message"), pl.col("text").fill_null(""))
    message, text = (redact_text(t) if t is not None else None for t in (message, text))
    found = _one(expr, exc_type=exc_type, message=message, text=text)
    return found if isinstance(found, str) else None


def is_specific(sig: str | None) -> bool:
    """Whether a signature may stand for a failure on its own (see `specific_expr`)."""
    return bool(_one(specific_expr(pl.col("sig")), sig=sig))
