"""The proof rules a KILL may rest on, and the checks `decide` runs on every proof before a KILL
may stand (docs/domain.md#what-established-means).

Every proof must name a known rule and a mechanism, carry quotes, and date nothing after `now`
(beyond the clock tolerance): evidence from the future is never proof. Each rule then adds the
checks that can be made from the evidence itself; the numeric conditions (persistence, window,
recovery) are the gates' and are pinned by the boundary corpus (`docs/verdict.md`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from shared.models import KillProof, RestartsResult
from shared.times import age_text, duration_text
from worker.evidence.case import Evidence
from worker.evidence.facts import CLOCK_TOLERANCE_S, PHASE, STEP
from worker.evidence.jobstate import JobState
from worker.evidence.roles import roles_of
from worker.gates.restarts import is_specific_signature
from worker.gates.stacks import rests_on_collective, stack_holes

__all__ = ["PROOF_RULES", "ProofRule", "crash_loop_check", "restarts_proof", "validate"]

Check = Callable[[KillProof, Evidence], str | None]


@dataclass(frozen=True)
class ProofRule:
    name: str
    gate: str
    learning_quality: bool
    meaning: str
    check: Check | None = None


def _is_stack(source: str) -> bool:
    return "stacks/" in source


def _stacks_live(proof: KillProof, evidence: Evidence) -> str | None:
    """Both dumps of each quoted process after the newest progress, fresh, of the current
    attempt, and no py-spy probe the proof needs failed (a failed dump of a helper or a native
    process is not a hole, nor, beside ranks parked in a collective, one of the driver)."""
    facts, limit = evidence.facts, evidence.thresholds.max_evidence_age_s
    dumps = [q for q in proof.evidence if _is_stack(q.source)]
    stamps = {q.timestamp for q in dumps if q.timestamp is not None}
    if len(stamps) < 2:
        return "the stall proof quotes fewer than two dumps taken at different times"
    newest = facts.newest()
    floor = evidence.now - timedelta(seconds=limit)
    for q in dumps:
        at = q.timestamp
        if at is None:
            return f"{q.source} has no time"
        if newest is not None and at <= newest.at:
            return f"{q.source} was taken at or before the newest progress ({newest.quote.text})"
        if at < floor:
            return f"{q.source} is older than MAX_EVIDENCE_AGE_S"
        if facts.attempt_started_at is not None and at < facts.attempt_started_at:
            return f"{q.source} was taken before the current attempt began"
    collective = proof.rule == "stall_stacks" and rests_on_collective(proof.mechanism)
    roles = roles_of(evidence.probes)
    failed = stack_holes(facts.failed("stacks"), roles, collective=collective)
    return f"a py-spy probe failed: {failed[0].text}" if failed else None


def _death_after_progress(proof: KillProof, evidence: Evidence) -> str | None:
    """No step or phase advanced after the death line."""
    newest = evidence.facts.newest(PHASE, STEP)
    if newest is not None and newest.at > proof.established_at:
        return f"the log advanced after the death ({newest.quote.text})"
    return None


def _log_quoted(proof: KillProof) -> bool:
    return any(q.line is not None and not _is_stack(q.source) for q in proof.evidence)


def _death_line(proof: KillProof, evidence: Evidence) -> str | None:
    """The death line is quoted, nothing advanced after it, and at least STALL_FLOOR_S of silence
    has passed since (the gate used the run's own limit, never less than the floor)."""
    if not _log_quoted(proof):
        return "no death line of a log is quoted"
    advanced = _death_after_progress(proof, evidence)
    if advanced is not None:
        return advanced
    silent = (evidence.now - proof.established_at).total_seconds()
    floor = evidence.thresholds.stall_floor_s
    if silent <= floor:
        return (
            f"only {duration_text(silent)} of silence since the death line "
            f"(STALL_FLOOR_S {duration_text(floor)})"
        )
    return None


def _configuration_over(proof: KillProof, evidence: Evidence) -> str | None:
    """A failure row is quoted, the job did not succeed, nothing advanced after the newest
    attempt's failure, and the attempt is over: a failed job, or STALL_FLOOR_S of silence."""
    state = evidence.facts.state
    if not _log_quoted(proof):
        return "no configuration failure line is quoted"
    if state is None or state is JobState.SUCCEEDED:
        return f"the job state is {state or 'unknown'}"
    advanced = _death_after_progress(proof, evidence)
    if advanced is not None:
        return advanced
    silent = (evidence.now - proof.established_at).total_seconds()
    if not state.failure and silent <= evidence.thresholds.stall_floor_s:
        return f"the newest attempt may still run ({state}, {age_text(silent)} since its failure)"
    return None


def _terminal(proof: KillProof, evidence: Evidence) -> str | None:
    """The job is in a failed terminal state."""
    state = evidence.facts.state
    if state is None or not state.failure:
        return f"the job state is {state or 'unknown'}, not a failure"
    return None


RULES: Final = (
    ProofRule("stall_stacks", "liveness", False, "two live dumps of each load-bearing process "
              "(ranks, driver, coordinator) parked in one collective or queue frame, no rank "
              "moving, quiet beyond the stall limit", _stacks_live),
    ProofRule("stall_still", "liveness", False, "every load-bearing process identical in two "
              "live dumps outside any collective, corroborated by silence, idle engines and no "
              "finished trial", _stacks_live),
    ProofRule("process_death", "liveness", False, "a death line after the newest advancement, "
              "silence past the stall limit since", _death_after_progress),
    ProofRule("logged_death", "liveness", False, "a death line of the trainer or of every "
              "inference engine after the newest advancement, silence past the stall limit "
              "since", _death_line),
    ProofRule("config_failure", "liveness", False, "a configuration-class failure (catalogue) "
              "that ended every attempt, the newest over", _configuration_over),
    ProofRule("terminal_failure", "liveness", False, "a failed job whose controller error and "
              "log error line are both quoted", _terminal),
    ProofRule("crash_loop", "restarts", False, "one specific signature on every failed attempt, "
              "the newest not past the earlier peak"),
    ProofRule("non_finite", "dynamics", False, "NaN/inf on each of the newest "
              "NON_FINITE_PERSIST_STEPS steps"),
    ProofRule("router_replay", "dynamics", False, "the broken router replay fingerprint on every "
              "window step"),
    ProofRule("zero_reward", "dynamics", False, "every reward exactly 0 from the first step "
              "through a full window"),
    ProofRule("cuda_fatal", "resources", False, "a CUDA fault whose component made no progress "
              "after it (death, failed job, or STALL_FLOOR_S of silence)"),
    ProofRule("systemic_trials", "rollouts", False, "SAME_CAUSE_SHARE of trials fail with one "
              "systemic cause (the reward signal invalid), the trainer corroborating: on zeros "
              "with every trial reward zero, or naming the exception on each window step"),
    ProofRule("one_turn", "rollouts", False, "median turns at or under ONE_TURN_MEDIAN over a "
              "window of trials"),
    ProofRule("reward_collapse", "dynamics", True, "reward under COLLAPSE_RATIO of its best "
              "window for a whole window, its trend not recovering"),
    ProofRule("entropy_collapse", "dynamics", True, "entropy under ENTROPY_COLLAPSE_RATIO of its "
              "early median on every window step, not recovering, reward not improving"),
    ProofRule("off_policy", "dynamics", True, "a TIS metric out of range on every window step, "
              "not trending back"),
    ProofRule("length_collapse", "rollouts", True, "response length under COLLAPSE_RATIO of its "
              "earlier median on every window step, not recovering"),
    ProofRule("trial_reward_collapse", "rollouts", True, "every newest window of trials under "
              "COLLAPSE_RATIO of the best window's mean reward, not recovering"),
)  # fmt: skip

PROOF_RULES: Final = {rule.name: rule for rule in RULES}


def validate(proof: KillProof | None, evidence: Evidence) -> str | None:
    """None when the proof may stand, else why it may not."""
    if proof is None:
        return "no proof"
    rule = PROOF_RULES.get(proof.rule)
    if rule is None:
        return f"unknown proof rule {proof.rule!r}"
    limit = evidence.now + timedelta(seconds=CLOCK_TOLERANCE_S)
    if proof.established_at > limit:
        return f"{proof.rule}: established after now ({proof.established_at.isoformat()})"
    late = next((q for q in proof.evidence if q.timestamp and q.timestamp > limit), None)
    if late is not None:
        return f"{proof.rule}: {late.source} is dated after now"
    why = rule.check(proof, evidence) if rule.check else None
    return f"{proof.rule}: {why}" if why else None


def restarts_proof(restarts: RestartsResult, evidence: Evidence) -> KillProof | None:
    """The crash-loop proof of a doomed restarts result: one specific signature repeated."""
    if not restarts.doomed or not restarts.signatures or not restarts.evidence:
        return None
    stamps = [q.timestamp for q in restarts.evidence if q.timestamp is not None]
    return KillProof(
        rule="crash_loop",
        mechanism=f"deterministic crash loop: `{restarts.signatures[0]}` on every failed attempt",
        established_at=max(stamps, default=evidence.now),
        evidence=restarts.evidence,
    )


def crash_loop_check(restarts: RestartsResult) -> str | None:
    """A crash loop needs same_failure on one specific signature."""
    if restarts.same_failure is not True or not restarts.signatures:
        return "crash_loop: the failed attempts do not share one signature"
    if not is_specific_signature(restarts.signatures[0]):
        return f"crash_loop: `{restarts.signatures[0]}` is no specific signature"
    return None
