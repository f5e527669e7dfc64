"""What the commands show on a terminal, and only there: progress on stderr, a coloured text report,
a live table of verdicts.

Every helper checks the stream it writes to: piped or redirected, stdout carries exactly the report
(byte for byte what `render_text` or `render_json` returned) and stderr carries no progress. Rich
also honours NO_COLOR and TERM=dumb.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import IO, Any, Final

from rich.console import Console
from rich.live import Live
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from shared.models import VerdictEntry, iso_utc
from shared.redact import escape_controls

__all__ = [
    "LogProgress",
    "coloured_report",
    "is_terminal",
    "live_verdicts",
    "log_progress",
    "probing",
    "write_report",
]

LogProgress = Callable[[str, int, int], None]
"""The parser's progress callback: `(file about to be read, bytes read before it, bytes in all)`."""

VERDICT_STYLES: Final = {
    "KILL": "bold white on red",
    "NO-KILL": "bold green",
    "ERROR": "bold yellow",
}
STATUS_STYLES: Final = {"PASS": "green", "FAIL": "bold red", "ERROR": "bold yellow", "N/A": "dim"}
_VERDICT_LINE: Final = re.compile(r"^VERDICT: (\S+)")
_STATUS_LINE: Final = re.compile(r"^(?:LIVENESS|RESOURCES|ROLLOUTS|DYNAMICS|DUTY CYCLE): +(\S+)")
_TABLE_ROWS: Final = 30


def is_terminal(stream: IO[str]) -> bool:
    """True when `stream` is an interactive terminal (not a pipe, a file or a captured buffer)."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _console(stream: IO[str]) -> Console:
    return Console(file=stream, soft_wrap=True, highlight=False)


def coloured_report(text: str) -> Text:
    """The text report with its verdict and gate statuses coloured; the characters unchanged."""
    styled = Text(text)
    offset = 0
    for line in text.splitlines(keepends=True):
        for pattern, styles in ((_VERDICT_LINE, VERDICT_STYLES), (_STATUS_LINE, STATUS_STYLES)):
            match = pattern.match(line)
            if match and match.group(1) in styles:
                styled.stylize(
                    styles[match.group(1)], offset + match.start(1), offset + match.end(1)
                )
        offset += len(line)
    return styled


def write_report(text: str, stream: IO[str] | None = None) -> None:
    """Write a text report: coloured on a terminal, exactly `text` anywhere else."""
    stream = stream or sys.stdout
    if not is_terminal(stream):
        stream.write(text)
        return
    _console(stream).print(coloured_report(text), end="")


@contextmanager
def log_progress(stream: IO[str] | None = None) -> Iterator[LogProgress | None]:
    """A progress bar on stderr fed by the log parser's callback; None when not on a terminal."""
    stream = stream or sys.stderr
    if not is_terminal(stream):
        yield None
        return
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=_console(stream), transient=True) as bar:
        task = bar.add_task("reading logs", total=None)

        def advance(source: str, done: int, total: int) -> None:
            label = f"reading {source}" if source else "logs read"
            bar.update(task, description=label, completed=done, total=total or None)
            bar.refresh()  # every file is shown, however fast it is read

        yield advance


def probing(backend: str, stream: IO[str] | None = None) -> Any:
    """A spinner on stderr while live probes run; nothing when not on a terminal."""
    stream = stream or sys.stderr
    if not is_terminal(stream):
        return nullcontext()
    return _console(stream).status(f"running live probes through {backend} (read-only)…")


def _table(entries: list[VerdictEntry]) -> Table:
    table = Table(title="verdicts (newest first)", expand=False)
    for column in ("captured", "verdict", "confidence", "job", "event ids", "report"):
        table.add_column(column, overflow="fold")
    for entry in reversed(entries[-_TABLE_ROWS:]):
        verdict = Text(entry.verdict.value, style=VERDICT_STYLES.get(entry.verdict.value, ""))
        table.add_row(  # Text, never markup; controls escaped: no cell can move the cursor
            iso_utc(entry.captured_at),
            verdict,
            entry.confidence.value,
            Text(escape_controls(entry.job_id)),
            Text("\n".join(escape_controls(i) for i in entry.event_ids)),
            Text(escape_controls(entry.report_uri)),
        )
    return table


def live_verdicts(entries: Iterable[VerdictEntry], stream: IO[str] | None = None) -> int:
    """Show verdicts as they come in a table redrawn in place; returns how many were shown."""
    seen: list[VerdictEntry] = []
    console = _console(stream or sys.stdout)
    with Live(_table(seen), console=console, auto_refresh=False) as live:
        for entry in entries:
            seen.append(entry)
            live.update(_table(seen), refresh=True)
    return len(seen)
