"""`rl-health diagnose`: the whole diagnosis in this process, with no Redis, S3 or cluster.

With `--backend`, the cluster tools, the iris command, the refresh template and the connections are
resolved from the operator's settings at start-up; a setting the allowlist refuses stops the
command with exit 2 before anything runs (docs/security.md). `--cache DIR` keeps each log's parsed
state in DIR, so a later diagnosis of a grown log reads only the appended bytes. `--out` and
`--cache` must be this process's own directories (`shared.safefs`): another user's is refused with
exit 2 and one line.
"""

from __future__ import annotations

import sys
import tempfile
from datetime import UTC, date, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from shared.models import Mode, Report
from shared.redact import clean
from shared.safefs import CACHE_MODE, write_file
from shared.settings import Settings
from worker.backends import BACKENDS
from worker.cli.options import (
    ISO_DATETIME,
    UnusableError,
    load_campaign_thresholds,
    load_settings,
    own_directory,
    writable_directory,
)
from worker.evidence.case import Evidence

if TYPE_CHECKING:
    from worker.backends import Toolbox

__all__ = ["diagnose_command"]


def _tools(settings: Settings) -> Toolbox:
    """The cluster tools, iris command and refresh template, resolved and checked at start-up."""
    from worker.backends import ToolSettingsError, resolve_tools

    try:
        return resolve_tools(settings)
    except ToolSettingsError as exc:
        raise click.UsageError(f"settings refused: {clean(str(exc))}") from exc


def _live_probes(
    first: Evidence, backend: str, out: Path | None, settings: Settings, tools: Toolbox
) -> tuple[Path | None, tuple[str, ...]]:
    from worker.cli.terminal import probing
    from worker.pipeline.capture import capture_live

    target = out / "probes" if out else Path(tempfile.mkdtemp(prefix="rlhealth-probes-"))
    with probing(backend):
        probe_dir, notes = capture_live(first, backend, target, settings, tools=tools)
    if probe_dir is not None and out is None:
        click.echo(f"live probes recorded in {probe_dir}", err=True)
    return probe_dir, notes


def _write_outputs(report: Report, out: Path, html: str) -> None:
    from worker.cli.local_reports import write_local

    write_local(report, out)
    write_file(out, "report.html", html.encode())


def _render(report: Report, evidence: Evidence, fmt: str) -> str:
    from reports.html import render_html
    from reports.json_report import render_json
    from reports.text import render_text

    if fmt == "html":
        return render_html(report, evidence)
    return render_json(report) if fmt == "json" else render_text(report)


class DateParam(click.ParamType[date]):
    """A calendar date, `YYYY-MM-DD`."""

    name = "YYYY-MM-DD"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> date:
        if isinstance(value, date):
            return value
        try:
            return date.fromisoformat(str(value))
        except ValueError:
            self.fail(f"{value!r} is not a date YYYY-MM-DD (e.g. 2026-07-30)", param, ctx)


def _probe_folder(probes_dir: Path | None) -> Path | None:
    """The folder holding probes.json: the one given, or its `probes/` (what `--out` wrote);
    exit 2 with one line when neither holds it (nothing given is ignored in silence)."""
    if probes_dir is None or (probes_dir / "probes.json").is_file():
        return probes_dir
    inner = probes_dir / "probes"
    if (inner / "probes.json").is_file():
        click.echo(f"--probes: reading {inner} (the probes.json of {probes_dir})", err=True)
        return inner
    raise UnusableError(
        f"--probes {probes_dir} holds no probes.json: give the folder a diagnosis recorded its "
        "probes in (`diagnose --out DIR` writes DIR/probes)"
    )


@click.command("diagnose")
@click.argument("job_dir", metavar="PATH", type=click.Path(path_type=Path))
@click.option(
    "--probes",
    "probes_dir",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    help="A recorded probe directory (the one holding probes.json).",
)
@click.option(
    "--log-date",
    type=DateParam(),
    help="The date of the log's time-only [HH:MM:SS] lines (default: inferred, and the report "
    "says from what).",
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    help="Capture live evidence through this backend when the rules call for it.",
)
@click.option("--now", type=ISO_DATETIME, help="Judge the evidence as of this time (default: now).")
@click.option(
    "--mode",
    type=click.Choice([m.value for m in Mode if m is not Mode.UNDECLARED]),
    help="Declare the mode explicitly (else read from the launched entrypoint).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "html"]),
    default="text",
    show_default=True,
    help="html: one self-contained page with the plots (no script, no network).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    help="Also write report.txt, report.json and report.html here.",
)
@click.option(
    "--campaign",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="A campaign file (JSON or TOML) overriding thresholds.",
)
@click.option(
    "--cache",
    "cache_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Keep each log's parsed state here; a later run reads only the appended bytes.",
)
def diagnose_command(
    job_dir: Path,
    probes_dir: Path | None,
    backend: str | None,
    now: datetime | None,
    mode: str | None,
    fmt: str,
    out: Path | None,
    campaign: Path | None,
    cache_dir: Path | None,
    log_date: date | None,
) -> None:
    """Diagnose PATH and print KILL, NO-KILL or ERROR with evidence.

    PATH is a watcher job directory, a folder of logs with any names (a trainer's stdout, pod
    logs, vLLM logs, Harbor trial folders) or a single log file: the report's INPUTS say what
    each file was taken to be, what was skipped and why, and where the dates of time-only lines
    came from.

    Exit 0 whenever a report was made, whatever the verdict; 2 for unusable arguments. On a
    terminal, progress goes to stderr and the text report is coloured; piped, stdout is exactly
    the report.
    """
    from worker.cli.terminal import log_progress, write_report
    from worker.diagnosis import collect_evidence, judge
    from worker.evidence.layout import discover
    from worker.evidence.log_cache import LogCache
    from worker.evidence.logs.budget import parse_settings

    if not (job_dir.is_dir() or job_dir.is_file()):
        raise click.BadParameter(f"{job_dir} is neither a directory nor a file", param_hint="PATH")
    if probes_dir is not None and backend is not None:
        raise click.UsageError("give --probes or --backend, not both")
    probes_dir = _probe_folder(probes_dir)
    try:
        parse_settings()
    except ValueError as exc:
        raise click.UsageError(clean(str(exc))) from exc
    thresholds = load_campaign_thresholds(campaign)
    if out is not None:
        writable_directory(out, "--out")
    if cache_dir is not None:
        own_directory(cache_dir, "--cache", CACHE_MODE)
    cache = LogCache(directory=cache_dir) if cache_dir is not None else None
    moment = now or datetime.now(UTC)
    collect = partial(
        collect_evidence,
        job_dir,
        now=moment,
        mode=Mode(mode) if mode else None,
        thresholds=thresholds,
        evidence_label=str(job_dir),
        log_cache=cache,
        layout=discover(job_dir),
        log_date=log_date,
    )
    notes: tuple[str, ...] = ()
    if backend is not None:
        settings = load_settings()
        tools = _tools(settings)
        with log_progress() as progress:
            first = collect(progress=progress)
        probes_dir, notes = _live_probes(first, backend, out, settings, tools)
    with log_progress() as progress:
        evidence = collect(probes_dir=probes_dir, notes=notes, progress=progress)
    for note in cache.notes if cache is not None else ():
        click.echo(f"cache: {clean(note)}", err=True)
    report = judge(evidence)
    rendered = _render(report, evidence, fmt)
    if fmt == "text":
        write_report(rendered)
    else:
        sys.stdout.write(rendered)
    if out is not None:
        html = rendered if fmt == "html" else _render(report, evidence, "html")
        _write_outputs(report, out, html)
