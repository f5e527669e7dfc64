"""Issue 27, findings 3, 4 and 9, on bundles whose engines log only to their own Ray worker logs
(`tests/scenarios/engine_lines.py`), judged by `diagnose` as a user runs it. The statuses of each
pair are pinned in the boundary corpus; these tests check what the report says.

- 3: idle engines are silent — a last line at 0 tok/s, then nothing, corroborates a stall.
- 4: every engine's logged death in its own log, then silence: the logged-death KILL.
- 9: a wedged engine is named and counted; every engine wedged without progress asks for stacks;
  an engine failing to start again and again is named with its count; engine lines dated after
  `now` are a discrepancy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.models import Confidence, GateName, Report
from tests.scenarios import engine_lines as eng
from tests.scenarios.catalog import Built
from worker.diagnosis import diagnose


def judge(built: Built) -> Report:
    return diagnose(built.job_dir, now=built.now, probes_dir=built.probes)


def test_every_engines_death_in_its_own_worker_log_is_the_logged_death_kill(
    tmp_path: Path,
) -> None:
    """Finding 4: `EngineCore encountered a fatal error` in each engine's own worker log (the
    driver forwarded nothing), the controller running, 11 min of silence: KILL on the
    `logged_death` proof quoting both worker logs."""
    report = judge(eng.death(tmp_path, "rl-ray-dead", engines=2, dead=2, silent_min=11))
    assert report.verdict.value == "KILL", report.reasoning
    proof = report.kill_proof
    assert proof is not None and proof.rule == "logged_death"
    assert "every inference engine (2 of 2)" in proof.mechanism
    quoted = [q for q in proof.evidence if q.source.startswith("ray_vllm_logs/")]
    assert len(quoted) == 2 and all("fatal error" in q.text for q in quoted)


def test_engines_silent_after_their_idle_line_corroborate_a_still_stall(tmp_path: Path) -> None:
    """Finding 3: identical stacks outside collectives, 50 quiet minutes, and each engine's last
    stat line (before the newest advancement) at 0 tok/s with nothing running: the `stall_still`
    KILL, its proof quoting an engine's idle line."""
    report = judge(eng.silent_stall(tmp_path, "rl-silent-idle", last_gen=0.0))
    assert report.verdict.value == "KILL", report.reasoning
    proof = report.kill_proof
    assert proof is not None and proof.rule == "stall_still"
    assert "every engine's last stat line" in proof.mechanism
    assert any(q.source.startswith("ray_vllm_logs/") for q in proof.evidence)


@pytest.mark.parametrize("logged", [True, False], ids=["logged", "silent"])
def test_one_wedged_engine_among_healthy_ones_is_named_and_counted(
    tmp_path: Path, logged: bool
) -> None:
    """Finding 9: one engine of two wedged for 11 min (its lines logged, or one line and then
    silence) is named in a resources FAIL and counted in the fleet; NO-KILL with a restart
    handoff, since its /health stays 200."""
    report = judge(
        eng.wedged(tmp_path, "rl-one-wedged", engines=2, wedged=1, wedge_min=11, logged=logged)
    )
    resources = report.gates[GateName.RESOURCES]
    assert report.verdict.value == "NO-KILL" and report.confidence is Confidence.MEDIUM
    assert "1 of 2 inference engine(s) wedged" in resources.summary
    assert "-287294.out/000 (Waiting 23, Running 0, 0 tok/s" in resources.summary
    assert "2 engine(s): 1 wedged, 1 saturated" in resources.summary
    assert report.handoff is not None and "vLLM" in report.handoff.component


def test_every_engine_wedged_and_nothing_advancing_asks_for_engine_stacks(tmp_path: Path) -> None:
    """Finding 9 (job-level effect): every engine wedged and the trainer silent since is ERROR,
    not KILL: the next action names the EngineCore and policy-rank stacks that would establish
    the stall."""
    report = judge(
        eng.wedged(tmp_path, "rl-all-wedged", engines=2, wedged=2, wedge_min=11, trainer_stops=True)
    )
    resources = report.gates[GateName.RESOURCES]
    assert report.verdict.value == "ERROR"
    assert "every inference engine wedged (2 of 2)" in resources.summary
    assert "EngineCore" in report.next_action and "py-spy" in report.next_action


def test_an_engine_failing_to_start_again_and_again_is_named_with_its_count(
    tmp_path: Path,
) -> None:
    """Finding 9: an engine whose own log shows three failed starts is a resources FAIL naming
    it and the count (NO-KILL: the other engines serve)."""
    report = judge(eng.restart_loop(tmp_path, "rl-restarts", failures=3))
    resources = report.gates[GateName.RESOURCES]
    assert report.verdict.value == "NO-KILL"
    assert resources.status.value == "FAIL"
    assert "-287296.out 3 times" in resources.summary


@pytest.mark.parametrize(("ahead_s", "stated"), [(61, True), (59, False)])
def test_engine_lines_ahead_of_now_are_a_stated_discrepancy(
    tmp_path: Path, ahead_s: float, stated: bool
) -> None:
    """Finding 9: an engine whose clock runs 61 s ahead logs lines dated after now: the report
    lists the discrepancy with its lead and resources says they were not counted; 59 s ahead
    is clock noise."""
    report = judge(eng.clock_ahead(tmp_path, f"rl-ahead-{ahead_s}", ahead_s=ahead_s))
    found = [d for d in report.discrepancies if "engine stat line" in d]
    assert bool(found) is stated
    if stated:
        assert "1 min 1 s ahead" in found[0]
        assert "not counted" in report.gates[GateName.RESOURCES].summary
