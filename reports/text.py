"""The procedure's text report (docs/domain.md#the-procedure), line for line.

```
RL-JOB-HEALTH — <job-id> — captured <timestamp> at <evidence-dir>

VERDICT: ...
CONFIDENCE: ...
MODE: ...
RESTARTS: <count and interpretation>

LIVENESS:  <STATUS> — <summary> — <first quote>
  second look — <outcome> after <N> s (taken <time>): <what it saw> — <first quote>
RESOURCES: ...
ROLLOUTS:  ...
DYNAMICS:  ...
DUTY CYCLE: ...

REASONING: ...
NEXT ACTION: ...
FLIP SIGNAL: ...
```
Further quotes for a gate follow its line, indented by two spaces; then its detail lines and its
tables (the DYNAMICS metric window and phase table, laid out by `reports.tables`), indented the
same way. A handoff follows NEXT ACTION, indented; the second look before a stall KILL, when one was
taken, closes the LIVENESS section, indented, with its quotes;
the inputs (what each file given was taken to be, what was skipped and why, where the dates of
time-only lines came from), then the discrepancies, when there are any, close the report.

No line is wider than `WIDTH` (120) characters, except for one word longer than that (a URI):
a longer line continues on the next lines, indented to where its field's value begins (a field
line: `LIVENESS:  ` is 11 characters, so its continuation lines start with 11 spaces) or four
spaces deeper than itself (an indented line), so every field stays one logical line — join a
line's continuation lines to it with one space to read it whole. A table wider than the page is
laid out in blocks of columns, each repeating the row's key (`reports.tables`).

Every value is rendered from `reports.bounds.bounded(report)`: redacted, control characters
escaped (no evidence value can forge a line), lists capped with `… and N more`, the whole report
under `MAX_REPORT_BYTES`.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable

from reports.bounds import OMITTED_SOURCE, bounded_rendering
from reports.tables import format_table
from shared.models import (
    GateName,
    GateResult,
    GateStatus,
    Handoff,
    Quote,
    Report,
    SecondLook,
    iso_utc,
)
from shared.times import duration_text

__all__ = ["WIDTH", "format_quote", "logical_lines", "render_text", "wrap_line"]

INDENT = "  "
WIDTH = 120
CONTINUED = "    "  # an indented line's continuation: four spaces deeper than the line itself
# a field line of the template: its label, up to where the value begins
_FIELD = re.compile(r"^(?:RL-JOB-HEALTH — |[A-Z][A-Z ]*[A-Z]: +)")
_LABELS: dict[GateName, str] = {
    GateName.LIVENESS: "LIVENESS:  ",
    GateName.RESOURCES: "RESOURCES: ",
    GateName.ROLLOUTS: "ROLLOUTS:  ",
    GateName.DYNAMICS: "DYNAMICS:  ",
    GateName.DUTY_CYCLE: "DUTY CYCLE: ",
}


def format_quote(quote: Quote) -> str:
    """`"text" (source:line, timestamp)`, omitting what is unknown."""
    if quote.source == OMITTED_SOURCE:  # the "… and N more" entry of a capped list
        return quote.text
    where = quote.source if quote.line is None else f"{quote.source}:{quote.line}"
    stamp = iso_utc(quote.timestamp)
    origin = f"{where}, {stamp}" if stamp else where
    return f'"{quote.text}" ({origin})'


def _with_quotes(head: str, quotes: tuple[Quote, ...]) -> list[str]:
    if not quotes:
        return [head]
    first, *rest = quotes
    return [f"{head} — {format_quote(first)}", *(INDENT + format_quote(q) for q in rest)]


def _gate_lines(name: GateName, gate: GateResult) -> list[str]:
    if name is GateName.DUTY_CYCLE and gate.status is GateStatus.NA:
        return [f"{_LABELS[name]}N/A — {gate.summary}"]
    lines = _with_quotes(f"{_LABELS[name]}{gate.status.value} — {gate.summary}", gate.evidence)
    lines.extend(INDENT + detail for detail in gate.details)
    width = WIDTH - len(INDENT)
    lines.extend(INDENT + row for table in gate.tables for row in format_table(table, width))
    return lines


def _second_look_lines(look: SecondLook | None) -> list[str]:
    """The second look before a stall KILL, under LIVENESS: what it saw, then its quotes."""
    if look is None:
        return []
    head = (
        f"{INDENT}second look — {look.outcome.value} after {duration_text(look.waited_s)} "
        f"(taken {iso_utc(look.taken_at)}): {look.summary}"
    )
    first, *rest = _with_quotes(head, look.evidence)
    return [first, *(INDENT + line for line in rest)]


def _restarts_lines(report: Report) -> list[str]:
    restarts = report.restarts
    count = "unknown" if restarts.count is None else str(restarts.count)
    return _with_quotes(f"RESTARTS: {count} — {restarts.interpretation}", restarts.evidence)


def _handoff_lines(handoff: Handoff | None) -> list[str]:
    if handoff is None:
        return []
    lines = [
        f"{INDENT}handoff — likely cause: {handoff.likely_cause}",
        f"{INDENT}handoff — component: {handoff.component}",
        f"{INDENT}handoff — proposed behaviour: {handoff.proposed_behavior}",
        f"{INDENT}handoff — test that proves the fix: {handoff.test}",
    ]
    lines.extend(f"{INDENT}handoff — evidence: {format_quote(q)}" for q in handoff.evidence)
    return lines


def _input_lines(items: Iterable[str]) -> list[str]:
    items = list(items)
    if not items:
        return []
    return ["", "INPUTS:", *(f"{INDENT}- {item}" for item in items)]


def _discrepancy_lines(items: Iterable[str]) -> list[str]:
    items = list(items)
    if not items:
        return []
    return ["", "DISCREPANCIES:", *(f"{INDENT}- {item}" for item in items)]


def _hang(line: str) -> str:
    """The indentation of `line`'s continuation lines."""
    field = _FIELD.match(line)
    own = len(line) - len(line.lstrip(" "))
    return " " * len(field.group(0)) if field else " " * own + CONTINUED


def wrap_line(line: str, width: int = WIDTH) -> list[str]:
    """`line` as lines of at most `width` characters (a word longer than that stays whole),
    each continuation indented to the field's value or four spaces deeper than the line."""
    if len(line) <= width:
        return [line]
    hang = _hang(line)
    return textwrap.wrap(
        line,
        width=width,
        subsequent_indent=hang,
        break_long_words=False,
        break_on_hyphens=False,
        replace_whitespace=False,
    )


def logical_lines(text: str) -> list[str]:
    """The report's lines with every continuation joined back to its line (one space), as they
    were before wrapping: what a program reading the text report should split on."""
    joined: list[str] = []
    hang: str | None = None
    for line in text.splitlines():
        if hang is not None and line.startswith(hang) and line[len(hang) : len(hang) + 1] != " ":
            joined[-1] = f"{joined[-1]} {line[len(hang) :]}"
            continue
        joined.append(line)
        hang = _hang(line) if line.strip() else None
    return joined


@bounded_rendering  # every value cleaned, every list capped, the whole under a byte ceiling
def render_text(report: Report) -> str:
    """The full text report, ending with a newline."""
    lines = [
        f"RL-JOB-HEALTH — {report.job_id} — captured {iso_utc(report.captured_at)} "
        f"at {report.evidence_dir}",
        "",
        f"VERDICT: {report.verdict.value}",
        f"CONFIDENCE: {report.confidence.value}",
        f"MODE: {report.mode.value}",
        *_restarts_lines(report),
        "",
    ]
    for name in GateName:
        lines.extend(_gate_lines(name, report.gates[name]))
        if name is GateName.LIVENESS:
            lines.extend(_second_look_lines(report.second_look))
    lines.extend(
        [
            "",
            f"REASONING: {report.reasoning}",
            f"NEXT ACTION: {report.next_action}",
            *_handoff_lines(report.handoff),
            f"FLIP SIGNAL: {report.flip_signal}",
            *_input_lines(report.inputs),
            *_discrepancy_lines(report.discrepancies),
        ]
    )
    return "\n".join(wrapped for line in lines for wrapped in wrap_line(line)) + "\n"
