"""Turn evidence rows into quotes, one way for every gate: redacted, escaped, cut by bytes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import polars as pl

from shared.models import Quote
from shared.redact import clean_cut
from worker.evidence.parsed import LogTables

__all__ = ["is_comment", "log_head", "log_head_quotes", "quote", "quote_rows"]

MAX_QUOTE_BYTES = 400


def quote(
    source: str, text: str, line: int | None = None, timestamp: datetime | None = None
) -> Quote:
    """A quote, its text redacted and escaped, then cut to a readable length by bytes with a
    visible `…[+N bytes]` (redaction first, so a cut never leaves half a credential behind)."""
    text = clean_cut(text.strip(), MAX_QUOTE_BYTES)
    return Quote(source=source, line=line, timestamp=timestamp, text=text)


def _row_quote(row: Mapping[str, Any], text_column: str) -> Quote:
    return quote(
        source=str(row.get("source") or "?"),
        text=str(row.get(text_column) or ""),
        line=row.get("line"),
        timestamp=row.get("timestamp"),
    )


def quote_rows(frame: pl.DataFrame, text_column: str = "text", limit: int = 3) -> tuple[Quote, ...]:
    """Quotes for the first `limit` rows of a table with provenance columns."""
    rows: Iterable[dict[str, Any]] = frame.head(limit).iter_rows(named=True)
    return tuple(_row_quote(row, text_column) for row in rows)


def is_comment(text: str) -> bool:
    """A comment line someone put above a log (`# source: ...`, `#` alone): `#` then a space or
    nothing. `#12 ...` (a number, a tag) is a line of the log itself."""
    stripped = text.lstrip()
    return stripped == "#" or stripped.startswith("# ")


def log_head(logs: LogTables) -> list[tuple[int, str]]:
    """The log's first lines as (index in the head, text), comment lines left out. Hypothesis: a
    program's output rarely begins with `# `, while a file saved by hand or copied from a
    tracker often carries a note above the log; quoting the note says nothing about the log. A
    head of comments only is returned whole (that is what the file holds)."""
    head = list(enumerate(logs.summary.head))
    content = [(i, text) for i, text in head if not is_comment(text)]
    return content or head


def log_head_quotes(logs: LogTables | None, limit: int = 3) -> tuple[Quote, ...]:
    """The first lines of the log, quoted, to show what a log without usable records looks like
    (comment lines above it left out: `log_head`)."""
    if logs is None or not logs.summary.head:
        return ()
    files = logs.summary.files
    source = logs.summary.head_source or (files[0] if files else "finelog.log")
    numbers = logs.summary.head_lines
    return tuple(
        quote(source, text, line=numbers[i] if i < len(numbers) else None)
        for i, text in log_head(logs)[:limit]
    )
