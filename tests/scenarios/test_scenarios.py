"""Table-driven: every scenario of the corpus gives its expected verdict and gate statuses, in
text and JSON, and every FAIL and ERROR quotes its evidence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reports.json_report import render_json
from reports.text import render_text
from shared.models import GateStatus, Report
from tests.scenarios.catalog import SCENARIOS, Scenario
from worker.diagnosis import diagnose

LABELS = {
    "liveness": "LIVENESS:  ",
    "resources": "RESOURCES: ",
    "rollouts": "ROLLOUTS:  ",
    "dynamics": "DYNAMICS:  ",
    "duty_cycle": "DUTY CYCLE: ",
}


def _diagnose(scenario: Scenario, tmp_path: Path) -> Report:
    built = scenario.build(tmp_path)
    return diagnose(built.job_dir, now=built.now, probes_dir=built.probes)


def _assert_quotes(report: Report) -> None:
    for name, gate in report.gates.items():
        if gate.status in (GateStatus.FAIL, GateStatus.ERROR):
            assert gate.evidence, f"{name} {gate.status} quotes no evidence: {gate.summary}"
            assert all(q.source for q in gate.evidence)
        if gate.status is GateStatus.FAIL:
            # log and stack quotes carry their line; JSON artifacts (trial results, probe files)
            # are quoted by path
            lines = [q for q in gate.evidence if q.source.endswith((".log", ".txt", ".out"))]
            assert all(q.line is not None for q in lines), (
                f"{name} quotes a log line without a line"
            )
            assert lines or all(q.source.endswith(".json") for q in gate.evidence)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_scenario(scenario: Scenario, tmp_path: Path) -> None:
    """The scenario's verdict and gate statuses match, in the JSON and the text report alike."""
    report = _diagnose(scenario, tmp_path)
    text = render_text(report)
    body = json.loads(render_json(report))
    statuses = {name: gate["status"] for name, gate in body["gates"].items()}
    assert (body["verdict"], statuses) == (scenario.verdict, scenario.gates), text
    assert f"VERDICT: {scenario.verdict}\n" in text
    for name, status in scenario.gates.items():
        assert f"\n{LABELS[name]}{status} — " in text, text
    if scenario.restarts_count is not None:
        assert body["restarts"]["count"] == scenario.restarts_count, text
    if scenario.same_failure is not None:
        assert body["restarts"]["same_failure"] is scenario.same_failure, text
    if scenario.mode is not None:
        assert body["mode"] == scenario.mode
    for fragment in scenario.text_contains:
        assert fragment in text, text
    _assert_quotes(report)
