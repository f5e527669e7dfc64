"""A CUDA fault of an inference engine is judged by the inference side as a whole: one engine of
several lost, silent since, is no proof (the same reason one engine's death line is none); the
only engine, or every engine dead, is the `cuda_fatal` hard failure."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest

from shared.models import GateStatus
from tests import factories as f
from worker.evidence.logs.job import parse_job_logs
from worker.gates import resources

STAT = (
    "(AsyncVLLMInferenceEngine pid={pid}, ip=10.0.0.{ip}) INFO 04-30 10:{minute:02d}:05 "
    "[loggers.py:248] Engine 000: Avg prompt throughput: 1200.0 tokens/s, Avg generation "
    "throughput: {gen} tokens/s, Running: {running} reqs, Waiting: 0 reqs, GPU KV cache usage: "
    "{kv}%, Prefix cache hit rate: 41.2%"
)
# tests/fixtures/real_failures/vllm.toml (vllm-project/vllm#17276) and a CUDA error before it
FAULT = (
    "(AsyncVLLMInferenceEngine pid=1000, ip=10.0.0.1) ERROR 04-30 10:10:30 [core.py:398] "
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "(AsyncVLLMInferenceEngine pid=1000, ip=10.0.0.1) ERROR 04-30 10:10:30 [core.py:398] "
    "EngineCore encountered a fatal error.",
)


def _judge(tmp_path: Path, engines: int) -> Any:
    """Engines busy for ten minutes; engine 1000 faults at 10:10:30; the others log one idle
    interval (0 tok/s, nothing running) and fall silent; judged at 10:40."""
    lines = []
    for minute in range(10):
        for n in range(engines):
            lines.append(
                STAT.format(pid=1000 + n, ip=n + 1, minute=minute, gen=2450.0, running=48, kv=46.0)
            )
    lines += FAULT
    for n in range(1, engines):
        lines.append(STAT.format(pid=1000 + n, ip=n + 1, minute=11, gen=0.0, running=0, kv=0.0))
    (tmp_path / "finelog.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tables = parse_job_logs(tmp_path, reference_date=date(2026, 4, 30))
    assert tables is not None
    now = datetime(2026, 4, 30, 10, 40, tzinfo=UTC)
    return resources.check(f.evidence(log_tables=tables, now=now))


@pytest.mark.parametrize(
    ("engines", "status", "hard"), [(1, GateStatus.FAIL, True), (2, GateStatus.ERROR, False)]
)
def test_one_engine_of_several_lost_is_no_proof(
    tmp_path: Path, engines: int, status: GateStatus, hard: bool
) -> None:
    """The only engine faulting and silent 30 min is `cuda_fatal`; one engine of two is ERROR
    asking for stacks, never a KILL proof."""
    result = _judge(tmp_path, engines)
    assert result.status is status, result.summary
    assert result.hard_failure is hard
    if not hard:
        assert "one engine of 2" in result.summary
