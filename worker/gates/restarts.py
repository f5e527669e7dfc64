"""Restarts: do the job's attempts repeat one failure, or did it recover from a transient?

Reads, in order of authority: the controller's attempt history (`probes.attempts`, quoted as
`probes/attempts.json`), the controller summary (`probes.controller`: `failure_count`,
`preemption_count`, `max_retries_failure`, `error`), and the logs (RESUMES `attempt_boundary`,
`resumed` and `scratch` rows; ERRORS rows of each attempt; TIMERS and METRICS steps of the newest
attempt).

- **Attempts.** From `probes.attempts` when captured; otherwise from the logs when they mark an
  attempt boundary, Iris's setup line or an in-log restart (`worker.evidence.logs.attempts`: a
  death, then the launcher or a new driver pid starting), so a crash loop without Iris setup lines
  counts (every attempt but the newest ended in a restart; its cause is unknown unless a hard
  error line names it); otherwise only the controller's counters; otherwise nothing.
- **Count** = attempts that ended in failure (`failed`, `worker_failed`, `cosched_failed`, a
  log attempt that ended on a failure row) or preemption (`preempted`, or an ended log attempt
  without a failure row). With no attempt information at all the count is None and the
  interpretation says the controller attempt history was not captured.
- **The attempt's failure** (`Facts.attempt_failures`): its first ERRORS row (by line) whose
  catalogue class is hard or configuration, or that no entry knows and is a traceback or a final
  exception line — the first *specific* one, so a Hydra banner or torchrun's exit record does not
  hide the exception. Benign and transient rows never are an attempt's failure.
- **Signature** = the parser's signature of that row (exception type + normalised message:
  numbers, hex, pids, hosts, ports, paths, uuids and times replaced), else the controller's
  `error` normalised the same way, else `exit code N`.
- **same_failure** is True when at least two non-transient failed attempts all carry one
  *specific* signature, False when they differ or fewer than two failed, None when a failed
  attempt has no signature or only a generic one (an exit record), or nothing is known.
  `worker_failed`, `preempted` and attempts whose terminal reason names a preemption or a node
  are transient.
- **recovered**: the newest attempt is running or succeeded and stepped past the checkpoint it
  resumed from (its newest finished step or metric step > the `resumed` step, > 0 after a
  scratch start, > the highest step an earlier attempt reached when no resume line exists); after a
  repeated signature it must also pass the highest step an earlier attempt reached.
- **doomed** = same_failure and not recovered: a deterministic crash loop, a hard failure.
- **retries_left** = `max_retries_failure` - failures (never below 0) when the budget is known,
  else None.

Never raises: odd records give an "unknown" interpretation rather than an exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

import polars as pl

from shared.models import Quote, RestartsResult
from shared.redact import redact_text
from worker.evidence import failures
from worker.evidence.case import Evidence
from worker.evidence.facts import row_signature
from worker.evidence.jobstate import JobState
from worker.evidence.model import AttemptRecord, ControllerView, LogTables
from worker.evidence.quotes import quote, quote_rows
from worker.gates.progress import finished_steps, newest_attempt

__all__ = ["check", "failure_signature", "is_specific_signature"]

ATTEMPTS_SOURCE = "probes/attempts.json"
CONTROLLER_SOURCE = "probes/controller.json"


_TRANSIENT_REASON = re.compile(r"preempt|node|evict|spot", re.IGNORECASE)


class Outcome(StrEnum):
    FAILED = "failed"
    PREEMPTED = "preempted"
    ENDED = "ended"  # a log attempt followed by a restart, cause unknown
    ALIVE = "alive"  # running, succeeded or not yet started
    OTHER = "other"  # killed, unschedulable, missing, unknown


@dataclass(frozen=True)
class Attempt:
    label: str
    outcome: Outcome
    transient: bool
    signature: str | None
    quotes: tuple[Quote, ...]
    specific: bool = False  # the signature may stand for the failure on its own


# --- failure signatures ----------------------------------------------------------------------

_EXCEPTION = re.compile(
    r"\b((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Failure|Timeout|Died|Crash)"
    r"\w*)\b:?\s*(.*)"
)
_EXIT_CODE = re.compile(r"exit code:?\s*(-?\d+)", re.IGNORECASE)


def is_specific_signature(signature: str | None) -> bool:
    """Whether a failure signature names a failure (docs/domain.md#failure-signatures): `exit code
    N`, Slurm's bare `FAILED` and the like are no signature — attempts that share only them may have
    died of anything. The one test of specificity in the gates; it is the log parser's predicate
    (`worker.evidence.failures.is_specific`), so a controller's error text and a log row are
    judged alike. A log row of a generic catalogue entry (an exit record, a banner) is never
    specific whatever its words: the row's `specific` column says so (`_row_failure`)."""
    return failures.is_specific(signature)


def failure_signature(text: str | None, exit_code: int | None = None) -> str | None:
    """The signature of a controller's error text, normalised as the log parser normalises a
    row's (`worker.evidence.failures.signature`): exception type + normalised message of the
    first line naming an exception; else `exit code N` + the normalised first line. Credentials
    are redacted first: normalising digits inside a token would hide it from the redaction."""
    lines = [line.strip() for line in redact_text(text or "").splitlines() if line.strip()]
    for line in lines:
        match = _EXCEPTION.search(line)
        if match:
            return failures.signature(match[1].rsplit(".", 1)[-1], match[2])
    if lines:
        code = _EXIT_CODE.search(lines[0])
        rest = _EXIT_CODE.sub("", lines[0]).strip(" .:")
        prefix = f"exit code {code[1]}" if code else ""
        return "; ".join(p for p in (prefix, failures.normalise(rest) if rest else "") if p) or None
    return f"exit code {exit_code}" if exit_code is not None else None


@dataclass(frozen=True)
class RowFailure:
    """An attempt's failure as the logs show it: its signature, whether that is specific, quotes."""

    signature: str | None
    specific: bool
    quotes: tuple[Quote, ...]


def _row_failure(evidence: Evidence, attempt: int) -> RowFailure | None:
    """The failure that ended `attempt` in the logs (`Facts.attempt_failures`)."""
    rows = evidence.facts.attempt_failures.filter(pl.col("attempt") == attempt)
    return _failure(rows.head(1))


def _failure(rows: pl.DataFrame) -> RowFailure | None:
    """The failure of an attempt's `Facts.attempt_failures` row (none when `rows` is empty): the
    row's own signature (credentials redacted before it is normalised: `row_signature`) and
    specificity; a row the parser did not sign (an older freeze) is signed here."""
    if rows.is_empty():
        return None
    row = rows.row(0, named=True)
    signature = row_signature(row) or failure_signature(str(row.get("text") or ""))
    specific = row.get("specific")
    specific = is_specific_signature(signature) if specific is None else bool(specific)
    return RowFailure(signature, specific, quote_rows(rows.head(1)))


# --- attempts from the controller ------------------------------------------------------------


def _state(raw: str) -> str:
    state = JobState.parse(raw)
    return state.value if state is not None else raw.strip().lower()


def _outcome(state: str) -> Outcome:
    parsed = JobState.parse(state)
    if parsed is None:
        return Outcome.OTHER
    if parsed.failure:
        return Outcome.FAILED
    if parsed is JobState.PREEMPTED:
        return Outcome.PREEMPTED
    return Outcome.ALIVE if parsed.alive else Outcome.OTHER


def _ms(value: int | None) -> datetime | None:
    return datetime.fromtimestamp(value / 1000, tz=UTC) if value is not None else None


def _record_quote(record: AttemptRecord, state: str) -> Quote:
    parts = [f"{record.task_id}:{record.attempt_id} state={state}"]
    parts += [f"exit_code={record.exit_code}"] if record.exit_code is not None else []
    parts += [f"terminal_reason={record.terminal_reason}"] if record.terminal_reason else []
    parts += [f"error={record.error}"] if record.error else []
    return quote(ATTEMPTS_SOURCE, " ".join(parts), timestamp=_ms(record.finished_at_ms))


def _record_signature(record: AttemptRecord, row: RowFailure | None) -> tuple[str | None, bool]:
    """The log row's signature when specific (the parser's canonical, first-error signature), else
    the controller's error text when specific, else whichever is known (not specific)."""
    if row is not None and row.specific:
        return row.signature, True
    controller = failure_signature(record.error, record.exit_code)
    if is_specific_signature(controller):
        return controller, True
    return (controller or (row.signature if row else None)), False


def _from_record(record: AttemptRecord, evidence: Evidence, single_task: bool) -> Attempt:
    state = _state(record.state)
    outcome = _outcome(state)
    parsed = JobState.parse(state)
    transient = (parsed is not None and parsed.transient) or bool(
        _TRANSIENT_REASON.search(record.terminal_reason or "")
    )
    quotes = [_record_quote(record, state)]
    label = f"{record.task_id}:{record.attempt_id}"
    if outcome is not Outcome.FAILED:
        return Attempt(label, outcome, transient, None, tuple(quotes))
    row = _row_failure(evidence, record.attempt_id) if single_task else None
    quotes += list(row.quotes) if row else []
    signature, specific = _record_signature(record, row)
    return Attempt(label, outcome, transient, signature, tuple(quotes), specific)


def _record_attempts(evidence: Evidence) -> list[Attempt] | None:
    records = evidence.probes.attempts if evidence.probes else None
    if not records:
        return None
    ordered = sorted(records, key=lambda r: (r.started_at_ms or 0, r.task_id, r.attempt_id))
    single_task = len({r.task_id for r in records}) == 1
    return [_from_record(r, evidence, single_task) for r in ordered]


# --- attempts from the logs ------------------------------------------------------------------


@dataclass(frozen=True)
class _ByAttempt:
    """The log rows of each attempt, split once: its boundary rows by line, its failure row."""

    boundaries: dict[int, pl.DataFrame]
    failures: dict[int, pl.DataFrame]
    empty_boundary: pl.DataFrame
    empty_failure: pl.DataFrame

    @classmethod
    def of(cls, boundaries: pl.DataFrame, failures: pl.DataFrame) -> _ByAttempt:
        def split(frame: pl.DataFrame) -> dict[int, pl.DataFrame]:
            known = frame.filter(pl.col("attempt").is_not_null())  # `== attempt` never holds
            parts = known.partition_by("attempt", as_dict=True, maintain_order=True)
            return {int(key[0]): part for key, part in parts.items()}

        return cls(
            split(boundaries.sort("line")), split(failures), boundaries.clear(), failures.clear()
        )

    def boundary(self, attempt: int) -> pl.DataFrame:
        return self.boundaries.get(attempt, self.empty_boundary)

    def failure(self, attempt: int) -> RowFailure | None:
        return _failure(self.failures.get(attempt, self.empty_failure))


def _log_attempt(rows: _ByAttempt, attempt: int, newest_state: str | None) -> Attempt:
    """A log attempt: every one but the newest ended in a restart, failed when a failure row
    (`Facts.attempt_failures`) names why, else ended for an unknown (transient) reason."""
    row = rows.failure(attempt)
    quotes = quote_rows(rows.boundary(attempt), limit=1) + (row.quotes if row else ())
    signature, specific = (row.signature, row.specific) if row else (None, False)
    label = f"log attempt {attempt}"
    if newest_state is not None:
        outcome = _outcome(_state(newest_state))
        if outcome is not Outcome.FAILED:
            return Attempt(label, outcome, False, None, quotes)
        return Attempt(label, outcome, False, signature, quotes, specific)
    if signature is None:
        return Attempt(label, Outcome.ENDED, True, None, quotes)
    return Attempt(label, Outcome.FAILED, False, signature, quotes, specific)


def _log_attempts(evidence: Evidence) -> list[Attempt] | None:
    logs = evidence.logs
    if logs is None:
        return None
    newest = newest_attempt(logs)
    boundaries = logs.resumes.filter(pl.col("kind") == "attempt_boundary")
    if newest == 0 and boundaries.is_empty():
        return None
    state = _controller_state(evidence)
    rows = _ByAttempt.of(boundaries, evidence.facts.attempt_failures)
    return [_log_attempt(rows, i, state if i == newest else None) for i in range(newest + 1)]


def _controller_state(evidence: Evidence) -> str | None:
    if evidence.probes and evidence.probes.controller:
        return evidence.probes.controller.state
    return evidence.bundle.state


# --- progress of the newest attempt ----------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    newest_step: int | None  # newest finished or metric step of the newest log attempt
    resumed_step: int | None  # the checkpoint it resumed from (0 after a scratch start)
    prior_peak: int | None  # the highest step any earlier attempt reached
    quotes: tuple[Quote, ...]


def _max_step(frame: pl.DataFrame) -> int | None:
    values = frame["step"].drop_nulls() if not frame.is_empty() else pl.Series([], dtype=pl.Int64)
    return int(values.max()) if len(values) else None  # type: ignore[arg-type]


def _steps(logs: LogTables, keep: pl.Expr) -> int | None:
    finished = finished_steps(logs).filter(keep)
    metrics = logs.metrics.filter(keep)
    found = [s for s in (_max_step(finished), _max_step(metrics)) if s is not None]
    return max(found, default=None)


def _resume(logs: LogTables, attempt: int) -> tuple[int | None, tuple[Quote, ...]]:
    rows = logs.resumes.filter(
        (pl.col("attempt") == attempt) & pl.col("kind").is_in(["resumed", "scratch"])
    ).sort("line")
    if rows.is_empty():
        return None, ()
    last = rows.tail(1)
    step = last["step"][0] if last["kind"][0] == "resumed" else 0
    return (int(step) if step is not None else None), quote_rows(last)


def _progress(logs: LogTables | None) -> Progress:
    if logs is None:
        return Progress(None, None, None, ())
    attempt = newest_attempt(logs)
    resumed, quotes = _resume(logs, attempt)
    newest = _steps(logs, pl.col("attempt") == attempt)
    prior = _steps(logs, pl.col("attempt") < attempt)
    return Progress(newest, resumed, prior, quotes)


def _stepped_past(progress: Progress, need_peak: bool) -> bool:
    if progress.newest_step is None:
        return False
    baseline = progress.resumed_step if progress.resumed_step is not None else progress.prior_peak
    if baseline is not None and progress.newest_step <= baseline:
        return False
    peak = progress.prior_peak
    return not (need_peak and peak is not None and progress.newest_step <= peak)


# --- judging -----------------------------------------------------------------------------------


def _same_failure(failed: list[Attempt], known: bool) -> bool | None:
    if not known:
        return None
    if len(failed) < 2:
        return False
    signatures = {a.signature if a.specific else None for a in failed}
    if None in signatures:
        return None
    return len(signatures) == 1


def _retries_left(controller: ControllerView | None, failures: int) -> int | None:
    if controller is None or controller.max_retries_failure is None:
        return None
    used = controller.failure_count if controller.failure_count is not None else failures
    return max(0, controller.max_retries_failure - used)


def _signatures(attempts: list[Attempt]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a.signature for a in attempts if a.signature))


@dataclass(frozen=True)
class _Judgement:
    count: int
    failed: int
    transient: int
    same_failure: bool | None
    recovered: bool
    doomed: bool
    retries_left: int | None
    signatures: tuple[str, ...]


def _judge(evidence: Evidence, attempts: list[Attempt], progress: Progress) -> _Judgement:
    ended = [a for a in attempts if a.outcome in (Outcome.FAILED, Outcome.PREEMPTED, Outcome.ENDED)]
    hard = [a for a in ended if a.outcome is Outcome.FAILED and not a.transient]
    same = _same_failure(hard, known=True)
    alive = attempts[-1].outcome is Outcome.ALIVE
    recovered = bool(ended) and alive and _stepped_past(progress, need_peak=same is True)
    controller = evidence.probes.controller if evidence.probes else None
    failures = sum(a.outcome is Outcome.FAILED for a in ended)
    return _Judgement(
        count=len(ended),
        failed=len(hard),
        transient=len(ended) - len(hard),
        same_failure=same,
        recovered=recovered,
        doomed=same is True and not recovered,
        retries_left=_retries_left(controller, failures),
        signatures=_signatures([*hard, *ended]),  # the repeated one first
    )


def _budget_text(judgement: _Judgement, controller: ControllerView | None) -> str:
    if judgement.retries_left is None:
        return "retry budget unknown"
    budget = controller.max_retries_failure if controller else None
    return f"{judgement.retries_left} of {budget} failure retries left"


def _interpretation(
    judgement: _Judgement, attempts: list[Attempt], progress: Progress, evidence: Evidence
) -> str:
    controller = evidence.probes.controller if evidence.probes else None
    head = (
        f"{judgement.count} of {len(attempts)} attempt(s) ended in failure or preemption "
        f"({judgement.failed} failed, {judgement.transient} transient)"
    )
    if judgement.doomed:
        body = f"every failed attempt has the same signature `{judgement.signatures[0]}`: "
        body += "a deterministic crash loop (doomed)"
    elif judgement.recovered:
        start = "scratch" if progress.resumed_step == 0 else f"step {progress.resumed_step}"
        if progress.resumed_step is None:
            start = f"an unnamed checkpoint (earlier peak {progress.prior_peak})"
        body = (
            f"the newest attempt resumed from {start} and reached step "
            f"{progress.newest_step}: recovered from the earlier loss"
        )
    elif judgement.same_failure is None and judgement.failed >= 2:
        body = (
            "a failed attempt carries no specific signature (no error text, or only a generic "
            f"one such as `exit code N`: {_sig_list(judgement)}), so the attempts cannot be "
            "shown to repeat one failure"
        )
    elif judgement.count:
        sigs = "; ".join(f"`{s}`" for s in judgement.signatures) or "no error signature"
        body = f"signatures: {sigs}; the newest attempt has not yet stepped past its checkpoint"
    else:
        body = "no restart"
    return f"{head}; {body}; {_budget_text(judgement, controller)}."


def _sig_list(judgement: _Judgement) -> str:
    return "; ".join(f"`{s}`" for s in judgement.signatures) or "none"


def _flip(judgement: _Judgement, progress: Progress) -> str:
    peak = progress.prior_peak if progress.prior_peak is not None else progress.resumed_step
    past = f" past step {peak}" if peak is not None else ""
    if judgement.doomed:
        return (
            f"a new attempt that finishes a `Finished: 'step'`{past} without "
            f"`{judgement.signatures[0]}`, or an attempt ending with a different failure"
        )
    if judgement.signatures:
        return f"another attempt failing with `{judgement.signatures[-1]}`"
    return "an attempt ending in failure with the same signature as an earlier one"


def _controller_quote(controller: ControllerView) -> Quote:
    text = (
        f"state={controller.state} failure_count={controller.failure_count} "
        f"preemption_count={controller.preemption_count}"
    )
    if controller.max_retries_failure is not None:
        text += f" max_retries_failure={controller.max_retries_failure}"
    if controller.error:
        text += f" error={controller.error}"
    return quote(CONTROLLER_SOURCE, text)


def _from_attempts(evidence: Evidence, attempts: list[Attempt]) -> RestartsResult:
    progress = _progress(evidence.logs)
    judgement = _judge(evidence, attempts, progress)
    controller = evidence.probes.controller if evidence.probes else None
    quotes = [q for a in attempts if a.outcome is not Outcome.ALIVE for q in a.quotes]
    quotes += [_controller_quote(controller)] if controller else []
    quotes += list(progress.quotes) if judgement.recovered else []
    return RestartsResult(
        count=judgement.count,
        same_failure=judgement.same_failure,
        interpretation=_interpretation(judgement, attempts, progress, evidence),
        evidence=tuple(quotes[:10]),
        attempts=len(attempts),
        retries_left=judgement.retries_left,
        doomed=judgement.doomed,
        recovered=judgement.recovered,
        signatures=judgement.signatures,
        flip_signal=_flip(judgement, progress),
    )


def _from_controller(controller: ControllerView) -> RestartsResult | None:
    if controller.failure_count is None and controller.preemption_count is None:
        return None
    failures = controller.failure_count or 0
    count = failures + (controller.preemption_count or 0)
    signature = failure_signature(controller.error) if controller.error else None
    budget = _retries_left(controller, failures)
    return RestartsResult(
        count=count,
        same_failure=False if failures < 2 else None,
        interpretation=(
            f"{count} attempt(s) ended in failure or preemption by the controller's counters; "
            "the controller attempt history was not captured, so whether they share one failure "
            f"is unknown (newest error: {signature or 'none'}); "
            + (f"{budget} failure retries left." if budget is not None else "budget unknown.")
        ),
        evidence=(_controller_quote(controller),),
        retries_left=budget,
        signatures=(signature,) if signature else (),
        flip_signal="the controller attempt history showing two failed attempts with one signature",
    )


def _unknown() -> RestartsResult:
    return RestartsResult(
        count=None,
        same_failure=None,
        interpretation=(
            "unknown: the controller attempt history was not captured (no probes/attempts.json "
            "or controller counters) and the logs mark no attempt boundary."
        ),
        flip_signal="a captured attempt history showing two failed attempts with one signature",
    )


def check(evidence: Evidence) -> RestartsResult:
    """Count the attempts that ended badly and decide whether they repeat one failure."""
    attempts = _record_attempts(evidence) or _log_attempts(evidence)
    if attempts:
        return _from_attempts(evidence, attempts)
    controller = evidence.probes.controller if evidence.probes else None
    from_counters = _from_controller(controller) if controller else None
    return from_counters or _unknown()
