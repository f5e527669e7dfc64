"""The terminal: progress on stderr and colours only on a terminal; piped output is exactly the
report. Real processes on a real pseudo-terminal."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from reports.text import render_text
from shared.models import Confidence, Verdict, VerdictEntry
from worker.cli import main
from worker.cli.terminal import STATUS_STYLES, coloured_report, live_verdicts, probing
from worker.diagnosis import collect_evidence, judge

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples/jobs/cw-rno2a/ops/rl-gsm8k-stalled"
PROBES = ROOT / "examples/probes/rl-gsm8k-stalled"
NOW = "2026-07-30T19:17:00Z"
RL_HEALTH = str(Path(sys.executable).with_name("rl-health"))
DIAGNOSE = [RL_HEALTH, "diagnose", str(DEMO), "--probes", str(PROBES), "--now", NOW]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def report_text() -> str:
    evidence = collect_evidence(
        DEMO, now=datetime(2026, 7, 30, 19, 17, tzinfo=UTC), probes_dir=PROBES
    )
    return render_text(judge(evidence))


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"NO_COLOR", "FORCE_COLOR", "TERM"}}
    return env | {"TERM": "xterm-256color", "COLUMNS": "200"} | extra


def _drain(fd: int, into: bytearray) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: every writer of the terminal has closed it
            return
        if not chunk:
            return
        into.extend(chunk)


def _run(argv: list[str], *, tty_out: bool, tty_err: bool, **env: str) -> tuple[str, str, str]:
    """Run `argv` with stdout and/or stderr on a pseudo-terminal (200 columns); returns (piped
    stdout, piped stderr, what the terminal received)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=slave if tty_out else subprocess.PIPE,
        stderr=slave if tty_err else subprocess.PIPE,
        env=_env(**env),
    )
    os.close(slave)
    received = bytearray()
    reader = threading.Thread(target=_drain, args=(master, received))
    reader.start()
    out, err = process.communicate(timeout=120)
    reader.join(30)
    os.close(master)
    return (out or b"").decode(), (err or b"").decode(), received.decode(errors="replace")


def _plain(terminal: str) -> str:
    return ANSI.sub("", terminal).replace("\r\n", "\n")


def test_piped_diagnose_prints_exactly_the_report_and_nothing_on_stderr(report_text: str) -> None:
    """Piped, stdout is byte for byte the text report and stderr carries no progress."""
    result = subprocess.run(
        DIAGNOSE, check=False, capture_output=True, text=True, env=_env(), timeout=120
    )
    assert result.returncode == 0
    assert result.stdout == report_text
    assert result.stderr == ""


def test_on_a_terminal_the_verdict_and_statuses_are_coloured(report_text: str) -> None:
    """On a terminal the KILL and the FAIL/PASS statuses carry colour codes; the text is the
    report's, character for character; with stderr piped, no progress is drawn anywhere."""
    _out, err, terminal = _run(DIAGNOSE, tty_out=True, tty_err=False)
    assert "VERDICT: \x1b[1;37;41mKILL\x1b[0m" in terminal
    assert "LIVENESS:  \x1b[1;31mFAIL\x1b[0m" in terminal
    assert "RESOURCES: \x1b[32mPASS\x1b[0m" in terminal
    assert _plain(terminal) == report_text
    assert err == ""


def test_no_color_turns_the_colours_off(report_text: str) -> None:
    """NO_COLOR on a terminal prints the report without a colour code (bold may stay, as
    no-color.org allows)."""
    _out, _err, terminal = _run(DIAGNOSE, tty_out=True, tty_err=False, NO_COLOR="1")
    codes = [m.group(1) for m in re.finditer(r"\x1b\[([0-9;]*)m", terminal)]
    assert not [c for c in codes if any(p[:1] in {"3", "4", "9"} for p in c.split(";") if p)]
    assert _plain(terminal) == report_text


def test_progress_goes_to_a_terminal_stderr_while_piped_stdout_stays_the_report(
    report_text: str,
) -> None:
    """stderr on a terminal shows the log being read; stdout, piped, is still exactly the report."""
    out, _err, terminal = _run(DIAGNOSE, tty_out=False, tty_err=True)
    assert out == report_text
    assert "reading finelog.log" in _plain(terminal)


def test_parse_shows_progress_only_on_a_terminal(tmp_path: Path) -> None:
    """`parse` draws its progress on a terminal stderr and prints the same summary either way."""
    argv = [RL_HEALTH, "parse", str(DEMO), "--out", str(tmp_path)]
    out, _err, terminal = _run(argv, tty_out=False, tty_err=True)
    assert "reading finelog.log" in _plain(terminal)
    piped = subprocess.run(
        argv, check=False, capture_output=True, text=True, env=_env(), timeout=120
    )
    assert piped.stdout == out and piped.stderr == ""


def test_coloured_report_keeps_every_character() -> None:
    """Styling changes no character, and styles exactly the status words."""
    text = 'VERDICT: ERROR\nLIVENESS:  PASS — fine — "VERDICT: KILL"\nDUTY CYCLE: N/A — x\n'
    styled = coloured_report(text)
    assert styled.plain == text
    spans = {text[s.start : s.end]: str(s.style) for s in styled.spans}
    assert spans == {"ERROR": "bold yellow", "PASS": STATUS_STYLES["PASS"], "N/A": "dim"}


def test_html_format_and_out_write_the_page(tmp_path: Path) -> None:
    """--format html prints the page; --out also writes report.html beside txt and json."""
    runner = CliRunner()
    args = ["diagnose", str(DEMO), "--probes", str(PROBES), "--now", NOW]
    result = runner.invoke(main, [*args, "--format", "html", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("<!DOCTYPE html>") and "<h1>KILL</h1>" in result.stdout
    assert (tmp_path / "report.html").read_text() == result.stdout
    assert (tmp_path / "report.txt").is_file() and (tmp_path / "report.json").is_file()


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_live_table_lists_verdicts_newest_first() -> None:
    """`verdicts --follow` on a terminal redraws one table, newest verdict on top."""
    entries = [
        VerdictEntry(
            event_id=f"e{i}",
            event_ids=(f"e{i}",),
            job_id=f"/ops/job-{i}",
            verdict=verdict,
            confidence=Confidence.HIGH,
            report_uri=f"s3://b/reports/cw/ops/job-{i}/t-e{i}.json",
            captured_at=datetime(2026, 7, 30, 21, i, tzinfo=UTC),
        )
        for i, verdict in enumerate((Verdict.NO_KILL, Verdict.KILL))
    ]
    stream = _Tty()
    assert live_verdicts(iter(entries), stream) == 2
    final = _plain(stream.getvalue().split("verdicts (newest first)")[-1])
    assert final.index("/ops/job-1") < final.index("/ops/job-0")
    assert "NO-KILL" in final and "KILL" in final


def test_probing_shows_a_spinner_only_on_a_terminal() -> None:
    """While live probes run, a terminal stderr shows which backend is probed; a pipe gets none."""
    tty, pipe = _Tty(), io.StringIO()
    with probing("iris", tty):
        pass  # the spinner renders its line when it starts and once more when it stops
    with probing("iris", pipe):
        pass
    assert "running live probes through iris (read-only)" in tty.getvalue()
    assert pipe.getvalue() == ""
