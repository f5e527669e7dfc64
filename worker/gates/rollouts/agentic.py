"""Agentic rollouts: open the actual trial results — rewards, verifier results, exceptions, turns.

Exceptions are grouped by Harbor's causes: `sandbox` (environment start, sandbox build, agent
setup, test or verifier upload, any `Daytona*`; terminal-bench `agent_installation_failed`),
`agent budget` (agent timeout, context or output length; the reward stays valid; terminal-bench
`agent_timeout`, `context_length_exceeded`, `output_length_exceeded`), `verifier` (verifier
timeout, reward file missing or empty, output parse; terminal-bench `test_timeout`, `parse_error`),
`agent error` (other terminal-bench agent failures) and `other`. Each rule below states its
hypothesis; the first that holds decides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import polars as pl

from shared.models import GateResult, GateStatus, Handoff, KillProof, Quote, Table
from worker.evidence.model import Evidence, LogTables
from worker.evidence.quotes import quote, quote_rows
from worker.gates.base import error, passed
from worker.gates.dynamics.trend import projection
from worker.gates.progress import initialization, newest_attempt
from worker.gates.rollouts.standard import metric_quotes, reward_rows
from worker.gates.rules import rule

__all__ = [
    "AGENT_ERROR",
    "BUDGET",
    "CAUSES",
    "OTHER",
    "SANDBOX",
    "SYSTEMIC",
    "VERIFIER",
    "cause_expr",
    "cause_of",
    "check",
    "trainer_rewards",
]

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

_QUOTA = re.compile(r"quota|limit exceeded|maximum allowed", re.I)


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


def check(evidence: Evidence) -> GateResult:
    """Judge the finished trials of an agentic run as of `evidence.now`."""
    table = evidence.trials
    trials = table.trials if table is not None else pl.DataFrame()
    finished = trials.filter(pl.col("status") == "finished") if not trials.is_empty() else trials
    if finished.is_empty():
        return _no_trials(evidence)
    finished = _with_cause(finished)
    for finding in (_systemic, _one_turn, _zero_rewards, _reward_collapse):
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
    rewards = reward_rows(logs).tail(steps)
    if rewards.is_empty():
        return TrainerRewards(None)
    zero = bool((rewards["value"].fill_nan(None).fill_null(0.0) == 0).all())
    return TrainerRewards(zero, metric_quotes(rewards))


@rule("rollouts.agentic")
def _systemic(evidence: Evidence, finished: pl.DataFrame) -> GateResult | None:
    """At least SAME_CAUSE_SHARE of finished trials fail with one systemic cause (sandbox or
    verifier): the rewards are not real. Hard when every reward is also null or zero and the
    trainer agrees it trains on zeros."""
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
    hard = rewards_zero and trainer.all_zero is True
    mechanism = f"systemic {cause} failure: {top_type} on nearly every trial"
    return GateResult(
        status=GateStatus.FAIL,
        summary=summary,
        evidence=quotes,
        tables=_cause_table(finished),
        hard_failure=hard,
        proof=_proof("systemic_trials", mechanism, quotes) if hard else None,
        kind=f"systemic_{cause}",
        mechanism=mechanism,
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


@rule("rollouts.agentic")
def _one_turn(evidence: Evidence, finished: pl.DataFrame) -> GateResult | None:
    """Median turns of the trials that reached the agent at or under ONE_TURN_MEDIAN, over at
    least MIN_WINDOW_STEPS trials: a dead engine or a broken agent loop, every episode broken."""
    t = evidence.thresholds
    agent = finished.filter(
        pl.col("n_turns").is_not_null() & (pl.col("cause") != SANDBOX).fill_null(value=True)
    )
    median = agent["n_turns"].median()
    if agent.is_empty() or not isinstance(median, (int, float)) or median > t.one_turn_median:
        return None
    if agent.height < t.min_window_steps:
        return _too_few(evidence, finished, f"median {median:g} turns over {agent.height} trials")
    quotes = _trial_quotes(agent.sort("n_turns"))
    mechanism = "about one turn per trial: dead inference engine or broken agent loop"
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"median {median:g} turns over {agent.height} trials that reached the agent "
        f"(limit {t.one_turn_median:g}): the agent loop stops after about one turn",
        evidence=quotes,
        tables=_cause_table(finished),
        hard_failure=True,
        proof=_proof("one_turn", mechanism, quotes),
        kind="one_turn",
        mechanism=mechanism,
        next_action="Supervisor: kill the job (every episode ends after one turn, so it trains "
        "on broken rollouts); then check the engines and the agent's tool-call parsing",
        flip_signal=f"median turns of the newest trials above {t.one_turn_median:g}",
    )


@rule("rollouts.agentic")
def _zero_rewards(evidence: Evidence, finished: pl.DataFrame) -> GateResult | None:
    """Every finished reward null or zero over at least MIN_WINDOW_STEPS trials: nothing earns a
    reward (an ERROR when the trainer logs positive rewards: the sources disagree)."""
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
        tables=_cause_table(finished),
        kind="zero_reward",
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
        tables=_cause_table(finished),
    )


def _cause_table(finished: pl.DataFrame) -> tuple[Table, ...]:
    """Failed trials by cause and exception type, with their share of the finished trials."""
    grouped = (
        finished.filter(pl.col("cause").is_not_null())
        .group_by("cause", "exception_type")
        .len()
        .sort(["cause", "len"], descending=[False, True])
    )
    if grouped.is_empty():
        return ()
    rows = tuple(
        (cause, exc, n, 100.0 * n / finished.height) for cause, exc, n in grouped.iter_rows()
    )
    title = f"trial exceptions by cause ({finished.height} finished trials)"
    columns = ("cause", "exception", "trials", "share")
    return (Table(title=title, columns=columns, rows=rows, units=("", "", "", "%")),)


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
    return passed(summary, evidence=_trial_quotes(finished, limit=2), tables=_cause_table(finished))


def _proof(rule_name: str, mechanism: str, quotes: tuple[Quote, ...]) -> KillProof:
    stamps = [q.timestamp for q in quotes if q.timestamp is not None]
    return KillProof(
        rule=rule_name,
        mechanism=mechanism,
        established_at=max(stamps),
        evidence=quotes,
    )


def _rolling(finished: pl.DataFrame, size: int) -> pl.DataFrame:
    """The mean reward of each run of `size` consecutive finished trials, in finishing order."""
    ordered = finished.sort("finished_at", nulls_last=False).with_row_index("step")
    reward = pl.col("reward").fill_nan(None).fill_null(0.0)
    return ordered.with_columns(mean=reward.rolling_mean(size)).drop_nulls("mean")


@rule("rollouts.agentic")
def _reward_collapse(evidence: Evidence, finished: pl.DataFrame) -> GateResult | None:
    """Trial rewards collapsed: the mean reward of every newest MIN_WINDOW_STEPS-trial window
    fell under COLLAPSE_RATIO of the best window's and does not trend back within one more window
    (the trial-side evidence a trainer reward collapse must agree with)."""
    t = evidence.thresholds
    size = t.min_window_steps
    rolling = _rolling(finished, size)
    if rolling.height < 2 * size:
        return None
    best = float(rolling["mean"].max())  # type: ignore[arg-type]
    line = t.collapse_ratio * best
    tail = rolling.tail(size)
    if best <= 0 or not bool((tail["mean"] < line).all()):
        return None
    if projection(tail, "mean", size) >= line:
        return None
    newest = float(tail["mean"][-1])
    quotes = _trial_quotes(finished.sort("finished_at").tail(size), limit=3)
    mechanism = f"trial reward collapse: newest {size}-trial mean {newest:.3f} < {line:.3f}"
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"trial rewards collapsed: every newest {size}-trial window mean under "
        f"{line:.3f} ({t.collapse_ratio:.0%} of the best window {best:.3f}), newest "
        f"{newest:.3f}, not trending back",
        evidence=quotes,
        tables=_cause_table(finished),
        learning_quality=True,
        kind="reward_collapse",
        proof=_proof("trial_reward_collapse", mechanism, quotes),
        mechanism=mechanism,
        next_action="open the newest trials' verifier output; confirm with the trainer's reward",
        flip_signal=f"a {size}-trial window mean reward back above {line:.3f}",
    )
