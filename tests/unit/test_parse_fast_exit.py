"""`rl-health parse` run as its own process exits at once after writing (no interpreter
teardown); what it prints, its exit status and its tables are those of the same command run
in process (CliRunner: the normal exit)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from worker.cli import main

ROOT = Path(__file__).resolve().parents[2]
RL_HEALTH = str(Path(sys.executable).with_name("rl-health"))
LOGS = ROOT / "tests/fixtures/logs"


@pytest.mark.parametrize(
    ("log", "code"),
    [("skyrl_gsm8k_yottalabs.log", 0), ("job_logs_healthy.txt", 1)],
)
def test_the_process_exit_loses_nothing(log: str, code: int, tmp_path: Path) -> None:
    done = subprocess.run(
        [RL_HEALTH, "parse", str(LOGS / log), "--out", str(tmp_path / "process")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    runner = CliRunner()
    result = runner.invoke(main, ["parse", str(LOGS / log), "--out", str(tmp_path / "runner")])
    assert (done.returncode, result.exit_code) == (code, code)
    assert done.stdout == result.stdout
    assert done.stderr == result.stderr
    written = sorted(p.name for p in (tmp_path / "process").iterdir())
    assert written == sorted(p.name for p in (tmp_path / "runner").iterdir())
    assert written  # at least one table, even without metrics
    for name in written:
        assert (tmp_path / "process" / name).read_bytes() == (
            tmp_path / "runner" / name
        ).read_bytes()
