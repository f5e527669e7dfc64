"""Resources gate: policy ranks and inference ranks, judged apart, never averaged.

Three kinds of rule, each with its hypothesis in its docstring: `cuda` (an OOM or CUDA error of the
newest attempt, hard only when the component that hit it made no progress afterwards), `wedge`
(an engine that holds requests and runs none while its /health stays 200; one that fails to start
again and again) and `saturation` (the inference engines by the tuple over a window: saturated,
busy, swinging, starved, or quiet while the trainer trains). Failed engine starts of the newest
attempt are always stated. See `docs/gates/resources.md` for the rules and thresholds.

- FAIL (hard, proof `cuda_fatal`) — a CUDA fault whose component died after it (a death line or a
  failed/killed job) or made no progress for STALL_FLOOR_S; the summary names the component.
- FAIL (not hard) — a CUDA fault the component survived (the report names who progressed after
  it), or one that ended the previous attempt when the newest stepped past its resume point (the
  report names both attempts); a wedged engine; an engine restart loop; starvation.
- ERROR — every engine wedged and nothing advancing (a stall needs live stacks); a CUDA fault less
  than STALL_FLOOR_S old with nothing after it yet; no engine stat lines
  and no `vllm/*` metrics covering the engine tuple over a window (GPU probes alone are
  point-in-time); every engine too sparse; quiet engines while nothing says what the trainer does.
- PASS — engines saturated, busy or swinging (benign backpressure); quiet engines while the trainer
  trains; the tuple logged as `vllm/*` metrics over a window; initialising.
"""

from __future__ import annotations

import polars as pl

from shared.models import GateResult
from shared.times import duration_text
from worker.evidence.case import Evidence
from worker.evidence.facts import ENGINE_LINE
from worker.gates import engines as eng
from worker.gates.resources import cuda, saturation, wedge
from worker.gates.resources.saturation import (
    DOMINANT_SHARE,
    MISSING_TELEMETRY,
    buffer_wait_share,
    trainer_wait,
)

__all__ = ["DOMINANT_SHARE", "MISSING_TELEMETRY", "buffer_wait_share", "check", "trainer_wait"]


def check(evidence: Evidence) -> GateResult:
    """Judge policy and inference ranks of the newest attempt as of `evidence.now`."""
    failures = wedge.start_failures(evidence)
    fault = cuda.check(evidence)
    if fault is not None:
        return wedge.with_start_failures(fault, failures)
    horizon = wedge.log_horizon(evidence)
    states = saturation.fleet_states(evidence, horizon)
    wedges = _wedges(evidence, horizon)
    found = wedge.check(evidence, states, wedges, failures) or saturation.check(evidence, states)
    return _with_future_lines(wedge.with_start_failures(found, failures), evidence)


def _with_future_lines(result: GateResult, evidence: Evidence) -> GateResult:
    """`result` saying that engine stat lines dated after `now` were not counted (a node clock
    ahead: the discrepancy is also listed in the report)."""
    ahead = [m for m in evidence.facts.future if m.kind == ENGINE_LINE]
    if not ahead:
        return result
    lead = (ahead[0].at - evidence.now).total_seconds()
    note = (
        f"; engine stat lines dated up to {duration_text(lead)} after now "
        f"({ahead[0].quote.source}) "
        "not counted: the engine's clock runs ahead"
    )
    return result.model_copy(update={"summary": result.summary + note})


def _wedges(evidence: Evidence, horizon: pl.Expr | None) -> pl.DataFrame:
    logs = evidence.logs
    if logs is None:
        return pl.DataFrame()
    attempt = logs.engines.filter(pl.col("attempt") == evidence.facts.newest_attempt)
    return eng.engine_wedges(attempt, evidence.now, evidence.thresholds, horizon)
