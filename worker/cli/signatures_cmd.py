"""`rl-health signatures`: which failure lines of a log matched which catalogue entry or signature.

For an operator extending the catalogue (worker/evidence/failures/catalogue.toml, see
docs/failures.md): every ERRORS row the parser made from PATH, with its kind, class, catalogue
entry (or none), component, exception and signature, then the distinct signatures and how often
each occurred. The parse is the one `diagnose` runs, so what this shows is what the gates see.

Every text it prints is redacted and escaped (the parser signs redacted texts; the quoted line is
cut by bytes). Logs that cannot be read within the parse memory budget, or an unusable
RLHEALTH_PARSE_MEMORY_MB, stop it with exit 2 and one line saying why, as `rl-health parse` does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, NoReturn

import click
import polars as pl

from shared.redact import clean, clean_cut, redact_data

__all__ = ["signatures_command"]

_COLUMNS = (
    "source",
    "line",
    "last_line",
    "attempt",
    "kind",
    "failure_class",
    "entry",
    "component",
    "exc_type",
    "signature",
    "specific",
    "text",
)
_TEXT_CHARS = 160
_MESSAGE_MAX_BYTES = 300


def _fail(message: str) -> NoReturn:
    """Stop with exit 2 and one line (logs past the memory budget, an unusable setting)."""
    click.echo(f"rl-health signatures: {clean_cut(message, _MESSAGE_MAX_BYTES)}", err=True)
    raise SystemExit(2)


def _errors(path: Path) -> pl.DataFrame:
    """The failure rows of PATH; a folder is read through its layout (`worker.evidence.layout`),
    whose decisions — each file taken and what as, each skipped and why — go to stderr."""
    from worker.evidence import schema
    from worker.evidence.layout import discover
    from worker.evidence.logs import LogBudgetError, parse_job_logs, parse_log_file
    from worker.evidence.logs.budget import parse_settings

    try:
        parse_settings()
        if path.is_dir():
            layout = discover(path)
            for line in () if layout.quiet() else layout.inputs():
                click.echo(f"input: {clean(line)}", err=True)
            tables = parse_job_logs(layout.root, files=layout.files)
        else:
            tables = parse_log_file(path, source=path.name)
    except LogBudgetError as exc:
        _fail(str(exc))
    except ValueError as exc:  # an unusable RLHEALTH_PARSE_MEMORY_MB
        _fail(str(exc))
    if tables is None:
        click.echo(f"input: no log file was read under {clean(str(path))}", err=True)
    return tables.errors if tables is not None else schema.empty(schema.ERRORS)


def _meaning(row: dict[str, Any]) -> str:
    if row["entry"] is None:
        return "uncatalogued"
    return f"{row['failure_class']} {row['entry']}"


def _span(row: dict[str, Any]) -> str:
    first, last = row["line"], row["last_line"]
    where = f"{row['source']}:{first}" + (f"-{last}" if last not in (None, first) else "")
    return where + (f" (attempt {row['attempt']})" if row["attempt"] else "")


def _row_lines(row: dict[str, Any]) -> list[str]:
    specific = "specific" if row["specific"] else "not a signature on its own"
    return [
        clean(f"{_span(row)}  {row['kind']}  [{_meaning(row)}]  {row['component']}"),
        f"    {clean(str(row['text']))[:_TEXT_CHARS]}",  # redacted whole, then cut
        f"    signature: {clean(str(row['signature']))} ({specific})",
    ]


def _summary(errors: pl.DataFrame) -> pl.DataFrame:
    return (
        errors.group_by("signature", "entry", "failure_class", "specific")
        .agg(count=pl.len(), first_line=pl.col("line").min())
        .sort(["count", "first_line"], descending=[True, False])
    )


def _summary_lines(errors: pl.DataFrame) -> list[str]:
    summary = _summary(errors)
    lines = [f"{errors.height} failure row(s), {summary.height} distinct signature(s):"]
    for row in summary.iter_rows(named=True):
        note = "" if row["specific"] else ", not a signature on its own"
        lines.append(clean(f"  {row['count']:>5}x  [{_meaning(row)}{note}] {row['signature']}"))
    return lines


def _as_json(errors: pl.DataFrame) -> str:
    rows = redact_data(errors.select(_COLUMNS).to_dicts())  # redacted whole, then cut
    for row in rows:
        row["text"] = row["text"][:_TEXT_CHARS] if row["text"] is not None else None
    document = {"rows": rows, "signatures": redact_data(_summary(errors).to_dicts())}
    return json.dumps(document, indent=1, default=str)


@click.command("signatures")
@click.argument("path", type=click.Path(path_type=Path, exists=True))
@click.option("--unmatched", is_flag=True, help="Only the rows no catalogue entry matched.")
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
def signatures_command(path: Path, unmatched: bool, fmt: Literal["text", "json"]) -> None:
    """Show the failure rows of PATH (a log file or a job directory): the catalogue entry each
    matched, or none, its class, component and normalised signature, and how often each
    signature occurs."""
    errors = _errors(path)
    if unmatched:
        errors = errors.filter(pl.col("entry").is_null())
    if fmt == "json":
        click.echo(_as_json(errors))
        return
    for row in errors.sort("source", "line").iter_rows(named=True):
        for line in _row_lines(row):
            click.echo(line)
    click.echo("\n".join(_summary_lines(errors)))
