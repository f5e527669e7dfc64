"""Rollouts gate: are the rollouts the trainer learns from real? Mode-specific.

`agentic` opens the finished trial results (rewards, exceptions, turns) and, for agreement, the
trainer's batch lines and reward metrics; `standard` reads the trainer's reward and generation
metrics and verifier exceptions. Each rule states its hypothesis in its docstring; see
`docs/gates/rollouts.md` for the table of rules and thresholds.

Undeclared mode (no entrypoint and no explicit mode) is ERROR with missing "declared mode".
"""

from __future__ import annotations

from shared.models import GateResult, Mode
from worker.evidence.case import Evidence
from worker.evidence.quotes import quote
from worker.gates.base import error
from worker.gates.rollouts import agentic, standard
from worker.gates.rollouts.agentic import CAUSES, SANDBOX, cause_expr, cause_of

__all__ = ["CAUSES", "SANDBOX", "cause_expr", "cause_of", "check", "undeclared"]


def check(evidence: Evidence) -> GateResult:
    """Judge the rollouts of the declared mode as of `evidence.now`."""
    mode = evidence.mode.mode
    if mode is Mode.UNDECLARED:
        return undeclared("rollouts", evidence)
    if mode is Mode.AGENTIC:
        return agentic.check(evidence)
    return standard.check(evidence)


def undeclared(gate: str, evidence: Evidence) -> GateResult:
    """The ERROR a mode-specific gate returns when the mode was never declared."""
    return error(
        f"{gate} not judged: mode undeclared (no entrypoint and no explicit mode)",
        missing=("declared mode",),
        evidence=(
            quote("manifest.json", f"job.entrypoint: {evidence.bundle.entrypoint or 'absent'}"),
        ),
    )
