"""Every command exits 2 with one clear line for an unusable argument or setting, never a
traceback (issue 11): bad RLHEALTH_* values, bad campaign files, an unwritable --out, an empty
JOB_DIR."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from worker.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/jobs/cw-rno2a/ops/rl-gsm8k-stalled"
LOG = ROOT / "tests/fixtures/logs/skyrl_gsm8k_yottalabs.log"


def _run(*args: str | Path, **env: str) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], env=env, catch_exceptions=False)


def _one_line_exit_2(result: Result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("rl-health: ")
    assert needle in lines[0]


@pytest.mark.parametrize(
    ("args", "variable"),
    [
        (("alert", "jobs/x"), "RLHEALTH_LEASE_S"),
        (("ingest", "--once"), "RLHEALTH_LEASE_S"),
        (("worker",), "RLHEALTH_LEASE_S"),
        (("verdicts",), "RLHEALTH_LEASE_S"),
        (("replay", "evt-1"), "RLHEALTH_LEASE_S"),
    ],
)
def test_pipeline_commands_refuse_a_bad_setting(args: tuple[str, ...], variable: str) -> None:
    """A non-numeric RLHEALTH_LEASE_S: one line naming the variable, exit 2."""
    _one_line_exit_2(_run(*args, RLHEALTH_LEASE_S="soon"), f"unusable setting {variable}")


def test_a_setting_just_past_its_bound_is_refused() -> None:
    """RLHEALTH_LEASE_S=4.9 is below its floor of 5 s: refused, with the reason."""
    _one_line_exit_2(_run("verdicts", RLHEALTH_LEASE_S="4.9"), "greater than or equal to 5")


def test_a_setting_value_is_never_echoed() -> None:
    """A malformed connection URL (which may carry a password) is named, not printed."""
    result = _run("alert", "jobs/x", RLHEALTH_COALESCE_S="s3cr3t")
    _one_line_exit_2(result, "RLHEALTH_COALESCE_S")
    assert "s3cr3t" not in result.stderr


def test_alert_with_an_empty_job_dir() -> None:
    """`rl-health alert ''` says the JOB_DIR is empty."""
    _one_line_exit_2(_run("alert", "", RLHEALTH_BUNDLE_ROOT=str(ROOT)), "JOB_DIR is empty")


def test_diagnose_refuses_a_bad_threshold_variable() -> None:
    """A non-numeric RLHEALTH_STALL_FLOOR_S stops `diagnose` with one line, exit 2."""
    result = _run("diagnose", EXAMPLE, RLHEALTH_STALL_FLOOR_S="abc")
    _one_line_exit_2(result, "unusable threshold RLHEALTH_STALL_FLOOR_S")


def test_diagnose_accepts_a_threshold_on_its_bound() -> None:
    """RLHEALTH_STALL_FLOOR_S=0 is allowed (ge=0): a report, exit 0."""
    assert _run("diagnose", EXAMPLE, RLHEALTH_STALL_FLOOR_S="0").exit_code == 0


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[thresholds]\nSTALL_FLOOR_S = "soon"\n', "stall_floor_s"),
        ("[thresholds]\nSTALL_FLOOR_S = -1\n", "stall_floor_s"),
        ("[thresholds\n", "does not parse"),
        ("[thresholds]\nNOT_ONE = 1\n", "unknown thresholds"),
    ],
)
def test_diagnose_refuses_a_bad_campaign_file(tmp_path: Path, text: str, needle: str) -> None:
    """A campaign file that does not parse or holds bad values: one line, exit 2."""
    campaign = tmp_path / "campaign.toml"
    campaign.write_text(text)
    _one_line_exit_2(_run("diagnose", EXAMPLE, "--campaign", campaign), needle)


def test_diagnose_refuses_a_missing_campaign_variable(tmp_path: Path) -> None:
    """RLHEALTH_CAMPAIGN_FILE naming no file: one line, exit 2."""
    result = _run("diagnose", EXAMPLE, RLHEALTH_CAMPAIGN_FILE=str(tmp_path / "none.toml"))
    _one_line_exit_2(result, "none.toml")


@pytest.mark.parametrize("command", ["diagnose", "parse"])
def test_an_unwritable_out_is_refused_before_any_work(tmp_path: Path, command: str) -> None:
    """--out under a regular file (or in /proc) cannot be written: one line, exit 2."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    target = EXAMPLE if command == "diagnose" else LOG
    for out in (blocker / "out", Path("/proc/rl-health-out")):
        _one_line_exit_2(_run(command, target, "--out", out), "--out")


def test_a_writable_out_is_made(tmp_path: Path) -> None:
    """A missing but makeable --out is created and written."""
    assert _run("parse", LOG, "--out", tmp_path / "new" / "dir").exit_code == 0
    assert (tmp_path / "new" / "dir" / "metrics.csv").is_file()
