"""Hard dynamics failures: the training math diverged, the router replay is broken, or the reward
was never computed. Each one establishes a KILL on its own (with its proof rule)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl

from shared.models import Handoff, Quote
from worker.gates.dynamics.series import (
    Finding,
    Signals,
    as_float,
    metric_quote,
    num,
    row_quote,
    signal_quotes,
)
from worker.gates.rules import rule

__all__ = [
    "NON_FINITE_SIGNALS",
    "NonFinite",
    "all_zero",
    "non_finite",
    "non_finite_run",
    "pending_non_finite",
    "router_replay",
    "spike_note",
]

NON_FINITE_SIGNALS: Final = ("loss", "grad_norm", "reward", "entropy")

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


# --- non-finite values ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NonFinite:
    """The non-finite values of the run: every bad row, and the run of bad steps at the end."""

    rows: pl.DataFrame  # METRICS rows with NaN/inf in a NON_FINITE_SIGNALS key, by step
    trailing: int  # consecutive newest steps that carry one
    first_trailing: int | None  # the first step of that run


def _non_finite_rows(sig: Signals) -> pl.DataFrame:
    keys = [k for name in NON_FINITE_SIGNALS if (k := sig.keys.get(name)) is not None]
    bad = pl.col("value").is_nan() | pl.col("value").is_infinite()
    return sig.metrics.filter(pl.col("key").is_in(keys) & bad).sort(["step", "line"])


def non_finite_run(sig: Signals) -> NonFinite:
    """The non-finite rows and how many of the newest steps in a row carry one."""
    rows = _non_finite_rows(sig)
    bad_steps = set(rows["step"].to_list())
    steps = sig.series["step"].to_list()
    trailing = 0
    for step in reversed(steps):
        if step not in bad_steps:
            break
        trailing += 1
    first = steps[-trailing] if trailing else None
    return NonFinite(rows, trailing, first)


def _value_quote(row: dict[str, object]) -> Quote:
    return row_quote(row, f"step {row['step']} {row['key']}={num(as_float(row['value']))}")


@rule("dynamics.hard")
def non_finite(sig: Signals, found: NonFinite) -> Finding | None:
    """NaN or inf in loss, grad norm, reward or entropy on each of the newest
    NON_FINITE_PERSIST_STEPS steps: the weights are NaN and every later step will be too. One spike
    followed by finite steps is a skipped update or a bad batch, noted but not failed."""
    persist = sig.limits.non_finite_persist_steps
    if found.trailing < persist or found.first_trailing is None:
        return None
    rows = found.rows.filter(pl.col("step") >= found.first_trailing)
    first, newest = rows.row(0, named=True), rows.row(-1, named=True)
    key, step = str(first["key"]), int(first["step"])
    keys = ", ".join(sorted(set(rows["key"].to_list())))
    return Finding(
        summary=f"non-finite {key} from step {step}: NaN/inf in {keys} on each of the newest "
        f"{found.trailing} steps through step {newest['step']} "
        f"(NON_FINITE_PERSIST_STEPS {persist})",
        mechanism=f"non-finite {key} from step {step}, persisting through the newest step: the "
        "training math diverged (NaN/inf)",
        evidence=(_value_quote(first),)
        if first == newest
        else tuple(_value_quote(r) for r in (first, newest)),
        next_action=f"KILL: the run is training on NaN/inf; find the divergence (learning rate, "
        f"loss scale, a bad batch) before relaunching from a checkpoint before step {step}",
        flip_signal=f"every value of {keys} finite on a step after {newest['step']}",
        hard=True,
        rule="non_finite",
        kind="divergence",
        established_at=newest["timestamp"],
    )


def spike_note(sig: Signals, found: NonFinite) -> str | None:
    """A note on non-finite values that finite steps followed (or not yet persisting)."""
    if found.rows.is_empty():
        return None
    row = found.rows.row(-1, named=True)
    if found.trailing:
        return (
            f"note: non-finite {row['key']} at the newest {found.trailing} step(s) "
            f"({row['source']}:{row['line']}), fewer than NON_FINITE_PERSIST_STEPS "
            f"{sig.limits.non_finite_persist_steps}"
        )
    return (
        f"note: non-finite {row['key']} last at step {row['step']} "
        f"({row['source']}:{row['line']}); finite steps since (a spike, not divergence)"
    )


@rule("dynamics.hard")
def pending_non_finite(sig: Signals, found: NonFinite) -> Finding | None:
    """NaN or inf on the newest steps but not yet on NON_FINITE_PERSIST_STEPS of them: a warning
    the gate cannot call either way yet (the next steps tell a spike from divergence)."""
    if not found.trailing or found.trailing >= sig.limits.non_finite_persist_steps:
        return None
    rows = found.rows.filter(pl.col("step") >= (found.first_trailing or 0))
    row = rows.row(-1, named=True)
    return Finding(
        summary=f"non-finite {row['key']} on the newest {found.trailing} step(s), fewer than "
        f"NON_FINITE_PERSIST_STEPS {sig.limits.non_finite_persist_steps}: too few to tell a "
        "spike from divergence",
        mechanism="non-finite values at the newest steps, not yet persistent",
        evidence=(_value_quote(row),),
        next_action="re-diagnose after the next steps: finite values mean a spike, persisting "
        "NaN/inf mean divergence",
        flip_signal=f"a finite step (spike) or NaN/inf on "
        f"{sig.limits.non_finite_persist_steps} newest steps (divergence)",
    )


# --- broken router replay ------------------------------------------------------------------------


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


@rule("dynamics.hard")
def router_replay(sig: Signals) -> Finding | None:
    """On every step of the window the max log-ratio reaches ROUTER_REPLAY_LOG_RATIO_MAX together
    with policy loss and grad norm at their broken-replay levels: the updates are driven by a
    routing mismatch, not by the reward."""
    mask = _router_replay_mask(sig)
    window = sig.window
    if mask is None or window.is_empty() or not window.select(mask.all()).item():
        return None
    first, newest = int(window["step"][0]), int(window["step"][-1])
    evidence = tuple(
        q for name in ("shift_max", "loss", "grad_norm") for q in signal_quotes(sig, name, [newest])
    ) + signal_quotes(sig, "shift_max", [first])
    row = window.row(-1, named=True)
    values = f"max log-ratio {num(row['shift_max'])}, loss {num(row['loss'])}, " + (
        f"grad norm {num(row['grad_norm'])}"
    )
    handoff = Handoff(
        evidence=evidence,
        test=f"a short MoE run with router replay on keeps {sig.key('shift_max')} under "
        f"{num(sig.limits.router_replay_log_ratio_max)}, policy loss under "
        f"{num(sig.limits.router_replay_policy_loss)} and grad norm under "
        f"{num(sig.limits.router_replay_grad_norm)} on every step",
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
        f"{num(sig.limits.router_replay_log_ratio_max)} with policy loss and grad norm at "
        "ordinary levels on a window of steps",
        hard=True,
        handoff=handoff,
        rule="router_replay",
        kind="router_replay",
        established_at=sig.stamp("shift_max", newest),
    )


# --- rewards never computed ----------------------------------------------------------------------


def _generation_quotes(sig: Signals, step: int) -> tuple[Quote, ...]:
    """Generation failures logged at `step`, the likeliest why of an all-zero reward."""
    failed = sig.series.filter((pl.col("step") == step) & (pl.col("gen_failed") > 0))
    quotes = signal_quotes(sig, "gen_failed", [step]) if not failed.is_empty() else ()
    errors = (metric_quote(sig, key, step) for key in sig.keys.generation_errors)
    return quotes + tuple(q for q in errors if q is not None)


@rule("dynamics.hard")
def all_zero(sig: Signals) -> Finding | None:
    """Every reward logged from the first recorded step on is exactly 0: an infrastructure
    fingerprint (rewards never computed), not a bad model — every gradient step trained on
    nothing. Judged only once a full window of steps exists."""
    reward = sig.series.select("step", "reward").drop_nulls()
    if reward.is_empty() or not reward.select((pl.col("reward") == 0).all()).item():
        return None
    key = sig.key("reward")
    first, newest = int(reward["step"][0]), int(reward["step"][-1])
    evidence = signal_quotes(sig, "reward", [first, newest]) + _generation_quotes(sig, newest)
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
        rule="zero_reward",
        kind="zero_reward",
        established_at=sig.stamp("reward", newest),
    )
