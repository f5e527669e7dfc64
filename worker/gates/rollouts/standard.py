"""Standard rollouts: reward metrics, generation-token metrics and verifier exceptions in the
trainer log (no trial artifacts). Each rule below states its hypothesis; the first that holds
decides."""

from __future__ import annotations

import re

import polars as pl

from shared.models import GateResult, GateStatus, Handoff, KillProof, Quote
from worker.evidence.case import Evidence
from worker.evidence.model import LogTables
from worker.evidence.quotes import log_head_quotes, quote, quote_rows
from worker.gates import metric_keys as mk
from worker.gates.base import error, passed
from worker.gates.dynamics.trend import projection
from worker.gates.progress import initialization, newest_attempt
from worker.gates.rules import rule

__all__ = ["check", "metric_quotes", "reward_key", "reward_rows"]

TRUNCATION_TOLERANCE = 1e-6
"""Relative gap under which an average response length equals the maximum."""

_VERIFIER_TRACE = re.compile(r"reward|verifier", re.I)


def reward_key(logs: LogTables) -> str | None:
    keys = mk.resolve(mk.present_keys(logs.metrics))
    return keys.get("reward") or keys.get("pass_at_k")


def reward_rows(logs: LogTables) -> pl.DataFrame:
    key = reward_key(logs)
    if key is None:
        return logs.metrics.clear()
    return logs.metrics.filter(pl.col("key") == key).sort("step")


def metric_quotes(rows: pl.DataFrame, limit: int = 2) -> tuple[Quote, ...]:
    texted = rows.with_columns(_text=pl.format("{}={} at step {}", "key", "value", "step"))
    return quote_rows(texted.tail(limit), text_column="_text", limit=limit)


def _no_rewards(evidence: Evidence) -> GateResult:
    if initialization(evidence) is not None:
        return passed("initialising: no step finished yet; no reward metric yet", initializing=True)
    quotes = log_head_quotes(evidence.logs) or (
        quote("manifest.json", "no trainer log with metrics in the bundle"),
    )
    return error(
        "no reward metric (reward/avg_raw_reward, loss/avg_final_rewards, reward/avg_pass_at_k) "
        "in the trainer log",
        missing=("trainer reward metrics",),
        evidence=quotes,
    )


def check(evidence: Evidence) -> GateResult:
    """Judge a standard run's rollouts from the trainer's reward and generation metrics."""
    logs = evidence.logs
    if logs is None or reward_key(logs) is None:
        return _no_rewards(evidence)
    for finding in (_truncated, _length_collapse, _standard_zero):
        result = finding(evidence, logs)
        if result is not None:
            return result
    return _healthy_rewards(evidence, logs)


def _tokens(logs: LogTables) -> pl.DataFrame:
    """`step, avg, max` generation lengths per step (rows with both present)."""
    avg, top = mk.GENERATION_AVG_TOKENS[0], mk.GENERATION_MAX_TOKENS[0]
    wide = logs.metrics_wide([avg, top])
    if avg not in wide.columns:
        return pl.DataFrame(schema={"step": pl.Int64(), "avg": pl.Float64(), "max": pl.Float64()})
    top_col = pl.col(top) if top in wide.columns else pl.lit(None, dtype=pl.Float64())
    return wide.select("step", avg=pl.col(avg), max=top_col).filter(pl.col("avg").is_not_null())


def _token_quotes(logs: LogTables) -> tuple[Quote, ...]:
    keys = (mk.GENERATION_AVG_TOKENS[0], mk.GENERATION_MAX_TOKENS[0])
    rows = logs.metrics.filter(pl.col("key").is_in(keys)).sort(["step", "key"])
    return metric_quotes(rows, limit=2)


@rule("rollouts.standard")
def _truncated(evidence: Evidence, logs: LogTables) -> GateResult | None:
    """Every step of the newest window has an average response length equal to the maximum:
    every response is cut at the cap (an inefficiency with a configuration handoff)."""
    t = evidence.thresholds
    window = _tokens(logs).filter(pl.col("max").is_not_null()).tail(t.min_window_steps)
    if window.height < t.min_window_steps:
        return None
    gap = (pl.col("max") - pl.col("avg")).abs() <= TRUNCATION_TOLERANCE * pl.col("max").abs()
    if not bool(window.select((gap & (pl.col("max") > 0)).all()).item()):
        return None
    top = window["max"][-1]
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"every response hits the length limit: generate/avg_num_tokens equals "
        f"generate/max_num_tokens ({top:g}) at each of the newest {window.height} steps",
        evidence=_token_quotes(logs),
        kind="truncation",
        mechanism="generation runs to the maximum length on every sample (truncated responses: "
        "a generation cap too low, a missing stop token, or degenerate repetition)",
        next_action="read a few rollouts; check stop tokens, the chat template and the cap",
        flip_signal="a step whose generate/avg_num_tokens is below generate/max_num_tokens",
        handoff=Handoff(
            evidence=_token_quotes(logs),
            likely_cause="responses are cut at the generation cap: the cap is below what the "
            "task needs, or the stop token never fires",
            component="generator sampling params (max_generate_length, stop tokens, chat template)",
            proposed_behavior="responses end on their stop token below the cap",
            test=f"a 2-step run whose generate/avg_num_tokens stays below generate/max_num_tokens "
            f"({top:g})",
        ),
    )


@rule("rollouts.standard")
def _length_collapse(evidence: Evidence, logs: LogTables) -> GateResult | None:
    """The average response length stayed under COLLAPSE_RATIO of the earlier steps' median (or at
    0) on every step of the newest window, and its trend does not climb back within one more
    window: the policy emits near-empty responses."""
    t = evidence.thresholds
    tokens = _tokens(logs)
    if tokens.height < t.min_window_steps:
        return None
    window = tokens.tail(t.min_window_steps)
    earlier = tokens.head(tokens.height - t.min_window_steps)["avg"].median()
    line = t.collapse_ratio * earlier if isinstance(earlier, (int, float)) else 0.0
    under = (pl.col("avg") < line) | (pl.col("avg") == 0)
    if not bool(window.select(under.all()).item()):
        return None
    if line > 0 and projection(window, "avg", t.min_window_steps) >= line:
        return None
    last = float(window["avg"].median() or 0.0)  # type: ignore[arg-type]
    before = f" from a median of {earlier:g} before" if isinstance(earlier, (int, float)) else ""
    quotes = _token_quotes(logs)
    mechanism = "generation length collapse (the policy emits near-empty responses)"
    stamps = [q.timestamp for q in quotes if q.timestamp is not None]
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"response length collapsed: generate/avg_num_tokens under {line:g} on every one "
        f"of the newest {t.min_window_steps} steps (median {last:g}){before}, not trending back",
        evidence=quotes,
        learning_quality=True,
        kind="length_collapse",
        proof=KillProof(
            rule="length_collapse",
            mechanism=mechanism,
            established_at=max(stamps, default=evidence.now),
            evidence=quotes,
        )
        if quotes
        else None,
        mechanism=mechanism,
        next_action="check the newest weight sync and the rollouts' text",
        flip_signal=f"median response length back above {t.collapse_ratio:g} of its earlier median",
    )


def _verifier_errors(logs: LogTables) -> pl.DataFrame:
    errors = logs.errors.filter(pl.col("attempt") == newest_attempt(logs))
    kind = pl.col("kind") == "verifier_error"
    trace = (pl.col("kind") == "traceback") & pl.col("text").str.contains(_VERIFIER_TRACE.pattern)
    return errors.filter(kind | trace.fill_null(value=False)).sort("line")


@rule("rollouts.standard")
def _standard_zero(evidence: Evidence, logs: LogTables) -> GateResult | None:
    """The reward is zero or null at every one of at least MIN_WINDOW_STEPS steps: the reward
    function or the verifier is broken."""
    t = evidence.thresholds
    rewards = reward_rows(logs)
    values = rewards["value"].fill_nan(None).fill_null(0.0)
    if rewards.height < t.min_window_steps or not bool((values == 0).all()):
        return None
    verifier = _verifier_errors(logs)
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"{rewards['key'][0]} is zero or null at all {rewards.height} steps; "
        f"{verifier.height} verifier exception(s) in the trainer log",
        evidence=metric_quotes(rewards) + quote_rows(verifier, limit=2),
        kind="zero_reward",
        mechanism="zero reward from the first step: the reward function or verifier is broken",
        next_action="check the reward function and dataset labels before more training",
        flip_signal=f"any step with {rewards['key'][0]} above 0",
    )


def _healthy_rewards(evidence: Evidence, logs: LogTables) -> GateResult:
    rewards = reward_rows(logs)
    window = rewards.tail(evidence.thresholds.min_window_steps)
    mean = window["value"].fill_nan(None).mean()
    verifier = _verifier_errors(logs)
    summary = (
        f"{rewards['key'][0]} logged at {rewards.height} steps, mean "
        f"{_num(mean)} over the newest {window.height}"
    )
    tokens = _tokens(logs).tail(evidence.thresholds.min_window_steps)
    if not tokens.is_empty():
        summary += f"; generate/avg_num_tokens median {_num(tokens['avg'].median(), 'g')}"
    if not verifier.is_empty():
        summary += f"; {verifier.height} verifier exception(s) in the trainer log"
    quotes = metric_quotes(rewards, limit=1) + quote_rows(verifier, limit=2)
    return passed(summary, evidence=quotes)


def _num(value: object, spec: str = ".3f") -> str:
    """A number formatted with `spec`, or "n/a" for anything else."""
    return format(value, spec) if isinstance(value, int | float) else "n/a"
