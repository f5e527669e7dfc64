"""`rl-health parse`: extract the evidence tables from a job directory or a single log file.

Every line it prints that quotes the log (malformed examples, the head of a log without metrics)
is redacted, escaped and cut to QUOTE_BYTES: a 300 MB line is never echoed. The tables it writes
are redacted by `write_frame`.

Logs that cannot be read within the parse memory budget (docs/reliability.md) stop the command
with exit 2 and one line saying why; notes about how the logs were read (lines cut, a compressed
file, a path refused) are printed before the summary. `--cache DIR` keeps the parsed state of
each log file in DIR, so a later run reads only what was appended. `--out` and `--cache` must be
this process's own directories (`shared.safefs`): another user's is refused with exit 2 and one
line; the tables are written under new names and renamed into place (a symlink planted in
`--out` is replaced, never written through).

This is the one parse command: `python -m worker.evidence.logs` runs it too.
"""

from __future__ import annotations

import sys
import tempfile
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, NoReturn

import click

from shared.redact import clean_cut
from shared.safefs import CACHE_MODE, OUTPUT_MODE, UnsafeDirectoryError, owned_directory

if TYPE_CHECKING:
    from worker.cli.terminal import LogProgress
    from worker.evidence.log_cache import LogCache
    from worker.evidence.parsed import LogTables, TrialTables

__all__ = ["parse_command"]

QUOTE_BYTES: Final = 300  # of a log line quoted on the terminal


def _shown(text: str) -> str:
    """A log line as this command prints it: redacted, escaped, cut by bytes."""
    return clean_cut(text, QUOTE_BYTES)


def _fail(message: str) -> NoReturn:
    """Stop with exit 2 and one line (unusable input or settings)."""
    click.echo(f"rl-health parse: {_shown(message)}", err=True)
    raise SystemExit(2)


def _own(path: Path, option: str, mode: int) -> None:
    """`path`, made with `mode` if missing and checked to be this process's own, as
    `options.own_directory` does (same line, exit 2), without importing `worker.cli.options`
    (and the verdict signing it loads, which a parse never needs)."""
    try:
        owned_directory(path, mode=mode)
    except UnsafeDirectoryError as exc:
        click.echo(f"rl-health: {option}: {exc}", err=True)
        raise SystemExit(2) from None


def _writable(out: Path) -> None:
    """`--out`, this process's own (`_own`) and checked writable, as `options.writable_directory`
    does."""
    _own(out, "--out", OUTPUT_MODE)
    try:
        with tempfile.NamedTemporaryFile(dir=out, prefix=".rlhealth-write-test-"):
            pass
    except OSError as exc:
        click.echo(f"rl-health: --out {out} is not a writable directory: {exc.strerror}", err=True)
        raise SystemExit(2) from None


def _progress() -> AbstractContextManager[LogProgress | None]:
    """A progress bar on stderr, only on a terminal (rich is imported only then)."""
    isatty = getattr(sys.stderr, "isatty", None)
    if not (isatty and isatty()):
        return nullcontext()
    from worker.cli.terminal import log_progress

    return log_progress()


def _read_logs(path: Path, cache: LogCache | None) -> tuple[LogTables | None, list[str]]:
    """The tables and the notes to print (refused paths, lines cut, compressed files)."""
    from worker.evidence.layout import discover
    from worker.evidence.logs import LogBudgetError, parse_job_logs, parse_log_file
    from worker.evidence.paths import BundleFiles

    files = BundleFiles(path)
    inputs: tuple[str, ...] = ()
    try:
        with _progress() as progress:  # a bar on stderr, only on a terminal
            if path.is_dir():  # any folder of logs, mapped onto the bundle layout
                layout = discover(path)
                files, inputs = layout.files, () if layout.quiet() else layout.inputs()
                tables = parse_job_logs(layout.root, files=files, progress=progress, cache=cache)
            else:
                tables = parse_log_file(path, source=path.name, progress=progress, cache=cache)
    except LogBudgetError as exc:
        _fail(str(exc))
    notes = [*inputs, *files.refused, *(tables.summary.notes if tables is not None else ())]
    return tables, notes


def _read(path: Path, cache_dir: Path | None) -> tuple[LogTables | None, list[str]]:
    """The tables and the notes to print, the log cache's notes printed on stderr."""
    from worker.evidence.log_cache import LogCache

    cache = LogCache(directory=cache_dir) if cache_dir is not None else None
    found = _read_logs(path, cache)
    for note in cache.notes if cache is not None else ():
        click.echo(f"cache: {_shown(note)}", err=True)
    return found


def _read_trials(path: Path, trace_jobs_dir: Path | None) -> TrialTables | None:
    if not path.is_dir() and trace_jobs_dir is None:
        return None  # a single log file: the trials module is not even imported
    from worker.evidence.layout import discover
    from worker.evidence.trials import read_trials

    if path.is_dir():
        found = discover(path).trials if trace_jobs_dir is None else None
        return read_trials(path, path / found if found else trace_jobs_dir)
    assert trace_jobs_dir is not None
    return read_trials(trace_jobs_dir.parent, trace_jobs_dir)


def _write_trials(
    trials: TrialTables | None, out: Path, fmt: Literal["csv", "parquet"]
) -> list[Path]:
    from worker.cli.tables import write_frame

    if trials is None or trials.trials.is_empty():
        return []
    return [write_frame(trials.trials, out, "trials", fmt)]


def _failures_line(logs: LogTables) -> str:
    errors = logs.errors
    known = errors.get_column("entry").is_not_null().sum()
    return (
        f"failure rows: {errors.height:,} ({known:,} catalogued, "
        f"{errors.get_column('signature').n_unique():,} signatures; `rl-health signatures` "
        "lists them)"
    )


def _summary_lines(logs: LogTables | None, trials: TrialTables | None) -> list[str]:
    lines: list[str] = []
    if logs is not None:
        s = logs.summary
        records = ", ".join(f"{k}={v:,}" for k, v in sorted(s.records.items())) or "none"
        lines += [
            f"files: {_shown(', '.join(s.files)) or 'none'} ({s.lines:,} lines, {s.bytes:,} bytes)",
            f"records: {records}",
            f"serializations seen: {', '.join(s.serializations) or 'none'}",
            f"malformed lines: {s.malformed:,}",
            *(f"  {_shown(example)}" for example in s.malformed_examples),
            f"metric steps: {logs.metrics['step'].n_unique():,}; "
            f"metric keys: {logs.metrics['key'].n_unique():,}",
            _failures_line(logs),
        ]
    if trials is not None:
        lines.append(f"trials: {trials.trials.height:,} ({len(trials.unreadable)} unreadable)")
    return lines


def _no_metrics_message(path: Path, logs: LogTables | None) -> str:
    if logs is None:
        return f"no usable metrics: no log file found under {_shown(str(path))}"
    head = "\n".join(f"  | {_shown(line)}" for line in logs.summary.head) or "  (the log is empty)"
    return (
        f"no usable metrics in {_shown(str(path))}: no WANDB_MIRROR record, console dict, "
        f"policy dict or reward line was recognised ({logs.summary.lines:,} lines, "
        f"{logs.summary.malformed:,} malformed). "
        f"The log looks like this:\n{head}"
    )


@click.command("parse")
@click.argument("path", type=click.Path(path_type=Path, exists=True))
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path(),
    show_default=True,
    help="Directory for the tables.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["csv", "parquet"]), default="csv", show_default=True
)
@click.option(
    "--trace-jobs-dir",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    help="Harbor/terminal-bench trials, when not at JOB_DIR/trace_jobs.",
)
@click.option(
    "--cache",
    "cache_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Keep each log's parsed state here; a later run reads only the appended bytes.",
)
def parse_command(
    path: Path,
    out: Path,
    fmt: Literal["csv", "parquet"],
    trace_jobs_dir: Path | None,
    cache_dir: Path | None,
) -> None:
    """Extract metrics, phases, engines, trials and errors tables from PATH (a job directory or a
    single log file) into --out, and print a short summary.

    Exits 1, quoting what the log looks like, when no usable metrics were found (a failed probe);
    the other tables are still written.
    """
    from worker.evidence.logs.budget import parse_settings

    try:
        parse_settings()
    except ValueError as exc:
        _fail(str(exc))
    _writable(out)
    if cache_dir is not None:
        _own(cache_dir, "--cache", CACHE_MODE)
    logs, notes = _read(path, cache_dir)
    trials = _read_trials(path, trace_jobs_dir)
    from worker.cli.tables import write_tables

    try:
        written = write_tables(logs, out, fmt) if logs is not None else []
        written += _write_trials(trials, out, fmt)
    except OSError as exc:
        _fail(f"cannot write the tables to {out}: {exc.strerror or exc}")
    for note in notes:
        click.echo(f"note: {_shown(note)}")
    for line in _summary_lines(logs, trials):
        click.echo(line)
    click.echo("wrote: " + (", ".join(p.name for p in written) or "nothing"))
    if logs is None or logs.metrics.is_empty():
        click.echo(_no_metrics_message(path, logs), err=True)
        raise SystemExit(1)
