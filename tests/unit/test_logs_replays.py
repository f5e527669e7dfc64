"""Replayed lines (`worker.evidence.logs.replays`): a line whose own time is older than its Iris
prefix time by more than the log's usual lag, or older than the consistent lines before it, is a
re-sent copy: left out of the progress tables, counted and quoted in the summary. A constant
offset is the usual lag, never a replay. Every log is parsed every way (`tests.log_lines`)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from tests.log_lines import actor_line, at, parse_every_way
from worker.evidence.logs import replays
from worker.evidence.logs.context import PREFIX_SKEW_TOLERANCE_S
from worker.evidence.logs.state import ParserState
from worker.evidence.model import LogTables

LAG_S = 2.0  # the log's usual lag: every line written two seconds before it is collected
TOLERANCE = replays.REPLAY_TOLERANCE_S


def steps(n: int, *, offset: timedelta = timedelta(0), iris: bool = True) -> list[str]:
    """`n` steps a minute apart from T0, each line written LAG_S before it is collected, plus
    `offset` (a clock or time-zone offset)."""
    lines = []
    for step in range(1, n + 1):
        for name, moment in (("Started", at(60 * step - 59)), ("Finished", at(60 * step))):
            written = moment - timedelta(seconds=LAG_S) + offset
            cost = ", time cost: 59.00s" if name == "Finished" else ""
            lines.append(actor_line(moment, f"{name}: 'step'{cost}", written=written, iris=iris))
    return lines


def copy_of_step_1(collected: datetime, written: datetime, *, iris: bool = True) -> str:
    """Step 1's `Finished: 'step'` line, collected (again) at `collected`."""
    return actor_line(collected, "Finished: 'step', time cost: 59.00s", written=written, iris=iris)


def finished_lines(tables: LogTables) -> list[int]:
    rows = tables.timers.filter(pl.col("event") == "finished")
    return rows.get_column("line").to_list()


@pytest.mark.parametrize(("beyond", "replayed"), [(1.0, 1), (-1.0, 0)], ids=["past", "short"])
def test_own_time_older_than_the_usual_lag_allows(
    beyond: float, replayed: int, tmp_path: Path
) -> None:
    """Own time older than its prefix by the usual lag + the tolerance + 1 s is a replay (no
    timer row); by 1 s less it is a late line, kept."""
    lines = steps(3)
    collected = at(240)
    written = collected - timedelta(seconds=LAG_S + TOLERANCE + beyond)
    tables = parse_every_way([*lines, copy_of_step_1(collected, written)], tmp_path)
    assert tables.summary.clock.replayed == replayed
    assert (len(lines) + 1 in finished_lines(tables)) is (replayed == 0)


def test_a_constant_two_hour_offset_is_no_replay(tmp_path: Path) -> None:
    """Every line two hours ahead (or behind) of its prefix: the usual lag, not a replay."""
    for sign in (1, -1):
        tables = parse_every_way(steps(4, offset=timedelta(hours=2 * sign)), tmp_path)
        assert tables.summary.clock.replayed == 0
        assert len(finished_lines(tables)) == 4
        assert tables.summary.clock.off_lines == 8


def test_a_replay_on_top_of_a_constant_offset_is_seen(tmp_path: Path) -> None:
    """Two hours ahead on every line, and step 1's line sent again four minutes later: the
    offset is stated, the copy is a replay."""
    offset = timedelta(hours=2)
    lines = steps(3, offset=offset)
    copy = copy_of_step_1(at(240), at(60) - timedelta(seconds=LAG_S) + offset)
    tables = parse_every_way([*lines, copy], tmp_path)
    assert tables.summary.clock.replayed == 1
    assert (tables.summary.clock.min_s, tables.summary.clock.max_s) == (7198.0, 7198.0)


@pytest.mark.parametrize(("beyond", "replayed"), [(1.0, 1), (-1.0, 0)], ids=["past", "short"])
def test_without_a_prefix_own_time_older_than_the_lines_before_it(
    beyond: float, replayed: int, tmp_path: Path
) -> None:
    """A pod log has no Iris prefix: a line older than the newest line before it by the
    tolerance + 1 s is a replay; by 1 s less, interleaved writers, kept."""
    lines = steps(3, iris=False)
    newest = at(180) - timedelta(seconds=LAG_S)
    copy = copy_of_step_1(at(240), newest - timedelta(seconds=TOLERANCE + beyond), iris=False)
    tables = parse_every_way([*lines, copy], tmp_path)
    assert tables.summary.clock.replayed == replayed


def test_a_replayed_step_line_is_never_the_newest_progress(tmp_path: Path) -> None:
    """Issue 27 finding 7: step 1's line re-sent after step 3 is not progress, does not count as
    a finished step for the step context, and is quoted in the summary."""
    lines = steps(3)
    copy = copy_of_step_1(at(600), at(60) - timedelta(seconds=LAG_S))
    after = actor_line(at(610), "Started: 'step'", written=at(610) - timedelta(seconds=LAG_S))
    tables = parse_every_way([*lines, copy, after], tmp_path)
    newest = tables.timers.sort("timestamp").row(-1, named=True)
    assert (newest["line"], newest["step"]) == (len(lines) + 2, 4)  # not step 5
    assert tables.summary.clock.replayed == 1
    (example,) = tables.summary.clock.replayed_examples
    assert example.startswith(f"finelog.log:{len(lines) + 1}: own time 2026-07-30 18:00:58")
    assert "collected 2026-07-30 18:10:00" in example


def test_a_replayed_failure_line_stays_a_failure(tmp_path: Path) -> None:
    """A re-sent line is never progress; a failure line is kept for the rules of failures."""
    copy = actor_line(
        at(600), "Train loop failed", written=at(60) - timedelta(seconds=LAG_S), level="ERROR"
    )
    tables = parse_every_way([*steps(3), copy], tmp_path)
    assert tables.summary.clock.replayed == 1
    assert tables.errors.filter(pl.col("kind") == "train_loop_failed").height == 1


def test_the_usual_skew_is_the_running_median_of_the_first_lines() -> None:
    """Before LAG_SAMPLE lines it is the median of those before the line (none for the first);
    after, the median of the first LAG_SAMPLE, whatever comes later."""
    state = ParserState()
    skews = [-2.0, -4.0, -1000.0, -2.0, None, -3.0]
    frame = pl.DataFrame({"_skew": skews}, schema={"_skew": pl.Float64})
    assert replays.usual_skew(frame, state).to_list() == [None, -2.0, -3.0, -4.0, None, -3.0]
    state.lag_sample = [-2.0] * replays.LAG_SAMPLE
    assert replays.usual_skew(frame, state).to_list() == [-2.0] * 4 + [None, -2.0]


def test_the_replay_tolerance_is_the_prefix_tolerance() -> None:
    """One tolerance for own time against prefix time, whether offset or replay."""
    assert replays.REPLAY_TOLERANCE_S == PREFIX_SKEW_TOLERANCE_S
