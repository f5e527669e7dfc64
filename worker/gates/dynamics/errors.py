"""The dynamics gate's answers when there is nothing to judge: no log, no usable metrics, no step
yet, or a job still inside its initialization grace."""

from __future__ import annotations

from shared.models import GateResult, Quote
from worker.evidence.case import Evidence
from worker.evidence.model import LogTables
from worker.evidence.quotes import log_head, log_head_quotes, quote
from worker.gates.base import error, passed
from worker.gates.dynamics.series import as_float, num, row_quote
from worker.gates.metric_keys import present_keys
from worker.gates.progress import Initialization, finished_steps

__all__ = ["initializing", "log_source", "no_log", "no_step_yet", "no_usable_metrics", "stepped"]


def log_source(logs: LogTables | None) -> str:
    files = logs.summary.files if logs is not None else ()
    return files[0] if files else "finelog.log"


def _malformed_quotes(logs: LogTables) -> tuple[Quote, ...]:
    """The parser's malformed examples ("source:line: text") as quotes."""
    quotes = []
    for example in logs.summary.malformed_examples[:2]:
        source, line, text = [*example.split(":", 2), "", ""][:3]
        number = int(line) if line.strip().isdigit() else None
        quotes.append(quote(source or log_source(logs), text or example, line=number))
    return tuple(quotes)


def no_usable_metrics(logs: LogTables) -> GateResult:
    """ERROR: a parser that returns no usable metrics is a failed probe; show what the log is."""
    summary, source = logs.summary, log_source(logs)
    keys = sorted(present_keys(logs.metrics))
    head = log_head_quotes(logs, limit=5)
    evidence = (
        head
        + _malformed_quotes(logs)
        + tuple(
            row_quote(r, f"step {r['step']} {r['key']}={num(as_float(r['value']))}")
            for r in logs.metrics.head(1).iter_rows(named=True)
        )
    )
    head_text = [text for _i, text in log_head(logs)]
    begins = f"; log begins {head_text[0][:80]!r}" if head_text else "; no non-empty line read"
    text = (
        f"no usable metrics (no reward, entropy or loss key) in {summary.lines} line(s) of "
        f"{', '.join(summary.files) or 'the log'}: serializations seen "
        f"{', '.join(summary.serializations) or 'none'}, {summary.malformed} malformed"
        f"{', keys seen ' + ', '.join(keys[:5]) if keys else ''}{begins}"
    )
    return error(
        text,
        missing=("reward, entropy or loss metrics",),
        evidence=evidence or (quote(source, "(the parser read no line from this log)"),),
        details=tuple(f"head: {line}" for line in head_text[:10]),
        next_action="inspect the log serialization (the metric parse is a failed probe) before "
        "classifying dynamics",
        flip_signal="the parser reads reward, entropy or loss from the log",
    )


def no_log(evidence: Evidence) -> GateResult:
    status = evidence.bundle.statuses.get("finelog")
    raw = status.raw if status is not None else None
    return error(
        "no trainer log: no metrics to judge dynamics from",
        missing=("trainer log",),
        evidence=(quote("manifest.json", f"artifacts.finelog: {raw or '(missing)'}"),),
        next_action="sync the job's finelog (watcher refresh), then re-diagnose",
        flip_signal="a trainer log with reward, entropy or loss metrics",
    )


def initializing(init: Initialization) -> GateResult:
    return passed(
        f"initializing since {init.since.isoformat()}: no step finished yet, no window yet",
        initializing=True,
        flip_signal=f"no finished step by {init.deadline.isoformat()} (liveness), or NaN/inf in "
        "the first window's loss or grad norm",
        next_action="none from dynamics until a window exists",
    )


def stepped(logs: LogTables) -> bool:
    """The log shows a training step: a finished step timer, a metric row or a malformed record."""
    return (
        not finished_steps(logs).is_empty()
        or not logs.metrics.is_empty()
        or logs.summary.malformed > 0
    )


def _newest_timer_quotes(logs: LogTables) -> tuple[Quote, ...]:
    rows = logs.timers.sort("line").tail(2).iter_rows(named=True)
    return tuple(
        quote(r["source"], f"{r['event'].capitalize()}: '{r['phase']}'", r["line"], r["timestamp"])
        for r in rows
    )


def no_step_yet(logs: LogTables) -> GateResult:
    """Past the initialization grace (or after the job ended) with no step at all: no metrics."""
    source = logs.summary.files[0] if logs.summary.files else "finelog.log"
    return error(
        f"no finished step and no metric record in {logs.summary.lines} line(s) of the newest "
        "attempt's log, past its initialization grace: no dynamics to judge",
        missing=("trainer metrics (no step finished)",),
        evidence=_newest_timer_quotes(logs)
        or log_head_quotes(logs)
        or (quote(source, f"{logs.summary.lines} line(s), no step"),),
        flip_signal="a finished step or a metric record appears",
        next_action="none from dynamics until a window exists",
    )
