"""The capture policy: bundle first, refresh when stale, live probes only when the rules say so."""

from __future__ import annotations

import shlex
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from shared.settings import Settings, Thresholds
from tests.factories import NOW, evidence, logs
from worker.capture_policy import needs_live_probes
from worker.evidence.case import Evidence
from worker.evidence.model import ParseSummary, ProbeEvidence
from worker.evidence.probes import read_probes
from worker.pipeline.capture import capture_live


def _log(minutes_quiet: float) -> ParseSummary:
    return ParseSummary(lines=100, last_timestamp=NOW - timedelta(minutes=minutes_quiet))


HELD = ProbeEvidence(directory="probes", attempts=())


def _evidence(
    quiet_min: float = 1, probes: ProbeEvidence | None = HELD, **fields: object
) -> Evidence:
    return evidence(log_tables=logs(summary=_log(quiet_min)), probes=probes, **fields)


def test_fresh_consistent_bundle_needs_no_probe() -> None:
    """A fresh manifest with a recently advancing log calls for nothing live."""
    assert needs_live_probes(_evidence()) == ()


def test_attempt_history_not_in_hand_is_a_reason() -> None:
    """The bundle holds no attempts: the controller is asked for them."""
    reasons = needs_live_probes(_evidence(probes=None))
    assert len(reasons) == 1 and "attempt history" in reasons[0]


def test_quiet_log_of_a_running_job_needs_stacks() -> None:
    """A log quiet beyond STALL_FLOOR_S while the job runs calls for live stacks."""
    reasons = needs_live_probes(_evidence(quiet_min=30))
    assert len(reasons) == 1 and "quiet for 1800 s" in reasons[0]


def test_quiet_log_of_a_finished_job_needs_nothing() -> None:
    """A terminal job has no process left to dump: quiet is not a reason."""
    assert needs_live_probes(_evidence(quiet_min=30, state="failed")) == ()


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"manifest": None, "manifest_error": "no manifest.json"}, "manifest missing"),
        ({"synced_at": NOW - timedelta(hours=2)}, "bundle stale"),
        ({"synced_at": None}, "no synced_at"),
        ({"state": "failed", "finished_at": NOW - timedelta(hours=1)}, "contradictory"),
    ],
)
def test_missing_stale_or_contradictory_bundle_needs_probes(
    fields: dict[str, object], expected: str
) -> None:
    """Missing, stale and contradictory bundles are reasons to ask the cluster."""
    assert any(expected in reason for reason in needs_live_probes(_evidence(**fields)))


def test_no_probe_called_for_returns_none(tmp_path: Path) -> None:
    """Without a reason nothing runs and no directory is written."""
    probe_dir, notes = capture_live(_evidence(), "iris", tmp_path / "p", Settings())
    assert probe_dir is None and not (tmp_path / "p").exists()
    assert "no live probe needed" in notes[-1]


def test_stale_without_refresh_command_stays_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No RLHEALTH_REFRESH_COMMAND: the note says the evidence stays stale."""
    monkeypatch.setenv("RLHEALTH_IRIS_COMMAND", "/nonexistent/iris")
    stale = _evidence(synced_at=NOW - timedelta(hours=2))
    _, notes = capture_live(stale, "iris", tmp_path / "p", Settings(probe_timeout_s=5))
    assert any("stays stale" in note for note in notes)


def test_refresh_runs_exactly_the_configured_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refresh template is filled with the job id and cluster and run through spawn."""
    monkeypatch.setenv("RLHEALTH_IRIS_COMMAND", "/nonexistent/iris")
    target = tmp_path / "refreshed.txt"
    script = tmp_path / "watcher.py"
    script.write_text(f"import sys\nopen({str(target)!r}, 'w').write(' '.join(sys.argv[1:]))\n")
    template = shlex.join([sys.executable, str(script)]) + " {job_id} {cluster}"
    stale = replace(_evidence(synced_at=NOW - timedelta(hours=2)), job_dir=str(tmp_path / "nojob"))
    settings = Settings(refresh_command=template, probe_timeout_s=10)
    _, notes = capture_live(stale, "iris", tmp_path / "p", settings)
    assert target.read_text() == "/ops/rl-job cw"
    assert any(note.startswith("watcher refresh ran") for note in notes)


def test_missing_cli_is_a_recorded_probe_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing iris CLI is written to probes.json (exit 127) and explained in the notes."""
    monkeypatch.setenv("RLHEALTH_IRIS_COMMAND", "/nonexistent/iris")
    quiet = _evidence(quiet_min=30)
    settings = Settings(iris_controller_url="http://c.test", probe_timeout_s=5)
    probe_dir, notes = capture_live(quiet, "iris", tmp_path / "p", settings, sleep=lambda _: None)
    assert probe_dir == tmp_path / "p"
    probes = read_probes(probe_dir)
    assert probes.commands and all(c.exit_code == 127 for c in probes.commands)
    assert probes.failures and probes.controller is None
    assert any("command not found" in note for note in notes)


def test_stall_floor_comes_from_the_thresholds() -> None:
    """Lowering STALL_FLOOR_S makes a shorter quiet a reason."""
    short = _evidence(quiet_min=2, thresholds=Thresholds(stall_floor_s=60))
    assert any("quiet" in reason for reason in needs_live_probes(short))


def test_probes_run_and_failed_are_counted_per_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capture policy counts every probe command it ran, and the failed ones, for Prometheus."""
    from prometheus_client import REGISTRY

    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name, {"backend": "iris"}) or 0.0

    before = sample("rlhealth_probes_run_total"), sample("rlhealth_probes_failed_total")
    monkeypatch.setenv("RLHEALTH_IRIS_COMMAND", "/nonexistent/iris")
    settings = Settings(iris_controller_url="http://c.test", probe_timeout_s=5)
    probe_dir, _ = capture_live(
        _evidence(quiet_min=30), "iris", tmp_path / "p", settings, sleep=lambda _: None
    )
    assert probe_dir is not None
    probes = read_probes(probe_dir)
    run = sample("rlhealth_probes_run_total") - before[0]
    failed = sample("rlhealth_probes_failed_total") - before[1]
    assert run == len(probes.commands) > 0
    assert failed == sum(1 for c in probes.commands if c.exit_code != 0) > 0
