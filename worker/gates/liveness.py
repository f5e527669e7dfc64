"""Liveness: pair the controller's state with the newest step or phase advancement.

Reads the controller state (`probes.controller`, quoted as `probes/controller.json`, when a probe
captured it within MAX_EVIDENCE_AGE_S; else the manifest's `job.state`, quoted as `manifest.json`
with its age), the attempt history (`probes.attempts`, for the terminal time), the manifest's
`pod_logs` status, the log tables (TIMERS `Started:`/`Finished:` rows and train METRICS rows are
the only advancement; ERRORS death lines; PROGRESS step totals; ENGINES only to say they prove
nothing) and live stacks (`probes.stacks`, interpreted by `worker.gates.stacks`).

Rules, first match wins (quiet = now - newest advancement; threshold = max(STALL_FLOOR_S,
STALL_FACTOR x p90 of the open phase's past durations, or of the step's when no phase is open)):

Time is checked, not assumed: advancement is read from `evidence.facts` (rows dated after `now`
never count; the parser has judged each line by its Iris prefix time when its own time disagreed
by a constant offset, and left out the lines the log shipper re-sent: a replayed step line is
never progress, so the quiet time runs from the newest consistent line).

1. ERROR when no controller state is known; when a trainer line is dated more than the clock
   tolerance after `now` (the quiet time cannot be judged as of `now`); or when the manifest is
   older than MAX_EVIDENCE_AGE_S, no fresh controller probe exists and the log's newest line is
   older too (stale evidence).
2. ERROR when the state is terminal (succeeded, failed, killed, worker_failed, unschedulable) but
   the log advanced after the terminal time (newest attempt `finished_at_ms`, else the manifest's
   `finished_at`, else when the state was observed).
3. PASS when the newest global step reached the PROGRESS total (max_steps): the run is complete
   and its tail errors are noise.
3b. FAIL hard (proof `config_failure`, `worker.gates.configuration`) when a configuration-class
   failure ended every attempt and the newest is over (a failed job, or silence past the
   threshold); the handoff comes from the catalogue entry.
3c. ERROR with that handoff when a configuration-class failure ended the newest attempt before
   its first step but 3b cannot establish it yet (`config_death_pending`, job not terminal): a
   logged configuration death ends initialisation; it is never the initialisation PASS.
4. Terminal states: succeeded PASS ("job completed"); killed and unschedulable FAIL; failed /
   worker_failed FAIL, with hard_failure (proof `terminal_failure`) only when both the controller's
   error and the newest attempt's failure row (`Facts.attempt_failures`) are quoted (a
   configuration-class failure adds the catalogue's handoff).
5. ERROR when the controller says running but the manifest's `pod_logs` says no pod (a waiting
   status or 0 pods) and the job was submitted more than STALL_FLOOR_S ago.
6. pending / building / assigned: PASS initialising within INIT_GRACE_S of submission, else FAIL
   (not scheduled; not a hard failure).
7. ERROR without a trainer log. PASS with initializing=True while the newest attempt has finished
   no step and is within INIT_GRACE_S of its start (flip: no `Finished: 'step'` by the deadline),
   unless a logged death (below) is established first.
8. PASS when quiet <= threshold. When the quiet time exceeds it:
   - ERROR when the finelog class is stale in the bundle (the quiet time cannot be judged);
   - FAIL hard (proof `process_death`) when, after the newest advancement, an
     `actor_died`/`worker_crashed` line not of an engine, or an NCCL watchdog timeout followed by
     a death line (traceback, actor death, train loop failed) is logged (a lone watchdog line
     proves nothing);
   - FAIL hard (proof `logged_death`, `worker.gates.deaths`) when a death line of the trainer or
     of every inference engine was logged after the newest advancement and the silence since that
     line exceeds the threshold (one engine of several is no proof);
   - ERROR when a py-spy probe the judgement needs failed (quoting the command and its exit):
     one that names no process, or the dump of a process that is not a helper or native (nor,
     beside ranks parked in a collective, the driver or a coordinator); the others are noted;
   - FAIL hard (proof `stall_stacks`) when two live dumps of each load-bearing process prove a
     stall (`worker.gates.stacks.judge_stacks`, roles from `worker.evidence.roles`, with the
     window of live evidence: after the newest progress of any kind, within MAX_EVIDENCE_AGE_S of
     `now`, of the current attempt); helpers' frames are never movement;
   - FAIL hard (proof `stall_still`) outside collectives: every load-bearing process (rank,
     driver, coordinator) still in two dumps at least MIN_STILL_GAP_S apart, corroborated by the
     log quiet beyond STILL_QUIET_FACTOR x the threshold, no engine generating since the newest
     advancement (each silent after a last stat line at 0 tok/s with nothing running:
     `engine_idle`), and no trial finished since;
   - otherwise ERROR: "stall suspected, live stacks needed" (or: the stacks do not prove a stall).
   Fresh vLLM engine stat lines never count as advancement; when they are fresher than the trainer
   the summary says so (colocated engines can stay busy while the policy mesh is wedged).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl

from shared.models import GateResult, GateStatus, Handoff, KillProof, Quote
from shared.times import age_text, duration_text
from worker.evidence.case import Evidence
from worker.evidence.facts import (
    CLOCK_TOLERANCE_S,
    LOG_LINE,
    PHASE,
    STEP,
    TRIAL,
    Moment,
    ProbeFailure,
)
from worker.evidence.jobstate import JobState
from worker.evidence.model import ArtifactState, LogTables
from worker.evidence.quotes import log_head_quotes, quote, quote_rows
from worker.evidence.roles import roles_of
from worker.gates import configuration, deaths
from worker.gates.base import error, passed
from worker.gates.engine_idle import engines_generated_since
from worker.gates.progress import initialization, minute_utc, newest_attempt, started_at
from worker.gates.rules import rule
from worker.gates.stacks import DumpWindow, ProcessState, StackFinding, judge_stacks

__all__ = ["STACKS_NEEDED", "STILL_QUIET_FACTOR", "check"]

STILL_QUIET_FACTOR = 2.0
"""Outside a collective the log must be quiet this many times the stall threshold: identical
stacks alone do not show a wedge, so the silence must be well past what the run's cadence allows."""
_DEATH_KINDS = ("actor_died", "worker_crashed")
_AFTER_WATCHDOG = ("actor_died", "worker_crashed", "traceback", "train_loop_failed")
STACKS_NEEDED = "py-spy stacks captured while the job exists"


# --- small readings ------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    return duration_text(seconds)


def _p90(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def _newest(frame: pl.DataFrame) -> dict[str, Any] | None:
    rows = frame.filter(pl.col("timestamp").is_not_null())
    if rows.is_empty():
        return None
    return rows.sort(["timestamp", "line"]).row(-1, named=True)


@dataclass(frozen=True)
class ControllerState:
    state: JobState | None
    source: str
    observed_at: datetime | None
    live: bool  # a controller probe captured within MAX_EVIDENCE_AGE_S
    quote: Quote | None


def _controller(evidence: Evidence) -> ControllerState:
    probes, limit = evidence.probes, evidence.thresholds.max_evidence_age_s
    if probes and probes.controller and probes.captured_at is not None:
        age = (evidence.now - probes.captured_at).total_seconds()
        if age <= limit:
            view = probes.controller
            text = f"state={view.state} failure_count={view.failure_count} error={view.error or ''}"
            q = quote("probes/controller.json", text, timestamp=probes.captured_at)
            return ControllerState(
                JobState.parse(view.state), q.source, probes.captured_at, True, q
            )
    bundle = evidence.bundle
    state = JobState.parse(bundle.state)
    synced = bundle.synced_at
    aged = f" (synced {age_text((evidence.now - synced).total_seconds())})" if synced else ""
    aged = aged or " (sync time unknown)"
    q = quote("manifest.json", f"job.state={bundle.state}{aged}", timestamp=bundle.synced_at)
    return ControllerState(state, "manifest.json", bundle.synced_at, False, q)


def _advancement(evidence: Evidence) -> Moment | None:
    """The newest timer or train-metric row dated at or before `now` (`evidence.facts`)."""
    return evidence.facts.newest(PHASE, STEP)


def _engine_quote(logs: LogTables, now: datetime) -> Quote | None:
    row = _newest(logs.engines.filter(pl.col("timestamp") <= now))
    if row is None:
        return None
    text = (
        f"Engine {row['engine']}: Running: {row['running']} reqs, Waiting: {row['waiting']} reqs, "
        f"GPU KV cache usage: {row['kv_cache_pct']}%, "
        f"Avg generation throughput: {row['generation_tokens_per_s']} tokens/s"
    )
    return quote(str(row["source"]), text, line=row["line"], timestamp=row["timestamp"])


# --- the run's cadence --------------------------------------------------------------------------


@dataclass(frozen=True)
class Cadence:
    phase: str
    open: bool
    p90_s: float | None
    samples: int
    threshold_s: float

    def describe(self, floor: float, factor: float) -> str:
        """How the threshold was reached, e.g. `max(STALL_FLOOR_S 600s, 4 x p90 60s of 8 step)`."""
        which = f"open phase '{self.phase}'" if self.open else "step"
        if self.p90_s is None:
            return f"STALL_FLOOR_S {floor:g}s; no past durations of the {which}"
        spread = (
            f"{factor:g} x p90 {_duration(self.p90_s)} of {self.samples} past {which} durations"
        )
        return f"max(STALL_FLOOR_S {floor:g}s, {spread})"


def _open_phases(logs: LogTables) -> list[str]:
    """Phases started and not finished in the newest attempt, innermost (latest started) first."""
    timers = logs.timers.filter(pl.col("attempt") == newest_attempt(logs))
    last = timers.group_by("phase", "event").agg(pl.col("line").max())
    started = {r["phase"]: r["line"] for r in last.iter_rows(named=True) if r["event"] == "started"}
    finished = {
        r["phase"]: r["line"] for r in last.iter_rows(named=True) if r["event"] == "finished"
    }
    open_phases = [(line, p) for p, line in started.items() if line > finished.get(p, -1)]
    return [phase for _, phase in sorted(open_phases, reverse=True)]


def _durations(logs: LogTables, phase: str) -> list[float]:
    timed = logs.timers.filter(
        (pl.col("event") == "finished")
        & (pl.col("phase") == phase)
        & pl.col("seconds").is_not_null()
    )
    if timed.is_empty():
        timed = logs.phases.filter((pl.col("phase") == phase) & pl.col("seconds").is_not_null())
    values = [float(v) for v in timed["seconds"].to_list()]
    if values or phase != "step":
        return values
    stamps = logs.metrics.group_by("step").agg(pl.col("timestamp").min()).sort("step")
    gaps = stamps["timestamp"].drop_nulls().diff().drop_nulls()
    return [g.total_seconds() for g in gaps.to_list() if g.total_seconds() > 0]


def _cadence(evidence: Evidence, logs: LogTables) -> Cadence:
    """The quiet-time threshold from the innermost open phase with a history: a nested phase
    seen for the first time (`policy_train`) falls back to its enclosing phase, then the step."""
    open_phases = _open_phases(logs)
    candidates = [*open_phases, "step"] if "step" not in open_phases else open_phases
    phase, values = next(
        ((p, v) for p in candidates if (v := _durations(logs, p))),
        (open_phases[0] if open_phases else "step", []),
    )
    p90 = _p90(values)
    t = evidence.thresholds
    threshold = max(t.stall_floor_s, t.stall_factor * p90) if p90 is not None else t.stall_floor_s
    return Cadence(phase, phase in open_phases and phase != "step", p90, len(values), threshold)


# --- the rules -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    evidence: Evidence
    controller: ControllerState
    logs: LogTables | None
    advancement: Moment | None

    @property
    def now(self) -> datetime:
        return self.evidence.now

    def base_quotes(self) -> tuple[Quote, ...]:
        found = [self.controller.quote, self.advancement.quote if self.advancement else None]
        return tuple(q for q in found if q is not None)

    def log_last(self) -> datetime | None:
        """The newest log time that is not after `now` (a future stamp is not fresh)."""
        stamps = [self.advancement.at if self.advancement else None]
        stamps.append(self.logs.summary.last_timestamp if self.logs else None)
        return max((s for s in stamps if s is not None and s <= self.now), default=None)


Rule = Callable[[Context], GateResult | None]


@rule("liveness")
def _unknown_state(ctx: Context) -> GateResult | None:
    """Liveness pairs the controller state with the log; without a state it cannot judge."""
    if ctx.controller.state is not None:
        return None
    failed, quotes = _failed_probes(ctx, "controller")
    return error(
        "controller state unknown: no probes/controller.json and no job.state in the manifest"
        + failed,
        missing=("the controller state of the job",),
        evidence=quotes + ctx.base_quotes() or (quote("manifest.json", "job.state missing"),),
    )


def _failed_probes(ctx: Context, kind: str) -> tuple[str, tuple[Quote, ...]]:
    """`; the <kind> probe failed: `cmd` exited N` and its quotes, when a needed probe failed."""
    failures = ctx.evidence.facts.failed(kind)[:2]
    if not failures:
        return "", ()
    listed = "; ".join(f.text for f in failures)
    return f"; the {kind} probe failed: {listed}", tuple(f.quote for f in failures)


@rule("liveness")
def _future(ctx: Context) -> GateResult | None:
    """A trainer line dated after `now` means the clock or `now` is wrong, so the quiet time cannot
    be judged: the line is not fresh progress, and the older lines are not proof of silence."""
    ahead = [m for m in ctx.evidence.facts.future if m.kind == LOG_LINE]
    if not ahead:
        return None
    newest = max(ahead, key=lambda m: m.at)
    lead = (newest.at - ctx.now).total_seconds()
    return error(
        f"evidence dated after now: {newest.quote.text} at {minute_utc(newest.at)}, "
        f"{_duration(lead)} after the time judged ({minute_utc(ctx.now)}); the quiet time "
        f"cannot be judged (clock tolerance {CLOCK_TOLERANCE_S:g}s)",
        missing=("trainer log times not later than now (check --now and the trainer's clock)",),
        evidence=(newest.quote, *ctx.base_quotes()),
        next_action="Re-run with `now` at or after the capture, or fix the trainer's clock.",
    )


@rule("liveness")
def _stale(ctx: Context) -> GateResult | None:
    """Without a fresh sync, controller probe or log line, nothing says what the job does now."""
    limit = ctx.evidence.thresholds.max_evidence_age_s
    synced = ctx.evidence.bundle.synced_at
    if ctx.controller.live or (synced and (ctx.now - synced).total_seconds() <= limit):
        return None
    last = ctx.log_last()
    if last is not None and (ctx.now - last).total_seconds() <= limit:
        return None
    age = age_text((ctx.now - synced).total_seconds()) if synced else "at an unknown time"
    newest = age_text((ctx.now - last).total_seconds()) if last else "never"
    failed, quotes = _failed_probes(ctx, "controller")
    return error(
        f"stale evidence: manifest synced {age}, no live controller probe, newest log line {newest}"
        f" (MAX_EVIDENCE_AGE_S {limit:g}s){failed}",
        missing=("a fresh watcher sync or a live controller probe",),
        evidence=quotes + ctx.base_quotes(),
        next_action="Refresh the bundle (a targeted watcher sync) or probe the controller; rerun.",
    )


def _terminal_at(ctx: Context) -> datetime:
    probes = ctx.evidence.probes
    ends = [a.finished_at_ms for a in (probes.attempts or ()) if a.finished_at_ms] if probes else []
    if ends:
        return datetime.fromtimestamp(max(ends) / 1000, tz=UTC)
    fallback = ctx.evidence.bundle.finished_at or ctx.controller.observed_at
    return fallback or ctx.now


@rule("liveness")
def _terminal_disagrees(ctx: Context) -> GateResult | None:
    """A terminal controller state while the log advanced afterwards: sources disagree."""
    state = ctx.controller.state
    if state is None or not state.terminal or ctx.advancement is None:
        return None
    ended = _terminal_at(ctx)
    if ctx.advancement.at <= ended:
        return None
    return error(
        f"sources disagree: controller says {ctx.controller.state} since {minute_utc(ended)} but "
        f"the log advanced at {minute_utc(ctx.advancement.at)}",
        missing=("a controller state that agrees with the log",),
        evidence=ctx.base_quotes(),
        next_action="Re-probe the controller and the pods; a relaunch may be writing to this log.",
    )


def _global_step(logs: LogTables) -> int | None:
    progress = logs.progress.filter(pl.col("kind") == "training_step")["done"]
    found = [
        s.drop_nulls().max()
        for s in (progress, logs.timers["step"], logs.metrics["step"])
        if s.drop_nulls().len()
    ]
    return max((int(v) for v in found if isinstance(v, int)), default=None)


@rule("liveness")
def _complete(ctx: Context) -> GateResult | None:
    """A run whose global step reached max_steps is complete; its tail errors are noise."""
    if ctx.logs is None:
        return None
    rows = ctx.logs.progress.filter(
        (pl.col("kind") == "training_step") & pl.col("total").is_not_null()
    )
    step = _global_step(ctx.logs)
    if rows.is_empty() or step is None:
        return None
    total = int(rows["total"].max())  # type: ignore[arg-type]
    if step < total:
        return None
    newest = rows.sort("line").tail(1)
    return passed(
        f"run complete: global step {step} reached max_steps {total}; later errors are tail noise "
        f"(controller: {ctx.controller.state})",
        evidence=quote_rows(newest, text_column="kind") + ctx.base_quotes(),
    )


def _newest_failure(ctx: Context) -> pl.DataFrame:
    """The failure of the newest attempt (`Facts.attempt_failures`), as a one-row frame."""
    facts = ctx.evidence.facts
    return facts.attempt_failures.filter(pl.col("attempt") == facts.newest_attempt)


def _config_handoff(row: pl.DataFrame, quotes: tuple[Quote, ...]) -> Handoff | None:
    """The catalogue's handoff for a configuration-class failure; an override error the parser
    did not annotate (an older freeze) gets the Hydra one."""
    if row.is_empty():
        return None
    found = configuration.config_handoff(row.row(0, named=True), quotes)
    if found is not None or row["kind"][0] != "config_override":
        return found
    text = str(row["text"][0])
    return Handoff(
        evidence=quotes,
        likely_cause=f"the launcher passes an override the config schema does not hold: {text}",
        component="the launch configuration key named in the override (Hydra struct config)",
        proposed_behavior="drop or rename the key, or add it to the config schema",
        test="compose the launched overrides with the config schema and assert it parses",
    )


def _configuration(ctx: Context) -> GateResult | None:
    """`configuration.config_failure` with the run's stall limit (a registered rule there)."""
    if ctx.logs is None or ctx.controller.state is None:
        return None
    limit = _cadence(ctx.evidence, ctx.logs).threshold_s
    return configuration.config_failure(ctx.evidence, limit, ctx.base_quotes())


def _configuration_pending(ctx: Context) -> GateResult | None:
    """`configuration.config_death_pending`: a configuration death before the first step is
    never initialisation, even before `config_failure` can establish it."""
    if ctx.logs is None or ctx.controller.state is None:
        return None
    limit = _cadence(ctx.evidence, ctx.logs).threshold_s
    return configuration.config_death_pending(ctx.evidence, limit, ctx.base_quotes())


@rule("liveness")
def _terminal(ctx: Context) -> GateResult | None:
    """A terminal job is over: succeeded passes; a failure quoted by both the controller and the
    log is a hard failure of the newest attempt; killed or unschedulable is a FAIL, not proof."""
    state = ctx.controller.state
    if state is None or not state.terminal:
        return None
    if state is JobState.SUCCEEDED:
        return passed(f"job completed (state succeeded, {ctx.controller.source})")
    log_error = _newest_failure(ctx)
    quotes = ctx.base_quotes() + quote_rows(log_error)
    probes = ctx.evidence.probes
    controller_error = probes.controller.error if probes and probes.controller else None
    hard = state.failure and bool(controller_error) and not log_error.is_empty()
    cause = str(log_error["text"][0]) if not log_error.is_empty() else controller_error or state
    mechanism = f"job terminated ({state}): {cause}"
    proof = None
    if hard:
        proof = KillProof(
            rule="terminal_failure",
            mechanism=mechanism,
            established_at=_terminal_at(ctx),
            evidence=quotes,
        )
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"job is {state}; the log stopped with it: {cause}",
        evidence=quotes,
        hard_failure=hard,
        proof=proof,
        mechanism=mechanism,
        next_action="Nothing left to stop: the job has already ended; keep it down and fix the "
        "cause before relaunching.",
        flip_signal="a new attempt that finishes a `Finished: 'step'` line in finelog.log",
        handoff=_config_handoff(log_error, quotes),
    )


@rule("liveness")
def _no_pods(ctx: Context) -> GateResult | None:
    """The controller says running but the watcher found no pod: sources disagree."""
    status = ctx.evidence.bundle.statuses.get("pod_logs")
    if ctx.controller.state is not JobState.RUNNING or status is None:
        return None
    podless = status.state is ArtifactState.WAITING or (
        status.state is ArtifactState.PRESENT and status.count == 0
    )
    submitted = ctx.evidence.bundle.submitted_at
    floor = ctx.evidence.thresholds.stall_floor_s
    if not podless or (submitted and (ctx.now - submitted).total_seconds() <= floor):
        return None
    return error(
        f"sources disagree: controller says running but the manifest's pod_logs says "
        f"'{status.raw}'",
        missing=("the pods of a job the controller calls running",),
        evidence=(*ctx.base_quotes(), quote("manifest.json", f"artifacts.pod_logs={status.raw}")),
        next_action="Query the controller and kubectl for the job's pods, then rerun.",
    )


@rule("liveness")
def _waiting(ctx: Context) -> GateResult | None:
    """A job not yet running is initialising within INIT_GRACE_S of submission, else unscheduled."""
    if ctx.controller.state is None or not ctx.controller.state.waiting:
        return None
    since = ctx.evidence.bundle.submitted_at or started_at(ctx.evidence)
    grace = ctx.evidence.thresholds.init_grace_s
    if since is None or ctx.now <= since + timedelta(seconds=grace):
        deadline = minute_utc(since + timedelta(seconds=grace)) if since else "unknown"
        return passed(
            f"job is {ctx.controller.state}, within INIT_GRACE_S of submission",
            initializing=True,
            evidence=ctx.base_quotes(),
            flip_signal=f"the job still not running by {deadline}",
        )
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"job still {ctx.controller.state} {_duration((ctx.now - since).total_seconds())} "
        "after submission, beyond INIT_GRACE_S",
        evidence=ctx.base_quotes(),
        mechanism="not scheduled",
        next_action="Check queue admission (Kueue) and capacity; the job has not started.",
        flip_signal="the controller state turning running",
    )


RULES: tuple[Rule, ...] = (
    _unknown_state,
    _future,
    _stale,
    _terminal_disagrees,
    _complete,
    _configuration,
    _configuration_pending,
    _terminal,
    _no_pods,
    _waiting,
)


# --- quiet time ----------------------------------------------------------------------------------


def _initialising(ctx: Context) -> GateResult | None:
    init = initialization(ctx.evidence)
    if init is None:
        return None
    newest = ctx.advancement.quote.text if ctx.advancement else "no phase line yet"
    deadline = minute_utc(init.deadline)
    return passed(
        f"initialising: no step finished yet in the newest attempt (started "
        f"{minute_utc(init.since)}); newest advancement: {newest}; first step due by {deadline}",
        initializing=True,
        evidence=ctx.base_quotes(),
        flip_signal=f"no `Finished: 'step'` line in finelog.log by {deadline} (INIT_GRACE_S)",
    )


def _engine_note(ctx: Context) -> tuple[str, tuple[Quote, ...]]:
    engine = _engine_quote(ctx.logs, ctx.now) if ctx.logs else None
    if engine is None or engine.timestamp is None or ctx.advancement is None:
        return "", ()
    if engine.timestamp <= ctx.advancement.at:
        return "", ()
    age = _duration((ctx.now - engine.timestamp).total_seconds())
    note = (
        f"; vLLM engine stats are newer than the trainer's (the newest {age} ago) but prove "
        "nothing about the policy "
        "(colocated engines stay busy while the trainer is wedged)"
    )
    return note, (engine,)


def _death(ctx: Context) -> pl.DataFrame:
    assert ctx.logs is not None and ctx.advancement is not None
    after = ctx.logs.errors.filter(
        (pl.col("attempt") == newest_attempt(ctx.logs))
        & (pl.col("timestamp") >= ctx.advancement.at)
        & (pl.col("timestamp") <= ctx.now)
    ).sort("line")
    # an engine actor's death is judged by `deaths.logged_death` (every engine, or no proof)
    trainer = pl.col("component").fill_null("driver") != "engine"
    dead = after.filter(pl.col("kind").is_in(_DEATH_KINDS) & trainer)
    if not dead.is_empty():
        return dead.head(2)
    watchdog = after.filter(pl.col("kind") == "nccl_watchdog_timeout").head(1)
    if watchdog.is_empty():
        return watchdog
    later = after.filter(
        (pl.col("line") > watchdog["line"][0]) & pl.col("kind").is_in(_AFTER_WATCHDOG)
    )
    return pl.concat([watchdog, later.head(1)]) if not later.is_empty() else later


def _next_line_signal(ctx: Context) -> str:
    return f"a `Started:` or `Finished:` line in finelog.log after {minute_utc(ctx.now)}"


@rule("liveness")
def _dead(ctx: Context, quiet: str) -> GateResult | None:
    """A death line (actor death, worker crash, or a watchdog abort followed by one) logged after
    the newest advancement, with silence past the stall limit since, establishes the death."""
    rows = _death(ctx)
    if rows.is_empty():
        return None
    quotes = ctx.base_quotes() + quote_rows(rows)
    mechanism = f"trainer process death ({', '.join(rows['kind'].to_list())})"
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"trainer dead: {rows['kind'][0]} logged after the newest advancement; "
        f"quiet {quiet} while the controller says {ctx.controller.state}",
        evidence=quotes,
        hard_failure=True,
        proof=KillProof(
            rule="process_death",
            mechanism=mechanism,
            established_at=rows["timestamp"][0],
            evidence=quote_rows(rows) + ctx.base_quotes(),
        ),
        mechanism=mechanism,
        next_action="Supervisor: kill the job; its trainer died and it will not advance again.",
        flip_signal=_next_line_signal(ctx),
    )


def _logged_death(ctx: Context, cadence: Cadence) -> GateResult | None:
    """`deaths.logged_death` with the run's stall limit (a registered rule there)."""
    limit = _limit_text(ctx, cadence)
    return deaths.logged_death(ctx.evidence, cadence.threshold_s, limit, ctx.base_quotes())


def _dump_window(ctx: Context) -> DumpWindow:
    """Live evidence only: dumps after the newest progress, fresh, of the current attempt."""
    facts, limit = ctx.evidence.facts, ctx.evidence.thresholds.max_evidence_age_s
    newest = facts.newest()
    floors = [ctx.now - timedelta(seconds=limit)]
    floors += [facts.attempt_started_at] if facts.attempt_started_at else []
    probes = ctx.evidence.probes
    records = sorted(probes.attempts or (), key=lambda a: a.attempt_id) if probes else []
    old = frozenset(r.pod_name for r in records[:-1] if r.pod_name)
    return DumpWindow(
        after=newest.at if newest else None,
        not_before=max(floors),
        not_after=ctx.now + timedelta(seconds=CLOCK_TOLERANCE_S),
        old_targets=old - {records[-1].pod_name} if records else old,
    )


def _stall_proof(ctx: Context, finding: StackFinding, rule_name: str, mechanism: str) -> KillProof:
    stamps = [q.timestamp for q in finding.quotes if q.timestamp is not None]
    return KillProof(
        rule=rule_name,
        mechanism=mechanism,
        established_at=max(stamps, default=ctx.now),
        evidence=finding.quotes + ctx.base_quotes(),
    )


def _stalled(
    ctx: Context, finding: StackFinding, quiet: str, cadence: str, proof: KillProof
) -> GateResult:
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"stalled: quiet {quiet} beyond {cadence}; live stacks: {finding.summary}"
        + _noted(finding),
        evidence=ctx.base_quotes() + finding.quotes,
        hard_failure=True,
        proof=proof,
        mechanism=proof.mechanism,
        next_action="Supervisor: kill the job; it is wedged and will not resume by itself. "
        "Relaunch from the newest checkpoint.",
        flip_signal=_next_line_signal(ctx),
    )


@rule("liveness")
def _parked(ctx: Context, finding: StackFinding, quiet: str, cadence: str) -> GateResult | None:
    """Two live dumps of each process parked in one collective or queue frame, none moving,
    unpaired or stale, prove the stall (docs/interface.md#evidence-read: stacks of the same process
    taken twice)."""
    if not finding.proven or finding.mechanism is None:
        return None
    proof = _stall_proof(ctx, finding, "stall_stacks", finding.mechanism)
    return _stalled(ctx, finding, quiet, cadence, proof)


@dataclass(frozen=True)
class Corroboration:
    """What the live signals other than the stacks say about a stall outside collectives."""

    holds: bool
    reason: str
    quotes: tuple[Quote, ...] = ()


def _idle_engines(ctx: Context, since: datetime) -> Corroboration:
    """No engine generated after `since`, read from each engine's silence after its last stat
    line (`worker.gates.engine_idle`: vLLM logs intervals without tokens at DEBUG)."""
    silence = engines_generated_since(ctx.evidence, since)
    return Corroboration(silence.holds, silence.reason, silence.quotes)


def _corroborated(ctx: Context, quiet_s: float, threshold_s: float) -> Corroboration:
    """The log quiet far past the limit, idle engines, and no trial finished since."""
    assert ctx.advancement is not None
    if quiet_s <= STILL_QUIET_FACTOR * threshold_s:
        return Corroboration(
            False, f"quiet {_duration(quiet_s)} not beyond {STILL_QUIET_FACTOR:g}x the limit"
        )
    trial = ctx.evidence.facts.newest(TRIAL)
    if trial is not None and trial.at > ctx.advancement.at:
        return Corroboration(False, f"a trial finished at {minute_utc(trial.at)}", (trial.quote,))
    return _idle_engines(ctx, ctx.advancement.at)


@rule("liveness")
def _still(
    ctx: Context, finding: StackFinding, quiet_s: float, cadence: Cadence
) -> GateResult | None:
    """Outside collectives: every trainer/coordinator process identical in two live dumps at least
    the probe interval apart is a wedge only when every other live signal agrees nothing moves —
    the log quiet far past the limit, engines at 0 tok/s with nothing running, no trial finished."""
    if not finding.still:
        return None
    support = _corroborated(ctx, quiet_s, cadence.threshold_s)
    if not support.holds:
        return None
    mechanism = (
        f"trainer processes wedged outside any collective (`{finding.still_frame}`): identical "
        f"stacks, the log silent, engines idle ({support.reason})"
    )
    proof = _stall_proof(ctx, finding, "stall_still", mechanism)
    proof = proof.model_copy(update={"evidence": proof.evidence + support.quotes})
    return _stalled(ctx, finding, _duration(quiet_s), _limit_text(ctx, cadence), proof)


def _replay_note(ctx: Context) -> str:
    """Lines the log shipper re-sent (`worker.evidence.logs.replays`) are no progress: the quiet
    time runs from the newest consistent line, and the summary says why it is not shorter."""
    replayed = ctx.logs.summary.clock.replayed if ctx.logs is not None else 0
    if not replayed:
        return ""
    return (
        f"; {replayed} log line(s) re-sent by the log shipper (own time older than their "
        "collection allows) are not progress"
    )


def _unproven(
    ctx: Context,
    finding: StackFinding | None,
    quiet: str,
    cadence: str,
    why: str = "",
) -> GateResult:
    note, engine = _engine_note(ctx)
    note += _replay_note(ctx)
    if finding is None or not finding.processes:
        summary = f"stall suspected, live stacks needed: quiet {quiet} beyond {cadence}{note}"
        missing: tuple[str, ...] = (STACKS_NEEDED,)
    else:
        summary = f"quiet {quiet} beyond {cadence}, but the stacks do not prove a stall: "
        summary += f"{finding.summary}{why}{_noted(finding)}{note}"
        missing = ("two live py-spy dumps per policy rank showing it parked in one place",)
    return error(
        summary,
        missing=missing,
        evidence=ctx.base_quotes() + engine + (finding.quotes if finding else ()),
        next_action="Capture `py-spy dump --pid <pid>` of every policy rank twice, some seconds "
        "apart (iris task exec <task> -- ...), while the job exists; then rerun.",
        flip_signal=f"a `Finished:` line in finelog.log after {minute_utc(ctx.now)} (PASS), or two "
        "dumps parked in one collective frame (KILL)",
    )


def _noted(finding: StackFinding) -> str:
    """What the stacks showed that neither proves nor disproves a stall (helpers, a driver)."""
    return f"; noted: {'; '.join(finding.notes)}" if finding.notes else ""


def _probe_failed(
    ctx: Context, quiet: str, cadence: str, failures: Sequence[ProbeFailure]
) -> GateResult | None:
    """A stack probe the judgement cannot do without failed: one that names no process, or the
    dump of a process that is neither a helper nor native (nor, beside ranks parked in a
    collective, the driver or a coordinator)."""
    if not failures:
        return None
    listed = "; ".join(f.text for f in failures[:3])
    return error(
        f"quiet {quiet} beyond {cadence}, and a py-spy probe the capture needed failed: {listed}",
        missing=(f"py-spy stacks of every process (failed: {listed})",),
        evidence=tuple(f.quote for f in failures[:3]) + ctx.base_quotes(),
        next_action="Re-run the failed py-spy dumps while the job exists (check the pid and the "
        "permission to ptrace), then rerun.",
    )


def _failed_of(failure: ProbeFailure, holes: set[tuple[str, int]]) -> bool:
    """Whether the failed dump is of a process whose failure blocks the judgement."""
    return any(pid == failure.pid and failure.target in {None, target} for target, pid in holes)


def _limit_text(ctx: Context, cadence: Cadence) -> str:
    t = ctx.evidence.thresholds
    return f"{_duration(cadence.threshold_s)} = {cadence.describe(t.stall_floor_s, t.stall_factor)}"


def _quiet_verdict(ctx: Context, quiet_s: float, cadence: Cadence) -> GateResult:
    quiet, limit = _duration(quiet_s), _limit_text(ctx, cadence)
    finelog = ctx.evidence.bundle.freshness.get("finelog")
    if finelog is not None and finelog.stale:
        return error(
            f"quiet {quiet} beyond {limit}, but finelog is stale ({finelog.reason or 'old sync'})",
            missing=("a fresh finelog sync",),
            evidence=ctx.base_quotes(),
        )
    dead = _dead(ctx, quiet) or _logged_death(ctx, cadence)
    if dead is not None:
        return dead
    failures = ctx.evidence.facts.failed("stacks")
    failed = _probe_failed(ctx, quiet, limit, [f for f in failures if f.pid is None])
    if failed is not None:
        return failed
    probes = ctx.evidence.probes
    stacks = probes.stacks if probes else ()
    if not stacks:
        return _probe_failed(ctx, quiet, limit, failures) or _unproven(ctx, None, quiet, limit)
    finding = judge_stacks(stacks, _dump_window(ctx), roles=roles_of(probes), failed=failures)
    holes = {(j.target, j.pid) for j in finding.holes if j.state is ProcessState.FAILED}
    failed = _probe_failed(ctx, quiet, limit, [f for f in failures if _failed_of(f, holes)])
    if failed is not None:
        return failed
    proven = _parked(ctx, finding, quiet, limit) or _still(ctx, finding, quiet_s, cadence)
    if proven is not None:
        return proven
    why = ""
    if finding.still:
        support = _corroborated(ctx, quiet_s, cadence.threshold_s)
        why = f"; identical stacks outside a collective, not corroborated: {support.reason}"
    return _unproven(ctx, finding, quiet, limit, why)


def _judge_quiet(ctx: Context) -> GateResult:
    if ctx.logs is None:
        return error(
            "no trainer log: finelog.log (and pod logs) missing",
            missing=("the trainer log",),
            evidence=ctx.base_quotes(),
        )
    early = _initialising(ctx)
    if early is not None or ctx.advancement is None:
        # a logged death is not initialisation: the death line establishes it
        death = _logged_death(ctx, _cadence(ctx.evidence, ctx.logs))
        if death is not None:
            return death
    if early is not None:
        return early
    if ctx.advancement is None:
        return error(
            "no `Started:`/`Finished:` timer line or train metrics in the trainer log",
            missing=("phase timer lines or train metrics in the trainer log",),
            evidence=ctx.base_quotes() + log_head_quotes(ctx.logs, limit=2),
        )
    cadence = _cadence(ctx.evidence, ctx.logs)
    quiet_s = (ctx.now - ctx.advancement.at).total_seconds()
    if quiet_s > cadence.threshold_s:
        return _quiet_verdict(ctx, quiet_s, cadence)
    deadline = minute_utc(ctx.advancement.at + timedelta(seconds=cadence.threshold_s))
    t = ctx.evidence.thresholds
    limit = cadence.describe(t.stall_floor_s, t.stall_factor)
    return passed(
        f"advancing: newest {ctx.advancement.quote.text} {_duration(quiet_s)} ago, within "
        f"{_duration(cadence.threshold_s)} ({limit}); controller {ctx.controller.state}",
        evidence=ctx.base_quotes(),
        flip_signal=f"no `Started:`/`Finished:` line in finelog.log by {deadline}",
        gaps=tuple(f"probe failed: {f.text}" for f in ctx.evidence.facts.probe_failures),
    )


def check(evidence: Evidence) -> GateResult:
    """Judge whether the job is alive, as of `evidence.now`."""
    ctx = Context(evidence, _controller(evidence), evidence.logs, _advancement(evidence))
    for check_rule in RULES:
        result = check_rule(ctx)
        if result is not None:
            return result
    return _judge_quiet(ctx)
