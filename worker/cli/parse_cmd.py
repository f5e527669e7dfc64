"""`rl-health parse`: extract the evidence tables from a job directory or a single log file."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import click

from worker.evidence.model import LogTables, TrialTables

__all__ = ["parse_command"]


def _read_logs(path: Path) -> LogTables | None:
    from worker.evidence.logs import parse_job_logs, parse_log_file

    if path.is_dir():
        return parse_job_logs(path)
    return parse_log_file(path, source=path.name)


def _read_trials(path: Path, trace_jobs_dir: Path | None) -> TrialTables | None:
    from worker.evidence.trials import read_trials

    if path.is_dir():
        return read_trials(path, trace_jobs_dir)
    if trace_jobs_dir is not None:
        return read_trials(trace_jobs_dir.parent, trace_jobs_dir)
    return None


def _write_trials(
    trials: TrialTables | None, out: Path, fmt: Literal["csv", "parquet"]
) -> list[Path]:
    from worker.evidence.logs.write import write_frame

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
            f"files: {', '.join(s.files) or 'none'} ({s.lines:,} lines, {s.bytes:,} bytes)",
            f"records: {records}",
            f"serializations seen: {', '.join(s.serializations) or 'none'}",
            f"malformed lines: {s.malformed:,}",
            *(f"  {example}" for example in s.malformed_examples),
            f"metric steps: {logs.metrics['step'].n_unique():,}; "
            f"metric keys: {logs.metrics['key'].n_unique():,}",
            _failures_line(logs),
        ]
    if trials is not None:
        lines.append(f"trials: {trials.trials.height:,} ({len(trials.unreadable)} unreadable)")
    return lines


def _no_metrics_message(path: Path, logs: LogTables | None) -> str:
    if logs is None:
        return f"no usable metrics: no log file found under {path}"
    head = "\n".join(f"  | {line}" for line in logs.summary.head) or "  (the log is empty)"
    return (
        f"no usable metrics in {path}: no WANDB_MIRROR record, console dict, policy dict or reward "
        f"line was recognised ({logs.summary.lines:,} lines, "
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
def parse_command(
    path: Path, out: Path, fmt: Literal["csv", "parquet"], trace_jobs_dir: Path | None
) -> None:
    """Extract metrics, phases, engines, trials and errors tables from PATH (a job directory or a
    single log file) into --out, and print a short summary.

    Exits 1, quoting what the log looks like, when no usable metrics were found (a failed probe);
    the other tables are still written.
    """
    from worker.evidence.logs import write_tables

    logs = _read_logs(path)
    trials = _read_trials(path, trace_jobs_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = write_tables(logs, out, fmt) if logs is not None else []
    written += _write_trials(trials, out, fmt)
    for line in _summary_lines(logs, trials):
        click.echo(line)
    click.echo("wrote: " + (", ".join(p.name for p in written) or "nothing"))
    if logs is None or logs.metrics.is_empty():
        click.echo(_no_metrics_message(path, logs), err=True)
        raise SystemExit(1)
