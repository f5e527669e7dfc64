"""Issue 28, Medium 7: CSV formula injection.

A job's author writes what `rl-health parse` tabulates: phase names, metric keys, error messages,
trial names and tasks. Cells such as `=HYPERLINK(...)`, `+cmd|...`, `-...` and `@...` were written
as they are in `trials.csv`, `errors.csv`, `phases.csv` and the `metrics.csv` header, so a
spreadsheet opening the table ran them. Now every CSV cell and column name that starts like a
formula (`=`, `+`, `-`, `@`, a tab, a carriage return) is written behind a `'`, which spreadsheets
show as text; Parquet tables keep the values as they are.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from worker.cli import main
from worker.cli.tables import write_frame

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/logs/skyrl_gsm8k_yottalabs.log"
LINK = '=HYPERLINK("http://evil.example/x","click")'
COMMAND = "+cmd|' /C calc'!A0"
MINUS = "-2+3+cmd|' /C calc'!A0"
AT = "@SUM(1+1)*cmd|' /C calc'!A0"
TAB = "\t=1+1"
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _crafted_job(top: Path) -> Path:
    """A job directory whose log and trials put a formula in each table the issue names."""
    job = top / "job"
    job.mkdir()
    log = FIXTURE.read_text().replace("'sync_weights'", f"'{LINK}'")
    mirror = {COMMAND: 2.0, MINUS: 3.0, AT: 4.0, "reward/avg_raw_reward": 0.5}
    log += f"WANDB_MIRROR kind=train step=9 metrics={json.dumps(mirror)}\n"
    log += (
        "(skyrl_entrypoint pid=8455) 2026-03-26 15:10:00.000 | ERROR    | skyrl.train.trainer:"
        "train:400 - Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        f"RuntimeError: {LINK}\n"
    )
    (job / "finelog.log").write_text(log)
    trial = job / "trace_jobs" / "run" / AT
    trial.mkdir(parents=True)
    result = {
        "trial_name": MINUS,
        "task_name": COMMAND,
        "verifier_result": {"rewards": {"reward": 1.0}},
    }
    (trial / "result.json").write_text(json.dumps(result))
    return job


def _cells(path: Path) -> list[str]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [cell for row in csv.reader(handle) for cell in row]


def test_parse_writes_no_cell_a_spreadsheet_would_run(tmp_path: Path) -> None:
    """`rl-health parse` on a job whose phase, metric keys, error and trial hold formulas: no
    cell or column name of trials.csv, errors.csv, phases.csv or metrics.csv starts like a
    formula, and each formula is there, behind a `'`."""
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["parse", str(_crafted_job(tmp_path)), "--out", str(out)])
    assert result.exit_code == 0, result.output
    tables = {name: _cells(out / f"{name}.csv") for name in ("trials", "errors", "phases")}
    header = len(pl.read_csv(out / "metrics.csv").columns)
    tables["metrics"] = _cells(out / "metrics.csv")[:header]
    for name, cells in tables.items():
        assert not [c for c in cells if c.startswith(FORMULA_START)], name
    assert f"'{LINK}" in tables["phases"]
    assert any(c.startswith("'RuntimeError") or c == f"'{LINK}" for c in tables["errors"])
    assert {f"'{MINUS}", f"'{COMMAND}"} <= set(tables["trials"])
    assert {f"'{COMMAND}", f"'{MINUS}", f"'{AT}"} <= set(tables["metrics"])


@pytest.mark.parametrize(
    ("value", "written"),
    [(LINK, f"'{LINK}"), (TAB, f"'{TAB}"), ("a=b", "a=b"), (" =1", " =1"), ("1-2", "1-2")],
)
def test_only_a_formula_start_is_quoted(tmp_path: Path, value: str, written: str) -> None:
    """A cell starting with a formula character is quoted; one with the character later (or
    after a space, which spreadsheets do not run) is written as it is."""
    path = write_frame(pl.DataFrame({"text": [value]}), tmp_path, "t")
    assert _cells(path) == ["text", written]


def test_parquet_keeps_the_values(tmp_path: Path) -> None:
    """Parquet is data, not a spreadsheet: its values and names are written as they are."""
    frame = pl.DataFrame({LINK: [COMMAND]})
    path = write_frame(frame, tmp_path, "t", "parquet")
    assert pl.read_parquet(path).equals(frame)
