"""The long fault drills (`make drills`, i.e. `pytest -m drill tests/drills`): every fault of
issue 11, each repeated DRILL_RUNS times (default 3) on its own stack, each alert answered
exactly once. They take from a minute to half an hour each; docs/reliability.md has the figures
and the `python -m tests.drills` command behind each."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.drills import drills
from tests.drills.drills import Session
from tests.drills.test_fast_drills import assert_exactly_once

pytestmark = [pytest.mark.drill, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(0)]

RUNS = int(os.environ.get("DRILL_RUNS", "3"))
LIMITS = {"RLHEALTH_GATE_TIME_LIMIT_S": "20", "RLHEALTH_CAPTURE_TIME_LIMIT_S": "20"}
Drill = Callable[[Session], dict[str, Any]]


def _run(tmp_path: Path, drill: Drill, env: dict[str, str] | None = None, **kw: Any) -> Any:
    with drills.session(tmp_path / "stack", env=env, **kw) as started:
        figures = drill(started)
        figures["product"] = started.stack.product.label
    _save(figures)
    return figures


def _save(figures: dict[str, Any]) -> None:
    """With DRILL_RESULTS set, the figures go to `$DRILL_RESULTS/<test id>.json` (the load
    average with them), as `python -m tests.drills` saves its own."""
    out = os.environ.get("DRILL_RESULTS")
    if not out:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "drill").split("::")[-1].split(" ")[0]
    figures["command"] = f"pytest -m drill tests/drills/test_drills.py::{test}"
    figures["load_average"] = Path("/proc/loadavg").read_text().split()[:3]
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"{test}.json").write_text(json.dumps(figures, indent=1, default=str))


@pytest.mark.parametrize("task", ["rlhealth.capture", "rlhealth.gate"])
def test_worker_child_killed(tmp_path: Path, task: str) -> None:
    """A pool child SIGKILLed in the capture or a gate: its task runs again; one verdict."""
    figures = _run(tmp_path, lambda s: drills.worker_kill(s, runs=RUNS, task=task,
                                                          main_process=False))  # fmt: skip
    assert_exactly_once(figures)


@pytest.mark.parametrize("task", ["rlhealth.capture", "rlhealth.gate"])
def test_worker_main_process_killed(tmp_path: Path, task: str) -> None:
    """The worker's main process SIGKILLed (then started again): answered within the default
    lease of 120 s and a watchdog tick, not the broker's 900 s visibility timeout."""
    figures = _run(tmp_path, lambda s: drills.worker_kill(
        s, runs=RUNS, task=task, main_process=True, settle_s=600))  # fmt: skip
    assert_exactly_once(figures)
    assert max(figures["kill_to_verdict_s"]) < 300


@pytest.mark.parametrize("down_s", [5, 60])
@pytest.mark.parametrize("crash", [False, True])
def test_redis_outage(tmp_path: Path, down_s: float, crash: bool) -> None:
    """redis-server stopped (SIGTERM) or crashed (SIGKILL), AOF on, for 5 s and 60 s while
    diagnoses run and alerts keep coming: every alert answered once."""
    figures = _run(tmp_path, lambda s: drills.redis_outage(
        s, runs=RUNS, down_s=down_s, crash=crash))  # fmt: skip
    assert_exactly_once(figures)


@pytest.mark.parametrize(("down_s", "lose"), [(30, False), (300, False), (30, True)])
def test_s3_outage(tmp_path: Path, down_s: float, lose: bool) -> None:
    """S3 unreachable for 30 s and 5 min, or restarted empty: every alert answered once, never
    before its report."""
    runs = 1 if down_s > 60 else RUNS
    figures = _run(tmp_path, lambda s: drills.s3_outage(s, runs=runs, down_s=down_s, lose=lose))
    assert_exactly_once(figures)


def test_ingest_killed_mid_burst(tmp_path: Path) -> None:
    """`rl-health ingest` SIGKILLed right after reading a burst: nothing lost or doubled."""
    assert_exactly_once(_run(tmp_path, lambda s: drills.ingest_kill(s, runs=RUNS)))


def test_poison_bundle(tmp_path: Path) -> None:
    """A bundle that fails its diagnosis: ERROR with a dead letter; later alerts answered."""
    figures = _run(tmp_path, lambda s: drills.poison(s, runs=RUNS))
    assert_exactly_once(figures)
    assert figures["later_alerts_answered"] == RUNS
    assert figures["diagnoses_failed_and_dead_lettered"] == RUNS


@pytest.mark.parametrize(("kind", "stall_s"), [("soft", 17), ("hard", 26)])
@pytest.mark.parametrize("task", ["rlhealth.capture", "rlhealth.gate"])
def test_stage_past_its_time_limit(tmp_path: Path, task: str, kind: str, stall_s: float) -> None:
    """A capture or gate past its soft (16 s) or hard (20 s) limit: sent again, and past it
    again answered ERROR naming it with a dead letter; never a time limit frozen as evidence;
    the next alert for the job is answered."""
    figures = _run(tmp_path, lambda s: drills.time_limit(
        s, runs=RUNS, task=task, stall_s=stall_s, kind=kind), env=LIMITS)  # fmt: skip
    assert_exactly_once(figures)
    assert figures["reports_quoting_a_time_limit_as_evidence"] == 0
    assert figures["later_alerts_answered"] == RUNS
    assert figures["watchdog_or_callback_resends"] >= RUNS
    assert all("time limit" in reason for reason in figures["failure_reasons"])


def test_bundle_beyond_the_workers_memory(tmp_path: Path) -> None:
    """A bundle that needs more memory than the worker has (a 1.5 GB memory cgroup, below the
    parse budget of 8 GB it is given, so the kernel, not the parse, stops the child): ERROR
    after the second kill, with a dead letter, not endless redelivery."""
    env = {"RLHEALTH_PARSE_MEMORY_MB": "8192"}
    figures = _run(tmp_path, lambda s: drills.memory(s, runs=RUNS), env=env,
                   worker_memory_limit_mb=1500)  # fmt: skip
    assert_exactly_once(figures)
    assert figures["diagnoses_failed_and_dead_lettered"] == RUNS
    assert RUNS <= figures["oom_kills"] <= 2 * RUNS  # the kernel did kill: the drill's fault
    assert all("killed twice" in reason for reason in figures["failure_reasons"])


def test_bundle_beyond_the_memory_budget(tmp_path: Path) -> None:
    """A bundle past RLHEALTH_WORKER_MEMORY_MB: the task stops itself, ERROR says so, with a
    dead letter."""
    env = {"RLHEALTH_WORKER_MEMORY_MB": "300"}
    figures = _run(tmp_path, lambda s: drills.memory(s, runs=RUNS), env=env)
    assert_exactly_once(figures)
    assert figures["diagnoses_failed_and_dead_lettered"] == RUNS
    assert figures["failure_reasons"]
    assert all("memory budget" in reason for reason in figures["failure_reasons"])
