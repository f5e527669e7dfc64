"""Reports a person reads at 3 a.m.: durations in human units and never negative, text lines
within 120 characters with every field one logical line, wide tables in blocks, the HTML report
carrying the text report's tables, comment lines above a log never quoted as the log, and a KILL
of a job that has already ended saying so."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from reports.html import render_html
from reports.tables import format_table
from reports.text import WIDTH, logical_lines, render_text, wrap_line
from shared.models import (
    Confidence,
    GateName,
    GateResult,
    GateStatus,
    KillProof,
    Mode,
    Quote,
    Report,
    RestartsResult,
    Table,
    Verdict,
)
from shared.times import age_text, duration_text
from tests import factories
from worker.evidence.jobstate import JobState
from worker.evidence.parsed import ParseSummary
from worker.evidence.quotes import is_comment, log_head_quotes
from worker.verdict import Decision, _for_ended_job

T = datetime(2026, 7, 30, 21, 15, tzinfo=UTC)
LONG = "the trainer logged nothing for a long while " * 6  # ~270 characters


# --- durations ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.4, "0.4 s"),
        (59, "59 s"),
        (60, "1 min"),
        (200, "3 min 20 s"),
        (599, "9 min 59 s"),
        (600, "10 min"),
        (5399, "90 min"),
        (5400, "1 h 30 min"),
        (9600, "2 h 40 min"),
        (172_799, "48 h"),
        (172_800, "2 days"),
        (302_400, "3.5 days"),
        (11_039_819, "127.8 days"),
    ],
)
def test_durations_read_in_human_units(seconds: float, text: str) -> None:
    """Each unit takes over just at its boundary (59 s / 1 min, 90 min / 1 h 30 min, 48 h /
    2 days), and nothing reads as 184040 min or 11039819 s."""
    assert duration_text(seconds) == text


def test_an_age_ahead_of_the_reference_is_never_negative() -> None:
    """-69271 s is `19 h 15 min after the time judged`; +9600 s is `2 h 40 min ago`."""
    assert age_text(-69_271) == "19 h 15 min after the time judged"
    assert age_text(9600) == "2 h 40 min ago"
    assert "-" not in duration_text(-69_271)


# --- the text report's lines -------------------------------------------------------------------


def _report(**changes: object) -> Report:
    gates = {name: GateResult(status=GateStatus.PASS, summary="ok") for name in GateName}
    quote = Quote(source="finelog.log", line=7, timestamp=T, text="Started: 'policy_train' " * 4)
    gates[GateName.LIVENESS] = GateResult(
        status=GateStatus.FAIL, summary=LONG, evidence=(quote, quote)
    )
    gates[GateName.DYNAMICS] = GateResult(
        status=GateStatus.PASS,
        summary="plateau",
        tables=(
            Table(
                title="per step",
                columns=("step", *(f"metric number {i}" for i in range(9))),
                rows=((3, *(float(i) for i in range(9))), (12, *(float(i) for i in range(9)))),
            ),
        ),
    )
    base: dict[str, object] = {
        "job_id": "/ops/rl-job",
        "captured_at": T,
        "evidence_dir": "jobs/cw/ops/rl-job",
        "verdict": Verdict.NO_KILL,
        "confidence": Confidence.HIGH,
        "mode": Mode.STANDARD,
        "restarts": RestartsResult(count=0, same_failure=False, interpretation="none"),
        "gates": gates,
        "reasoning": LONG,
        "next_action": "none",
        "flip_signal": "a step",
    }
    return Report.model_validate(base | changes)


def test_no_line_of_the_text_report_is_wider_than_120() -> None:
    """A 270-character summary, a long quote and a ten-column table all fit in 120 columns."""
    text = render_text(_report())
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    assert any(len(line) > 100 for line in text.splitlines())  # the page is used, not shrunk


def test_each_field_stays_one_logical_line() -> None:
    """Joined back, the LIVENESS field is the procedure's one line: label, status, the whole summary
    and its first quote; REASONING likewise; and the quote lines are still their own lines."""
    lines = logical_lines(render_text(_report()))
    liveness = next(line for line in lines if line.startswith("LIVENESS:  FAIL — "))
    assert LONG.strip() in liveness and "(finelog.log:7, 2026-07-30T21:15:00Z)" in liveness
    assert f"REASONING: {LONG.strip()}" in lines
    assert sum(1 for line in lines if line.startswith('  "Started:')) == 1


def test_a_line_at_the_width_is_kept_and_one_past_it_is_wrapped() -> None:
    """120 characters stay one line; 121 continue on a line indented to the field's value."""
    label = "REASONING: "
    at_width = label + "x" * (WIDTH - len(label) - 5) + " yyyy"
    assert wrap_line(at_width) == [at_width]
    past = at_width + "z"
    first, second = wrap_line(past)
    assert second == " " * len(label) + "yyyyz" and len(first) <= WIDTH


def test_an_indented_line_continues_four_spaces_deeper() -> None:
    """A quote line (two spaces) continues at six; the continuation joins back with one space."""
    line = '  "' + "word " * 40 + '" (finelog.log:1)'
    wrapped = wrap_line(line)
    assert len(wrapped) > 1 and all(w.startswith("      ") for w in wrapped[1:])
    assert logical_lines("\n".join(wrapped)) == [" ".join(line.split(" ")).rstrip()]


# --- tables ---------------------------------------------------------------------------------------


def _wide() -> Table:
    return Table(title="t", columns=("engine", "a", "b", "c"), rows=(("e0", 1, 22, 333),))


def test_a_table_that_fits_is_one_block_and_one_column_more_splits_it() -> None:
    """At exactly its width the table is one block; one character less and it is laid out in
    two blocks, the second repeating the key column."""
    full = format_table(_wide())
    width = max(len(line) for line in full)
    assert format_table(_wide(), width) == full
    split = format_table(_wide(), width - 1)
    headers = [line for line in split if line.startswith("engine")]
    assert len(headers) == 2 and all(len(line) <= width - 1 for line in split)
    assert sum(line.startswith("e0") for line in split) == 2


def test_the_key_column_is_left_aligned_so_rows_never_start_with_spaces() -> None:
    """Steps 3 and 12345 both start their row: a row never looks like a wrapped line."""
    table = Table(title="t", columns=("step", "reward"), rows=((3, 0.5), (12345, 0.6)))
    rows = format_table(table)[2:]
    assert all(not row.startswith(" ") for row in rows)


def test_the_html_report_carries_the_text_reports_tables() -> None:
    """The dynamics table of the text report is an HTML table in the page, every column and
    value in it."""
    page = render_html(_report())
    assert '<table class="data"><caption>per step</caption>' in page
    assert "<th>metric number 8</th>" in page and '<td class="num">8</td>' in page


# --- what a log looks like ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "comment"),
    [("# source: https://github.com/x/y/issues/1", True), ("#", True), ("#12 step 3", False)],
)
def test_a_comment_line_is_a_hash_then_a_space(line: str, comment: bool) -> None:
    """`# source: ...` and a bare `#` are notes above a log; `#12 step 3` is the log itself."""
    assert is_comment(line) is comment


def test_the_log_head_quoted_skips_the_notes_above_the_log() -> None:
    """Two comment lines then the log: the quotes start at the log's first line, with its line
    number; a file of comments only is quoted as it is."""
    summary = ParseSummary(
        files=("finelog.log",),
        head=("# copied from a tracker", "# source: somewhere", "INFO starting trainer"),
        head_lines=(1, 2, 3),
    )
    quotes = log_head_quotes(factories.logs(summary=summary))
    assert [(q.text, q.line) for q in quotes] == [("INFO starting trainer", 3)]
    only = ParseSummary(files=("finelog.log",), head=("# nothing else",), head_lines=(1,))
    assert [q.text for q in log_head_quotes(factories.logs(summary=only))] == ["# nothing else"]


# --- a KILL of a job that has already ended -----------------------------------------------------


def _kill(action: str) -> Decision:
    crash = Quote(source="finelog.log", line=9, text="RuntimeError: crash")
    proof = KillProof(
        rule="terminal_failure", mechanism="crash", established_at=T, evidence=(crash,)
    )
    return Decision(
        verdict=Verdict.KILL,
        confidence=Confidence.HIGH,
        reasoning="Hard failure established.",
        next_action=action,
        flip_signal="a new attempt",
        proof=proof,
    )


def test_a_kill_of_a_failed_job_says_there_is_nothing_left_to_stop() -> None:
    """The job failed: NEXT ACTION says it has ended and must stay down, never "kill the job"
    or "no job action" beside VERDICT: KILL."""
    decided = _for_ended_job(
        _kill("Supervisor: kill the job; it will not recover."), JobState.FAILED
    )
    assert decided.verdict is Verdict.KILL
    assert decided.next_action.startswith(
        "Nothing left to stop: the job has already ended (failed)"
    )
    assert "kill the job" not in decided.next_action.lower()
    assert decided.reasoning.startswith("The job has already ended (failed).")


def test_a_kill_of_a_running_job_keeps_its_action() -> None:
    """The job still runs: the supervisor is told to kill it, unchanged."""
    action = "Supervisor: kill the job; it will not recover."
    assert _for_ended_job(_kill(action), JobState.RUNNING).next_action == action


def test_advice_that_is_not_a_kill_is_kept_for_an_ended_job() -> None:
    """A specific instruction (fix the config) stays, after the opening for an ended job."""
    decided = _for_ended_job(_kill("Fix the configuration key `x` (handoff)."), JobState.KILLED)
    assert decided.next_action.endswith(
        "until this is done: Fix the configuration key `x` (handoff)."
    )
