"""Rollouts gate: are the rollouts the trainer learns from real? Mode-specific.

Agentic mode reads the finished rows of the TRIALS table (rewards, exception types and messages,
turns; a trial's quote source is its result file) and, for agreement, the trainer's BATCHES lines
and reward metrics. Exceptions are grouped by Harbor's causes: `sandbox` (environment start, sandbox
build, agent setup, test or verifier upload, any `Daytona*`; terminal-bench
`agent_installation_failed`), `agent budget` (agent timeout, context or output length; the reward
stays valid; terminal-bench `agent_timeout`, `context_length_exceeded`, `output_length_exceeded`),
`verifier` (verifier timeout, reward file missing or empty, output parse; terminal-bench
`test_timeout`, `parse_error`), `agent error` (other terminal-bench agent failures) and `other`.

- FAIL — at least `SAME_CAUSE_SHARE` of finished trials fail with one systemic cause (sandbox or
  verifier), with a handoff naming the component (a Daytona quota or limit message names the
  organisation's quota); hard failure when, in addition, every finished reward is null or zero and
  the trainer agrees (every BATCHES line failed or masked, or every reward metric 0).
- FAIL (hard) — median turns of trials that reached the agent at or under `ONE_TURN_MEDIAN` over at
  least `MIN_WINDOW_STEPS` trials (dead engine or broken agent loop: every episode is broken).
- FAIL — every finished reward null or zero, with the trainer agreeing or silent.
- ERROR — the trainer's rewards are positive while every trial scored zero (sources disagree); a
  warning sign above seen on fewer than `MIN_WINDOW_STEPS` finished trials (too few to call); no
  trials directory or no finished trial (missing "trial outputs"), unless initialising.
- PASS — otherwise; occasional agent-budget exceptions are named as benign noise.

Standard mode reads the stitched METRICS (reward `reward/avg_raw_reward`, `loss/avg_final_rewards`,
pass@k; `generate/{avg,max}_num_tokens`) and ERRORS (`verifier_error`, tracebacks naming a reward or
verifier) of the newest attempt; it needs no trial artifacts.

- FAIL (not learning quality; a handoff) — over the newest `MIN_WINDOW_STEPS` steps every step's
  average response length equals the maximum (every response truncated at the cap).
- FAIL (learning quality) — the window's median average response length fell under
  `COLLAPSE_RATIO` of the earlier steps' median (or to 0).
- FAIL — the reward is zero or null at every one of at least `MIN_WINDOW_STEPS` steps.
- ERROR — no reward metric at all (quoting what the log looks like), unless initialising.
- PASS — otherwise, naming verifier exceptions in the trainer log when there are any.

Undeclared mode (no entrypoint and no explicit mode) is ERROR with missing "declared mode".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import polars as pl

from shared.models import GateResult, GateStatus, Handoff, Mode, Quote
from worker.evidence.model import Evidence, LogTables
from worker.evidence.quotes import log_head_quotes, quote, quote_rows
from worker.gates import metric_keys as mk
from worker.gates.base import error, passed
from worker.gates.progress import initialization, newest_attempt

__all__ = ["CAUSES", "SANDBOX", "cause_expr", "cause_of", "check", "undeclared"]

SANDBOX: Final = "sandbox"
BUDGET: Final = "agent budget"
VERIFIER: Final = "verifier"
AGENT_ERROR: Final = "agent error"
OTHER: Final = "other"
SYSTEMIC: Final = (SANDBOX, VERIFIER)

CAUSES: Final[dict[str, str]] = {
    "EnvironmentStartTimeoutError": SANDBOX,
    "SandboxBuildFailedError": SANDBOX,
    "AgentSetupTimeoutError": SANDBOX,
    "AddTestsDirError": SANDBOX,
    "DownloadVerifierDirError": SANDBOX,
    "agent_installation_failed": SANDBOX,
    "AgentTimeoutError": BUDGET,
    "ContextLengthExceededError": BUDGET,
    "OutputLengthExceededError": BUDGET,
    "agent_timeout": BUDGET,
    "context_length_exceeded": BUDGET,
    "output_length_exceeded": BUDGET,
    "VerifierTimeoutError": VERIFIER,
    "RewardFileNotFoundError": VERIFIER,
    "RewardFileEmptyError": VERIFIER,
    "VerifierOutputParseError": VERIFIER,
    "test_timeout": VERIFIER,
    "parse_error": VERIFIER,
    "unknown_agent_error": AGENT_ERROR,
    "fatal_llm_parse_error": AGENT_ERROR,
    "unknown": AGENT_ERROR,
}
"""Harbor exception types and terminal-bench failure modes -> cause (DOMAIN.md section 4)."""

TRUNCATION_TOLERANCE = 1e-6
"""Relative gap under which an average response length equals the maximum."""

_QUOTA = re.compile(r"quota|limit exceeded|maximum allowed", re.I)
_VERIFIER_TRACE = re.compile(r"reward|verifier", re.I)


def check(evidence: Evidence) -> GateResult:
    """Judge the rollouts of the declared mode as of `evidence.now`."""
    mode = evidence.mode.mode
    if mode is Mode.UNDECLARED:
        return undeclared("rollouts", evidence)
    if mode is Mode.AGENTIC:
        return _agentic(evidence)
    return _standard(evidence)


def undeclared(gate: str, evidence: Evidence) -> GateResult:
    """The ERROR a mode-specific gate returns when the mode was never declared."""
    return error(
        f"{gate} not judged: mode undeclared (no entrypoint and no explicit mode)",
        missing=("declared mode",),
        evidence=(
            quote("manifest.json", f"job.entrypoint: {evidence.bundle.entrypoint or 'absent'}"),
        ),
    )


def cause_of(exception_type: str | None) -> str | None:
    """The cause of one exception type (None for a clean trial)."""
    if not exception_type:
        return None
    if exception_type.startswith("Daytona"):
        return SANDBOX
    return CAUSES.get(exception_type, OTHER)


# --- agentic ------------------------------------------------------------------------------------


def cause_expr() -> pl.Expr:
    """`cause_of` as a polars expression over the `exception_type` column."""
    return (
        pl.when(pl.col("exception_type").is_null() | (pl.col("exception_type") == ""))
        .then(None)
        .when(pl.col("exception_type").str.starts_with("Daytona"))
        .then(pl.lit(SANDBOX))
        .otherwise(pl.col("exception_type").replace_strict(CAUSES, default=OTHER))
    )


def _with_cause(trials: pl.DataFrame) -> pl.DataFrame:
    cause = cause_expr()
    outcome = pl.format(
        "reward {}, turns {}",
        pl.col("reward").cast(pl.String()).fill_null("null"),
        pl.col("n_turns").cast(pl.String()).fill_null("?"),
    )
    failure = pl.format(
        "{}: {} ({})", "exception_type", pl.col("exception_message").fill_null(""), outcome
    )
    text = pl.when(pl.col("exception_type").is_null()).then(outcome).otherwise(failure)
    return trials.with_columns(cause=cause, _text=text, timestamp=pl.col("finished_at"))


def _trial_quotes(rows: pl.DataFrame, limit: int = 3) -> tuple[Quote, ...]:
    newest_first = rows.sort("finished_at", descending=True, nulls_last=True)
    return quote_rows(newest_first, text_column="_text", limit=limit)


def _no_trials(evidence: Evidence) -> GateResult:
    if initialization(evidence) is not None:
        return passed(
            "initialising: no step finished yet; no finished trial yet", initializing=True
        )
    table = evidence.trials
    where = table.directory if table is not None and table.directory else "trace_jobs/"
    status = evidence.bundle.statuses.get("traces")
    traces = status.raw if status is not None and status.raw else "missing"
    quotes = [quote("manifest.json", f"artifacts.traces: {traces}")]
    if table is not None:
        running = table.trials.filter(pl.col("status") != "finished").height
        quotes.append(quote(where, f"{running} trial(s) without a result file"))
        quotes += [quote(where, text) for text in table.unreadable[:2]]
    return error(
        f"agentic run with no finished trial in {where}: rewards and exceptions cannot be read",
        missing=("trial outputs",),
        evidence=tuple(quotes),
    )


def _agentic(evidence: Evidence) -> GateResult:
    table = evidence.trials
    trials = table.trials if table is not None else pl.DataFrame()
    finished = trials.filter(pl.col("status") == "finished") if not trials.is_empty() else trials
    if finished.is_empty():
        return _no_trials(evidence)
    finished = _with_cause(finished)
    for finding in (_systemic, _one_turn, _zero_rewards):
        result = finding(evidence, finished)
        if result is not None:
            return result
    return _healthy_trials(finished, trials.height - finished.height)


@dataclass(frozen=True)
class TrainerRewards:
    """The trainer's side of the reward story: True all zero, False positive, None unknown."""

    all_zero: bool | None
    quotes: tuple[Quote, ...] = ()


def _batch_quotes(batches: pl.DataFrame) -> tuple[Quote, ...]:
    texted = batches.with_columns(
        _text=pl.format(
            "Exception breakdown: {}; Batch generation complete: {}/{} successful, {} failed, "
            "{} masked",
            "exceptions",
            "successful",
            "total",
            "failed",
            "masked",
        )
    )
    return quote_rows(texted.tail(2), text_column="_text")


def trainer_rewards(logs: LogTables | None, steps: int) -> TrainerRewards:
    """Whether the trainer trains on zeros: batch lines first, then the reward metric."""
    if logs is None:
        return TrainerRewards(None)
    batches = logs.batches.filter(pl.col("attempt") == newest_attempt(logs)).sort("line")
    if not batches.is_empty():
        newest = batches.tail(steps)
        zero = bool((newest["successful"].fill_null(0) == 0).all())
        if zero:
            return TrainerRewards(True, _batch_quotes(newest))
    rewards = _reward_rows(logs).tail(steps)
    if rewards.is_empty():
        return TrainerRewards(None)
    zero = bool((rewards["value"].fill_nan(None).fill_null(0.0) == 0).all())
    return TrainerRewards(zero, _metric_quotes(rewards))


def _systemic(evidence: Evidence, finished: pl.DataFrame) -> GateResult | None:
    t = evidence.thresholds
    counts = finished.filter(pl.col("cause").is_in(SYSTEMIC)).group_by("cause").len()
    top = counts.sort("len").tail(1)
    if top.is_empty() or top["len"][0] / finished.height < t.same_cause_share:
        return None
    cause = str(top["cause"][0])
    failing = finished.filter(pl.col("cause") == cause)
    if finished.height < t.min_window_steps:
        return _too_few(evidence, finished, f"{failing.height} failing with {cause} errors")
    return _systemic_fail(evidence, finished, failing, cause)


def _systemic_fail(
    evidence: Evidence, finished: pl.DataFrame, failing: pl.DataFrame, cause: str
) -> GateResult:
    types = failing.group_by("exception_type").len().sort("len", descending=True)
    top_type = str(types["exception_type"][0])
    example = failing.filter(pl.col("exception_type") == top_type)
    rewards_zero = bool((finished["reward"].fill_nan(None).fill_null(0.0) == 0).all())
    trainer = trainer_rewards(evidence.logs, evidence.thresholds.min_window_steps)
    quotes = _trial_quotes(example) + trainer.quotes
    share = failing.height / finished.height
    summary = (
        f"{failing.height}/{finished.height} finished trials ({share:.0%}) failed with {cause} "
        f"errors, mostly {top_type} ({int(types['len'][0])})"
        + ("; every reward null or zero" if rewards_zero else "")
        + ("; the trainer trains on zeros" if trainer.all_zero else "")
    )
    return GateResult(
        status=GateStatus.FAIL,
        summary=summary,
        evidence=quotes,
        details=_cause_table(finished),
        hard_failure=rewards_zero and trainer.all_zero is True,
        mechanism=f"systemic {cause} failure: {top_type} on nearly every trial",
        next_action=f"fix the {cause} side before any further training; the rewards are not real",
        flip_signal=f"finished trials without {top_type} reaching over "
        f"{1 - evidence.thresholds.same_cause_share:.0%} of the newest trials",
        handoff=_cause_handoff(cause, top_type, str(example["_text"][0]), quotes),
    )


def _cause_handoff(
    cause: str, exception_type: str, text: str, quotes: tuple[Quote, ...]
) -> Handoff:
    if cause == VERIFIER:
        return Handoff(
            evidence=quotes,
            likely_cause=f"the verifier fails on every trial ({exception_type})",
            component="task verifier / tests and the reward file they write",
            proposed_behavior="the verifier writes a parseable reward for every trial, and the "
            "generator stops the run when no trial yields a reward",
            test="a trial of the same task image produces a reward file the harness parses",
        )
    quota = exception_type == "DaytonaValidationError" or bool(_QUOTA.search(text))
    likely = (
        "the Daytona organisation is over its snapshot quota or CPU limit, so no sandbox starts"
        if quota
        else f"sandboxes never come up ({exception_type})"
    )
    return Handoff(
        evidence=quotes,
        likely_cause=likely,
        component="Daytona organisation quota (snapshots, CPU) used by the Harbor environment"
        if quota
        else "Harbor environment / Daytona sandbox creation",
        proposed_behavior="free or raise the quota, and make the generator fail fast when every "
        "sandbox creation is refused instead of training on zero rewards",
        test="a single trial in the same organisation starts its sandbox and writes a reward; "
        "a run whose every trial is refused stops before its first optimizer step",
    )


def _one_turn(evidence: Evidence, finished: pl.DataFrame) -> GateResult | None:
    t = evidence.thresholds
    agent = finished.filter(
        pl.col("n_turns").is_not_null() & (pl.col("cause") != SANDBOX).fill_null(value=True)
    )
    median = agent["n_turns"].median()
    if agent.is_empty() or not isinstance(median, (int, float)) or median > t.one_turn_median:
        return None
    if agent.height < t.min_window_steps:
        return _too_few(evidence, finished, f"median {median:g} turns over {agent.height} trials")
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"median {median:g} turns over {agent.height} trials that reached the agent "
        f"(limit {t.one_turn_median:g}): the agent loop stops after about one turn",
        evidence=_trial_quotes(agent.sort("n_turns")),
        details=_cause_table(finished),
        hard_failure=True,
        mechanism="about one turn per trial: dead inference engine or broken agent loop",
        next_action="Supervisor: kill the job (every episode ends after one turn, so it trains "
        "on broken rollouts); then check the engines and the agent's tool-call parsing",
        flip_signal=f"median turns of the newest trials above {t.one_turn_median:g}",
    )


def _zero_rewards(evidence: Evidence, finished: pl.DataFrame) -> GateResult | None:
    t = evidence.thresholds
    rewards = finished["reward"].fill_nan(None)
    if not bool((rewards.fill_null(0.0) == 0).all()):
        return None
    if finished.height < t.min_window_steps:
        return _too_few(evidence, finished, "every reward null or zero")
    trainer = trainer_rewards(evidence.logs, t.min_window_steps)
    nulls = rewards.null_count()
    what = f"all {finished.height} finished trials scored zero or no reward ({nulls} null)"
    quotes = _trial_quotes(finished) + trainer.quotes
    if trainer.all_zero is False:
        return error(
            f"{what}, but the trainer logs positive rewards: trials and trainer disagree",
            missing=("agreement between trial results and trainer rewards",),
            evidence=quotes,
        )
    agree = "the trainer agrees" if trainer.all_zero else "no trainer reward to compare"
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"{what}; {agree}",
        evidence=quotes,
        details=_cause_table(finished),
        mechanism="no trial earns a reward: the policy trains on zeros",
        next_action="open a few trials' verifier output to see why nothing passes",
        flip_signal="any finished trial with a reward above 0",
    )


def _too_few(evidence: Evidence, finished: pl.DataFrame, sign: str) -> GateResult:
    t = evidence.thresholds
    return error(
        f"only {finished.height} finished trials (< {t.min_window_steps}) with a warning sign "
        f"({sign}): too few to call",
        missing=(f"at least {t.min_window_steps} finished trials",),
        evidence=_trial_quotes(finished),
        details=_cause_table(finished),
    )


def _cause_table(finished: pl.DataFrame) -> tuple[str, ...]:
    grouped = (
        finished.filter(pl.col("cause").is_not_null())
        .group_by("cause", "exception_type")
        .len()
        .sort(["cause", "len"], descending=[False, True])
    )
    lines = [
        f"{cause} | {exc} | {n} ({n / finished.height:.0%})"
        for cause, exc, n in grouped.iter_rows()
    ]
    return ("cause | exception | trials", *lines) if lines else ()


def _healthy_trials(finished: pl.DataFrame, unfinished: int) -> GateResult:
    stats = finished.select(
        mean=pl.col("reward").fill_nan(None).mean(),
        nonzero=(pl.col("reward").fill_nan(None) > 0).mean(),
        nulls=pl.col("reward").fill_nan(None).null_count(),
        turns=pl.col("n_turns").median(),
        budget=(pl.col("cause") == BUDGET).sum(),
        failed=pl.col("cause").is_not_null().sum(),
    ).row(0, named=True)
    mean = "n/a" if stats["mean"] is None else f"{stats['mean']:.3f}"
    nonzero = stats["nonzero"] or 0.0
    turns = "n/a" if stats["turns"] is None else f"{stats['turns']:g}"
    summary = (
        f"{finished.height} finished trials ({unfinished} running): mean reward {mean}, "
        f"{nonzero:.0%} nonzero, {stats['nulls']} null; median turns {turns}; "
        f"{stats['failed']} with an exception"
    )
    if stats["budget"]:
        summary += f" ({stats['budget']} agent-budget: benign noise, rewards stay valid)"
    return passed(
        summary, evidence=_trial_quotes(finished, limit=2), details=_cause_table(finished)
    )


# --- standard -----------------------------------------------------------------------------------


def _reward_key(logs: LogTables) -> str | None:
    keys = mk.resolve(mk.present_keys(logs.metrics))
    return keys.get("reward") or keys.get("pass_at_k")


def _reward_rows(logs: LogTables) -> pl.DataFrame:
    key = _reward_key(logs)
    if key is None:
        return logs.metrics.clear()
    return logs.metrics.filter(pl.col("key") == key).sort("step")


def _metric_quotes(rows: pl.DataFrame, limit: int = 2) -> tuple[Quote, ...]:
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


def _standard(evidence: Evidence) -> GateResult:
    logs = evidence.logs
    if logs is None or _reward_key(logs) is None:
        return _no_rewards(evidence)
    for finding in (_truncated, _length_collapse, _standard_zero):
        result = finding(evidence, logs)
        if result is not None:
            return result
    return _healthy_rewards(evidence, logs)


def _tokens(logs: LogTables) -> pl.DataFrame:
    """`step, avg, max` generation lengths per step (rows with both present)."""
    wide = logs.metrics_wide()
    avg, top = mk.GENERATION_AVG_TOKENS[0], mk.GENERATION_MAX_TOKENS[0]
    if avg not in wide.columns:
        return pl.DataFrame(schema={"step": pl.Int64(), "avg": pl.Float64(), "max": pl.Float64()})
    top_col = pl.col(top) if top in wide.columns else pl.lit(None, dtype=pl.Float64())
    return wide.select("step", avg=pl.col(avg), max=top_col).filter(pl.col("avg").is_not_null())


def _token_quotes(logs: LogTables) -> tuple[Quote, ...]:
    keys = (mk.GENERATION_AVG_TOKENS[0], mk.GENERATION_MAX_TOKENS[0])
    rows = logs.metrics.filter(pl.col("key").is_in(keys)).sort(["step", "key"])
    return _metric_quotes(rows, limit=2)


def _truncated(evidence: Evidence, logs: LogTables) -> GateResult | None:
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


def _length_collapse(evidence: Evidence, logs: LogTables) -> GateResult | None:
    t = evidence.thresholds
    tokens = _tokens(logs)
    if tokens.height < t.min_window_steps:
        return None
    last = tokens.tail(t.min_window_steps)["avg"].median()
    earlier = tokens.head(tokens.height - t.min_window_steps)["avg"].median()
    if not isinstance(last, (int, float)):
        return None
    collapsed = last == 0 or (
        isinstance(earlier, (int, float)) and last < t.collapse_ratio * earlier
    )
    if not collapsed:
        return None
    before = f" from a median of {earlier:g} before" if isinstance(earlier, (int, float)) else ""
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"response length collapsed: median generate/avg_num_tokens {last:g} over the "
        f"newest {t.min_window_steps} steps{before}",
        evidence=_token_quotes(logs),
        learning_quality=True,
        mechanism="generation length collapse (the policy emits near-empty responses)",
        next_action="check the newest weight sync and the rollouts' text",
        flip_signal=f"median response length back above {t.collapse_ratio:g} of its earlier median",
    )


def _verifier_errors(logs: LogTables) -> pl.DataFrame:
    errors = logs.errors.filter(pl.col("attempt") == newest_attempt(logs))
    kind = pl.col("kind") == "verifier_error"
    trace = (pl.col("kind") == "traceback") & pl.col("text").str.contains(_VERIFIER_TRACE.pattern)
    return errors.filter(kind | trace.fill_null(value=False)).sort("line")


def _standard_zero(evidence: Evidence, logs: LogTables) -> GateResult | None:
    t = evidence.thresholds
    rewards = _reward_rows(logs)
    values = rewards["value"].fill_nan(None).fill_null(0.0)
    if rewards.height < t.min_window_steps or not bool((values == 0).all()):
        return None
    verifier = _verifier_errors(logs)
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"{rewards['key'][0]} is zero or null at all {rewards.height} steps; "
        f"{verifier.height} verifier exception(s) in the trainer log",
        evidence=_metric_quotes(rewards) + quote_rows(verifier, limit=2),
        mechanism="zero reward from the first step: the reward function or verifier is broken",
        next_action="check the reward function and dataset labels before more training",
        flip_signal=f"any step with {rewards['key'][0]} above 0",
    )


def _healthy_rewards(evidence: Evidence, logs: LogTables) -> GateResult:
    rewards = _reward_rows(logs)
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
    quotes = _metric_quotes(rewards, limit=1) + quote_rows(verifier, limit=2)
    return passed(summary, evidence=quotes)


def _num(value: object, spec: str = ".3f") -> str:
    """A number formatted with `spec`, or "n/a" for anything else."""
    return format(value, spec) if isinstance(value, int | float) else "n/a"
