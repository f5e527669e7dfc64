"""The text report follows the procedure's template (docs/domain.md#the-procedure) line for line."""

from __future__ import annotations

from datetime import UTC, datetime

from reports.text import render_text
from shared.models import (
    Confidence,
    GateName,
    GateResult,
    GateStatus,
    KillProof,
    Mode,
    Quote,
    Report,
    RestartsResult,
    Verdict,
)

T = datetime(2026, 7, 30, 21, 15, tzinfo=UTC)
OOM = Quote(
    source="finelog.log",
    line=12,
    timestamp=datetime(2026, 7, 30, 20, 1, 2, tzinfo=UTC),
    text="torch.OutOfMemoryError: CUDA out of memory",
)
ATTEMPTS = Quote(source="probes/attempts.json", text="3 attempts failed")


def _report(**changes: object) -> Report:
    gates = {name: GateResult(status=GateStatus.PASS, summary="ok") for name in GateName}
    gates[GateName.RESOURCES] = GateResult(
        status=GateStatus.FAIL, summary="policy rank OOM", evidence=(OOM, ATTEMPTS)
    )
    gates[GateName.DYNAMICS] = GateResult(
        status=GateStatus.PASS, summary="plateau", details=("step | reward", "   9 | 0.5000")
    )
    gates[GateName.DUTY_CYCLE] = GateResult(status=GateStatus.NA, summary="N/A for standard runs")
    base: dict[str, object] = {
        "job_id": "/ops/rl-job",
        "captured_at": T,
        "evidence_dir": "jobs/cw/ops/rl-job",
        "verdict": Verdict.KILL,
        "confidence": Confidence.HIGH,
        "mode": Mode.STANDARD,
        "restarts": RestartsResult(count=3, same_failure=True, interpretation="same OOM x3"),
        "gates": gates,
        "reasoning": "OOM on every attempt.",
        "next_action": "Supervisor: kill the job.",
        "flip_signal": "an attempt that passes step 1",
        "kill_proof": KillProof(
            rule="crash_loop", mechanism="same OOM x3", established_at=T, evidence=(ATTEMPTS,)
        ),
    }
    merged = base | changes
    if merged["verdict"] is not Verdict.KILL:
        merged["kill_proof"] = None
    return Report.model_validate(merged)


def test_text_report_matches_the_template() -> None:
    """Header, verdict block, gate lines with the first quote inline, the rest indented."""
    assert render_text(_report()) == (
        "RL-JOB-HEALTH — /ops/rl-job — captured 2026-07-30T21:15:00Z at jobs/cw/ops/rl-job\n"
        "\n"
        "VERDICT: KILL\n"
        "CONFIDENCE: high\n"
        "MODE: standard\n"
        "RESTARTS: 3 — same OOM x3\n"
        "\n"
        "LIVENESS:  PASS — ok\n"
        'RESOURCES: FAIL — policy rank OOM — "torch.OutOfMemoryError: CUDA out of memory" '
        "(finelog.log:12, 2026-07-30T20:01:02Z)\n"
        '  "3 attempts failed" (probes/attempts.json)\n'
        "ROLLOUTS:  PASS — ok\n"
        "DYNAMICS:  PASS — plateau\n"
        "  step | reward\n"
        "     9 | 0.5000\n"
        "DUTY CYCLE: N/A — N/A for standard runs\n"
        "\n"
        "REASONING: OOM on every attempt.\n"
        "NEXT ACTION: Supervisor: kill the job.\n"
        "FLIP SIGNAL: an attempt that passes step 1\n"
    )


def test_unknown_restart_count_and_discrepancies() -> None:
    """An unknown restart count prints as unknown; discrepancies close the report."""
    text = render_text(
        _report(
            restarts=RestartsResult(count=None, same_failure=None, interpretation="not captured"),
            discrepancies=("pod_logs status says 4 pods; pod_logs/ holds none",),
            mode=Mode.UNDECLARED,
        )
    )
    assert "RESTARTS: unknown — not captured\n" in text
    assert "MODE: undeclared\n" in text
    assert text.endswith("DISCREPANCIES:\n  - pod_logs status says 4 pods; pod_logs/ holds none\n")
