"""The verdicts of the corpus do not hinge on incidental properties of a bundle: file mtimes (a
fresh checkout, or an old copy) and the watcher generation that wrote the manifest."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.scenarios.catalog import SCENARIOS, Built, Scenario
from worker.diagnosis import diagnose


def _touch_now(built: Built) -> None:
    for path in built.job_dir.rglob("*"):
        os.utime(path, None)


def _touch_three_days_old(built: Built) -> None:
    stamp = built.now.timestamp() - 3 * 86400
    for path in built.job_dir.rglob("*"):
        os.utime(path, (stamp, stamp))


def _oldest_generation(built: Built) -> None:
    path = built.job_dir / "manifest.json"
    data = json.loads(path.read_text())
    data["job"].pop("task_state", None)
    data["job"].pop("finished_at_ms", None)
    artifacts = data["artifacts"]
    artifacts.pop("trace_selected", None)
    if str(artifacts.get("traces", "")).startswith("fleet"):
        n = artifacts.get("trace_completed", 0)
        artifacts["traces"] = f"newest {n}/{n} traces; {n} copied, 0 skipped"
    path.write_text(json.dumps(data))


VARIANTS: dict[str, Callable[[Built], None]] = {
    "mtime-now": _touch_now,
    "mtime-3-days-old": _touch_three_days_old,
    "oldest-manifest": _oldest_generation,
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_verdict_survives_variant(scenario: Scenario, variant: str, tmp_path: Path) -> None:
    """The verdict and every gate status are those of the unaltered scenario."""
    built = scenario.build(tmp_path)
    VARIANTS[variant](built)
    report = diagnose(built.job_dir, now=built.now, probes_dir=built.probes)
    statuses = {name.value: gate.status.value for name, gate in report.gates.items()}
    assert (report.verdict.value, statuses) == (scenario.verdict, scenario.gates)
