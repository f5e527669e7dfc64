"""Wedged and restarting inference engines, judged by their effect on the job.

A vLLM engine can wedge while its `/health` stays 200: it holds requests (Waiting > 0), runs none
(Running 0) and generates nothing (0 tok/s) — for hours, since nothing restarts a healthy-looking
engine (vLLM issue and PR threads on hung engines). vLLM logs an interval without throughput at
DEBUG, so at INFO a wedge shows as one such stat line and then silence; with DEBUG logging (or an
older logger) as the same line interval after interval. `worker.gates.engines.engine_wedges`
finds both shapes; this module decides what they mean for the job. An engine can also fail to
start again and again (`EngineCore failed to start`, `Engine core initialization failed`), each
try a few minutes of a GPU that never serves.

Each rule states its hypothesis in its docstring; the thresholds are STALL_FLOOR_S (a wedge lasts
at least this long), `engines.WEDGE_MIN_INTERVALS` and ENGINE_START_FAILURES.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import polars as pl

from shared.models import GateResult, GateStatus, Handoff, Quote
from shared.times import duration_text
from worker.evidence.case import Evidence
from worker.evidence.facts import LOG_LINE, PHASE, STEP
from worker.evidence.quotes import quote_rows
from worker.gates import engines as eng
from worker.gates.base import error
from worker.gates.engine_owners import owner_of_rows, owners
from worker.gates.progress import minute_utc
from worker.gates.rules import rule

__all__ = [
    "ENGINE_START_FAILURES",
    "START_FAILURE_ENTRIES",
    "check",
    "log_horizon",
    "start_failures",
    "with_start_failures",
]

ENGINE_START_FAILURES: Final = 3
NEVER_STARTED: Final = "an engine that never came up"
"""The owner of failed starts by processes that never logged a stat line: Ray starts a failed
engine actor again in a new process (a new pid, a new worker log), so such failures are counted
together, as one engine that keeps failing to come up, not one failure per process."""
"""An engine that failed to start this many times in one attempt is in a restart loop: a transient
(a node's GPU not yet free, a port in use) clears on the second try; a deterministic start-up
failure (memory, configuration, a missing file) fails every one."""

START_FAILURE_ENTRIES: Final = ("vllm.engine_core_failed_to_start", "vllm.engine_init_failed")
"""Catalogue entries of one failed engine start: the core's own line and the client's. A failed
start usually logs both, so an engine's count is the larger of the two counts, not their sum."""

_LOG_CLASSES: Final = (("ray_vllm_logs/", "ray_logs"), ("pod_logs/", "pod_logs"))


# --- how far each log is known to reach ----------------------------------------------------------


def _reach(evidence: Evidence, name: str, prefix: str | None) -> datetime | None:
    """The newest time a log class is known to cover: its newest dated row at or before `now`
    (engine stat lines, and the trainer's newest line for the class it was read from), or when
    the class was last refreshed, if that is within MAX_EVIDENCE_AGE_S."""
    logs, now = evidence.logs, evidence.now
    stamps: list[datetime] = []
    if logs is not None:
        source = pl.col("source")
        ours = (
            source.str.starts_with(prefix)
            if prefix
            else ~pl.any_horizontal(source.str.starts_with(p) for p, _ in _LOG_CLASSES)
        )
        newest = logs.engines.filter(ours & (pl.col("timestamp") <= now))["timestamp"].max()
        stamps += [newest] if isinstance(newest, datetime) else []
    line = evidence.facts.newest(LOG_LINE)
    if line is not None and (line.quote.source.startswith(prefix) if prefix else True):
        stamps.append(line.at)
    fresh = evidence.bundle.freshness.get(name)
    if fresh is not None and not fresh.stale and fresh.age_s is not None:
        stamps.append(min(now, now - timedelta(seconds=fresh.age_s)))
    return max(stamps, default=None)


def log_horizon(evidence: Evidence) -> pl.Expr | None:
    """Per ENGINES row (by its `source`), the newest time its log is known to reach; None for a
    job in a terminal state (its engines stop logging when it ends: silence proves nothing)."""
    state = evidence.facts.state
    if state is not None and state.terminal:
        return None
    expr: pl.Expr = pl.lit(_reach(evidence, "finelog", None), dtype=pl.Datetime("us", UTC))
    for prefix, name in _LOG_CLASSES:
        reach = pl.lit(_reach(evidence, name, prefix), dtype=pl.Datetime("us", UTC))
        expr = pl.when(pl.col("source").str.starts_with(prefix)).then(reach).otherwise(expr)
    return expr


# --- start-up failures ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StartFailures:
    """Failed engine starts of the newest attempt: one row per engine owner (`owner`,
    `failures`) and the rows themselves (`_owner` attributed) for quoting."""

    per_engine: pl.DataFrame
    rows: pl.DataFrame

    @property
    def total(self) -> int:
        return int(self.per_engine["failures"].sum()) if not self.per_engine.is_empty() else 0

    def looping(self) -> pl.DataFrame:
        return self.per_engine.filter(pl.col("failures") >= ENGINE_START_FAILURES)

    def text(self) -> str:
        """`9 (4242@10.0.0.1: 9; ...)`, the busiest engines first."""
        listed = "; ".join(
            f"{row['owner']}: {row['failures']}"
            for row in self.per_engine.head(3).iter_rows(named=True)
        )
        return f"{self.total} ({listed})"

    def quotes(self, owner: str) -> tuple[Quote, ...]:
        rows = self.rows.filter(pl.col("_owner") == owner)
        rows = rows.sort("timestamp", "line", nulls_last=True)  # the client's line has no time
        ends = rows.head(1) if rows.height < 2 else pl.concat([rows.head(1), rows.tail(1)])
        return quote_rows(ends, limit=2)


def start_failures(evidence: Evidence) -> StartFailures:
    """Rows of START_FAILURE_ENTRIES in the newest attempt, at or before `now`, counted per engine
    (`worker.gates.engine_owners`); rows of processes that never logged a stat line count
    together as NEVER_STARTED."""
    logs = evidence.logs
    empty = pl.DataFrame(schema={"owner": pl.String, "failures": pl.Int64})
    if logs is None or logs.errors.is_empty():
        return StartFailures(empty, logs.errors if logs is not None else pl.DataFrame())
    attempt = evidence.facts.newest_attempt
    when = pl.col("timestamp").is_null() | (pl.col("timestamp") <= evidence.now)
    rows = logs.errors.filter(
        (pl.col("attempt") == attempt) & pl.col("entry").is_in(START_FAILURE_ENTRIES) & when
    )
    if rows.is_empty():
        return StartFailures(empty, rows)
    engines = logs.engines.filter(pl.col("attempt") == attempt)
    owned = _never_started(owner_of_rows(rows, engines), owners(engines))
    counts = owned.group_by("_owner", "entry").agg(n=pl.len())
    per = counts.group_by("_owner").agg(failures=pl.col("n").max().cast(pl.Int64))
    per = per.select(owner="_owner", failures="failures").sort(
        ["failures", "owner"], descending=[True, False]
    )
    return StartFailures(per, owned)


def _never_started(owned: pl.DataFrame, served: pl.Series) -> pl.DataFrame:
    """Rows attributed (`_owner`, else their file): the failed starts of several processes that
    never logged a stat line count together as NEVER_STARTED (one process keeps its own name)."""
    owned = owned.with_columns(_owner=pl.coalesce("_owner", "source"))
    never = owned.filter(~pl.col("_owner").is_in(served.implode()))["_owner"].unique()
    if never.len() < 2:
        return owned
    return owned.with_columns(
        _owner=pl.when(pl.col("_owner").is_in(never.implode()))
        .then(pl.lit(NEVER_STARTED))
        .otherwise("_owner")
    )


def with_start_failures(result: GateResult, failures: StartFailures) -> GateResult:
    """`result` whose summary states the newest attempt's failed engine starts, when there are."""
    if failures.total == 0 or "failed to start" in result.summary:
        return result
    note = f"; failed engine starts in the newest attempt: {failures.text()}"
    return result.model_copy(update={"summary": result.summary + note})


# --- the rules -----------------------------------------------------------------------------------


def _wedge_text() -> pl.Expr:
    return pl.format(
        "vLLM engine {}: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 "
        "tokens/s, Running: 0 reqs, Waiting: {} reqs, GPU KV cache usage: {}%",
        pl.col("engine"),
        pl.col("waiting"),
        pl.col("kv").round(1),
    )


def _wedge_quotes(wedged: pl.DataFrame, limit: int = 3) -> tuple[Quote, ...]:
    return quote_rows(wedged.with_columns(_text=_wedge_text()), text_column="_text", limit=limit)


def _how(row: dict[str, Any]) -> str:
    """`since HH:MMZ, N stat lines over M min` (logged) or `..., then no stat line for M min`."""
    shape = f"since {minute_utc(row['since'])}"
    if row["logged"]:
        return f"{shape}, {row['lines']} stat lines over {duration_text(row['run_s'])}"
    return f"{shape}, then no stat line for {duration_text(row['silent_s'])} while its log went on"


def _named(wedged: pl.DataFrame) -> str:
    parts = [
        f"{row['engine']} (Waiting {row['waiting']}, Running 0, 0 tok/s {_how(row)})"
        for row in wedged.head(3).iter_rows(named=True)
    ]
    more = f" and {wedged.height - 3} more" if wedged.height > 3 else ""
    return "; ".join(parts) + more


def _total(evidence: Evidence, states: pl.DataFrame) -> int:
    configured = eng.engine_config(evidence.bundle.entrypoint).num_inference_engines or 0
    return max(states.height, configured)


@rule("resources.wedge")
def _every_engine_wedged(
    evidence: Evidence, states: pl.DataFrame, wedged: pl.DataFrame
) -> GateResult | None:
    """Every engine wedged and no phase or step advanced since the last of them wedged, for more
    than STALL_FLOOR_S: the job cannot generate. It is still not established: a stall is
    established only by live stacks (docs/domain.md#what-established-means), and vLLM's stat line
    cannot tell a wedged scheduler from one paused on purpose or waiting on a KV transfer, a grammar
    or a LoRA load, while at INFO the wedge is mostly silence. ERROR naming what would establish
    it."""
    total = _total(evidence, states)
    if wedged.height < total:
        return None
    began = wedged["since"].max()
    assert isinstance(began, datetime)
    advanced = evidence.facts.newest(PHASE, STEP)
    quiet = (evidence.now - began).total_seconds()
    if (advanced is not None and advanced.at > began) or quiet <= evidence.thresholds.stall_floor_s:
        return None
    newest = (
        f"newest advancement {advanced.quote.text} at {minute_utc(advanced.at)}"
        if advanced
        else "no advancement logged"
    )
    return error(
        f"every inference engine wedged ({wedged.height} of {total}): {_named(wedged)}; "
        f"nothing advanced since {minute_utc(began)} ({newest}): the job cannot generate, but a "
        "wedge is not a proof of a stall without live stacks",
        missing=(
            "py-spy dumps, taken twice while the job exists, of each engine's EngineCore process "
            "and of the trainer ranks (a stall is established only by live stacks; a stat line "
            "cannot tell a wedged scheduler from a paused one)",
        ),
        evidence=_wedge_quotes(wedged) + ((advanced.quote,) if advanced else ()),
        next_action="Capture `py-spy dump --pid <pid>` of every EngineCore and policy rank twice, "
        "some seconds apart (iris task exec <task> -- ...); then rerun. Restarting the engines "
        "(their /health stays 200) releases the job if they are wedged.",
        flip_signal="an engine logging Running > 0 or tokens, or a `Finished:` line in finelog.log"
        f" after {minute_utc(evidence.now)}",
    )


@rule("resources.wedge")
def _engine_wedged(
    evidence: Evidence, states: pl.DataFrame, wedged: pl.DataFrame, failures: StartFailures
) -> GateResult:
    """An engine that held requests with none running and generated nothing for STALL_FLOOR_S
    (logged over at least WEDGE_MIN_INTERVALS lines, or silent after its last line while its log
    went on) is wedged: its /health stays 200 so nothing restarts it, and the job runs on the
    other engines' capacity. A soft FAIL naming it (NO-KILL with a restart handoff)."""
    total = _total(evidence, states)
    quotes = _wedge_quotes(wedged)
    loop = failures.looping()
    summary = (
        f"{wedged.height} of {total} inference engine(s) wedged: {_named(wedged)}; their /health "
        f"stays 200, so nothing restarts them: {wedged.height}/{total} of the generation capacity "
        f"lost; {eng.fleet_line(states)}"
    )
    if not loop.is_empty():
        summary += f"; {_loop_text(loop)}"
        quotes += failures.quotes(str(loop["owner"][0]))
    names = ", ".join(wedged["engine"].head(3).to_list())
    return GateResult(
        status=GateStatus.FAIL,
        summary=summary,
        evidence=quotes,
        tables=(eng.engine_table(states),),
        mechanism="vLLM engine wedged: requests waiting, none running, no tokens, /health 200",
        next_action=f"Restart the wedged engine(s) {names}: the orchestrator will not (their "
        "/health stays 200); the job keeps running on the others.",
        flip_signal=f"engine {wedged['engine'][0]} logging Running > 0 or tokens again",
        handoff=Handoff(
            evidence=quotes,
            likely_cause="a vLLM scheduler that holds requests and runs none (KV blocks not "
            "freed, a hung executor) while its health check passes",
            component=f"vLLM inference engine {names} (liveness of generation)",
            proposed_behavior="judge engine health by generation progress: requests waiting with "
            "none running and 0 tok/s for STALL_FLOOR_S restarts the engine",
            test="an engine whose scheduler holds requests with none running for STALL_FLOOR_S is "
            "restarted and its waiting requests complete",
        ),
    )


def _loop_text(loop: pl.DataFrame) -> str:
    listed = ", ".join(
        f"{r['owner']} {r['failures']} times" for r in loop.head(3).iter_rows(named=True)
    )
    return f"engine(s) failed to start again and again in the newest attempt: {listed}"


@rule("resources.wedge")
def _restart_loop(evidence: Evidence, failures: StartFailures) -> GateResult | None:
    """An engine that failed to start ENGINE_START_FAILURES times in the newest attempt is in a
    restart loop: a deterministic start-up failure repeats on every try while its GPU serves
    nothing. A soft FAIL naming the engine and the count; every engine gone is the death rule's
    (liveness, `logged_death`)."""
    loop = failures.looping()
    if loop.is_empty():
        return None
    owner = str(loop["owner"][0])
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"{_loop_text(loop)} (limit ENGINE_START_FAILURES {ENGINE_START_FAILURES}); "
        f"failed engine starts in the newest attempt: {failures.text()}",
        evidence=failures.quotes(owner),
        mechanism="vLLM engine restart loop: the same engine fails to start again and again",
        next_action=f"Read engine {owner}'s first start-up failure (quoted) and its traceback: a "
        "start-up failure that repeats is a memory or configuration cause, not bad luck.",
        flip_signal="a stat line from the engine that never came up (it started)"
        if owner == NEVER_STARTED
        else f"engine {owner} logging a stat line (it started)",
    )


def check(
    evidence: Evidence, states: pl.DataFrame, wedges: pl.DataFrame, failures: StartFailures
) -> GateResult | None:
    """The wedged-engine and restart-loop rules, or None when neither applies."""
    wedged = wedges.filter(pl.col("wedged")) if not wedges.is_empty() else wedges
    if not wedged.is_empty():
        return _every_engine_wedged(evidence, states, wedged) or _engine_wedged(
            evidence, states, wedged, failures
        )
    return _restart_loop(evidence, failures)
