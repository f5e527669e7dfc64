"""The dynamics gate: does the training signal say the run is learning, stuck, or broken?

What it reads: the stitched METRICS table (newest attempt per step) through the canonical keys of
`worker.gates.metric_keys` (reward, pass@k, entropy, policy loss, grad norm, TIS, token shift,
generation errors), the PHASES table (or `timing/<phase>` keys when no timer line was parsed),
RESUMES (to correlate a collapse), PROGRESS (max_steps) and the parse summary (to quote what a log
without usable metrics looks like). All thresholds come from `Thresholds`; W is MIN_WINDOW_STEPS,
the window is the last W steps that carry any canonical metric.

The rules live in small modules, each with its hypothesis in its docstring: `series` (the signals
shaped once), `hard` (non-finite values persisting, broken router replay, all-zero reward),
`trend` (reward and entropy collapse held over the window, recovery), `tis` (off-policy mismatch),
`phases` (pipeline bubbles). This module joins them:

ERROR:
- past the initialization grace (or with the job ended), the log shows no step at all: no metrics;
- no trainer log at all, or no reward, entropy or loss key (a failed probe: the summary quotes the
  log's head, the serializations seen and the malformed count);
- no reward series (reward is a required input: collapse, plateau and all-zero need it), unless a
  hard failure is established without it;
- fewer than W steps past the initialization grace: no learning-quality judgement is possible
  (a short run is not a healthy one);
- non-finite values on the newest steps but fewer than NON_FINITE_PERSIST_STEPS of them;
- a fault while computing on malformed evidence (the exception is quoted; the gate never raises).

PASS: initialising (`progress.initialization`); the run is complete (max_steps reached; anything
seen is noted, not judged); otherwise when no FAIL rule matches: improving, plateau, or collapsed
but recovering.

FAIL (first match is the primary finding, the others listed under it): non-finite persisting
(hard, proof `non_finite`), broken router replay (hard, `router_replay`), all-zero reward (hard,
`zero_reward`), TIS out of range (learning quality, `off_policy`), reward collapse (learning
quality, `reward_collapse`), entropy collapse (learning quality, `entropy_collapse`), phase
inflation (an inefficiency). `policy/rollout_train_prob_diff_mean` is never judged. Every result
carries the window table and the phase table as data (`GateResult.tables`), rendered by `reports/`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

import polars as pl

from shared.models import GateResult, GateStatus, Table
from worker.evidence.case import Evidence
from worker.evidence.quotes import quote
from worker.gates.base import error, passed
from worker.gates.dynamics import errors, hard, phases, tis, trend
from worker.gates.dynamics.series import Finding, Signals, num, row_quote, signals
from worker.gates.progress import initialization

__all__ = ["check"]

USABLE: Final = ("reward", "entropy", "loss")
"""At least one of these must be logged for the gate to judge anything."""

TABLE_KEYS: Final = ("reward", "pass_at_k", "entropy", "tis_ratio", "tis_log_abs", "tis_exact")
"""The signals whose keys the window table's title names."""

WINDOW_COLUMNS: Final = (
    ("step", "step"),
    ("reward", "reward"),
    ("entropy", "entropy"),
    ("tis_ratio", "TIS ratio"),
    ("tis_log_abs", "|log r|"),
    ("tis_exact", "exact"),
    ("grad_norm", "grad norm"),
    ("step_s", "step s"),
)

_POLARS_FAULTS: Final = (
    pl.exceptions.PolarsError,
    ArithmeticError,
    LookupError,
    TypeError,
    ValueError,
)


# --- tables --------------------------------------------------------------------------------------


def _window_table(sig: Signals) -> tuple[Table, ...]:
    """The metric window as data: the last W steps, one row per step."""
    window = sig.window
    if window.is_empty():
        return ()
    used = ", ".join(
        f"{name}={key}" for name in TABLE_KEYS if (key := sig.keys.get(name)) is not None
    )
    title = (
        f"window: last {window.height} of {sig.steps} steps ({window['step'][0]}–"
        f"{window['step'][-1]}); keys: {used or 'none'}"
    )
    names = [name for name, _ in WINDOW_COLUMNS]
    rows = tuple(tuple(row) for row in window.select(names).iter_rows())
    return (Table(title=title, columns=tuple(label for _, label in WINDOW_COLUMNS), rows=rows),)


@dataclass(frozen=True)
class Details:
    """Detail lines and tables every dynamics result carries."""

    details: tuple[str, ...]
    tables: tuple[Table, ...]


def _report(sig: Signals, table: phases.PhaseTable | None, notes: Sequence[str]) -> Details:
    lines, phase_tables = phases.phase_tables(table, sig)
    return Details((*notes, *lines), _window_table(sig) + phase_tables)


# --- outcomes ------------------------------------------------------------------------------------


def _fail(findings: Sequence[Finding], report: Details, now: datetime) -> GateResult:
    primary, others = findings[0], findings[1:]
    extra = tuple(q for f in others for q in f.evidence[:1])
    also = tuple(f"also FAIL: {f.summary}" for f in others)
    suffix = f" (+{len(others)} more finding(s))" if others else ""
    return GateResult(
        status=GateStatus.FAIL,
        summary=primary.summary + suffix,
        evidence=primary.evidence + extra,
        details=also + report.details,
        tables=report.tables,
        hard_failure=primary.hard,
        learning_quality=primary.learning_quality,
        mechanism=primary.mechanism,
        kind=primary.kind,
        proof=primary.proof(now),
        next_action=primary.next_action,
        flip_signal=primary.flip_signal,
        handoff=primary.handoff or next((f.handoff for f in others if f.handoff), None),
    )


def _reward_summary(sig: Signals, reward: trend.RewardTrend) -> tuple[str, str]:
    """(summary, flip signal) of a PASS, from the reward trend."""
    ratio = sig.limits.collapse_ratio
    flip = (
        f"{reward.key} under {num(reward.line)} ({ratio:.0%} of best window "
        f"{num(reward.best_mean)}) for a {sig.size}-step window without recovering, "
        f"or NaN/inf in loss or grad norm on {sig.limits.non_finite_persist_steps} newest steps"
    )
    if reward.below_since is not None and reward.below_steps >= sig.size:
        return (
            f"{reward.key} below {num(reward.line)} since step {reward.below_since} but "
            f"recovering (trend reaches {num(reward.projected)} within {sig.size} steps); "
            "not a kill condition",
            flip,
        )
    if reward.improving:
        return (
            f"{reward.key} improving: first-window mean {num(reward.first_mean)} → last-window "
            f"mean {num(reward.last_mean)}",
            flip,
        )
    return (
        f"plateau at {num(reward.last_mean)} ({reward.key}; best window "
        f"{num(reward.best_mean)}); a plateau alone is not a kill condition",
        flip,
    )


def _pass(sig: Signals, reward: trend.RewardTrend, report: Details) -> GateResult:
    summary, flip = _reward_summary(sig, reward)
    return passed(
        f"{sig.steps} steps, window {sig.size}: {summary}",
        details=report.details,
        tables=report.tables,
        flip_signal=flip,
        next_action="none from dynamics",
    )


def _blind(sig: Signals, report: Details, why: str, missing: str, *found: Finding) -> GateResult:
    """ERROR: a required input is missing (no window, no reward series, a pending warning)."""
    evidence = tuple(q for f in found for q in f.evidence)
    newest = sig.metrics.sort(["step", "line"]).tail(1).iter_rows(named=True)
    head = tuple(
        row_quote(r, f"newest metric: step {r['step']} {r['key']}={r['value']}") for r in newest
    ) or (quote(errors.log_source(sig.logs), f"{sig.steps} step(s) with metrics"),)
    return error(
        why,
        missing=(missing,),
        evidence=evidence or head,
        details=report.details,
        tables=report.tables,
        next_action="wait for the missing evidence (a full window, a reward series), then "
        "re-diagnose",
        flip_signal=f"the run reaches {sig.size} steps with reward metrics (a full window)",
    )


def _short_run(sig: Signals, report: Details) -> GateResult:
    """Fewer steps than the window past the initialization grace: nothing can be judged yet."""
    anomalies = [f for f in (hard.all_zero(sig), tis.tis(sig)) if f is not None]
    prefix = f"{sig.steps} steps < window of {sig.size}"
    why = (
        f"{prefix} and already anomalous, too few steps to judge: {anomalies[0].summary}"
        if anomalies
        else f"{prefix} past the initialization grace: no learning-quality judgement yet"
    )
    return _blind(sig, report, why, f"a full window of {sig.size} steps", *anomalies)


def _completion(sig: Signals) -> tuple[int, int] | None:
    """(newest step, max_steps) when the run has reached its max_steps."""
    progress = sig.logs.progress.filter(
        (pl.col("kind") == "training_step") & pl.col("total").is_not_null()
    )
    if progress.is_empty() or sig.series.is_empty():
        return None
    total = int(progress.sort("line", nulls_last=False)["total"][-1])
    newest = int(sig.series["step"][-1])
    return (newest, total) if newest >= total else None


def _complete(done: tuple[int, int], findings: Sequence[Finding], report: Details) -> GateResult:
    newest, total = done
    past = " (resumed past the end)" if newest > total else ""
    noted = tuple(f"noted (run complete, not judged): {f.summary}" for f in findings)
    return passed(
        f"run complete: step {newest} reached max_steps {total}{past}; dynamics decide nothing "
        "for a finished run",
        details=noted + report.details,
        tables=report.tables,
        next_action="none from dynamics: the run is complete",
        flip_signal=f"a step past {newest} without a new max_steps (the run is not finished)",
    )


def _soft(
    sig: Signals, reward: trend.RewardTrend | None, table: phases.PhaseTable | None
) -> list[Finding]:
    found = (
        hard.all_zero(sig),
        tis.tis(sig),
        trend.reward_collapse(sig, reward),
        trend.entropy_collapse(sig, reward),
        phases.phase_inflation(sig, table),
    )
    return [f for f in found if f is not None]


def _judge(sig: Signals, now: datetime) -> GateResult:
    table = phases.phase_table(sig)
    run = hard.non_finite_run(sig)
    report = _report(sig, table, [n for n in (hard.spike_note(sig, run),) if n])
    findings = [f for f in (hard.non_finite(sig, run), hard.router_replay(sig)) if f is not None]
    done = _completion(sig)
    if done is not None:
        return _complete(done, findings + _soft(sig, trend.reward_trend(sig), table), report)
    if findings:
        return _fail(findings, report, now)
    pending = hard.pending_non_finite(sig, run)
    if pending is not None:
        return _blind(sig, report, pending.summary, pending.flip_signal, pending)
    if sig.short:
        return _short_run(sig, report)
    reward = trend.reward_trend(sig)
    if reward is None:
        return _blind(
            sig,
            report,
            f"{sig.steps} steps, window {sig.size}: no reward series (reward/avg_raw_reward, "
            "loss/avg_final_rewards): collapse, plateau and all-zero reward cannot be judged",
            "reward series",
        )
    soft = _soft(sig, reward, table)
    return _fail(soft, report, now) if soft else _pass(sig, reward, report)


# --- the entry point -----------------------------------------------------------------------------


def _check(evidence: Evidence) -> GateResult:
    logs = evidence.logs
    if logs is None:
        return errors.no_log(evidence)
    init = initialization(evidence)
    if init is not None:
        return errors.initializing(init)
    if not errors.stepped(logs):
        return errors.no_step_yet(logs)
    sig = signals(logs, evidence.thresholds)
    if not any(sig.has(name) for name in USABLE):
        return errors.no_usable_metrics(logs)
    return _judge(sig, evidence.now)


def check(evidence: Evidence) -> GateResult:
    """Judge the run's training dynamics; never raises (a fault becomes ERROR, quoted)."""
    try:
        return _check(evidence)
    except _POLARS_FAULTS as exc:
        fault = f"{type(exc).__name__}: {exc}"
        return error(
            f"dynamics could not be computed from this evidence: {fault}",
            evidence=(quote(errors.log_source(evidence.logs), fault),),
        )
