"""`rl-health signatures` shows which lines matched which catalogue entry or signature."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from worker.cli import main

LOG = """\
[10:00:00] task=/u/job/0 | [iris setup] step 1/2
[10:00:01] task=/u/job/0 | ERROR 05-01 10:00:01 [core.py:398] EngineCore encountered a fatal error.
[10:00:02] task=/u/job/0 | AttributeError: 'Env' object has no attribute 'x'
[10:00:03] task=/u/job/0 |       Exit Code:    137
[10:01:00] task=/u/job/0 | [iris setup] step 1/2
[10:01:01] task=/u/job/0 | AttributeError: 'Env' object has no attribute 'x'
"""


def _run(tmp_path: Path, *args: str) -> tuple[int, str]:
    path = tmp_path / "finelog.log"
    path.write_text(LOG, encoding="utf-8")
    result = CliRunner().invoke(main, ["signatures", *args, str(path)])
    return result.exit_code, result.output


def test_rows_name_their_entry_or_none(tmp_path: Path) -> None:
    """Each failure line is listed with its catalogue entry, or as uncatalogued, and signature."""
    code, out = _run(tmp_path)
    assert code == 0
    assert "finelog.log:2  engine_dead  [hard vllm.engine_core_fatal]  engine" in out
    assert "finelog.log:3  exception  [uncatalogued]  driver" in out
    assert "finelog.log:6 (attempt 1)  exception  [uncatalogued]" in out
    assert "signature: exit code" not in out
    assert "Exit Code: <n> (not a signature on its own)" in out


def test_summary_counts_each_signature_once(tmp_path: Path) -> None:
    """The same unknown failure in two attempts is one signature seen twice."""
    _, out = _run(tmp_path)
    assert "4 failure row(s), 3 distinct signature(s):" in out
    assert "2x  [uncatalogued] AttributeError: 'Env' object has no attribute 'x'" in out
    assert "1x  [hard k8s.exit_code, not a signature on its own] Exit Code: <n>" in out


def test_unmatched_lists_only_uncatalogued_rows(tmp_path: Path) -> None:
    """--unmatched keeps the rows no catalogue entry knows: what to add to the catalogue."""
    _, out = _run(tmp_path, "--unmatched")
    assert "vllm.engine_core_fatal" not in out
    assert "2 failure row(s), 1 distinct signature(s):" in out


def test_json_output(tmp_path: Path) -> None:
    """--format json gives the rows and the signature counts."""
    code, out = _run(tmp_path, "--format", "json")
    assert code == 0
    document = json.loads(out)
    assert [row["entry"] for row in document["rows"]] == [
        "vllm.engine_core_fatal",
        None,
        "k8s.exit_code",
        None,
    ]
    assert document["signatures"][0]["count"] == 2


def test_a_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    """A path that does not exist exits 2 with click's message, not a traceback."""
    result = CliRunner().invoke(main, ["signatures", str(tmp_path / "nope.log")])
    assert result.exit_code == 2
    assert "does not exist" in result.output
