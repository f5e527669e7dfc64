"""Configuration failures: a configuration-class failure that ended every attempt is a hard failure
(docs/domain.md#failure-signatures: "a configuration that cannot parse"), with a handoff fed from
the catalogue entry that knows the failure (its component and note). Proof rule `config_failure`.

Reads `Facts.attempt_failures` (the failure that ended each attempt: its first specific hard or
configuration row after the attempt's last timer or train metric line) and the job state.

- **Every attempt**: attempts 0 to the newest each have a failure, and each failure's catalogue
  class is `configuration` (an override of a missing key, a key not in a struct config,
  `max_model_len` beyond the KV cache, a GPU the build has no kernel for, a spent sandbox quota).
- **Ended it**: nothing advanced in that attempt after the row (no timer or train metric line;
  `Facts.attempt_failures` keeps only such rows): a configuration error caught and logged while
  training went on ended nothing.
- **The newest attempt is over**: the job state is a failure, or `now` is past the stall limit
  after the newest attempt's failure with nothing advancing since. A succeeded job never is.

Before that, a configuration failure that ended the newest attempt before its first step is
`config_death_pending`: not initialisation, an ERROR with the handoff
(docs/domain.md#deaths-that-need-a-change).

The handoff (`config_handoff`) is concrete: the entry's `subject` regex reads the affected key,
module or path from the line (redacted), and its `change`, `behaviour` and `test` say what to
change, what to propose and how to prove the fix (docs/failures.md).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final

import polars as pl

from shared.models import GateResult, GateStatus, Handoff, KillProof, Quote
from shared.redact import redact_text
from worker.evidence.case import Evidence
from worker.evidence.facts import row_signature
from worker.evidence.failures import Entry, FailureClass, catalogue
from worker.evidence.jobstate import JobState
from worker.evidence.quotes import quote_rows
from worker.gates.base import error
from worker.gates.progress import finished_steps, minute_utc
from worker.gates.rules import rule

__all__ = [
    "SUBJECT_MAX",
    "config_death_pending",
    "config_failure",
    "config_handoff",
    "failure_subject",
]

CONFIGURATION: Final = FailureClass.CONFIGURATION.value
SUBJECT_MAX: Final = 200
"""A key, module or path read from a failure line is cut to this many characters in a handoff."""

# component -> (what to change, the behaviour to propose)
_WHERE: Final[dict[str, tuple[str, str]]] = {
    "configuration": (
        "the launch configuration: the Hydra/OmegaConf keys and overrides the entrypoint passes",
        "correct the key or override the error names (rename or drop it, or add it to the "
        "config schema) so the configuration composes before any GPU is allocated",
    ),
    "engine": (
        "the inference engine settings (vLLM gpu_memory_utilization, max_model_len, "
        "max_num_seqs) and the GPU architectures the vLLM build supports",
        "change the engine setting the error names, or use a build for these GPUs, so the "
        "engine starts",
    ),
    "sandbox": (
        "the sandbox configuration (Daytona quota, snapshot, image reference)",
        "fix the sandbox setting the error names (raise the quota, create the snapshot, correct "
        "the image) before relaunching",
    ),
    "policy": (
        "the policy training configuration (model, parallelism, the kernels built for these GPUs)",
        "change the policy setting the error names so every rank starts on these GPUs",
    ),
}
_DEFAULT: Final = ("the job's configuration", "change the setting the error names")


def _entry(row: dict[str, Any]) -> Entry | None:
    entry_id = row.get("entry")
    found = [e for e in catalogue().entries if e.id == entry_id] if entry_id else []
    return found[0] if found else None


def failure_subject(entry: Entry, row: dict[str, Any]) -> str | None:
    """The key, module or path the failure names, read by the entry's `subject` regex from the
    row's final line (else its message), redacted and cut to SUBJECT_MAX characters."""
    for text in (row.get("text"), row.get("message")):
        found = entry.subject_of(str(text)) if text else None
        if found:
            return redact_text(found)[:SUBJECT_MAX]
    return None


def _filled(template: str, subject: str | None) -> str:
    return template.replace("{subject}", subject or "the one the error names")


def _where(entry: Entry, component: str, subject: str | None) -> tuple[str, str]:
    """What to change and the behaviour to propose: the entry's own, else its component's."""
    where, behaviour = _WHERE.get(component, _DEFAULT)
    if entry.change:
        where = _filled(entry.change, subject)
    elif subject:
        where = f"{where}: `{subject}`"
    return where, _filled(entry.behaviour, subject) if entry.behaviour else behaviour


def config_handoff(row: dict[str, Any], quotes: tuple[Quote, ...]) -> Handoff | None:
    """A handoff for a configuration-class failure row, from its catalogue entry: the thing to
    change (the key, module or path read from the line when the entry can), the entry's note as
    the cause, the behaviour to propose, and a test that proves the fix (the entry's check, then
    a relaunch with no such failure before its first finished step)."""
    entry = _entry(row)
    if entry is None or entry.failure_class is not FailureClass.CONFIGURATION:
        return None
    component = entry.component.value if entry.component else str(row.get("component") or "")
    subject = failure_subject(entry, row)
    where, behaviour = _where(entry, component, subject)
    signature = row_signature(row) or row.get("text")
    check = f"{_filled(entry.test, subject)}; then " if entry.test else ""
    return Handoff(
        evidence=quotes,
        likely_cause=f"{entry.note} (catalogue `{entry.id}`): `{row.get('text')}`",
        component=f"{where} [{component or 'unknown'}]",
        proposed_behavior=behaviour,
        test=f"{check}launch the corrected configuration once (or compose it offline) and assert "
        f"it logs a `Finished: 'step'` line and no failure with signature `{signature}` "
        "(`rl-health signatures` on its log lists none)",
    )


def _every_attempt(evidence: Evidence) -> pl.DataFrame | None:
    """The configuration failure that ended each attempt, when every attempt has one (an
    attempt's failure comes after its last advancement: `Facts.attempt_failures`)."""
    facts = evidence.facts
    attempts = set(range(facts.newest_attempt + 1))
    rows = facts.attempt_failures.filter(pl.col("failure_class") == CONFIGURATION)
    if set(rows["attempt"].to_list()) != attempts:
        return None
    return rows.sort("attempt")


def _quiet_from(evidence: Evidence, at: datetime) -> datetime:
    """When the log went quiet after a failure at `at`: its newest line of any kind (teardown,
    a caught error's aftermath, an engine still loading), never after `now`. A process that
    logs on after a configuration error it caught is alive, whatever the error's class."""
    logs = evidence.logs
    last = logs.summary.last_timestamp if logs is not None else None
    if last is None or last <= at:
        return at
    return min(last, evidence.now)


def _over(evidence: Evidence, newest: dict[str, Any], limit_s: float) -> datetime | None:
    """When the newest attempt is known to be over: at its failure when the job state is a
    failure, or when the log has been silent past the stall limit since the failure (and
    whatever it logged after it); None while it may still run."""
    state = evidence.facts.state
    at: datetime | None = newest.get("timestamp")
    if state is JobState.SUCCEEDED:
        return None
    if state is not None and state.failure:
        return at or evidence.bundle.finished_at or evidence.now
    if at is not None and (evidence.now - _quiet_from(evidence, at)).total_seconds() > limit_s:
        return at
    return None


@rule("liveness")
def config_failure(
    evidence: Evidence, limit_s: float, base: tuple[Quote, ...]
) -> GateResult | None:
    """A configuration-class failure (a catalogue entry's class) that ended every attempt, the
    newest included, is a hard failure: relaunching the same configuration fails the same way.
    The handoff names the component to change, from the catalogue entry.

    `limit_s` is the stall limit for a newest attempt the controller still calls alive; `base`
    the controller quote and the newest advancement."""
    rows = _every_attempt(evidence) if evidence.logs is not None else None
    if rows is None:
        return None
    newest = rows.row(-1, named=True)
    at = _over(evidence, newest, limit_s)
    if at is None:
        return None
    quotes = quote_rows(rows.reverse(), limit=3)
    n, text = rows.height, newest["text"]
    mechanism = f"configuration failure on every attempt ({n}): {text}"
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"the configuration fails every attempt ({n}); the newest ended at "
        f"{minute_utc(at)} on: {text}",
        evidence=quotes + base,
        hard_failure=True,
        proof=KillProof(
            rule="config_failure", mechanism=mechanism, established_at=at, evidence=quotes + base
        ),
        mechanism=mechanism,
        kind="config_failure",
        next_action="Supervisor: kill the job; relaunching the same configuration fails the same "
        "way. Fix the configuration (handoff) before relaunching.",
        flip_signal="a relaunch with a changed configuration that logs a `Finished: 'step'` line",
        handoff=config_handoff(newest, quotes),
    )


def _stepped(evidence: Evidence, attempt: int) -> bool:
    """Whether `attempt` finished a step or logged a train metric (it left initialisation)."""
    logs = evidence.logs
    if logs is None:
        return False
    if not finished_steps(logs, attempt).is_empty():
        return True
    return not logs.metrics.filter(pl.col("attempt") == attempt).is_empty()


def _pending_why(evidence: Evidence, at: datetime | None, limit_s: float) -> tuple[str, str]:
    """Why `config_failure` cannot establish the death yet, and the signal that would."""
    if _every_attempt(evidence) is None:
        return (
            "an earlier attempt did not end on a configuration failure, so the loop is not "
            "established by `config_failure`",
            "the job failing (a failed controller state) with this failure quoted",
        )
    if at is None:
        return "the failure line carries no time", "a failed controller state"
    deadline = minute_utc(_quiet_from(evidence, at) + timedelta(seconds=limit_s))
    return (
        f"the newest attempt is not over yet: the job is not failed and the log's silence "
        f"reaches the stall limit at {deadline}",
        f"no advancement by {deadline}, or a failed controller state: then KILL (config_failure)",
    )


@rule("liveness")
def config_death_pending(
    evidence: Evidence, limit_s: float, base: tuple[Quote, ...]
) -> GateResult | None:
    """A configuration-class failure (a key not in the config, a missing module or file, a
    schema mismatch) that ended the newest attempt before its first step ends initialisation:
    that attempt will not step, and the same configuration fails the same way. While
    `config_failure` cannot establish it (the job not failed and the silence since it within the
    stall limit, or an earlier attempt that ended otherwise) it is an ERROR with the handoff and
    the moment it would be established — never the initialisation PASS.

    `limit_s` is the run's stall limit; `base` the controller quote and the newest advancement."""
    facts = evidence.facts
    state = facts.state
    if evidence.logs is None or state is None or state.terminal:
        return None
    rows = facts.attempt_failures.filter(pl.col("attempt") == facts.newest_attempt)
    if rows.is_empty() or rows["failure_class"][0] != CONFIGURATION:
        return None
    if _stepped(evidence, facts.newest_attempt):
        return None
    row = rows.row(0, named=True)
    at: datetime | None = row.get("timestamp")
    quotes = quote_rows(rows)
    why, flip = _pending_why(evidence, at, limit_s)
    when = f" at {minute_utc(at)}" if at is not None else ""
    return error(
        f"not initialising: the newest attempt ended{when} before its first step on a "
        f"configuration failure: {row['text']}; not yet established: {why}",
        missing=(f"the end of the newest attempt established ({why})",),
        evidence=quotes + base,
        mechanism=f"configuration failure before the first step: {row['text']}",
        next_action="Fix the configuration (handoff); the job cannot step with it. Re-diagnose "
        "once the attempt is over to confirm the KILL.",
        flip_signal=flip,
        handoff=config_handoff(row, quotes),
    )
