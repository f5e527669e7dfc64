"""Resources gate: policy ranks and inference ranks, judged apart, never averaged.

Two kinds of rule, each with its hypothesis in its docstring: `cuda` (an OOM or CUDA error of the
newest attempt, hard only when the component that hit it made no progress afterwards) and
`saturation` (the inference engines by the tuple over a window: saturated, busy, swinging, starved,
or quiet while the trainer trains). See `docs/gates/resources.md` for the rules and thresholds.

- FAIL (hard, proof `cuda_fatal`) — a CUDA fault whose component died after it (a death line or a
  failed/killed job) or made no progress for STALL_FLOOR_S; the summary names the component.
- FAIL (not hard) — a CUDA fault the component survived (the report names who progressed after
  it), or one that ended the previous attempt when the newest stepped past its resume point (the
  report names both attempts); starvation.
- ERROR — a CUDA fault less than STALL_FLOOR_S old with nothing after it yet; no engine stat lines
  and no `vllm/*` metrics covering the engine tuple over a window (GPU probes alone are
  point-in-time); every engine too sparse; quiet engines while nothing says what the trainer does.
- PASS — engines saturated, busy or swinging (benign backpressure); quiet engines while the trainer
  trains; the tuple logged as `vllm/*` metrics over a window; initialising.
"""

from __future__ import annotations

from shared.models import GateResult
from worker.evidence.model import Evidence
from worker.gates.resources import cuda, saturation
from worker.gates.resources.saturation import (
    DOMINANT_SHARE,
    MISSING_TELEMETRY,
    buffer_wait_share,
    trainer_wait,
)

__all__ = ["DOMINANT_SHARE", "MISSING_TELEMETRY", "buffer_wait_share", "check", "trainer_wait"]


def check(evidence: Evidence) -> GateResult:
    """Judge policy and inference ranks of the newest attempt as of `evidence.now`."""
    return cuda.check(evidence) or saturation.check(evidence)
