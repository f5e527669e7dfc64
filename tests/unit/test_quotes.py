"""Quotes of what a log looks like carry the file and line they came from."""

from __future__ import annotations

from pathlib import Path

from worker.evidence.logs import parse_job_logs, parse_log_file
from worker.evidence.quotes import log_head_quotes


def test_head_quotes_carry_line_numbers(tmp_path: Path) -> None:
    """The first non-empty lines are quoted with their 1-based line numbers, blank lines skipped."""
    log = tmp_path / "finelog.log"
    log.write_text("\n\nstep 1 done, loss=0.1\n\nstep 2 done, loss=0.09\nstep 3 done\n")
    quotes = log_head_quotes(parse_log_file(log, "finelog.log"))
    assert [(q.source, q.line, q.text) for q in quotes] == [
        ("finelog.log", 3, "step 1 done, loss=0.1"),
        ("finelog.log", 5, "step 2 done, loss=0.09"),
        ("finelog.log", 6, "step 3 done"),
    ]


def test_head_quotes_name_the_file_that_has_the_head(tmp_path: Path) -> None:
    """With an empty finelog, the head comes from a pod log and is quoted as that file."""
    (tmp_path / "finelog.log").write_text("")
    pods = tmp_path / "pod_logs"
    pods.mkdir()
    (pods / "rank-0.log").write_text("custom print: reward 0.3\n")
    quotes = log_head_quotes(parse_job_logs(tmp_path))
    assert [(q.source, q.line) for q in quotes] == [("pod_logs/rank-0.log", 1)]
