"""Relative and absolute paths give the same evidence; a missing trace_jobs/ is named.

The commands run as a user runs them (the installed console script, in a subprocess), once with
the job directory relative to the working directory and once absolute.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shared.models import Mode
from worker.diagnosis import collect_evidence
from worker.evidence.trials import read_trials

ROOT = Path(__file__).resolve().parents[2]
RL_HEALTH = str(Path(sys.executable).with_name("rl-health"))
EXAMPLE = ROOT / "examples/jobs/cw-rno2a/ops/rl-gsm8k-stalled"
TRIALS = ROOT / "tests/fixtures/harbor/behavior__harbor_jobs"
NOW = "2026-07-30T19:17:00Z"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A working directory holding `job/`: the example job with Harbor trials in trace_jobs/."""
    shutil.copytree(EXAMPLE, tmp_path / "job")
    shutil.copytree(TRIALS, tmp_path / "job" / "trace_jobs")
    return tmp_path


def _run(cwd: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [RL_HEALTH, *map(str, args)]
    return subprocess.run(
        command, capture_output=True, text=True, cwd=cwd, timeout=120, check=False
    )


def test_read_trials_finds_trace_jobs_from_a_relative_job_dir(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative job directory finds its trace_jobs/ exactly as an absolute one does."""
    monkeypatch.chdir(workdir)
    relative = read_trials(Path("job"))
    absolute = read_trials(workdir / "job")
    assert relative is not None and absolute is not None
    assert relative.trials.height > 0
    assert relative.trials.equals(absolute.trials)
    assert relative.directory == absolute.directory == "trace_jobs"


def test_an_agentic_run_without_trace_jobs_is_a_named_discrepancy(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agentic and no trace_jobs/: a discrepancy names it; with it, or standard mode: none."""
    monkeypatch.chdir(workdir)

    def named(mode: Mode) -> bool:
        found = collect_evidence(Path("job"), mode=mode).discrepancies
        return any("trace_jobs/ is missing" in d for d in found)

    assert not named(Mode.AGENTIC)
    shutil.rmtree(workdir / "job" / "trace_jobs")
    assert named(Mode.AGENTIC)
    assert not named(Mode.STANDARD)


def _diagnose(cwd: Path, job: str | Path) -> dict[str, object]:
    result = _run(cwd, "diagnose", job, "--now", NOW, "--mode", "agentic", "--format", "json")
    assert result.returncode == 0, result.stderr
    report: dict[str, object] = json.loads(result.stdout)
    report.pop("evidence_dir")  # the path as given, by design
    return report


@pytest.mark.slow
def test_diagnose_is_the_same_with_relative_and_absolute_paths(workdir: Path) -> None:
    """`diagnose job` and `diagnose /abs/job` give the same report, trials included."""
    relative = _diagnose(workdir, "job")
    assert relative == _diagnose(workdir, workdir / "job")
    gates = relative["gates"]
    assert isinstance(gates, dict)
    assert "trace_jobs" not in str(relative.get("discrepancies"))
    assert "no finished trial" not in gates["rollouts"]["summary"]


@pytest.mark.slow
def test_parse_is_the_same_with_relative_and_absolute_paths(workdir: Path) -> None:
    """`parse job` and `parse /abs/job` print and write the same tables, trials included."""
    outputs = []
    for job, out in (("job", "rel"), (workdir / "job", workdir / "abs")):
        result = _run(workdir, "parse", job, "--out", out)
        assert result.returncode in (0, 1), result.stderr
        tables = {p.name: p.read_text() for p in sorted((workdir / out).iterdir())}
        outputs.append((result.stdout, tables))
    assert outputs[0] == outputs[1]
    assert "trials.csv" in outputs[0][1]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["job", "job/finelog.log"])
def test_signatures_is_the_same_with_relative_and_absolute_paths(
    workdir: Path, target: str
) -> None:
    """`signatures` on a relative or an absolute path prints the same rows."""
    relative = _run(workdir, "signatures", target)
    absolute = _run(workdir, "signatures", workdir / target)
    assert relative.returncode == absolute.returncode == 0, relative.stderr
    assert relative.stdout == absolute.stdout
    assert "distinct signature(s)" in relative.stdout
