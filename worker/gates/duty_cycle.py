"""Duty-cycle gate (agentic only): where a trial's wall time goes, and whether sandboxes churn.

Reads the newest `DUTY_CYCLE_TRIALS` finished TRIALS rows that carry phase timings, leaving out
trials whose sandbox never came up (a sandbox-cause exception: their phases measure a failure,
not a duty cycle; the rollouts gate judges them)
— `environment_setup_s`, `agent_setup_s`, `agent_execution_s`, `verifier_s`, `llm_request_s` — and
the start of the newest attempt (`progress.started_at`, else the first trial's start). A trial's
wall time is `finished_at - started_at`, or the sum of its phases when a timestamp is missing.
Shares are time-weighted over the trials: LLM generation (`llm_request_s`), tools
(`agent_execution_s - llm_request_s`), sandbox lifecycle (`environment_setup_s`; Harbor records
no teardown), agent setup, verifier, and what is left unattributed.

- N/A — standard runs ("N/A for standard runs; timing/* phases are judged under dynamics").
- ERROR — the mode is undeclared (missing "declared mode").
- FAIL (not a hard failure, not learning quality, mechanism "sandbox churn") — over trials that
  started after the first `CHURN_GRACE_S` of the attempt, the sandbox lifecycle share is above
  `CHURN_SHARE` or the `environment_setup` p90 is above `ENV_SETUP_P90_S`.
- PASS — otherwise; when only the trials of the first `CHURN_GRACE_S` (a start-up or relaunch
  burst) churn, the summary says it is a burst, not churn.
- PASS "not measured: N trials with phase timings" — fewer than `MIN_WINDOW_STEPS` trials carry
  phase timings. Duty cycle is optional evidence in the procedure: missing trial outputs already
  make the rollouts gate ERROR, so an unmeasured duty cycle never weakens or changes the verdict.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Final

import polars as pl

from shared.models import GateResult, GateStatus, Mode, Quote, Table
from shared.settings import Thresholds
from worker.evidence.case import Evidence
from worker.evidence.quotes import quote_rows
from worker.gates.base import na, passed
from worker.gates.progress import initialization, started_at
from worker.gates.rollouts import SANDBOX, cause_expr, undeclared

__all__ = ["NA_SUMMARY", "check", "duty_shares"]

NA_SUMMARY: Final = "N/A for standard runs; timing/* phases are judged under dynamics"

PHASES: Final = ("llm", "tools", "sandbox", "agent_setup", "verifier")
_WALL = pl.col("wall_s")
_PHASE_COLUMNS: Final = ("environment_setup_s", "agent_setup_s", "agent_execution_s", "verifier_s")


def check(evidence: Evidence) -> GateResult:
    """Judge the duty cycle of an agentic run's newest trials as of `evidence.now`."""
    mode = evidence.mode.mode
    if mode is Mode.UNDECLARED:
        return undeclared("duty cycle", evidence)
    if mode is Mode.STANDARD:
        return na(NA_SUMMARY)
    return _agentic(evidence)


def _timed(evidence: Evidence) -> pl.DataFrame:
    """Finished trials with a setup time and a wall time, newest DUTY_CYCLE_TRIALS of them."""
    if evidence.trials is None or evidence.trials.trials.is_empty():
        return pl.DataFrame()
    trials = evidence.trials.trials
    duration = (pl.col("finished_at") - pl.col("started_at")).dt.total_seconds(fractional=True)
    sandbox_failed = cause_expr() == SANDBOX
    return (
        trials.filter(
            (pl.col("status") == "finished")
            & pl.col("environment_setup_s").is_not_null()
            & ~sandbox_failed.fill_null(value=False)
        )
        .with_columns(wall_s=pl.coalesce(duration, pl.sum_horizontal(_PHASE_COLUMNS)))
        .filter(_WALL > 0)
        .sort("finished_at", nulls_last=True)
        .tail(evidence.thresholds.duty_cycle_trials)
    )


def duty_shares(trials: pl.DataFrame) -> dict[str, float | None]:
    """Time-weighted shares of wall time per phase, plus `env_setup_p90_s` and `n`."""
    llm = pl.col("llm_request_s")
    tools = pl.col("agent_execution_s") - llm.fill_null(0.0)
    row = trials.select(
        llm=llm.sum() / _WALL.filter(llm.is_not_null()).sum(),
        tools=tools.sum() / _WALL.filter(pl.col("agent_execution_s").is_not_null()).sum(),
        sandbox=pl.col("environment_setup_s").sum() / _WALL.sum(),
        agent_setup=pl.col("agent_setup_s").sum() / _WALL.sum(),
        verifier=pl.col("verifier_s").sum() / _WALL.sum(),
        unattributed=1 - pl.sum_horizontal(_PHASE_COLUMNS).sum() / _WALL.sum(),
        env_setup_p90_s=pl.col("environment_setup_s").quantile(0.9, interpolation="linear"),
        n=pl.len().cast(pl.Float64()),
    ).row(0, named=True)
    return {k: (None if v is None or math.isnan(v) else float(v)) for k, v in row.items()}


def _churns(shares: dict[str, float | None], t: Thresholds) -> bool:
    sandbox, p90 = shares["sandbox"] or 0.0, shares["env_setup_p90_s"] or 0.0
    return sandbox > t.churn_share or p90 > t.env_setup_p90_s


def _grace_end(evidence: Evidence, timed: pl.DataFrame) -> datetime | None:
    since = started_at(evidence)
    if since is None:
        first = timed["started_at"].min()
        since = first if isinstance(first, datetime) else None
    return None if since is None else since + timedelta(seconds=evidence.thresholds.churn_grace_s)


def _agentic(evidence: Evidence) -> GateResult:
    t = evidence.thresholds
    timed = _timed(evidence)
    if timed.height < t.min_window_steps:
        if initialization(evidence) is not None:
            return passed(
                "initialising: no step finished yet; no trial timings yet", initializing=True
            )
        return passed(
            f"not measured: {timed.height} trials with phase timings",
            gaps=(f"trial phase timings of at least {t.min_window_steps} trials",),
        )
    grace_end = _grace_end(evidence, timed)
    after = timed if grace_end is None else timed.filter(pl.col("started_at") > grace_end)
    if after.height >= t.min_window_steps and _churns(duty_shares(after), t):
        return _churn(evidence, after)
    return _no_churn(evidence, timed, after)


def _describe(shares: dict[str, float | None], t: Thresholds) -> str:
    sandbox, p90 = shares["sandbox"] or 0.0, shares["env_setup_p90_s"] or 0.0
    return (
        f"sandbox lifecycle {sandbox:.0%} of trial wall time (limit {t.churn_share:.0%}), "
        f"environment_setup p90 {p90:.1f}s (limit {t.env_setup_p90_s:g}s)"
    )


def _churn(evidence: Evidence, after: pl.DataFrame) -> GateResult:
    t = evidence.thresholds
    shares = duty_shares(after)
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"{_describe(shares, t)} over {after.height} trials started after the first "
        f"{t.churn_grace_s / 60:.0f} min of the attempt",
        evidence=_setup_quotes(after),
        tables=(share_table(after),),
        mechanism="sandbox churn",
        next_action="sandbox create/teardown eats the rollout budget: check Daytona latency and "
        "quota, and whether sandboxes or snapshots can be reused across trials",
        flip_signal=f"over the newest trials, sandbox lifecycle under {t.churn_share:.0%} of wall "
        f"time and environment_setup p90 under {t.env_setup_p90_s:g}s",
    )


def _no_churn(evidence: Evidence, timed: pl.DataFrame, after: pl.DataFrame) -> GateResult:
    t = evidence.thresholds
    burst = timed.filter(~pl.col("trial_name").is_in(after["trial_name"].implode()))
    shares = duty_shares(after if after.height >= t.min_window_steps else timed)
    summary = f"{_describe(shares, t)} over {timed.height} trials"
    if burst.height and _churns(duty_shares(burst), t):
        summary = (
            f"start-up burst, not churn: {burst.height} trials of the first "
            f"{t.churn_grace_s / 60:.0f} min show {_describe(duty_shares(burst), t)}; "
            f"{after.height} later trials do not"
        )
    return passed(summary, evidence=_setup_quotes(timed, limit=1), tables=(share_table(timed),))


def _setup_quotes(trials: pl.DataFrame, limit: int = 3) -> tuple[Quote, ...]:
    """The slowest sandbox set-ups, quoted from their result files."""
    texted = trials.sort("environment_setup_s", descending=True).with_columns(
        timestamp=pl.col("started_at"),
        _text=pl.format(
            "{}: environment_setup {}s of {}s wall (agent_execution {}s, verifier {}s)",
            "trial_name",
            pl.col("environment_setup_s").round(1),
            _WALL.round(1),
            pl.col("agent_execution_s").round(1),
            pl.col("verifier_s").round(1),
        ),
    )
    return quote_rows(texted, text_column="_text", limit=limit)


def share_table(trials: pl.DataFrame) -> Table:
    """Each phase's share of wall time (%) and its p50/p90 seconds, as data."""
    shares = duty_shares(trials)
    seconds = {
        "llm": pl.col("llm_request_s"),
        "tools": pl.col("agent_execution_s") - pl.col("llm_request_s").fill_null(0.0),
        "sandbox": pl.col("environment_setup_s"),
        "agent_setup": pl.col("agent_setup_s"),
        "verifier": pl.col("verifier_s"),
    }
    quantiles = trials.select(
        *(expr.median().alias(f"{name}_p50") for name, expr in seconds.items()),
        *(expr.quantile(0.9).alias(f"{name}_p90") for name, expr in seconds.items()),
    ).row(0, named=True)
    rows = [
        (name, _percent(shares[name]), quantiles[f"{name}_p50"], quantiles[f"{name}_p90"])
        for name in PHASES
    ]
    rows.append(("unattributed", _percent(shares["unattributed"]), None, None))
    return Table(
        title=f"duty cycle over {len(trials)} trials",
        columns=("phase", "share of wall", "p50 s", "p90 s"),
        rows=tuple(rows),
        units=("", "%", "", ""),
    )


def _percent(value: float | None) -> float | None:
    return None if value is None else 100.0 * value
