"""The seed's verdict rules, ordered by the precedence rule of DOMAIN.md section 6.

1. Hard failure: a FAIL that establishes a hard failure with quoted evidence (the same crash on
   every attempt, a configuration that cannot parse, NaN weights, a stall proven by live stacks)
   gives KILL even when other gates lack evidence; those gaps are listed and lower the confidence.
2. Otherwise a core gate (liveness, resources, rollouts, dynamics) that lacks evidence or whose
   sources disagree gives ERROR. Missing evidence is never a conservative NO-KILL.
3. A learning-quality FAIL gives KILL only with the minimum window (the gate's job), a named
   mechanism, trainer and trial agreement where both exist, and no sign of recovery. A plateau alone
   never kills (the dynamics gate passes it). Without agreement the sources disagree: ERROR.
4. Other FAILs (a pipeline bubble, sandbox churn, starved engines) are inefficiencies, not death:
   NO-KILL with the handoff and the gate's flip signal.
5. Everything passes: NO-KILL; low confidence while the job is still initialising.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.models import (
    Confidence,
    GateName,
    GateResult,
    GateStatus,
    Handoff,
    Mode,
    Report,
    RestartsResult,
    Verdict,
)
from worker.evidence.model import Evidence
from worker.retention import retention_note

__all__ = ["CORE_GATES", "Decision", "decide"]

CORE_GATES: tuple[GateName, ...] = (
    GateName.LIVENESS,
    GateName.RESOURCES,
    GateName.ROLLOUTS,
    GateName.DYNAMICS,
)


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    confidence: Confidence
    reasoning: str
    next_action: str
    flip_signal: str
    handoff: Handoff | None = None


def _label(name: GateName) -> str:
    return name.value.replace("_", " ")


def _failing(gates: Mapping[GateName, GateResult], **flags: bool) -> list[GateName]:
    return [
        name
        for name, gate in gates.items()
        if gate.status is GateStatus.FAIL
        and all(getattr(gate, flag) == value for flag, value in flags.items())
    ]


def _gaps(gates: Mapping[GateName, GateResult], mode: Mode) -> list[GateName]:
    names = list(CORE_GATES)
    if mode is Mode.UNDECLARED:
        names.append(GateName.DUTY_CYCLE)
    return [name for name in names if gates[name].status is GateStatus.ERROR]


def _gap_text(gates: Mapping[GateName, GateResult], gaps: Sequence[GateName]) -> str:
    return "; ".join(f"{_label(name)}: {gates[name].summary}" for name in gaps)


def _first_handoff(
    gates: Mapping[GateName, GateResult], names: Sequence[GateName]
) -> Handoff | None:
    return next((gates[n].handoff for n in names if gates[n].handoff is not None), None)


def _hard_kill(
    restarts: RestartsResult, gates: Mapping[GateName, GateResult], mode: Mode
) -> Decision | None:
    hard = _failing(gates, hard_failure=True)
    if not hard and not restarts.doomed:
        return None
    causes = [f"{_label(n)}: {gates[n].mechanism or gates[n].summary}" for n in hard]
    if restarts.doomed:
        causes.insert(0, f"restarts: {restarts.interpretation}")
    gaps = _gaps(gates, mode)
    reasoning = "Hard failure established with quoted evidence — " + "; ".join(causes) + "."
    if gaps:
        reasoning += (
            f" Evidence gaps (they lower confidence, not the verdict): {_gap_text(gates, gaps)}."
        )
    flip = restarts.flip_signal if restarts.doomed and restarts.flip_signal else None
    flip = flip or next((gates[n].flip_signal for n in hard if gates[n].flip_signal), None)
    failing = [*hard, *(n for n in _failing(gates) if n not in hard)]
    action = next((gates[n].next_action for n in failing if gates[n].next_action), None)
    handoff = _first_handoff(gates, failing)
    return Decision(
        verdict=Verdict.KILL,
        confidence=Confidence.MEDIUM if gaps else Confidence.HIGH,
        reasoning=reasoning,
        next_action=action
        or "Supervisor: kill the job; relaunching unchanged repeats the failure.",
        flip_signal=flip
        or "evidence that the quoted failure is transient: a later attempt that advances past it",
        handoff=handoff,
    )


def _error(gates: Mapping[GateName, GateResult], mode: Mode) -> Decision | None:
    gaps = _gaps(gates, mode)
    if not gaps:
        return None
    missing = [m for name in gaps for m in gates[name].missing] or [_gap_text(gates, gaps)]
    return Decision(
        verdict=Verdict.ERROR,
        confidence=Confidence.LOW,
        reasoning=f"Required evidence is missing or sources disagree — {_gap_text(gates, gaps)}. "
        "Missing evidence is not a conservative NO-KILL.",
        next_action="Obtain the missing evidence, then re-diagnose: "
        + "; ".join(dict.fromkeys(missing)),
        flip_signal=next(
            (flip for n in gaps if (flip := gates[n].flip_signal)),
            "the missing evidence captured: " + "; ".join(dict.fromkeys(missing)),
        ),
    )


def _trial_agreement(gates: Mapping[GateName, GateResult], mode: Mode, lq: list[GateName]) -> bool:
    """Trainer and trial evidence agree: in agentic runs both rollouts and dynamics must fail."""
    if mode is not Mode.AGENTIC:
        return True
    return GateName.ROLLOUTS in lq or gates[GateName.ROLLOUTS].status is GateStatus.FAIL


def _learning_kill(gates: Mapping[GateName, GateResult], mode: Mode) -> Decision | None:
    lq = _failing(gates, learning_quality=True, hard_failure=False)
    if not lq:
        return None
    named = [n for n in lq if gates[n].mechanism]
    mechanisms = "; ".join(f"{_label(n)}: {gates[n].mechanism or gates[n].summary}" for n in lq)
    if not named:
        return Decision(
            verdict=Verdict.ERROR,
            confidence=Confidence.LOW,
            reasoning=f"A learning-quality concern without a named mechanism — {mechanisms}.",
            next_action="Attribute the anomaly to a mechanism before any action.",
            flip_signal=gates[lq[0]].flip_signal or "a named mechanism for the anomaly",
        )
    if not _trial_agreement(gates, mode, lq):
        return Decision(
            verdict=Verdict.ERROR,
            confidence=Confidence.LOW,
            reasoning=f"Trainer evidence shows {mechanisms}, but the trial outputs do not agree "
            f"(rollouts: {gates[GateName.ROLLOUTS].summary}); sources disagree without resolution.",
            next_action="Open a sample of recent trials and the trainer window side by side.",
            flip_signal="trial rewards and exceptions that show the same failure as the trainer",
        )
    return Decision(
        verdict=Verdict.KILL,
        confidence=Confidence.MEDIUM,
        reasoning=f"Learning-quality failure over the configured window with a named mechanism "
        f"and no sign of recovery — {mechanisms}.",
        next_action=next((gates[n].next_action for n in lq if gates[n].next_action), None)
        or "Supervisor: stop the run and relaunch from the last checkpoint before the collapse.",
        flip_signal=gates[lq[0]].flip_signal or "the metric recovering over a full window",
        handoff=_first_handoff(gates, lq),
    )


def _soft_fail(gates: Mapping[GateName, GateResult]) -> Decision | None:
    soft = _failing(gates, hard_failure=False, learning_quality=False)
    if not soft:
        return None
    issues = "; ".join(f"{_label(n)}: {gates[n].mechanism or gates[n].summary}" for n in soft)
    handoff = _first_handoff(gates, soft)
    action = next((gates[n].next_action for n in soft if gates[n].next_action), None)
    return Decision(
        verdict=Verdict.NO_KILL,
        confidence=Confidence.MEDIUM,
        reasoning=f"The job is alive and learning; the anomaly is an inefficiency, not death — "
        f"{issues}.",
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


def _healthy(gates: Mapping[GateName, GateResult]) -> Decision:
    liveness = gates[GateName.LIVENESS]
    initializing = [n for n, g in gates.items() if g.initializing]
    if initializing:
        reason = f"Still initialising — {liveness.summary}"
        confidence = Confidence.LOW
    else:
        reason = "All gates pass — " + "; ".join(
            f"{_label(n)}: {gates[n].summary}" for n in CORE_GATES
        )
        confidence = Confidence.HIGH
    return Decision(
        verdict=Verdict.NO_KILL,
        confidence=confidence,
        reasoning=reason + ".",
        next_action="Supervisor: no action; keep the job running.",
        flip_signal=liveness.flip_signal or "a hard failure or a stall in any gate",
    )


def _decision(
    evidence: Evidence, restarts: RestartsResult, gates: Mapping[GateName, GateResult]
) -> Decision:
    mode = evidence.mode.mode
    return (
        _hard_kill(restarts, gates, mode)
        or _error(gates, mode)
        or _learning_kill(gates, mode)
        or _soft_fail(gates)
        or _healthy(gates)
    )


def decide(
    evidence: Evidence,
    restarts: RestartsResult,
    gates: Mapping[GateName, GateResult],
    *,
    event_id: str | None = None,
    event_ids: Sequence[str] = (),
) -> Report:
    """Join the restarts result and the gate results into the report."""
    decision = _decision(evidence, restarts, gates)
    note = retention_note(evidence)
    reasoning = f"{decision.reasoning} {note}" if note else decision.reasoning
    return Report(
        job_id=evidence.job_id,
        event_id=event_id,
        event_ids=tuple(event_ids) or ((event_id,) if event_id else ()),
        captured_at=evidence.now,
        evidence_dir=evidence.job_dir,
        verdict=decision.verdict,
        confidence=decision.confidence,
        mode=evidence.mode.mode,
        restarts=restarts,
        gates=dict(gates),
        reasoning=reasoning,
        next_action=decision.next_action,
        flip_signal=decision.flip_signal,
        handoff=decision.handoff,
        discrepancies=evidence.discrepancies,
    )
