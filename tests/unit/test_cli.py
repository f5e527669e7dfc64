"""`rl-health diagnose` and `rl-health parse` behave as docs/interface.md describes, run as a user
runs them (the installed console script, in a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reports.text import logical_lines

ROOT = Path(__file__).resolve().parents[2]
RL_HEALTH = str(Path(sys.executable).with_name("rl-health"))
EXAMPLE = ROOT / "examples/jobs/cw-rno2a/ops/rl-gsm8k-stalled"
PROBES = ROOT / "examples/probes/rl-gsm8k-stalled"
NOW = "2026-07-30T19:17:00Z"
LOGS = ROOT / "tests/fixtures/logs"


def run(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RL_HEALTH, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def test_diagnose_example_prints_the_seed_report() -> None:
    """The shipped example (a stall proven by stacks) is KILL, in the procedure's text format."""
    result = run("diagnose", EXAMPLE, "--probes", PROBES, "--now", NOW)
    assert result.returncode == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= 120
    lines = logical_lines(result.stdout)  # each field whole again, its wrapped lines joined
    assert lines[0].startswith(
        "RL-JOB-HEALTH — /ops/rl-gsm8k-stalled — captured 2026-07-30T19:17:00Z"
    )
    assert "VERDICT: KILL" in lines
    assert any(line.startswith("LIVENESS:  FAIL — stalled") for line in lines)
    assert any("all_reduce" in line and "probes/stacks/" in line for line in lines)
    assert [
        line.split(":")[0] for line in lines if line.startswith(("REASONING", "NEXT", "FLIP"))
    ] == [
        "REASONING",
        "NEXT ACTION",
        "FLIP SIGNAL",
    ]


def test_diagnose_json_and_out_dir(tmp_path: Path) -> None:
    """--format json prints the contract JSON; --out writes report.txt and report.json too."""
    result = run("diagnose", EXAMPLE, "--probes", PROBES, "--now", NOW, "--format", "json",
                 "--out", tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["verdict"] == "KILL"
    assert body["gates"]["liveness"]["status"] == "FAIL"
    assert body["captured_at"] == NOW
    assert json.loads((tmp_path / "report.json").read_text()) == body
    assert (tmp_path / "report.txt").read_text().startswith("RL-JOB-HEALTH — ")


def test_diagnose_without_probes_cannot_prove_the_stall() -> None:
    """Without live stacks the same quiet job is ERROR: a stall verdict needs process evidence."""
    result = run("diagnose", EXAMPLE, "--now", NOW)
    assert result.returncode == 0
    assert "VERDICT: ERROR" in result.stdout
    assert "py-spy" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("diagnose", "/nonexistent/job"),
        ("diagnose", EXAMPLE, "--now", "yesterday"),
        ("diagnose", EXAMPLE, "--probes", PROBES, "--backend", "iris"),
        ("diagnose", EXAMPLE, "--mode", "sideways"),
    ],
)
def test_diagnose_unusable_arguments_exit_2(args: tuple[str | Path, ...]) -> None:
    """A missing JOB_DIR or an unusable option exits 2 with a message, not a traceback."""
    result = run(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip()


def test_parse_writes_tables(tmp_path: Path) -> None:
    """`parse` on a real SkyRL log writes metrics and phases tables and a summary."""
    result = run("parse", LOGS / "skyrl_gsm8k_yottalabs.log", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "serializations seen:" in result.stdout
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[0] == "step"
    assert "policy/policy_entropy" in header
    assert (tmp_path / "phases.csv").read_text().startswith("step,phase,seconds")


def test_parse_without_metrics_exits_1_quoting_the_log(tmp_path: Path) -> None:
    """A log without usable metrics exits 1 and quotes what it looks like; other tables land."""
    log = tmp_path / "odd.log"
    log.write_text(
        "step 1 done, loss=0.1\nTraceback (most recent call last):\n"
        '  File "x.py"\nValueError: bad\n'
    )
    result = run("parse", log, "--out", tmp_path / "out")
    assert result.returncode == 1
    assert "step 1 done, loss=0.1" in result.stderr
    assert (tmp_path / "out" / "errors.csv").exists()
