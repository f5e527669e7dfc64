"""The dynamics gate: does the training signal say the run is learning, stuck, or broken?

What it reads: the stitched METRICS table (newest attempt per step) through the canonical keys of
`worker.gates.metric_keys` (reward, pass@k, entropy, policy loss, grad norm, TIS, token shift,
generation errors), the PHASES table (or `timing/<phase>` keys when no timer line was parsed),
RESUMES (to correlate a collapse), PROGRESS (max_steps) and the parse summary (to quote what a log
without usable metrics looks like). All thresholds come from `Thresholds`; W is MIN_WINDOW_STEPS,
the window is the last W steps that carry any canonical metric.

ERROR:
- past the initialization grace (or with the job ended), the log shows no step at all (no
  `Finished: 'step'`, no metric row, no malformed record): no metrics to judge;
- no trainer log at all, or the parser found no reward, entropy or loss key (a failed probe; the
  summary quotes the log's head, the serializations seen and the malformed count);
- fewer than W steps and an anomaly already visible (all-zero reward so far, TIS out of range on
  every step so far): too few steps to judge it either way;
- a fault while computing on malformed evidence (the exception is quoted; the gate never raises).

PASS:
- the newest attempt is still initialising (`progress.initialization`): no window yet;
- fewer than W steps and nothing anomalous: no learning-quality judgement yet;
- the run is complete (its newest step reached PROGRESS's max_steps, e.g. a resume past the end);
  anything else seen is listed as noted, not judged;
- otherwise, when no FAIL rule below matches: improving, plateau (also when below the best window
  but above the collapse line; "a plateau alone is not a kill condition"), or collapsed but
  recovering.

FAIL (first match is the primary finding; the others are listed under it):
1. non-finite (hard): NaN or ±inf in loss, grad norm, reward or entropy within the window (on any
   step so far for a short run). A non-finite value only before the window, with the window finite,
   is noted, not failed.
2. broken router replay (hard, with a handoff): on every window step the token-shift max log-ratio
   is ≥ ROUTER_REPLAY_LOG_RATIO_MAX and each of policy loss / grad norm that is logged (at least
   one must be) is ≥ ROUTER_REPLAY_POLICY_LOSS / ROUTER_REPLAY_GRAD_NORM.
3. all-zero reward (infrastructure fingerprint, hard — every gradient step since step 1 trained on
   nothing — not learning quality): every reward logged, from the first recorded step through a
   full window, is exactly 0.
4. TIS out of range (learning quality, off-policy mismatch, with a handoff): on every window step,
   importance-ratio mean outside TIS_RATIO_MEAN_MIN..MAX, or mean |log ratio| above
   TIS_LOG_RATIO_ABS_MAX, or capped fraction above TIS_CAPPED_FRACTION_MAX, or exact-match fraction
   below TIS_EXACT_MATCH_MIN.
5. reward collapse (learning quality): best W-step rolling mean > 0; every step since the last step
   at or above COLLAPSE_RATIO x best is below it, for at least W steps; and the least-squares trend
   over the window does not reach that line again within one more window (not recovering). The
   collapse step is correlated with an attempt change, a resume, or a `sync_weights` spike
   (> PHASE_INFLATION x its run median) between the last healthy step and the collapse.
6. entropy collapse (learning quality): last-window median entropy < ENTROPY_COLLAPSE_RATIO x the
   first-window median while reward is not improving (improving = last-window mean above the
   first-window mean by more than the first window's step-to-step noise, the standard deviation of
   its successive differences over sqrt(2), which a steady trend does not inflate). Without a
   reward series "not improving" cannot be shown and the rule does not fire.
7. phase inflation (a pipeline bubble, neither hard nor learning quality): a phase's last-window
   median over its first-window median > PHASE_INFLATION. The `step` phase (the sum) is not judged,
   nor a phase seen on fewer than half the steps of either window (checkpoint saves, evals), nor one
   whose last-window median is under BUFFER_WAIT_SHARE of the step's (near zero either way).

`policy/rollout_train_prob_diff_mean` is never judged (benign noise). Every result carries the
window table (step | reward | entropy | TIS ratio / |log r| / exact | grad norm | step s) and the
phase table (phase | first-window median s | last-window median s | ratio) in `details`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import polars as pl

from shared.models import GateResult, GateStatus, Handoff, Quote
from shared.settings import Thresholds
from worker.evidence.model import Evidence, LogTables
from worker.evidence.quotes import log_head_quotes, quote
from worker.gates.base import error, passed
from worker.gates.metric_keys import (
    CANDIDATES,
    PHASE_PREFIX,
    STEP_PHASE,
    WEIGHT_SYNC_PHASE,
    ResolvedKeys,
    present_keys,
    resolve,
)
from worker.gates.progress import Initialization, finished_steps, initialization

__all__ = ["check"]

SIGNALS: Final = (*CANDIDATES, "pass_at_k")
"""The canonical signal columns of the per-step series."""

USABLE: Final = ("reward", "entropy", "loss")
"""At least one of these must be logged for the gate to judge anything."""

NON_FINITE_SIGNALS: Final = ("loss", "grad_norm", "reward", "entropy")

TABLE_KEYS: Final = (
    "reward",
    "pass_at_k",
    "entropy",
    "tis_ratio",
    "tis_log_abs",
    "tis_exact",
    "grad_norm",
)
"""The signals whose keys the window table's header names."""

PHASE_MIN_PRESENCE: Final = 0.5
"""A phase must appear on this share of the steps of both windows to be compared step over step."""

PHASE_COLUMNS: Final = ("step", "phase", "seconds", "source", "line", "timestamp", "attempt")

ROUTER_REPLAY_HANDOFF: Final = {
    "likely_cause": (
        "MoE router replay is broken: the trainer recomputes log-probabilities with expert "
        "routing that differs from the rollout's, so per-token log-ratios blow up"
    ),
    "component": "MoE router replay in the trainer / vLLM weight sync (routing capture and replay)",
    "proposed_behavior": (
        "replay the rollout's recorded expert routing in the trainer forward pass (or turn router "
        "replay off) so the max log-ratio, policy loss and grad norm stay at ordinary levels"
    ),
}

TIS_HANDOFF: Final = {
    "likely_cause": (
        "rollout and trainer log-probabilities disagree (off-policy mismatch): sampling settings, "
        "dtype or a stale/partial weight sync between trainer and vLLM"
    ),
    "component": "rollout/trainer log-prob agreement: vLLM sampling config and the weight sync",
    "proposed_behavior": "trainer and rollout log-probabilities agree within the TIS healthy range",
}

TIS_RULES: Final = (
    # signal, label, lower bound field, upper bound field (on Thresholds)
    ("tis_ratio", "importance-ratio mean", "tis_ratio_mean_min", "tis_ratio_mean_max"),
    ("tis_log_abs", "mean |log ratio|", None, "tis_log_ratio_abs_max"),
    ("tis_capped", "capped fraction", None, "tis_capped_fraction_max"),
    ("tis_exact", "exact-match fraction", "tis_exact_match_min", None),
)

_POLARS_FAULTS: Final = (
    pl.exceptions.PolarsError,
    ArithmeticError,
    LookupError,
    TypeError,
    ValueError,
)


# --- the evidence, shaped once -------------------------------------------------------------------


@dataclass(frozen=True)
class Signals:
    """The run's canonical per-step series and the rows to quote them by."""

    keys: ResolvedKeys
    series: pl.DataFrame  # step, one Float64 column per SIGNALS name, step_s; one row per step
    metrics: pl.DataFrame  # long METRICS rows (all keys), for quoting
    phases: pl.DataFrame  # PHASE_COLUMNS, one row per (step, phase), newest attempt
    logs: LogTables
    limits: Thresholds

    @property
    def size(self) -> int:
        return self.limits.min_window_steps

    @property
    def steps(self) -> int:
        return self.series.height

    @property
    def short(self) -> bool:
        return self.steps < self.size

    @property
    def window(self) -> pl.DataFrame:
        return self.series.tail(self.size)

    def has(self, signal: str) -> bool:
        return self.keys.get(signal) is not None

    def key(self, signal: str) -> str:
        return self.keys.get(signal) or signal

    def column(self, signal: str) -> pl.DataFrame:
        """`step` and the signal's values, nulls and non-finite values dropped."""
        return self.series.select("step", signal).drop_nulls().filter(pl.col(signal).is_finite())


def _phase_rows(logs: LogTables) -> pl.DataFrame:
    """Phase durations, one row per (step, phase), the newest attempt's when a step repeats."""
    if not logs.phases.is_empty():
        rows = logs.phases.select(PHASE_COLUMNS)
    else:
        rows = logs.metrics.filter(pl.col("key").str.starts_with(PHASE_PREFIX)).select(
            "step",
            pl.col("key").str.strip_prefix(PHASE_PREFIX).alias("phase"),
            pl.col("value").alias("seconds"),
            *PHASE_COLUMNS[3:],
        )
    rows = rows.drop_nulls(["step", "phase", "seconds"])
    ordered = rows.sort(["step", "phase", "attempt", "line"], nulls_last=False)
    return ordered.unique(["step", "phase"], keep="last", maintain_order=True)


def _signal_column(wide: pl.DataFrame, key: str | None) -> pl.Expr:
    return pl.col(key) if key is not None and key in wide.columns else pl.lit(None)


def _series(logs: LogTables, keys: ResolvedKeys, phases: pl.DataFrame) -> pl.DataFrame:
    wide = logs.metrics_wide()
    columns = [
        _signal_column(wide, keys.get(name)).cast(pl.Float64).alias(name) for name in SIGNALS
    ]
    series = wide.select(pl.col("step"), *columns).filter(
        pl.any_horizontal(pl.col(name).is_not_null() for name in SIGNALS)
    )
    step_s = phases.filter(pl.col("phase") == STEP_PHASE).select(
        "step", pl.col("seconds").alias("step_s")
    )
    return series.join(step_s, on="step", how="left").sort("step")


def _signals(logs: LogTables, limits: Thresholds) -> Signals:
    keys = resolve(present_keys(logs.metrics))
    phases = _phase_rows(logs)
    return Signals(
        keys=keys,
        series=_series(logs, keys, phases),
        metrics=logs.metrics,
        phases=phases,
        logs=logs,
        limits=limits,
    )


# --- formatting and quoting ----------------------------------------------------------------------


def _num(value: float | None) -> str:
    """A compact number for tables and summaries."""
    if value is None:
        return "-"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}"


def _quoted_value(value: float | None) -> str:
    """A metric value as quoted evidence: four decimals unless that would hide it."""
    if value is None or not math.isfinite(value):
        return _num(value)
    if value != 0 and abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:.1f}" if abs(value) >= 1e4 else f"{value:.4f}"


def _as_float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _metric_quote(sig: Signals, key: str, step: int) -> Quote | None:
    """The METRICS row of `key` at `step`, quoted as `step N key=value`."""
    rows = sig.metrics.filter((pl.col("key") == key) & (pl.col("step") == step))
    if rows.is_empty():
        return None
    row = rows.row(-1, named=True)
    return _row_quote(row, f"step {step} {key}={_quoted_value(_as_float(row['value']))}")


def _row_quote(row: dict[str, Any], text: str) -> Quote:
    line = row.get("line")
    stamp = row.get("timestamp")
    return quote(
        source=str(row.get("source") or "?"),
        text=text,
        line=line if isinstance(line, int) else None,
        timestamp=stamp if isinstance(stamp, datetime) else None,
    )


def _signal_quotes(sig: Signals, signal: str, steps: Iterable[int | None]) -> tuple[Quote, ...]:
    """Quotes of one canonical signal at the given steps (absent rows and steps skipped)."""
    key = sig.keys.get(signal)
    if key is None:
        return ()
    found = (_metric_quote(sig, key, step) for step in dict.fromkeys(steps) if step is not None)
    return tuple(q for q in found if q is not None)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) else None


# --- findings ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One FAIL condition, with everything the GateResult needs for it."""

    summary: str
    mechanism: str
    evidence: tuple[Quote, ...]
    next_action: str
    flip_signal: str
    hard: bool = False
    learning_quality: bool = False
    handoff: Handoff | None = None


def _non_finite_rows(sig: Signals) -> pl.DataFrame:
    keys = [k for name in NON_FINITE_SIGNALS if (k := sig.keys.get(name)) is not None]
    bad = pl.col("value").is_nan() | pl.col("value").is_infinite()
    return sig.metrics.filter(pl.col("key").is_in(keys) & bad).sort(["step", "line"])


def _non_finite(sig: Signals) -> Finding | None:
    """NaN or inf in loss, grad norm, reward or entropy within the window."""
    window_steps = sig.window["step"].implode()
    rows = _non_finite_rows(sig).filter(pl.col("step").is_in(window_steps))
    if rows.is_empty():
        return None
    first, newest = rows.row(0, named=True), rows.row(-1, named=True)
    key, step = str(first["key"]), int(first["step"])
    keys = ", ".join(sorted(set(rows["key"].to_list())))
    evidence = tuple(
        _row_quote(r, f"step {r['step']} {r['key']}={_num(_as_float(r['value']))}")
        for r in (first, newest)
    )
    return Finding(
        summary=f"non-finite {key} at step {step} ({rows.height} NaN/inf value(s) of {keys} "
        f"in the window through step {newest['step']})",
        mechanism=f"non-finite {key} from step {step}: the training math diverged (NaN/inf)",
        evidence=evidence[:1] if first == newest else evidence,
        next_action=f"KILL: the run is training on NaN/inf; find the divergence (learning rate, "
        f"loss scale, a bad batch) before relaunching from a checkpoint before step {step}",
        flip_signal=f"every value of {keys} finite on the last {sig.size} steps",
        hard=True,
    )


def _earlier_non_finite_note(sig: Signals) -> str | None:
    rows = _non_finite_rows(sig)
    if rows.is_empty():
        return None
    row = rows.row(-1, named=True)
    return (
        f"note: non-finite {row['key']} last at step {row['step']} "
        f"({row['source']}:{row['line']}); finite throughout the window since"
    )


def _router_replay_mask(sig: Signals) -> pl.Expr | None:
    limits = sig.limits
    if not sig.has("shift_max") or not (sig.has("loss") or sig.has("grad_norm")):
        return None
    mask = pl.col("shift_max") >= limits.router_replay_log_ratio_max
    if sig.has("loss"):
        mask &= pl.col("loss") >= limits.router_replay_policy_loss
    if sig.has("grad_norm"):
        mask &= pl.col("grad_norm") >= limits.router_replay_grad_norm
    return mask.fill_null(False)


def _router_replay(sig: Signals) -> Finding | None:
    """The broken-router-replay fingerprint on every step of the window."""
    mask = _router_replay_mask(sig)
    window = sig.window
    if mask is None or window.is_empty() or not window.select(mask.all()).item():
        return None
    first, newest = int(window["step"][0]), int(window["step"][-1])
    evidence = tuple(
        q
        for name in ("shift_max", "loss", "grad_norm")
        for q in _signal_quotes(sig, name, [newest])
    ) + _signal_quotes(sig, "shift_max", [first])
    row = window.row(-1, named=True)
    values = f"max log-ratio {_num(row['shift_max'])}, loss {_num(row['loss'])}, " + (
        f"grad norm {_num(row['grad_norm'])}"
    )
    handoff = Handoff(
        evidence=evidence,
        test=f"a short MoE run with router replay on keeps {sig.key('shift_max')} under "
        f"{_num(sig.limits.router_replay_log_ratio_max)}, policy loss under "
        f"{_num(sig.limits.router_replay_policy_loss)} and grad norm under "
        f"{_num(sig.limits.router_replay_grad_norm)} on every step",
        **ROUTER_REPLAY_HANDOFF,
    )
    return Finding(
        summary=f"broken router replay fingerprint on every step {first}–{newest} ({values} "
        f"at step {newest})",
        mechanism="broken router replay",
        evidence=evidence,
        next_action="KILL and hand off: fix MoE router replay in the trainer/vLLM sync before "
        "relaunching; the updates are driven by routing mismatch, not by the reward",
        flip_signal=f"{sig.key('shift_max')} under "
        f"{_num(sig.limits.router_replay_log_ratio_max)} with policy loss and grad norm at "
        "ordinary levels on a window of steps",
        hard=True,
        handoff=handoff,
    )


def _generation_quotes(sig: Signals, step: int) -> tuple[Quote, ...]:
    """Generation failures logged at `step`, the likeliest why of an all-zero reward."""
    failed = sig.series.filter((pl.col("step") == step) & (pl.col("gen_failed") > 0))
    quotes = _signal_quotes(sig, "gen_failed", [step]) if not failed.is_empty() else ()
    errors = (_metric_quote(sig, key, step) for key in sig.keys.generation_errors)
    return quotes + tuple(q for q in errors if q is not None)


def _all_zero(sig: Signals) -> Finding | None:
    """Every reward logged, from the first recorded step on, is exactly 0."""
    reward = sig.series.select("step", "reward").drop_nulls()
    if reward.is_empty() or not reward.select((pl.col("reward") == 0).all()).item():
        return None
    key = sig.key("reward")
    first, newest = int(reward["step"][0]), int(reward["step"][-1])
    evidence = _signal_quotes(sig, "reward", [first, newest]) + _generation_quotes(sig, newest)
    return Finding(
        summary=f"all-zero {key} from step {first} through step {newest} "
        f"({reward.height} steps): rewards never computed",
        mechanism=f"all-zero reward since step {first}: infrastructure fingerprint "
        "(rewards never computed)",
        evidence=evidence,
        next_action="Supervisor: kill the job (it trains on zero reward); then check the reward "
        "path, not the model: verifier output and exceptions, sandbox creation (e.g. Daytona "
        "quota), reward-function wiring",
        flip_signal=f"any non-zero {key} at a step after {newest}",
        hard=True,
    )


def _tis_mask(signal: str, low: float | None, high: float | None) -> pl.Expr:
    column = pl.col(signal)
    out = pl.lit(False)
    if low is not None:
        out |= column < low
    if high is not None:
        out |= column > high
    return out.fill_null(False)


def _bound(limits: Thresholds, name: str | None) -> float | None:
    return None if name is None else float(getattr(limits, name))


def _healthy_range(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"{_num(low)}–{_num(high)}"
    return f"≥ {_num(low)}" if low is not None else f"≤ {_num(high)}"


def _tis_violations(sig: Signals) -> list[tuple[str, str]]:
    """(signal, description) of each TIS metric out of range on every step of the window."""
    window, found = sig.window, []
    for signal, label, low_name, high_name in TIS_RULES:
        low, high = _bound(sig.limits, low_name), _bound(sig.limits, high_name)
        if sig.has(signal) and window.select(_tis_mask(signal, low, high).all()).item():
            median = _as_float(window[signal].median())
            found.append(
                (signal, f"{label} median {_num(median)} (healthy {_healthy_range(low, high)})")
            )
    return found


def _tis(sig: Signals) -> Finding | None:
    """TIS out of its healthy range, sustained over the window."""
    violations = _tis_violations(sig)
    if sig.window.is_empty() or not violations:
        return None
    first, newest = int(sig.window["step"][0]), int(sig.window["step"][-1])
    evidence = tuple(q for name, _ in violations for q in _signal_quotes(sig, name, [newest]))
    described = "; ".join(text for _, text in violations)
    keys = ", ".join(sig.key(name) for name, _ in violations)
    handoff = Handoff(
        evidence=evidence,
        test=f"a short run with the same config keeps {keys} within the healthy range "
        "on every step",
        **TIS_HANDOFF,
    )
    return Finding(
        summary=f"TIS out of the healthy range on every step {first}–{newest}: {described}",
        mechanism=f"off-policy mismatch between rollout and trainer ({keys} out of range)",
        evidence=evidence,
        next_action="learning-quality KILL candidate: confirm with rollout evidence, then check "
        "the weight sync and vLLM sampling settings against the trainer's",
        flip_signal=f"{keys} back within the healthy range for a {sig.size}-step window",
        learning_quality=True,
        handoff=handoff,
    )


# --- the reward trend ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RewardTrend:
    """The reward series summarised for the collapse, entropy and PASS judgements."""

    key: str
    first_mean: float
    first_noise: float  # step-to-step noise of the first window: std of differences / sqrt(2)
    last_mean: float
    best_mean: float
    best_end: int  # last step of the best window
    line: float  # COLLAPSE_RATIO x best window mean
    last_healthy: int | None  # newest step at or above the line
    below_since: int | None  # first step after it
    below_steps: int  # steps since the last healthy step
    projected: float  # the window's trend line one window after the newest step

    @property
    def improving(self) -> bool:
        return self.last_mean > self.first_mean + self.first_noise

    @property
    def recovering(self) -> bool:
        return self.projected >= self.line


def _trend_projection(tail: pl.DataFrame, size: int) -> float:
    """Least-squares trend of the last window, evaluated one window after its newest step."""
    x = pl.col("step").cast(pl.Float64) - pl.col("step").cast(pl.Float64).mean()
    y = pl.col("reward") - pl.col("reward").mean()
    denominator = (x * x).sum()
    slope = pl.when(denominator > 0).then((x * y).sum() / denominator).otherwise(0.0)
    projected = pl.col("reward").mean() + slope * (x.last() + size)
    return float(tail.select(projected).item())


def _reward_trend(sig: Signals) -> RewardTrend | None:
    reward = sig.column("reward")
    if reward.height < sig.size:
        return None
    best_index = reward["reward"].rolling_mean(sig.size).arg_max()
    best = reward.slice((best_index or 0) - sig.size + 1, sig.size)
    best_mean = _as_float(best["reward"].mean()) or 0.0
    line = sig.limits.collapse_ratio * best_mean
    last_healthy = _int(reward.filter(pl.col("reward") >= line)["step"].max())
    below = reward.filter(pl.col("step") > (last_healthy if last_healthy is not None else -1))
    first, last = reward.head(sig.size)["reward"], reward.tail(sig.size)["reward"]
    return RewardTrend(
        key=sig.key("reward"),
        first_mean=_as_float(first.mean()) or 0.0,
        first_noise=(_as_float(first.diff().std()) or 0.0) / math.sqrt(2),
        last_mean=_as_float(last.mean()) or 0.0,
        best_mean=best_mean,
        best_end=int(best["step"][-1]),
        line=line,
        last_healthy=last_healthy,
        below_since=_int(below["step"].min()),
        below_steps=below.height,
        projected=_trend_projection(reward.tail(sig.size), sig.size),
    )


def _collapsed(trend: RewardTrend | None, size: int) -> bool:
    """Collapsed from a positive best window, below the line a full window, not recovering."""
    if trend is None or trend.best_mean <= 0 or trend.below_since is None:
        return False
    sustained = trend.below_steps >= size and trend.last_mean < trend.line
    return sustained and not trend.recovering


def _attempt_change(sig: Signals, before: int, at: int) -> tuple[str, Quote] | None:
    key = sig.key("reward")
    rows = sig.metrics.filter((pl.col("key") == key) & pl.col("step").is_in([before, at]))
    attempts = rows.sort("step")["attempt"].to_list()
    if len(attempts) != 2 or attempts[0] == attempts[1]:
        return None
    found = _metric_quote(sig, key, at)
    text = f"an attempt change ({attempts[0]} → {attempts[1]}) at step {at}"
    return (text, found) if found is not None else None


def _resume_near(sig: Signals, before: int, at: int) -> tuple[str, Quote] | None:
    resumes = sig.logs.resumes
    stamps = sig.metrics.filter(
        (pl.col("key") == sig.key("reward")) & pl.col("step").is_in([before, at])
    )["timestamp"]
    in_steps = pl.col("step").is_between(before - sig.size, at)
    in_time = pl.col("timestamp").is_between(stamps.min(), stamps.max())
    near = resumes.filter((in_steps | in_time).fill_null(False)).sort("line")
    if near.is_empty():
        return None
    row = near.row(0, named=True)
    return f"a resume ({row['text']})", _row_quote(row, str(row["text"]))


def _sync_spike(sig: Signals, before: int, at: int) -> tuple[str, Quote] | None:
    syncs = sig.phases.filter(pl.col("phase") == WEIGHT_SYNC_PHASE)
    median = _as_float(syncs["seconds"].median())
    if median is None or median <= 0:
        return None
    limit = sig.limits.phase_inflation * median
    spikes = syncs.filter(pl.col("step").is_between(before, at) & (pl.col("seconds") > limit))
    if spikes.is_empty():
        return None
    row = spikes.sort("seconds").row(-1, named=True)
    seconds = f"{_num(row['seconds'])} s vs run median {_num(median)} s"
    text = f"weight sync at step {row['step']} ({seconds})"
    return text, _row_quote(row, f"step {row['step']} {WEIGHT_SYNC_PHASE} {row['seconds']:.2f} s")


def _collapse_context(sig: Signals, before: int, at: int) -> list[tuple[str, Quote]]:
    """Events between the last healthy step and the collapse that may explain it."""
    probes = (_sync_spike, _resume_near, _attempt_change)
    return [found for probe in probes if (found := probe(sig, before, at)) is not None]


def _collapse(sig: Signals, trend: RewardTrend | None) -> Finding | None:
    """Reward collapsed from its best window, sustained a window and not recovering."""
    if trend is None or not _collapsed(trend, sig.size):
        return None
    at, before = int(trend.below_since or 0), int(trend.last_healthy or trend.best_end)
    context = _collapse_context(sig, before, at)
    cause = f" after {context[0][0]}" if context else " (no resume, attempt change or weight-sync"
    cause += "" if context else " spike next to it)"
    newest = int(sig.window["step"][-1])
    evidence = _signal_quotes(sig, "reward", [before, at, newest]) + tuple(q for _, q in context)
    ratio = sig.limits.collapse_ratio
    return Finding(
        summary=f"reward collapse at step {at}: {trend.key} last-window mean "
        f"{_num(trend.last_mean)} < {_num(trend.line)} ({ratio:.0%} of best window "
        f"{_num(trend.best_mean)}) for {trend.below_steps} steps, not recovering",
        mechanism=f"reward collapse at step {at}{cause}",
        evidence=evidence,
        next_action=f"learning-quality KILL candidate: confirm with rollout/trial evidence, then "
        f"inspect what changed at step {at} (weight sync, resume, config, data)",
        flip_signal=f"{trend.key} back above {_num(trend.line)} ({ratio:.0%} of best window "
        f"{_num(trend.best_mean)}) for a {sig.size}-step window",
        learning_quality=True,
    )


def _entropy_collapse(sig: Signals, trend: RewardTrend | None) -> Finding | None:
    """Entropy far under its early median while reward is not improving."""
    entropy = sig.column("entropy")
    if trend is None or trend.improving or entropy.height < sig.size:
        return None
    early = _as_float(entropy.head(sig.size)["entropy"].median())
    late = _as_float(entropy.tail(sig.size)["entropy"].median())
    if early is None or late is None or early <= 0:
        return None
    line = sig.limits.entropy_collapse_ratio * early
    if late >= line:
        return None
    since = int(entropy.filter(pl.col("entropy") < line)["step"][0])
    newest = int(entropy["step"][-1])
    key = sig.key("entropy")
    return Finding(
        summary=f"entropy collapse: {key} last-window median {_num(late)} < {_num(line)} "
        f"({sig.limits.entropy_collapse_ratio:.0%} of early median {_num(early)}) since step "
        f"{since}, while {trend.key} is not improving ({_num(trend.first_mean)} → "
        f"{_num(trend.last_mean)})",
        mechanism=f"entropy collapse from step {since} with reward not improving",
        evidence=_signal_quotes(sig, "entropy", [since, newest])
        + _signal_quotes(sig, "reward", [newest]),
        next_action="learning-quality KILL candidate: confirm with rollout evidence (repetitive or "
        "degenerate samples), then check the entropy/KL settings and the learning rate",
        flip_signal=f"{key} back above {_num(line)} or {trend.key} improving past "
        f"{_num(trend.first_mean + trend.first_noise)} over a {sig.size}-step window",
        learning_quality=True,
    )


# --- phases --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseTable:
    """Median phase seconds in the first and the last window of phase steps."""

    rows: pl.DataFrame  # phase, first_s, first_n, last_s, last_n, ratio, note, judged
    first_steps: tuple[int, int]
    last_steps: tuple[int, int]


def _window_medians(phases: pl.DataFrame, steps: pl.Series, prefix: str) -> pl.DataFrame:
    return (
        phases.filter(pl.col("step").is_in(steps.implode()))
        .group_by("phase")
        .agg(pl.col("seconds").median().alias(f"{prefix}_s"), pl.len().alias(f"{prefix}_n"))
    )


def _phase_note(sig: Signals, step_s: float | None) -> pl.Expr:
    """Why a phase is or is not judged, as the phase table's last column."""
    present = sig.size * PHASE_MIN_PRESENCE
    floor = (step_s or 0.0) * sig.limits.buffer_wait_share
    sparse = (pl.col("first_n") < present) | (pl.col("last_n") < present)
    return (
        pl.when(pl.col("phase") == STEP_PHASE)
        .then(pl.lit("step total, not judged"))
        .when(sparse.fill_null(True))
        .then(pl.lit("not every step, not judged"))
        .when(pl.col("last_s") < floor)
        .then(pl.lit("near zero, not judged"))
        .when(pl.col("ratio") > sig.limits.phase_inflation)
        .then(pl.lit("INFLATED"))
        .otherwise(pl.lit(""))
    )


def _phase_table(sig: Signals) -> PhaseTable | None:
    steps = sig.phases["step"].unique().sort()
    if steps.len() < sig.size:
        return None
    first, last = steps.head(sig.size), steps.tail(sig.size)
    table = _window_medians(sig.phases, first, "first").join(
        _window_medians(sig.phases, last, "last"), on="phase", how="full", coalesce=True
    )
    step_last = table.filter(pl.col("phase") == STEP_PHASE)["last_s"]
    step_s = _as_float(step_last[0]) if step_last.len() else None
    ratio = pl.when(pl.col("first_s") > 0).then(pl.col("last_s") / pl.col("first_s"))
    rows = (
        table.with_columns(ratio.alias("ratio"))
        .with_columns(_phase_note(sig, step_s).alias("note"))
        .with_columns(pl.col("note").is_in(["", "INFLATED"]).alias("judged"))
    )
    return PhaseTable(
        rows=rows.sort(["ratio", "phase"], descending=[True, False], nulls_last=True),
        first_steps=(int(first[0]), int(first[-1])),
        last_steps=(int(last[0]), int(last[-1])),
    )


def _phase_quotes(sig: Signals, phase: str, table: PhaseTable) -> tuple[Quote, ...]:
    rows = sig.phases.filter(pl.col("phase") == phase)
    first = rows.filter(pl.col("step") <= table.first_steps[1]).head(1)
    newest = rows.filter(pl.col("step") >= table.last_steps[0]).tail(1)
    return tuple(
        _row_quote(row, f"step {row['step']} {phase} {row['seconds']:.2f} s")
        for part in (first, newest)
        for row in part.iter_rows(named=True)
    )


def _phase_inflation(sig: Signals, table: PhaseTable | None) -> Finding | None:
    """The most inflated judged phase, when its ratio exceeds PHASE_INFLATION."""
    if table is None:
        return None
    limit = sig.limits.phase_inflation
    inflated = table.rows.filter(pl.col("judged") & (pl.col("ratio") > limit))
    if inflated.is_empty():
        return None
    row = inflated.row(0, named=True)
    phase = str(row["phase"])
    return Finding(
        summary=f"phase {phase} inflated {row['ratio']:.1f}×: median {_num(row['first_s'])} s in "
        f"steps {table.first_steps[0]}–{table.first_steps[1]} → {_num(row['last_s'])} s in steps "
        f"{table.last_steps[0]}–{table.last_steps[1]} (limit {_num(limit)}×)",
        mechanism=f"pipeline bubble: {phase} inflating step over step",
        evidence=_phase_quotes(sig, phase, table),
        next_action=f"attribute the {phase} bubble (engine saturation, weight-sync size, "
        "storage, a starved generation buffer) before any action; not a kill by itself",
        flip_signal=f"{phase} last-window median back under {_num(limit * row['first_s'])} s "
        f"({_num(limit)}× its first-window median)",
    )


# --- tables --------------------------------------------------------------------------------------


def _tis_cell(row: dict[str, Any]) -> str:
    return " / ".join(_num(row[name]) for name in ("tis_ratio", "tis_log_abs", "tis_exact"))


def _window_lines(sig: Signals) -> list[str]:
    """The metric window: the last W steps, one fixed-width row per step."""
    window = sig.window
    if window.is_empty():
        return []
    used = ", ".join(
        f"{name}={key}" for name in TABLE_KEYS if (key := sig.keys.get(name)) is not None
    )
    lines = [
        f"window: last {window.height} of {sig.steps} steps ({window['step'][0]}–"
        f"{window['step'][-1]}); keys: {used or 'none'}",
        f"{'step':>6} | {'reward':>9} | {'entropy':>9} | {'TIS ratio / |log r| / exact':>27} | "
        f"{'grad norm':>10} | {'step s':>8}",
    ]
    lines += [
        f"{row['step']:>6} | {_num(row['reward']):>9} | {_num(row['entropy']):>9} | "
        f"{_tis_cell(row):>27} | {_num(row['grad_norm']):>10} | {_num(row['step_s']):>8}"
        for row in window.iter_rows(named=True)
    ]
    return lines


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


def _phase_lines(table: PhaseTable | None, sig: Signals) -> list[str]:
    """The phase table: first- and last-window medians per phase, most inflated first."""
    if table is None:
        count = sig.phases["step"].n_unique()
        return [f"phases: {count} step(s) with phase times < window of {sig.size}: not compared"]
    first, last = table.first_steps, table.last_steps
    lines = [
        f"phases: first window steps {first[0]}–{first[1]}, last window steps {last[0]}–{last[1]}",
        f"{'phase':<32} | {'first-window median s':>21} | {'last-window median s':>20} | "
        f"{'ratio':>7} |",
    ]
    lines += [
        f"{row['phase']:<32} | {_num(row['first_s']):>21} | {_num(row['last_s']):>20} | "
        f"{_ratio(row['ratio']):>7} | {row['note']}".rstrip()
        for row in table.rows.iter_rows(named=True)
    ]
    return lines


def _details(sig: Signals, table: PhaseTable | None, notes: Sequence[str] = ()) -> tuple[str, ...]:
    return (*notes, *_window_lines(sig), *_phase_lines(table, sig))


# --- outcomes ------------------------------------------------------------------------------------


def _fail(findings: Sequence[Finding], details: tuple[str, ...]) -> GateResult:
    primary, others = findings[0], findings[1:]
    extra = tuple(q for f in others for q in f.evidence[:1])
    also = tuple(f"also FAIL: {f.summary}" for f in others)
    suffix = f" (+{len(others)} more finding(s))" if others else ""
    return GateResult(
        status=GateStatus.FAIL,
        summary=primary.summary + suffix,
        evidence=primary.evidence + extra,
        details=also + details,
        hard_failure=primary.hard,
        learning_quality=primary.learning_quality,
        mechanism=primary.mechanism,
        next_action=primary.next_action,
        flip_signal=primary.flip_signal,
        handoff=primary.handoff or next((f.handoff for f in others if f.handoff), None),
    )


def _reward_summary(sig: Signals, trend: RewardTrend | None) -> tuple[str, str]:
    """(summary, flip signal) of a PASS, from the reward trend."""
    if trend is None:
        return (
            "no reward series: entropy/loss judged only",
            "a reward key appears, or NaN/inf in loss or grad norm",
        )
    ratio = sig.limits.collapse_ratio
    flip = (
        f"{trend.key} under {_num(trend.line)} ({ratio:.0%} of best window "
        f"{_num(trend.best_mean)}) for a {sig.size}-step window without recovering, "
        "or NaN/inf in loss or grad norm"
    )
    if trend.below_since is not None and trend.below_steps >= sig.size:
        return (
            f"{trend.key} below {_num(trend.line)} since step {trend.below_since} but "
            f"recovering (trend reaches {_num(trend.projected)} within {sig.size} steps); "
            "not a kill condition",
            flip,
        )
    if trend.improving:
        return (
            f"{trend.key} improving: first-window mean {_num(trend.first_mean)} → last-window mean "
            f"{_num(trend.last_mean)}",
            flip,
        )
    return (
        f"plateau at {_num(trend.last_mean)} ({trend.key}; best window {_num(trend.best_mean)}); "
        "a plateau alone is not a kill condition",
        flip,
    )


def _pass(sig: Signals, trend: RewardTrend | None, details: tuple[str, ...]) -> GateResult:
    summary, flip = _reward_summary(sig, trend)
    missing = () if sig.has("reward") else ("reward series",)
    return passed(
        f"{sig.steps} steps, window {sig.size}: {summary}",
        details=details,
        missing=missing,
        flip_signal=flip,
        next_action="none from dynamics",
    )


def _short_anomalies(sig: Signals) -> list[Finding]:
    """Soft anomalies visible on a run shorter than the window."""
    checks: tuple[Callable[[Signals], Finding | None], ...] = (_all_zero, _tis)
    return [found for check in checks if (found := check(sig)) is not None]


def _short_run(sig: Signals, details: tuple[str, ...]) -> GateResult:
    """Fewer steps than the window: PASS without a judgement, or ERROR when an anomaly shows."""
    prefix = f"{sig.steps} steps < window of {sig.size}"
    flip = f"the run reaches {sig.size} steps with metrics (a full window)"
    anomalies = _short_anomalies(sig)
    if not anomalies:
        return passed(f"{prefix}: no learning-quality judgement", details=details, flip_signal=flip)
    return error(
        f"{prefix} and already anomalous, too few steps to judge: {anomalies[0].summary}",
        missing=(f"a full window of {sig.size} steps",),
        evidence=tuple(q for f in anomalies for q in f.evidence),
        details=details,
        next_action="wait for a full window, then re-diagnose",
        flip_signal=flip,
    )


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


def _complete(
    done: tuple[int, int], findings: Sequence[Finding], details: tuple[str, ...]
) -> GateResult:
    newest, total = done
    past = " (resumed past the end)" if newest > total else ""
    noted = tuple(f"noted (run complete, not judged): {f.summary}" for f in findings)
    return passed(
        f"run complete: step {newest} reached max_steps {total}{past}; dynamics decide nothing "
        "for a finished run",
        details=noted + details,
        next_action="none from dynamics: the run is complete",
        flip_signal=f"a step past {newest} without a new max_steps (the run is not finished)",
    )


def _judge(sig: Signals) -> GateResult:
    table = _phase_table(sig)
    notes = [note for note in (_earlier_non_finite_note(sig),) if note is not None]
    details = _details(sig, table, notes)
    hard = [f for f in (_non_finite(sig), _router_replay(sig)) if f is not None]
    done = _completion(sig)
    if done is None and hard:
        return _fail(hard, details)
    if done is None and sig.short:
        return _short_run(sig, details)
    trend = _reward_trend(sig)
    soft = (
        _all_zero(sig),
        _tis(sig),
        _collapse(sig, trend),
        _entropy_collapse(sig, trend),
        _phase_inflation(sig, table),
    )
    findings = hard + [f for f in soft if f is not None] if not sig.short else hard
    if done is not None:
        return _complete(done, findings, details)
    return _fail(findings, details) if findings else _pass(sig, trend, details)


# --- errors and the entry point ------------------------------------------------------------------


def _log_source(logs: LogTables | None) -> str:
    files = logs.summary.files if logs is not None else ()
    return files[0] if files else "finelog.log"


def _malformed_quotes(logs: LogTables) -> tuple[Quote, ...]:
    """The parser's malformed examples ("source:line: text") as quotes."""
    quotes = []
    for example in logs.summary.malformed_examples[:2]:
        source, line, text = [*example.split(":", 2), "", ""][:3]
        number = int(line) if line.strip().isdigit() else None
        quotes.append(quote(source or _log_source(logs), text or example, line=number))
    return tuple(quotes)


def _no_usable_metrics(logs: LogTables) -> GateResult:
    """ERROR: a parser that returns no usable metrics is a failed probe; show what the log is."""
    summary, source = logs.summary, _log_source(logs)
    keys = sorted(present_keys(logs.metrics))
    head = log_head_quotes(logs, limit=5)
    evidence = (
        head
        + _malformed_quotes(logs)
        + tuple(
            _row_quote(r, f"step {r['step']} {r['key']}={_num(_as_float(r['value']))}")
            for r in logs.metrics.head(1).iter_rows(named=True)
        )
    )
    begins = (
        f"; log begins {summary.head[0][:80]!r}" if summary.head else "; no non-empty line read"
    )
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
        details=tuple(f"head: {line}" for line in summary.head[:10]),
        next_action="inspect the log serialization (the metric parse is a failed probe) before "
        "classifying dynamics",
        flip_signal="the parser reads reward, entropy or loss from the log",
    )


def _no_log(evidence: Evidence) -> GateResult:
    status = evidence.bundle.statuses.get("finelog")
    raw = status.raw if status is not None else None
    return error(
        "no trainer log: no metrics to judge dynamics from",
        missing=("trainer log",),
        evidence=(quote("manifest.json", f"artifacts.finelog: {raw or '(missing)'}"),),
        next_action="sync the job's finelog (watcher refresh), then re-diagnose",
        flip_signal="a trainer log with reward, entropy or loss metrics",
    )


def _initializing(init: Initialization) -> GateResult:
    return passed(
        f"initializing since {init.since.isoformat()}: no step finished yet, no window yet",
        initializing=True,
        flip_signal=f"no finished step by {init.deadline.isoformat()} (liveness), or NaN/inf in "
        "the first window's loss or grad norm",
        next_action="none from dynamics until a window exists",
    )


def _stepped(logs: LogTables) -> bool:
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


def _no_step_yet(logs: LogTables) -> GateResult:
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


def _check(evidence: Evidence) -> GateResult:
    logs = evidence.logs
    if logs is None:
        return _no_log(evidence)
    init = initialization(evidence)
    if init is not None:
        return _initializing(init)
    if not _stepped(logs):
        return _no_step_yet(logs)
    sig = _signals(logs, evidence.thresholds)
    if not any(sig.has(name) for name in USABLE):
        return _no_usable_metrics(logs)
    return _judge(sig)


def check(evidence: Evidence) -> GateResult:
    """Judge the run's training dynamics; never raises (a fault becomes ERROR, quoted)."""
    try:
        return _check(evidence)
    except _POLARS_FAULTS as exc:
        fault = f"{type(exc).__name__}: {exc}"
        return error(
            f"dynamics could not be computed from this evidence: {fault}",
            evidence=(quote(_log_source(evidence.logs), fault),),
        )
