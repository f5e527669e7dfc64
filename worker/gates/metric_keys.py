"""Canonical metric keys: which logged key stands for each training signal.

SkyRL renamed its metrics over time and different serializations prefix them differently, so each
signal has an ordered list of candidate keys (docs/domain.md#metric-keys). The rule is *first
present wins*: the first candidate with at least one non-null value in the run's stitched metrics
names the signal for the whole run. The choice is made per run, not per step, so one series never
mixes two differently scaled keys (`reward/avg_raw_reward` and `loss/avg_final_rewards` are not the
same number).

Pure data and two small functions; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Final

import polars as pl

__all__ = [
    "BENIGN",
    "CANDIDATES",
    "ENTROPY",
    "GENERATION_AVG_TOKENS",
    "GENERATION_AVG_TURNS",
    "GENERATION_ERROR_PREFIX",
    "GENERATION_FAILED",
    "GENERATION_MAX_TOKENS",
    "GENERATION_MIN_TOKENS",
    "GRAD_NORM",
    "LOSS",
    "PASS_AT_K",
    "PHASE_PREFIX",
    "REWARD",
    "STEP",
    "STEP_PHASE",
    "TIS_CAPPED_FRACTION",
    "TIS_EXACT_MATCH",
    "TIS_LCS_FALLBACK",
    "TIS_LOG_RATIO_ABS_MEAN",
    "TIS_RATIO_MEAN",
    "TOKEN_SHIFT_MAX",
    "TOKEN_SHIFT_MEAN",
    "TOKEN_SHIFT_P99",
    "WEIGHT_SYNC_PHASE",
    "ResolvedKeys",
    "first_present",
    "pass_at_k_key",
    "present_keys",
    "resolve",
]

REWARD: Final = ("reward/avg_raw_reward", "loss/avg_final_rewards")
PASS_AT_K: Final = re.compile(r"^reward/avg_pass_at_(\d+)$")
ENTROPY: Final = ("policy/policy_entropy", "policy_entropy")
LOSS: Final = ("policy/policy_loss", "policy_loss")
GRAD_NORM: Final = ("policy/raw_grad_norm", "policy/grad_norm", "grad_norm")

# Truncated importance sampling: the older `tis/` family first, newer SkyRL's
# `policy/loss_metrics/` family after it (a run logs one family or the other).
TIS_RATIO_MEAN: Final = (
    "policy/tis/imp_ratio_mean",
    "tis/imp_ratio_mean",
    "policy/loss_metrics/is_ratio_mean",
)
TIS_CAPPED_FRACTION: Final = (
    "policy/tis/imp_ratio_capped_fraction",
    "tis/imp_ratio_capped_fraction",
    "policy/loss_metrics/tis_token_clip_high_ratio",
)
TIS_LOG_RATIO_ABS_MEAN: Final = ("policy/tis/log_ratio_abs_mean", "tis/log_ratio_abs_mean")
TIS_EXACT_MATCH: Final = ("generate/tis/exact_match_fraction",)
TIS_LCS_FALLBACK: Final = ("generate/tis/lcs_fallback_fraction",)

# Token shift between the rollout's and the trainer's log-probabilities.
TOKEN_SHIFT_MEAN: Final = ("policy/log_ratio_abs_mean",)
TOKEN_SHIFT_P99: Final = ("policy/log_ratio_abs_p99",)
TOKEN_SHIFT_MAX: Final = ("policy/log_ratio_abs_max",)

GENERATION_AVG_TOKENS: Final = ("generate/avg_num_tokens",)
GENERATION_MIN_TOKENS: Final = ("generate/min_num_tokens",)
GENERATION_MAX_TOKENS: Final = ("generate/max_num_tokens",)
GENERATION_AVG_TURNS: Final = ("generate/avg_num_turns",)
GENERATION_FAILED: Final = ("generate/num_failed_trajectories",)
GENERATION_ERROR_PREFIX: Final = "generate/errors/"

STEP: Final = ("trainer/global_step",)
PHASE_PREFIX: Final = "timing/"
STEP_PHASE: Final = "step"
WEIGHT_SYNC_PHASE: Final = "sync_weights"

# Logged, known, and never judged: a huge value here is noise (docs/domain.md#metric-keys).
BENIGN: Final = ("policy/rollout_train_prob_diff_mean",)

CANDIDATES: Final[Mapping[str, tuple[str, ...]]] = {
    "reward": REWARD,
    "entropy": ENTROPY,
    "loss": LOSS,
    "grad_norm": GRAD_NORM,
    "tis_ratio": TIS_RATIO_MEAN,
    "tis_capped": TIS_CAPPED_FRACTION,
    "tis_log_abs": TIS_LOG_RATIO_ABS_MEAN,
    "tis_exact": TIS_EXACT_MATCH,
    "tis_lcs_fallback": TIS_LCS_FALLBACK,
    "shift_mean": TOKEN_SHIFT_MEAN,
    "shift_p99": TOKEN_SHIFT_P99,
    "shift_max": TOKEN_SHIFT_MAX,
    "gen_avg_tokens": GENERATION_AVG_TOKENS,
    "gen_failed": GENERATION_FAILED,
}
"""Canonical signal name -> its candidate keys, most preferred first."""


@dataclass(frozen=True)
class ResolvedKeys:
    """The logged key chosen for each canonical signal of one run (absent signals are left out)."""

    by_signal: Mapping[str, str] = field(default_factory=dict)
    generation_errors: tuple[str, ...] = ()
    phases: tuple[str, ...] = ()  # `timing/<phase>` keys

    def get(self, signal: str) -> str | None:
        """The key chosen for `signal` (a key of CANDIDATES or `pass_at_k`), or None."""
        return self.by_signal.get(signal)


def present_keys(metrics: pl.DataFrame) -> frozenset[str]:
    """Keys with at least one non-null value in a long METRICS frame (NaN counts as present)."""
    if metrics.is_empty():
        return frozenset()
    keys = metrics.filter(pl.col("value").is_not_null())["key"].unique()
    return frozenset(str(k) for k in keys.to_list())


def first_present(candidates: tuple[str, ...], present: Collection[str]) -> str | None:
    """The first candidate key that is present, or None."""
    return next((key for key in candidates if key in present), None)


def pass_at_k_key(present: Collection[str]) -> str | None:
    """The present `reward/avg_pass_at_<k>` key with the smallest k, or None."""
    found = [(int(m.group(1)), key) for key in present if (m := PASS_AT_K.match(key))]
    return min(found)[1] if found else None


def resolve(present: Collection[str]) -> ResolvedKeys:
    """Resolve every canonical signal against the keys present in a run."""
    chosen = {name: first_present(keys, present) for name, keys in CANDIDATES.items()}
    chosen["pass_at_k"] = pass_at_k_key(present)
    return ResolvedKeys(
        by_signal={name: key for name, key in chosen.items() if key is not None},
        generation_errors=tuple(
            sorted(k for k in present if k.startswith(GENERATION_ERROR_PREFIX))
        ),
        phases=tuple(sorted(k for k in present if k.startswith(PHASE_PREFIX))),
    )
