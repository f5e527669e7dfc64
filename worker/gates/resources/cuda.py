"""CUDA faults of the newest attempt: an OOM or CUDA error, which component hit it, and whether that
component made progress afterwards; and a fault that ended the attempt before it, which the restart
survived when the newest attempt stepped past its resume point (`_recovered`).

The component is read from the error row: a `component` column when the log parser provides one,
else the line itself (a vLLM logger header `LEVEL MM-DD HH:MM:SS [file.py:N]`, an engine's
name), else the phase open when it was logged — labelled as inferred, since colocated engines and
policy ranks share the phases' GPUs. Progress of the policy is a finished step or a train metric
after the fault; progress of an inference engine is a stat line with a running request or
generated tokens after it, or a finished step (a step needs generation).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

import polars as pl

from shared.models import GateResult, GateStatus, Handoff, KillProof, Quote
from shared.times import age_text, duration_text
from worker.evidence.case import Evidence
from worker.evidence.jobstate import JobState
from worker.evidence.model import LogTables
from worker.evidence.quotes import quote, quote_rows
from worker.gates import deaths
from worker.gates.base import error
from worker.gates.progress import finished_steps, minute_utc, newest_attempt
from worker.gates.resources.saturation import GENERATION_PHASES, innermost_open
from worker.gates.rules import rule

__all__ = ["CUDA_KINDS", "INFERENCE", "POLICY", "check", "component_of"]

CUDA_KINDS: Final = ("cuda_oom", "cuda_error")
DEATH_KINDS: Final = ("actor_died", "worker_crashed", "train_loop_failed")
POLICY_PHASES: Final = (
    "policy_train",
    "critic_train",
    "train_critic_and_policy",
    "fwd_logprobs_values_reward",
)
POLICY: Final = "policy"
INFERENCE: Final = "inference"

_INFERENCE_TEXT = re.compile(
    r"vllm|AsyncVLLMInferenceEngine|EngineCore|inference_engine|"
    r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[",
    re.I,
)
_POLICY_TEXT = re.compile(
    r"skyrl_entrypoint|trainer|PolicyWorker|CriticWorker|RefWorker|policy|fsdp|megatron", re.I
)


# The parser's `component` column (worker.evidence.failures.Component): engine and policy name the
# rank kind; driver, sandbox, controller and configuration do not, so the text and phase decide.
_PARSER_COMPONENTS: Final = {"engine": INFERENCE, "policy": POLICY}
_OTHER_COMPONENTS: Final = frozenset({"driver", "sandbox", "controller", "configuration"})


@dataclass(frozen=True)
class Culprit:
    """Who hit the fault: policy or inference, how we know, and the label the report uses."""

    kind: str | None  # POLICY | INFERENCE | None (unclassified)
    label: str


def component_of(row: dict[str, Any], phase: str | None) -> Culprit:
    """The component of an error row: its `component` column, its text, else the open phase."""
    named = str(row.get("component") or "")
    text = str(row.get("text") or "")
    kind = _PARSER_COMPONENTS.get(named)
    if kind is None and named and named not in _OTHER_COMPONENTS:
        kind = INFERENCE if _INFERENCE_TEXT.search(named) else POLICY
    if kind is not None:
        return Culprit(kind, "an inference rank" if kind == INFERENCE else "a policy rank")
    if _INFERENCE_TEXT.search(text):
        return Culprit(INFERENCE, "an inference rank (vLLM engine)")
    if _POLICY_TEXT.search(text):
        return Culprit(POLICY, "a policy rank")
    if phase in POLICY_PHASES:
        return Culprit(POLICY, f"a policy rank (inferred from the open phase {phase})")
    if phase in GENERATION_PHASES:
        return Culprit(INFERENCE, f"an inference rank (inferred from the open phase {phase})")
    return Culprit(None, f"an unclassified rank ({row.get('source')})")


# --- what followed the fault ---------------------------------------------------------------------


def _later(frame: pl.DataFrame, row: dict[str, Any]) -> pl.DataFrame:
    """Rows after `row`: by timestamp when both have one, else by line in the same source."""
    stamp, by_line = (
        row["timestamp"],
        (pl.col("source") == row["source"]) & (pl.col("line") > row["line"]),
    )
    if stamp is None:
        return frame.filter(by_line)
    return frame.filter(
        pl.when(pl.col("timestamp").is_null()).then(by_line).otherwise(pl.col("timestamp") > stamp)
    )


def _policy_progress(logs: LogTables, attempt: int, row: dict[str, Any]) -> pl.DataFrame:
    timers = logs.timers.filter((pl.col("attempt") == attempt) & (pl.col("event") == "finished"))
    later = _later(timers, row)
    if later.is_empty():
        later = _later(logs.metrics.filter(pl.col("attempt") == attempt), row)
    return later.sort("line").head(1)


def _engine_progress(logs: LogTables, row: dict[str, Any]) -> pl.DataFrame:
    working = (pl.col("running") > 0) | (pl.col("generation_tokens_per_s") > 0)
    later = _later(logs.engines.filter(working), row) if row["timestamp"] is not None else None
    return later.sort("timestamp").head(1) if later is not None else logs.engines.clear()


@dataclass(frozen=True)
class After:
    """What followed the fault: progress (and by whom), or a death, or neither yet."""

    progress: Quote | None
    progress_by: str | None
    death: Quote | None
    death_at: datetime | None


def _progress_quote(rows: pl.DataFrame, text: str) -> Quote | None:
    if rows.is_empty():
        return None
    return quote_rows(rows.with_columns(_text=pl.lit(text)), text_column="_text", limit=1)[0]


def _progress(logs: LogTables, attempt: int, row: dict[str, Any], comp: Culprit) -> After:
    step = _policy_progress(logs, attempt, row)
    if comp.kind != POLICY:
        engine = _engine_progress(logs, row)
        if not engine.is_empty():
            q = _progress_quote(engine, "vLLM engine stat line with requests running after it")
            return After(q, "the inference engines kept generating", None, None)
    if not step.is_empty():
        q = _progress_quote(step, "a finished step or train metric after it")
        return After(q, "the policy kept stepping (a step needs generation)", None, None)
    return After(None, None, None, None)


def _death(evidence: Evidence, logs: LogTables, attempt: int, row: dict[str, Any]) -> After:
    deaths = logs.errors.filter((pl.col("attempt") == attempt) & pl.col("kind").is_in(DEATH_KINDS))
    later = _later(deaths, row).sort("line")
    if not later.is_empty():
        stamp = later["timestamp"][0]
        return After(None, None, quote_rows(later, limit=1)[0], stamp)
    state = evidence.facts.state
    if state is not None and (state.failure or state is JobState.KILLED):
        text = f"job state: {state} ({evidence.facts.state_source})"
        source = evidence.facts.state_source
        return After(None, None, quote(source, text), evidence.bundle.finished_at or evidence.now)
    return After(None, None, None, None)


# --- the rule ------------------------------------------------------------------------------------


def _phase_at(logs: LogTables, attempt: int, row: dict[str, Any]) -> str | None:
    """The innermost phase open when `row` was logged (from TIMERS of the same attempt)."""
    timers = logs.timers.filter(pl.col("attempt") == attempt)
    before = timers.filter(~pl.col("line").is_in(_later(timers, row)["line"].implode()))
    return innermost_open(before)


def _what(row: dict[str, Any]) -> str:
    return "CUDA out of memory" if row["kind"] == "cuda_oom" else "CUDA error"


# --- a fault that ended the attempt before the newest ---------------------------------------------


def _resume_point(logs: LogTables, attempt: int) -> int | None:
    """The step `attempt` resumed from (0 after a scratch start), None when it logs neither."""
    rows = logs.resumes.filter(
        (pl.col("attempt") == attempt) & pl.col("kind").is_in(["resumed", "scratch"])
    ).sort("line")
    if rows.is_empty():
        return None
    step = rows["step"][-1] if rows["kind"][-1] == "resumed" else 0
    return int(step) if step is not None else None


def _newest_step(logs: LogTables, attempt: int) -> pl.DataFrame:
    """The row of the highest step `attempt` finished (a `Finished: 'step'` or a train metric),
    as one row with `step`, `source`, `line`, `timestamp`; empty when it finished none."""
    columns = ("step", "source", "line", "timestamp", "attempt")
    rows = pl.concat(
        [
            finished_steps(logs, attempt).select(columns),
            logs.metrics.filter(pl.col("attempt") == attempt).select(columns),
        ]
    ).filter(pl.col("step").is_not_null())
    return rows.sort("step", "line").tail(1)


def _ending_faults(logs: LogTables, attempt: int) -> pl.DataFrame:
    """The CUDA rows of `attempt` logged after its last finished timer or train metric: the
    fault that ended it (a fault it trained past did not)."""
    moved = pl.concat(
        [
            logs.timers.filter(pl.col("event") == "finished").select("attempt", "source", "line"),
            logs.metrics.select("attempt", "source", "line"),
        ]
    ).filter(pl.col("attempt") == attempt)
    last = moved.group_by("source").agg(_last=pl.col("line").max())
    rows = logs.errors.filter((pl.col("attempt") == attempt) & pl.col("kind").is_in(CUDA_KINDS))
    rows = rows.join(last, on="source", how="left", maintain_order="left")
    ended = rows.filter(pl.col("_last").is_null() | (pl.col("line") > pl.col("_last")))
    return ended.drop("_last").sort("line")


@rule("resources.cuda")
def _recovered(evidence: Evidence, logs: LogTables, attempt: int) -> GateResult | None:
    """A CUDA fault that ended the attempt before the newest (nothing advanced after it in that
    attempt), followed by a newest attempt that finished a step past the point it resumed from,
    was survived by the restart: FAIL, not hard, naming the attempt that hit it and the one that
    progressed. The fault's component made no progress in *its* attempt, so it is no survived
    fault of one attempt; the same fault ending the next attempts too is the restarts gate's
    crash loop. A newest attempt that has not yet stepped past its resume point is judged by the
    restarts and liveness gates, not here."""
    if attempt == 0:
        return None
    faults = _ending_faults(logs, attempt - 1)
    newest = _newest_step(logs, attempt)
    if faults.is_empty() or newest.is_empty():
        return None
    reached = int(newest["step"][0])
    resumed = _resume_point(logs, attempt)
    earlier = _newest_step(logs, attempt - 1)
    peak = int(earlier["step"][0]) if not earlier.is_empty() else 0
    if reached <= (resumed if resumed is not None else peak):
        return None
    first = faults.row(0, named=True)
    comp = component_of(first, _phase_at(logs, attempt - 1, first))
    start = {None: f"an unnamed checkpoint (earlier peak {peak})", 0: "scratch"}.get(
        resumed, f"step {resumed}"
    )
    progress = _progress_quote(newest, f"step {reached} finished in attempt {attempt}")
    quotes = (*quote_rows(faults, limit=2), *((progress,) if progress else ()))
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"{_what(first)} on {comp.label} ended attempt {attempt - 1}; attempt "
        f"{attempt} resumed from {start} and reached step {reached}: recovered by the restart",
        evidence=quotes,
        mechanism=f"{_what(first)} on {comp.label}, recovered by a restart",
        kind="cuda_recovered",
        next_action="keep watching: the restart recovered; the same fault ending the next "
        "attempt too is a crash loop",
        flip_signal=f"attempt {attempt} ending on the same {_what(first)}",
        handoff=_oom_handoff(quotes, comp) if first["kind"] == "cuda_oom" else None,
    )


@rule("resources.cuda")
def check(evidence: Evidence) -> GateResult | None:
    """A CUDA OOM or error is a hard failure only when the component that hit it made no progress
    afterwards: it died (a death line or a failed job) or stayed silent for STALL_FLOOR_S. With
    progress after it, it is a survived fault (FAIL, not hard); logged less than STALL_FLOOR_S ago
    with nothing after it yet, it is too recent to call (ERROR)."""
    logs = evidence.logs
    if logs is None:
        return None
    attempt = newest_attempt(logs)
    faults = logs.errors.filter(
        (pl.col("attempt") == attempt)
        & pl.col("kind").is_in(CUDA_KINDS)
        & (pl.col("timestamp").is_null() | (pl.col("timestamp") <= evidence.now))
    ).sort(["timestamp", "line"], nulls_last=True)
    if faults.is_empty():
        return _recovered(evidence, logs, attempt)
    first = faults.row(0, named=True)
    phase = _phase_at(logs, attempt, first)
    comp = component_of(first, phase)
    after = _progress(logs, attempt, first, comp)
    if after.progress is None:
        after = _death(evidence, logs, attempt, first)
    return _judge(evidence, Fault(faults, first, comp, phase), after)


@dataclass(frozen=True)
class Fault:
    rows: pl.DataFrame
    first: dict[str, Any]
    component: Culprit
    phase: str | None

    @property
    def quotes(self) -> tuple[Quote, ...]:
        return quote_rows(self.rows, limit=3)

    def head(self) -> str:
        during = f" during phase {self.phase}" if self.phase else ""
        return (
            f"{_what(self.first)} on {self.component.label}{during} in attempt "
            f"{self.first['attempt']} ({self.rows.height} CUDA error line(s))"
        )


def _judge(evidence: Evidence, fault: Fault, after: After) -> GateResult:
    if after.progress is not None:
        return _survived(fault, after)
    at = fault.first["timestamp"]
    floor = evidence.thresholds.stall_floor_s
    if after.death is None and at is not None:
        if (evidence.now - at).total_seconds() <= floor:
            return _too_recent(evidence, fault)
        if fault.component.kind == INFERENCE and not _fleet_down(evidence):
            return _engines_left(evidence, fault)
        after = After(None, None, None, at + timedelta(seconds=floor))
    return _fatal(evidence, fault, after)


def _fleet_down(evidence: Evidence) -> bool:
    """Whether the inference side as a whole is down: one engine only, or every engine logged its
    death (`deaths.find_death`, the same attribution as the `logged_death` rule)."""
    if deaths.engine_count(evidence) <= 1:
        return True
    death = deaths.find_death(evidence, None)
    return death is not None and death.whose.startswith("every inference engine")


def _engines_left(evidence: Evidence, fault: Fault) -> GateResult:
    """A CUDA fault of one engine among several, silent since, proves nothing about the job: the
    other engines may idle because the trainer waits on the lost one, or carry the run once it
    retries (the same reason one engine's death line is no `logged_death` proof)."""
    total = deaths.engine_count(evidence)
    return error(
        f"{fault.head()}; nothing generated or stepped since, but it is one engine of {total} "
        "and the others did not fail: whether the trainer waits on the lost engine needs live "
        "stacks",
        missing=(f"py-spy stacks of the trainer and the engines (one engine of {total} failed)",),
        evidence=fault.quotes,
        next_action="Capture two py-spy dumps of the trainer ranks and each engine while the "
        "job exists, then rerun.",
        flip_signal="a finished step after the fault (survived), every engine dead, or stacks "
        "parked on the lost engine (KILL)",
    )


def _survived(fault: Fault, after: After) -> GateResult:
    assert after.progress is not None
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"{fault.head()}; survived: {after.progress_by} after it",
        evidence=(*fault.quotes, after.progress),
        mechanism=f"{_what(fault.first)} on {fault.component.label}, survived",
        kind="cuda_survived",
        next_action="keep watching: the attempt survived the CUDA error; re-check after the "
        "next step",
        flip_signal="a new CUDA error, or no step after "
        f"{fault.first['source']}:{fault.first['line']}",
        handoff=_oom_handoff(fault.quotes, fault.component)
        if fault.first["kind"] == "cuda_oom"
        else None,
    )


def _too_recent(evidence: Evidence, fault: Fault) -> GateResult:
    floor = evidence.thresholds.stall_floor_s
    at = fault.first["timestamp"]
    deadline = minute_utc(at + timedelta(seconds=floor))
    return error(
        f"{fault.head()}, logged {age_text((evidence.now - at).total_seconds())} with nothing "
        f"after it yet: too recent to know whether {fault.component.label} recovers "
        f"(STALL_FLOOR_S {duration_text(floor)})",
        missing=(f"what {fault.component.label} does after the fault (progress or death)",),
        evidence=fault.quotes,
        next_action=f"re-diagnose after {deadline}: a step after the fault means it survived",
        flip_signal=f"no step and no engine activity by {deadline} (hard), or a step (survived)",
    )


def _fatal(evidence: Evidence, fault: Fault, after: After) -> GateResult:
    tail = f"then {after.death.text}" if after.death else "no progress by it since (STALL_FLOOR_S)"
    mechanism = f"{_what(fault.first)} on {fault.component.label}, no progress after it"
    quotes = fault.quotes + ((after.death,) if after.death else ())
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"{fault.head()}; {tail}",
        evidence=quotes,
        hard_failure=True,
        proof=KillProof(
            rule="cuda_fatal",
            mechanism=mechanism,
            established_at=after.death_at or evidence.now,
            evidence=quotes,
        ),
        mechanism=mechanism,
        kind="cuda_fatal",
        next_action=_fault_action(fault.first["kind"], fault.component.label),
        flip_signal="a finished step after "
        f"{fault.first['source']}:{fault.first['line']} in the same attempt with no new CUDA error",
        handoff=_oom_handoff(quotes, fault.component)
        if fault.first["kind"] == "cuda_oom"
        else None,
    )


def _fault_action(kind: str, rank: str) -> str:
    if kind == "cuda_oom":
        return f"the newest attempt died of an OOM on {rank}: relaunching unchanged will repeat it"
    return f"inspect the node of {rank} (a CUDA error can be a bad GPU) before relaunching"


def _handoff(fault: Fault, quotes: tuple[Quote, ...]) -> Handoff | None:
    return _oom_handoff(quotes, fault.component) if fault.first["kind"] == "cuda_oom" else None


def _oom_handoff(evidence: tuple[Quote, ...], comp: Culprit) -> Handoff:
    component = (
        "vLLM engine memory settings (gpu_memory_utilization, max_num_seqs, max_model_len)"
        if comp.kind == INFERENCE
        else "policy training memory settings (micro batch size per GPU, sequence length, "
        "activation checkpointing, offload)"
    )
    return Handoff(
        evidence=evidence,
        likely_cause=f"the configured memory footprint does not fit the GPUs of {comp.label}",
        component=component,
        proposed_behavior="lower the per-GPU memory demand until the step fits",
        test="the same geometry completes two steps with no `CUDA out of memory` line",
    )
