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
from typing import Final

import polars as pl

from shared.models import GateResult, GateStatus, Handoff, KillProof, Quote, Table
from shared.redact import redact_text
from worker.evidence.case import Evidence
from worker.evidence.quotes import quote, quote_rows
from worker.gates.base import error, passed
from worker.gates.dynamics.trend import projection
from worker.gates.progress import initialization
from worker.gates.rollouts.trainer import Naming, names, reward_collapsed, trainer_rewards
from worker.gates.rules import rule

__all__ = [
    "AGENT_ERROR",
    "BUDGET",
    "CAUSES",
    "NOT_RUN",
    "OTHER",
    "SANDBOX",
    "SYSTEMIC",
    "VERIFIER",
    "cause_expr",
    "cause_of",
    "check",
    "trainer_rewards",
    "trial_quotes",
    "with_cause",
]

SANDBOX: Final = "sandbox"
BUDGET: Final = "agent budget"
VERIFIER: Final = "verifier"
AGENT_ERROR: Final = "agent error"
OTHER: Final = "other"
SYSTEMIC: Final = (SANDBOX, VERIFIER)
NOT_RUN: Final = "verifier could not run"
"""The failure of a trial with no exception whose verifier output says no test ran (a missing test
file: `trials.VERIFIER_NOT_RUN`): its reward of 0 says nothing about the model."""

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
"""Harbor exception types and terminal-bench failure modes -> cause
(docs/domain.md#harbor-trials)."""

_PROVIDER = re.compile(
    r"quota|limit exceeded|maximum allowed|limit reached|no space left on device", re.I
)
"""A sandbox failure message that names the provider's quota, limits or disk (Daytona's `Total CPU
limit exceeded. Maximum allowed: N`, `Snapshot quota exceeded`, `Total disk limit exceeded`)."""
_TESTED_PATH = re.compile(r"not found: (\S+)|can't open file '([^']+)'|directory: '([^']+)'")


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


def with_cause(trials: pl.DataFrame) -> pl.DataFrame:
    """Finished trials with their `cause`, their `failure` (the exception type, or NOT_RUN for a
    trial whose verifier output says no test ran), the text quoted for them and a timestamp."""
    not_run = pl.col("exception_type").is_null() & pl.col("verifier_error").is_not_null()
    cause = pl.when(not_run).then(pl.lit(VERIFIER)).otherwise(cause_expr())
    failure = pl.when(not_run).then(pl.lit(NOT_RUN)).otherwise(pl.col("exception_type"))
    outcome = pl.format(
        "reward {}, turns {}",
        pl.col("reward").cast(pl.String()).fill_null("null"),
        pl.col("n_turns").cast(pl.String()).fill_null("?"),
    )
    raised = pl.format(
        "{}: {} ({})", "exception_type", pl.col("exception_message").fill_null(""), outcome
    )
    untested = pl.format("{}: {} ({})", pl.lit(NOT_RUN), "verifier_error", outcome)
    clean = pl.col("exception_type").is_null()
    text = pl.when(not_run).then(untested).when(clean).then(outcome).otherwise(raised)
    return trials.with_columns(
        cause=cause, failure=failure, _text=text, timestamp=pl.col("finished_at")
    )


def trial_quotes(rows: pl.DataFrame, limit: int = 3) -> tuple[Quote, ...]:
    """The newest of `rows` (trials `with_cause`), quoted from their result files."""
    newest_first = rows.sort("finished_at", descending=True, nulls_last=True)
    return quote_rows(newest_first, text_column="_text", limit=limit)


def _verifier_quotes(rows: pl.DataFrame, limit: int = 2) -> tuple[Quote, ...]:
    """The verifier output lines of `rows` that say no test ran, quoted from their files."""
    told = rows.filter(pl.col("verifier_error").is_not_null()).sort("finished_at", descending=True)
    told = told.select(
        source="verifier_source",
        text="verifier_error",
        line=pl.lit(None, pl.Int64),
        timestamp="timestamp",
    )
    return quote_rows(told, limit=limit)


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
    finished = with_cause(finished)
    for finding in (_systemic, _one_turn, _zero_rewards, _reward_collapse):
        result = finding(evidence, finished)
        if result is not None:
            return result
    return _healthy_trials(finished, trials.height - finished.height)


@rule("rollouts.agentic")
def _systemic(evidence: Evidence, finished: pl.DataFrame) -> GateResult | None:
    """At least SAME_CAUSE_SHARE of finished trials fail with one systemic cause (sandbox or
    verifier, a verifier output saying no test ran included): the reward signal is invalid and its
    owner is the environment, not the model. Hard when the trainer corroborates it: it trains on
    zeros while every trial reward is null or zero, or its per-step lines name the trials'
    exception on each of its newest MIN_WINDOW_STEPS batches, whatever its reward shows."""
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


def _corroboration(
    evidence: Evidence, rewards_zero: bool, failure: str
) -> tuple[bool, str, tuple[Quote, ...]]:
    """Whether the trainer corroborates a systemic trial failure, how, and its quotes."""
    t = evidence.thresholds
    trainer = trainer_rewards(evidence.logs, t.min_window_steps)
    naming = names(evidence.logs, failure, None, evidence.now, newest=t.min_window_steps)
    if rewards_zero and trainer.all_zero is True:
        return True, "; the trainer trains on zeros", trainer.quotes
    if _names_every_step(naming, t.min_window_steps):
        said = f"; the trainer's per-step lines name {failure} on each of its newest {naming.lines}"
        return True, said, naming.quotes
    said = "; the trainer trains on zeros" if trainer.all_zero else ""
    return False, said, trainer.quotes


def _names_every_step(naming: Naming, steps: int) -> bool:
    return naming.every_line and naming.lines >= steps


def _systemic_fail(
    evidence: Evidence, finished: pl.DataFrame, failing: pl.DataFrame, cause: str
) -> GateResult:
    types = failing.group_by("failure").len().sort("len", descending=True)
    top_type = str(types["failure"][0])
    example = failing.filter(pl.col("failure") == top_type)
    rewards_zero = bool((finished["reward"].fill_nan(None).fill_null(0.0) == 0).all())
    hard, said, trainer_quotes = _corroboration(evidence, rewards_zero, top_type)
    quotes = trial_quotes(example) + _verifier_quotes(example) + trainer_quotes
    share = failing.height / finished.height
    summary = (
        f"{failing.height}/{finished.height} finished trials ({share:.0%}) failed with {cause} "
        f"errors, mostly {top_type} ({int(types['len'][0])})"
        + ("; every reward null or zero" if rewards_zero else "")
        + said
    )
    owner = _owner(cause, top_type, example)
    what = f"`{_first(example, 'verifier_error')}`" if top_type == NOT_RUN else top_type
    mechanism = (
        f"reward signal invalid: {owner}: {what} on {failing.height}/{finished.height} "
        "finished trials"
    )
    return GateResult(
        status=GateStatus.FAIL,
        summary=summary,
        evidence=quotes,
        tables=_cause_table(finished),
        hard_failure=hard,
        proof=_proof("systemic_trials", mechanism, quotes) if hard else None,
        kind=f"systemic_{cause}",
        mechanism=mechanism,
        next_action=(
            "Supervisor: kill the job: its reward signal is invalid. Hand off to the environment "
            "owner (handoff) before relaunching; the model is not the cause"
            if hard
            else f"hand off to the environment owner: fix the {cause} side before any further "
            "training; the rewards are not real"
        ),
        flip_signal=f"finished trials without {top_type} reaching over "
        f"{1 - evidence.thresholds.same_cause_share:.0%} of the newest trials",
        handoff=_cause_handoff(cause, top_type, example, (failing.height, finished.height), quotes),
    )


def _provider(top_type: str, example: pl.DataFrame) -> bool:
    """A sandbox failure the provider's quota, limits or disk explain."""
    messages = " ".join(example["exception_message"].drop_nulls().head(3).to_list())
    return top_type == "DaytonaValidationError" or bool(_PROVIDER.search(messages))


def _owner(cause: str, top_type: str, example: pl.DataFrame) -> str:
    """Who the invalid reward belongs to, in a few words (the mechanism's subject)."""
    if cause == VERIFIER:
        return "the verifier could not run"
    if _provider(top_type, example):
        return "the sandbox provider refuses sandboxes (its quota or limits are spent)"
    return "sandboxes never come up"


def _first(example: pl.DataFrame, column: str) -> str | None:
    values = example[column].drop_nulls()
    return redact_text(str(values[0])) if values.len() else None


def _tested_path(line: str | None) -> str | None:
    """The test path a verifier output line says is missing."""
    found = _TESTED_PATH.search(line or "")
    return next((g for g in found.groups() if g), None) if found else None


def _cause_handoff(
    cause: str,
    exception_type: str,
    example: pl.DataFrame,
    counts: tuple[int, int],
    quotes: tuple[Quote, ...],
) -> Handoff:
    """The handoff to the environment owner: what fails on how many trials, where to change it,
    the behaviour to propose and the test that proves the fix."""
    on = f"{counts[0]}/{counts[1]} trials"
    if cause == VERIFIER:
        return _verifier_handoff(exception_type, _first(example, "verifier_error"), on, quotes)
    message = _first(example, "exception_message") or ""
    said = f"`{exception_type}: {message}`" if message else f"`{exception_type}`"
    if _provider(exception_type, example):
        return Handoff(
            evidence=quotes,
            likely_cause=f"the sandbox provider refuses sandboxes on {on}: the organisation's "
            f"quota or limits are spent ({said}); their zero rewards are not the model's",
            component="the sandbox provider's organisation quota (Daytona: snapshots, CPU, "
            "memory, disk) the Harbor environment creates sandboxes in; owner: the environment",
            proposed_behavior="free or raise the quota, and make the generator fail fast when "
            "most sandbox creations are refused instead of training on zero rewards",
            test="create one sandbox in the same organisation with the job's resources and "
            "assert it starts and one trial writes a reward; a run whose sandboxes are all "
            "refused stops before its first optimizer step",
        )
    return Handoff(
        evidence=quotes,
        likely_cause=f"sandboxes never come up on {on} ({said})",
        component="the Harbor environment's sandbox creation (image, snapshot, start "
        "timeout); owner: the environment",
        proposed_behavior="make one sandbox of the task image start within the timeout, and "
        "make the generator fail fast when sandboxes never come up",
        test="run one trial of the same task in the same environment and assert its sandbox "
        "starts and the verifier writes a reward",
    )


def _verifier_handoff(
    exception_type: str, line: str | None, on: str, quotes: tuple[Quote, ...]
) -> Handoff:
    path = _tested_path(line)
    said = f": the verifier's output says `{line}`" if line else ""
    raised = "" if exception_type == NOT_RUN else f" ({exception_type})"
    where = f"the test path `{path}` its test script runs" if path else "its test script"
    return Handoff(
        evidence=quotes,
        likely_cause=f"the verifier could not run its tests on {on}{raised}{said}; "
        "their rewards of 0 say nothing about the model",
        component=f"the task's verifier: {where} and the reward file it writes; owner: the "
        "environment / task",
        proposed_behavior="ship the tests the verifier runs with the task (or run them by a path "
        "that exists in the sandbox), and make the verifier fail the trial, not score it 0, when "
        "no test ran",
        test="run the task's verifier once on its reference solution (Harbor's oracle agent) and "
        "assert at least one test ran and the reward is 1"
        + (f" (`{path}` exists in the sandbox)" if path else ""),
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
    quotes = trial_quotes(agent.sort("n_turns"))
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
    reward (an ERROR when the trainer logs positive rewards that have not collapsed: the sources
    disagree; a trainer reward under COLLAPSE_RATIO of its best window agrees with zero trials)."""
    t = evidence.thresholds
    rewards = finished["reward"].fill_nan(None)
    if not bool((rewards.fill_null(0.0) == 0).all()):
        return None
    if finished.height < t.min_window_steps:
        return _too_few(evidence, finished, "every reward null or zero")
    trainer = trainer_rewards(evidence.logs, t.min_window_steps)
    nulls = rewards.null_count()
    what = f"all {finished.height} finished trials scored zero or no reward ({nulls} null)"
    quotes = trial_quotes(finished) + trainer.quotes
    collapsed = trainer.all_zero is False and reward_collapsed(evidence.logs, t)
    if trainer.all_zero is False and not collapsed:
        return error(
            f"{what}, but the trainer logs positive rewards: trials and trainer disagree",
            missing=("agreement between trial results and trainer rewards",),
            evidence=quotes,
        )
    agree = "the trainer agrees" if trainer.all_zero else "no trainer reward to compare"
    if collapsed:
        agree = (
            f"the trainer's reward collapsed too (its newest {t.min_window_steps}-step mean "
            f"under {t.collapse_ratio:.0%} of its best)"
        )
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
        evidence=trial_quotes(finished),
        tables=_cause_table(finished),
    )


def _cause_table(finished: pl.DataFrame) -> tuple[Table, ...]:
    """Failed trials by cause and exception type, with their share of the finished trials."""
    grouped = (
        finished.filter(pl.col("cause").is_not_null())
        .group_by("cause", "failure")
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
    return passed(summary, evidence=trial_quotes(finished, limit=2), tables=_cause_table(finished))


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
    quotes = trial_quotes(finished.sort("finished_at").tail(size), limit=3)
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
