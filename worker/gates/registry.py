"""The ordered gates the diagnosis runs.

`GATES` is the ordered mapping the diagnosis runs (the chord's members in the pipeline);
`check_restarts` is reported on its own, as the procedure asks (docs/domain.md#the-procedure).
"""

from __future__ import annotations

from types import MappingProxyType

from shared.models import GateName, RestartsResult
from worker.evidence.case import Evidence
from worker.gates import duty_cycle, dynamics, liveness, resources, restarts, rollouts
from worker.gates.base import GateCheck

__all__ = ["GATES", "check_restarts"]

GATES: MappingProxyType[GateName, GateCheck] = MappingProxyType(
    {
        GateName.LIVENESS: liveness.check,
        GateName.RESOURCES: resources.check,
        GateName.ROLLOUTS: rollouts.check,
        GateName.DYNAMICS: dynamics.check,
        GateName.DUTY_CYCLE: duty_cycle.check,
    }
)


def check_restarts(evidence: Evidence) -> RestartsResult:
    """The restarts gate; a failure inside it becomes an 'unknown' interpretation, never a raise."""
    try:
        return restarts.check(evidence)
    except Exception as exc:
        return RestartsResult(
            count=None,
            same_failure=None,
            interpretation=f"restarts could not be judged: {type(exc).__name__}: {exc}",
        )
