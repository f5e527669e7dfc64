"""Whether any inference engine generated after a moment, read from each engine's own silence.

vLLM's `LoggingStatLogger` logs an interval at INFO only while that interval or the one before had
prompt or generation tokens ("avoid log noise on an idle production system"); otherwise at DEBUG.
So every interval with tokens leaves an INFO stat line, and an engine that stops generating prints
one last line at 0 tok/s and then nothing (docs/domain.md#idle-engines). Read
per engine of the newest attempt, from its newest stat line at or before `now`:

- a line at 0 prompt and 0 generation tok/s with nothing running, then silence: the engine made
  no tokens since — idle (Waiting 0) or wedged (Waiting > 0), either way generating nothing;
- a line with tokens or running requests, then silence: the log stopped (a death, a cut or stale
  log), not the idle signal — unknown;
- any line of the newest attempt with tokens or running requests after the moment: it generated;
- a line dated after `now`: its clock (or `now`) is off, so neither its lines nor its silence can
  be placed in time;
- silence read from a log class the last sync did not refresh (stale `ray_vllm_logs/`, `pod_logs/`)
  proves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import polars as pl

from shared.models import Quote
from shared.times import duration_text
from worker.evidence.case import Evidence
from worker.evidence.quotes import quote
from worker.gates.progress import minute_utc

__all__ = ["Silence", "engines_generated_since"]

_CLASSES: Final = (("ray_vllm_logs/", "ray_logs"), ("pod_logs/", "pod_logs"))
_ts = pl.col("timestamp")


@dataclass(frozen=True)
class Silence:
    """`holds` when no engine generated after the moment; `reason` says why or why not."""

    holds: bool
    reason: str
    quotes: tuple[Quote, ...] = ()


def stat_quote(row: dict[str, Any]) -> Quote:
    """A vLLM stat row quoted in the stat line's own words."""
    text = (
        f"Engine {row['engine']}: Avg prompt throughput: {row['prompt_tokens_per_s']} tokens/s, "
        f"Avg generation throughput: {row['generation_tokens_per_s']} tokens/s, "
        f"Running: {row['running']} reqs, Waiting: {row['waiting']} reqs, "
        f"GPU KV cache usage: {row['kv_cache_pct']}%"
    )
    return quote(str(row["source"]), text, line=row["line"], timestamp=row["timestamp"])


def _working() -> pl.Expr:
    tokens = (pl.col("generation_tokens_per_s") > 0) | (pl.col("prompt_tokens_per_s") > 0)
    return (tokens.fill_null(value=False) | (pl.col("running") > 0)).fill_null(value=True)


def _stale_class(evidence: Evidence, sources: list[str]) -> str | None:
    for prefix, name in _CLASSES:
        fresh = evidence.bundle.freshness.get(name)
        if fresh is not None and fresh.stale and any(s.startswith(prefix) for s in sources):
            why = fresh.reason or "old sync"
            return f"{prefix.rstrip('/')} is stale ({why}): its silence proves nothing"
    return None


def _ahead(evidence: Evidence, rows: pl.DataFrame) -> Silence | None:
    ahead = rows.filter(_ts > evidence.now)
    if ahead.is_empty():
        return None
    row = ahead.sort("timestamp", "line").row(-1, named=True)
    lead = (row["timestamp"] - evidence.now).total_seconds()
    return Silence(
        False,
        f"engine {row['engine']} logged a stat line dated {duration_text(lead)} after now "
        f"({minute_utc(row['timestamp'])}): its clock is off, so its silence cannot be placed",
        (stat_quote(row),),
    )


def _last_lines(rows: pl.DataFrame, evidence: Evidence) -> Silence:
    last = rows.sort("timestamp", "line").group_by("engine", maintain_order=True).last()
    busy = last.filter(_working())
    if not busy.is_empty():
        row = busy.sort("timestamp").row(-1, named=True)
        return Silence(
            False,
            f"engine {row['engine']}'s last stat line ({minute_utc(row['timestamp'])}) shows "
            f"{row['generation_tokens_per_s']} tok/s and {row['running']} running, then nothing: "
            "not the idle signal (a death or a cut log)",
            (stat_quote(row),),
        )
    stale = _stale_class(evidence, last["source"].to_list())
    if stale is not None:
        return Silence(False, stale)
    newest = last.sort("timestamp").row(-1, named=True)
    waiting = last.filter(pl.col("waiting") > 0)
    reason = (
        f"every engine's last stat line ({last.height} engine(s), the newest at "
        f"{minute_utc(newest['timestamp'])}) at 0 tok/s with nothing running, silent since "
        "(vLLM logs intervals without tokens at DEBUG)"
    )
    if not waiting.is_empty():
        reason += f"; {waiting.height} of them holding requests (wedged, generating nothing)"
    return Silence(True, reason, (stat_quote(newest),))


def engines_generated_since(evidence: Evidence, since: datetime) -> Silence:
    """Whether no engine of the newest attempt generated after `since` (see the module
    docstring): `holds` only when each engine's last stat line is at 0 tok/s with nothing
    running, none worked after `since`, none is dated after `now`, and its log is fresh."""
    logs = evidence.logs
    if logs is None:
        return Silence(False, "no trainer log")
    rows = logs.engines.filter(
        (pl.col("attempt") == evidence.facts.newest_attempt) & _ts.is_not_null()
    )
    if rows.is_empty():
        return Silence(False, "no vLLM engine stat line in the newest attempt")
    ahead = _ahead(evidence, rows)
    if ahead is not None:
        return ahead
    worked = rows.filter((_ts > since) & _working())
    if not worked.is_empty():
        row = worked.sort("timestamp", "line").row(-1, named=True)
        return Silence(False, "engines generated after the newest advancement", (stat_quote(row),))
    return _last_lines(rows, evidence)
