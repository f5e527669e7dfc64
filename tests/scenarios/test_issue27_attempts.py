"""Issue 27, findings 6 and 7, judged by `diagnose` as a user runs it: restarts the log shows only
by itself (no Iris setup lines, no attempt history) and a chunk the log shipper sent again.

Before the issue, the in-log restarts were one attempt: each restart's first step was "progress
after" the OOM before it (resources "survived"), so three attempts dying of one OOM were no KILL;
and a re-sent step line passed liveness as fresh progress. The boundary corpus pins both rules
(`in_log_crash_loop`, `replayed_line` in `tests/scenarios/boundary.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.models import GateName, Report
from tests.scenarios import in_log
from tests.scenarios.catalog import Built
from worker.diagnosis import diagnose
from worker.evidence.logs.replays import REPLAY_TOLERANCE_S


def judge(built: Built) -> Report:
    return diagnose(built.job_dir, now=built.now, probes_dir=built.probes)


def gate(report: Report, name: GateName) -> str:
    return report.gates[name].status.value


# --- finding 6: attempt boundaries without Iris setup lines ---------------------------------------


def test_three_in_log_attempts_dying_of_one_oom_are_a_crash_loop(tmp_path: Path) -> None:
    """Each attempt starts Ray, resumes and dies of the same OOM: the crash-loop KILL."""
    report = judge(in_log.crash_loop(tmp_path, "rl-gsm8k-oom-loop", last_recovers=False))
    assert report.verdict.value == "KILL"
    assert report.kill_proof is not None and report.kill_proof.rule == "crash_loop"
    assert report.restarts.doomed and report.restarts.same_failure is True
    assert report.restarts.attempts == 3
    assert "OutOfMemoryError: CUDA out of memory" in report.restarts.signatures[0]


def test_three_in_log_attempts_whose_last_trains_on_are_no_crash_loop(tmp_path: Path) -> None:
    """The same two OOM deaths, but the third attempt trains past the earlier peak: recovered."""
    report = judge(in_log.crash_loop(tmp_path, "rl-gsm8k-oom-then-ok", last_recovers=True))
    assert report.verdict.value == "NO-KILL"
    assert report.restarts.recovered and not report.restarts.doomed
    assert report.restarts.attempts == 3


def test_an_oom_then_a_restart_that_trains_on_names_who_progressed(tmp_path: Path) -> None:
    """One OOM ends attempt 0; attempt 1 resumes from step 8 and reaches step 12: no KILL, and
    the step after the restart is not called progress after the OOM in the same attempt."""
    report = judge(in_log.oom_then_recovery(tmp_path))
    assert report.verdict.value == "NO-KILL"
    assert report.restarts.recovered and report.restarts.count == 1
    resources = report.gates[GateName.RESOURCES]
    assert resources.kind == "cuda_recovered"
    assert resources.summary.endswith(
        "ended attempt 0; attempt 1 resumed from step 8 and reached step 12: recovered by the "
        "restart"
    )
    assert "survived" not in resources.summary


# --- finding 7: a replayed log chunk --------------------------------------------------------------


def test_a_replayed_step_line_as_the_newest_line_is_no_progress(tmp_path: Path) -> None:
    """Step 12's lines sent again forty minutes later, no stacks: liveness ERROR (live stacks
    needed), never PASS on the copy; the report states the re-sent lines."""
    report = judge(in_log.replayed_step(tmp_path, "rl-gsm8k-replayed", late_s=None))
    assert (report.verdict.value, gate(report, GateName.LIVENESS)) == ("ERROR", "ERROR")
    summary = report.gates[GateName.LIVENESS].summary
    assert summary.startswith("stall suspected, live stacks needed: quiet 41 min")
    assert "3 log line(s) re-sent by the log shipper" in summary
    stated = [d for d in report.discrepancies if "re-sent by the log shipper" in d]
    assert stated and "newest consistent progress: step at 2026-07-30T18:" in stated[0]


@pytest.mark.parametrize(("beyond", "liveness"), [(1.0, "ERROR"), (-1.0, "PASS")])
def test_a_step_line_older_than_its_collection_by_the_tolerance(
    beyond: float, liveness: str, tmp_path: Path
) -> None:
    """A `Finished: 'step'` collected a minute before `now` and written the tolerance + 1 s
    before that is a replay (ERROR, stated); written 1 s later it is a late line, progress."""
    built = in_log.replayed_step(
        tmp_path, f"rl-gsm8k-late-{liveness.lower()}", late_s=REPLAY_TOLERANCE_S + beyond
    )
    report = judge(built)
    assert gate(report, GateName.LIVENESS) == liveness
    stated = any("re-sent by the log shipper" in d for d in report.discrepancies)
    assert stated is (liveness == "ERROR")
