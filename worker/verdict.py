"""The procedure's verdict rules, ordered by the precedence rule of docs/domain.md#precedence. A
KILL is a proof the verdict checks; a blind spot is an ERROR.

0. Sources that disagree about which job this is (manifest vs directory vs probes) give ERROR.
1. Hard failure: a FAIL (or a doomed restarts result) whose proof passes `proofs.validate` gives
   KILL even when other gates lack evidence; those gaps are listed and lower the confidence. A
   hard FAIL whose proof does not pass becomes an ERROR of its gate, with the reason; an invalid
   crash-loop proof is dropped with the reason and the other rules decide (it may be NO-KILL).
2. Otherwise a core gate (liveness, resources, rollouts, dynamics) that is ERROR (evidence missing,
   a needed probe failed, sources disagree) gives ERROR. Missing evidence is never a conservative
   NO-KILL.
3. A learning-quality FAIL gives KILL only with a valid proof (the gate held it over the window
   and found no recovery for that mechanism), a named mechanism, and in agentic runs the trials
   agreeing by their evidence (`_agreement`): the rollouts gate failing on the same `kind`, or
   the trials finished over the trainer's window showing the same collapse — their rewards, their
   turn counts, or an exception the trainer's own per-step lines name
   (`worker.gates.rollouts.agreement`). Without agreement the sources disagree: ERROR. A plateau
   alone never kills (the dynamics gate passes it).
4. Other FAILs (a pipeline bubble, sandbox churn, starved engines, a survived OOM) are
   inefficiencies, not death: NO-KILL with the handoff and the gate's flip signal.
5. Everything passes: NO-KILL; low confidence while the job is still initialising; medium when
   inputs that are not load-bearing are missing (`GateResult.gaps`, a failed probe, a discrepancy).

Every KILL carries its `kill_proof` in the report (the contract's JSON report). A KILL of a job
that has already ended (the controller or the manifest says failed, killed, ...) says so in its
next action (`_for_ended_job`): there is nothing left to stop, the job must stay down, and
relaunching it unchanged repeats the failure — never "kill the job" beside a job that is gone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from shared.models import (
    Confidence,
    GateName,
    GateResult,
    GateStatus,
    Handoff,
    KillProof,
    Mode,
    Report,
    RestartsResult,
    Verdict,
    iso_utc,
)
from worker.evidence.case import Evidence
from worker.evidence.jobstate import JobState
from worker.gates.base import error
from worker.gates.proofs import PROOF_RULES, crash_loop_check, restarts_proof, validate
from worker.gates.rollouts.agreement import TrialSide, trial_agreement
from worker.retention import retention_note

__all__ = ["CORE_GATES", "Decision", "decide"]

CORE_GATES: tuple[GateName, ...] = (
    GateName.LIVENESS,
    GateName.RESOURCES,
    GateName.ROLLOUTS,
    GateName.DYNAMICS,
)

Gates = Mapping[GateName, GateResult]


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    confidence: Confidence
    reasoning: str
    next_action: str
    flip_signal: str
    handoff: Handoff | None = None
    proof: KillProof | None = None


@dataclass(frozen=True)
class Judging:
    """What the rules read: the evidence, the gates (invalid proofs already demoted), the restarts
    result, the reasons proofs were refused, and the inputs missing without being load-bearing."""

    evidence: Evidence
    restarts: RestartsResult
    gates: Gates
    refused: tuple[str, ...] = ()
    soft_gaps: tuple[str, ...] = field(default=())

    @property
    def mode(self) -> Mode:
        return self.evidence.mode.mode


def _label(name: GateName) -> str:
    return name.value.replace("_", " ")


def _failing(gates: Gates, **flags: bool) -> list[GateName]:
    return [
        name
        for name, gate in gates.items()
        if gate.status is GateStatus.FAIL
        and all(getattr(gate, flag) == value for flag, value in flags.items())
    ]


def _gaps(gates: Gates, mode: Mode) -> list[GateName]:
    names = list(CORE_GATES)
    if mode is Mode.UNDECLARED:
        names.append(GateName.DUTY_CYCLE)
    return [name for name in names if gates[name].status is GateStatus.ERROR]


def _gap_text(gates: Gates, gaps: Sequence[GateName]) -> str:
    return "; ".join(f"{_label(name)}: {gates[name].summary}" for name in gaps)


def _first_handoff(gates: Gates, names: Sequence[GateName]) -> Handoff | None:
    return next((gates[n].handoff for n in names if gates[n].handoff is not None), None)


def _proof_text(proof: KillProof) -> str:
    return (
        f" Kill proof: rule `{proof.rule}` ({PROOF_RULES[proof.rule].meaning}), established "
        f"{iso_utc(proof.established_at)}, {len(proof.evidence)} quote(s)."
    )


# --- proofs --------------------------------------------------------------------------------------


def _demote(gate: GateResult, why: str) -> GateResult:
    """A hard FAIL whose proof does not stand becomes an ERROR of its gate, saying why."""
    return error(
        f"{gate.summary} — not established: {why}",
        missing=(f"a valid proof ({why})",),
        evidence=gate.evidence,
        details=gate.details,
        tables=gate.tables,
        next_action=gate.next_action,
        flip_signal=gate.flip_signal,
    )


def _checked(evidence: Evidence, restarts: RestartsResult, gates: Gates) -> Judging:
    """Validate every proposed proof; demote the gates whose proofs fail and say why."""
    checked, refused = dict(gates), []
    for name, gate in gates.items():
        if gate.status is not GateStatus.FAIL or (gate.proof is None and not gate.hard_failure):
            continue
        why = validate(gate.proof, evidence)
        if why is not None:
            refused.append(f"{_label(name)} proof refused: {why}")
            checked[name] = _demote(gate, why)
    if restarts.doomed:
        why = crash_loop_check(restarts) or validate(restarts_proof(restarts, evidence), evidence)
        if why is not None:
            refused.append(f"restarts proof refused: {why}")
            restarts = restarts.model_copy(update={"doomed": False})
    return Judging(evidence, restarts, checked, tuple(refused), _soft_gaps(evidence, checked))


def _soft_gaps(evidence: Evidence, gates: Gates) -> tuple[str, ...]:
    """Inputs missing without being load-bearing: they lower the confidence."""
    found = [f"{_label(n)}: {gap}" for n, g in gates.items() for gap in g.gaps]
    found += [f"probe failed: {f.text}" for f in evidence.facts.probe_failures]
    found += list(evidence.facts.discrepancies())
    return tuple(dict.fromkeys(found))


# --- the rules -----------------------------------------------------------------------------------


def _identity(j: Judging) -> Decision | None:
    """Sources that disagree about which job this is: nothing may be said about it."""
    identity = j.evidence.facts.identity
    if identity is None:
        return None
    return Decision(
        verdict=Verdict.ERROR,
        confidence=Confidence.LOW,
        reasoning=f"Authoritative sources disagree and no rule resolves it — {identity}.",
        next_action="Check which job the bundle and the probes belong to, then re-diagnose.",
        flip_signal="a manifest, a directory and probes that name the same job",
    )


def _hard_kill(j: Judging) -> Decision | None:
    hard = _failing(j.gates, hard_failure=True)
    doomed = restarts_proof(j.restarts, j.evidence) if j.restarts.doomed else None
    if not hard and doomed is None:
        return None
    proof = doomed or j.gates[hard[0]].proof
    assert proof is not None
    causes = [f"{_label(n)}: {j.gates[n].mechanism or j.gates[n].summary}" for n in hard]
    if doomed is not None:
        causes.insert(0, f"restarts: {j.restarts.interpretation}")
    gaps = _gaps(j.gates, j.mode)
    reasoning = "Hard failure established with quoted evidence — " + "; ".join(causes) + "."
    listed = [_gap_text(j.gates, gaps)] if gaps else []
    listed += j.soft_gaps
    if listed:
        reasoning += (
            f" Evidence gaps (they lower confidence, not the verdict): {'; '.join(listed)}."
        )
    flip = j.restarts.flip_signal if doomed is not None and j.restarts.flip_signal else None
    flip = flip or next((j.gates[n].flip_signal for n in hard if j.gates[n].flip_signal), None)
    failing = [*hard, *(n for n in _failing(j.gates) if n not in hard)]
    action = next((j.gates[n].next_action for n in failing if j.gates[n].next_action), None)
    return Decision(
        verdict=Verdict.KILL,
        confidence=Confidence.MEDIUM if gaps or j.soft_gaps else Confidence.HIGH,
        reasoning=reasoning + _proof_text(proof),
        next_action=action
        or "Supervisor: kill the job; relaunching unchanged repeats the failure.",
        flip_signal=flip
        or "evidence that the quoted failure is transient: a later attempt that advances past it",
        handoff=_first_handoff(j.gates, failing),
        proof=proof,
    )


def _error(j: Judging) -> Decision | None:
    gaps = _gaps(j.gates, j.mode)
    if not gaps:
        return None
    missing = [m for name in gaps for m in j.gates[name].missing] or [_gap_text(j.gates, gaps)]
    return Decision(
        verdict=Verdict.ERROR,
        confidence=Confidence.LOW,
        reasoning=f"Required evidence is missing or sources disagree — {_gap_text(j.gates, gaps)}. "
        "Missing evidence is not a conservative NO-KILL.",
        next_action="Obtain the missing evidence, then re-diagnose: "
        + "; ".join(dict.fromkeys(missing)),
        flip_signal=next(
            (flip for n in gaps if (flip := j.gates[n].flip_signal)),
            "the missing evidence captured: " + "; ".join(dict.fromkeys(missing)),
        ),
        # a gate may see a cause that needs a change before it can establish it (a configuration
        # death not yet over): its owner gets the handoff now
        handoff=_first_handoff(j.gates, gaps),
    )


def _disagreement(j: Judging, mechanisms: str, trials: str) -> Decision:
    return Decision(
        verdict=Verdict.ERROR,
        confidence=Confidence.LOW,
        reasoning=f"Learning-quality evidence — {mechanisms} — is not matched by the other side "
        f"on the same mechanism (trials: {trials}; rollouts: "
        f"{j.gates[GateName.ROLLOUTS].summary}; dynamics: {j.gates[GateName.DYNAMICS].summary}); "
        "sources disagree without resolution.",
        next_action="Open a sample of recent trials and the trainer window side by side.",
        flip_signal="trial rewards, turn counts or exceptions over the trainer's window that show "
        "the same failure as the trainer",
    )


def _agreement(j: Judging, mechanisms: str, lq: list[GateName]) -> Decision | TrialSide | None:
    """Agentic runs: a trainer-side learning-quality failure needs the trials to agree by their
    evidence, not by a gate label — the hypothesis being that one mechanism leaves the same mark
    on both sides over the same window. They agree when the rollouts gate fails on the same
    `kind`, or when the trials finished over the trainer's window show it (their rewards
    collapsing the same way, their turn counts collapsing, an exception the trainer's per-step
    lines name: `trial_agreement`), even if no trial raised. Trials healthy over the window while
    the trainer collapses, too few of them, or a trial-side failure alone with the trainer
    passing: the sources disagree (a Decision, ERROR). Standard runs: None."""
    if j.mode is not Mode.AGENTIC:
        return None
    trainer = [n for n in lq if n is not GateName.ROLLOUTS]
    rollouts = j.gates[GateName.ROLLOUTS]
    if not trainer:
        return _disagreement(j, mechanisms, "the trainer side does not fail")
    if rollouts.status is GateStatus.FAIL and rollouts.kind in {j.gates[n].kind for n in trainer}:
        return TrialSide(True, f"the rollouts gate fails on the same mechanism ({rollouts.kind})")
    side = trial_agreement(j.evidence, j.gates[trainer[0]].kind)
    return side if side.agrees else _disagreement(j, mechanisms, side.sign)


def _with_trials(proof: KillProof, side: TrialSide | None) -> KillProof:
    """The trainer's proof, quoting the trial evidence that agrees with it too."""
    if side is None or not side.quotes:
        return proof
    quotes = tuple(dict.fromkeys((*proof.evidence, *side.quotes)))
    return proof.model_copy(update={"evidence": quotes})


def _learning_kill(j: Judging) -> Decision | None:
    lq = _failing(j.gates, learning_quality=True, hard_failure=False)
    if not lq:
        return None
    mechanisms = "; ".join(f"{_label(n)}: {j.gates[n].mechanism or j.gates[n].summary}" for n in lq)
    unnamed = [n for n in lq if not j.gates[n].mechanism or j.gates[n].proof is None]
    if unnamed:
        return Decision(
            verdict=Verdict.ERROR,
            confidence=Confidence.LOW,
            reasoning=f"A learning-quality concern without a named mechanism and its proof — "
            f"{mechanisms}.",
            next_action="Attribute the anomaly to a mechanism before any action.",
            flip_signal=j.gates[lq[0]].flip_signal or "a named mechanism for the anomaly",
        )
    agreed = _agreement(j, mechanisms, lq)
    if isinstance(agreed, Decision):
        return agreed
    trainer_proof = j.gates[lq[0]].proof
    assert trainer_proof is not None
    proof = _with_trials(trainer_proof, agreed)
    trials = f" The trials agree over the same window: {agreed.sign}." if agreed else ""
    return Decision(
        verdict=Verdict.KILL,
        confidence=Confidence.MEDIUM,
        reasoning=f"Learning-quality failure held over the configured window of "
        f"{j.evidence.thresholds.min_window_steps} steps, with a named mechanism and no recovery "
        f"of that mechanism's signal in the newest steps — {mechanisms}.{trials}"
        + _proof_text(proof),
        next_action=next((j.gates[n].next_action for n in lq if j.gates[n].next_action), None)
        or "Supervisor: stop the run and relaunch from the last checkpoint before the collapse.",
        flip_signal=j.gates[lq[0]].flip_signal or "the metric recovering over a full window",
        handoff=_first_handoff(j.gates, [*lq, GateName.ROLLOUTS]),
        proof=proof,
    )


def _soft_fail(j: Judging) -> Decision | None:
    soft = _failing(j.gates, hard_failure=False, learning_quality=False)
    if not soft:
        return None
    gates = j.gates
    issues = "; ".join(f"{_label(n)}: {gates[n].mechanism or gates[n].summary}" for n in soft)
    handoff = _first_handoff(gates, soft)
    action = next((gates[n].next_action for n in soft if gates[n].next_action), None)
    invalid = any((gates[n].kind or "").startswith("systemic_") for n in soft)
    lead = (
        "The job is alive; its trials say the reward signal is invalid, which the trainer's side "
        "does not corroborate yet (no KILL without it)"
        if invalid
        else "The job is alive and learning; the anomaly is an inefficiency, not death"
    )
    return Decision(
        verdict=Verdict.NO_KILL,
        confidence=Confidence.MEDIUM,
        reasoning=f"{lead} — {issues}.{_soft_gap_text(j)}",
        next_action=action
        or (
            "Implementation handoff (below); keep the job running."
            if handoff
            else "Keep running; attribute the anomaly."
        ),
        flip_signal=gates[soft[0]].flip_signal
        or gates[GateName.LIVENESS].flip_signal
        or "a hard failure in any gate",
        handoff=handoff,
    )


def _soft_gap_text(j: Judging) -> str:
    if not j.soft_gaps:
        return ""
    return f" Not load-bearing, but missing or disputed: {'; '.join(j.soft_gaps)}."


def _healthy(j: Judging) -> Decision:
    gates = j.gates
    liveness = gates[GateName.LIVENESS]
    initializing = [n for n, g in gates.items() if g.initializing]
    if initializing:
        reason = f"Still initialising — {liveness.summary}"
        confidence = Confidence.LOW
    else:
        reason = "All gates pass — " + "; ".join(
            f"{_label(n)}: {gates[n].summary}" for n in CORE_GATES
        )
        confidence = Confidence.MEDIUM if j.soft_gaps else Confidence.HIGH
    return Decision(
        verdict=Verdict.NO_KILL,
        confidence=confidence,
        reasoning=reason + "." + _soft_gap_text(j),
        next_action="Supervisor: no action; keep the job running.",
        flip_signal=liveness.flip_signal or "a hard failure or a stall in any gate",
    )


def _decision(j: Judging) -> Decision:
    return (
        _identity(j)
        or _hard_kill(j)
        or _error(j)
        or _learning_kill(j)
        or _soft_fail(j)
        or _healthy(j)
    )


def _with_refusals(decision: Decision, refused: tuple[str, ...]) -> Decision:
    if not refused:
        return decision
    note = " Proofs refused: " + "; ".join(refused) + "."
    return replace(decision, reasoning=decision.reasoning + note)


_KILL_WORDS: tuple[str, ...] = ("supervisor: kill", "kill the job", "kill:", "no job action")


def _for_ended_job(decision: Decision, state: JobState | None) -> Decision:
    """A KILL of a job that has already ended reads as what it is. Hypothesis: the supervisor
    acts on NEXT ACTION; for a job already gone the action left is to keep it down and fix the
    cause, so an instruction to kill it (or "no job action" beside VERDICT: KILL) misleads. A
    gate's advice that is not an instruction to kill is kept after the new opening."""
    if decision.verdict is not Verdict.KILL or state is None or not state.terminal:
        return decision
    ended = f"Nothing left to stop: the job has already ended ({state}). Keep it down"
    advice = decision.next_action.strip()
    if any(word in advice.lower() for word in _KILL_WORDS):
        cause = "the cause in the handoff" if decision.handoff else "the cause quoted above"
        action = f"{ended}: relaunching it unchanged repeats the failure; fix {cause} first."
    else:
        action = f"{ended} until this is done: {advice}"
    reasoning = f"The job has already ended ({state}). {decision.reasoning}"
    return replace(decision, next_action=action, reasoning=reasoning)


def decide(
    evidence: Evidence,
    restarts: RestartsResult,
    gates: Gates,
    *,
    event_id: str | None = None,
    event_ids: Sequence[str] = (),
) -> Report:
    """Join the restarts result and the gate results into the report; a KILL carries its proof."""
    judging = _checked(evidence, restarts, gates)
    decision = _with_refusals(_decision(judging), judging.refused)
    decision = _for_ended_job(decision, evidence.facts.state)
    note = retention_note(evidence)
    reasoning = f"{decision.reasoning} {note}" if note else decision.reasoning
    discrepancies = (*evidence.discrepancies, *evidence.facts.discrepancies(), *judging.refused)
    return Report(
        job_id=evidence.job_id,
        event_id=event_id,
        event_ids=tuple(event_ids) or ((event_id,) if event_id else ()),
        captured_at=evidence.now,
        evidence_dir=evidence.job_dir,
        verdict=decision.verdict,
        confidence=decision.confidence,
        mode=evidence.mode.mode,
        restarts=judging.restarts,
        gates=dict(judging.gates),
        reasoning=reasoning,
        next_action=decision.next_action,
        flip_signal=decision.flip_signal,
        handoff=decision.handoff,
        discrepancies=tuple(dict.fromkeys(discrepancies)),
        kill_proof=decision.proof if decision.verdict is Verdict.KILL else None,
        inputs=evidence.inputs,
    )
