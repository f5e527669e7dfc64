"""Poison guards, time limits and the workflow's error callbacks, without a broker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fakeredis
import pytest
from celery.exceptions import Reject, SoftTimeLimitExceeded, TimeLimitExceeded

from shared.streams import StreamNames
from worker.pipeline.failures import PoisonError, StageTimeoutError, classified
from worker.pipeline.guard import DeliveryGuard, MemoryCeiling, resident_bytes
from worker.pipeline.heartbeat import held_leads
from worker.pipeline.tasks import _timed, workflow

WAIT_S = 10  # a deadline for the budget's watcher thread, not a guess at how long it takes

# --- killed twice -------------------------------------------------------------------------------


def test_a_task_killed_once_runs_again() -> None:
    """The second start of one delivery (its process was killed once) is allowed."""
    guard = DeliveryGuard(fakeredis.FakeRedis(), StreamNames("t"))
    guard.started("task-1", 0, "capture")
    guard.started("task-1", 0, "capture")


def test_a_task_killed_twice_does_not_run_a_third_time() -> None:
    """The third start of one delivery raises PoisonError saying the task was killed twice."""
    guard = DeliveryGuard(fakeredis.FakeRedis(), StreamNames("t"))
    guard.started("task-1", 0, "capture")
    guard.started("task-1", 0, "capture")
    with pytest.raises(PoisonError, match="capture was killed twice"):
        guard.started("task-1", 0, "capture")


def test_retries_are_not_kills() -> None:
    """Each retry of a task is a new delivery: three retries are not three kills."""
    guard = DeliveryGuard(fakeredis.FakeRedis(), StreamNames("t"))
    for retries in range(4):
        guard.started("task-1", retries, "gate liveness")


def test_a_recorded_memory_overrun_stops_the_next_delivery() -> None:
    """After the process was stopped for its memory, the task fails at once with the reason."""
    guard = DeliveryGuard(fakeredis.FakeRedis(), StreamNames("t"))
    guard.stopped("task-1", "capture exhausted its memory budget")
    with pytest.raises(PoisonError, match="memory budget"):
        guard.started("task-1", 0, "capture")


# --- the memory budget --------------------------------------------------------------------------


def test_memory_budget_stops_the_process_past_the_budget() -> None:
    """Past the budget the overrun is recorded, then the process is stopped."""
    calls: list[str] = []
    stopped = threading.Event()

    def stop_process() -> None:
        calls.append("stopped")
        stopped.set()

    budget = MemoryCeiling(
        100,
        lambda used: calls.append(f"recorded {used}"),
        interval_s=0.01,
        measure=lambda: 101 * 2**20,
        stop_process=stop_process,
    )
    with budget.watching():
        assert stopped.wait(WAIT_S)
    assert calls == [f"recorded {101 * 2**20}", "stopped"]


def test_memory_budget_leaves_a_process_within_it_alone() -> None:
    """Just within the budget nothing happens; a budget of 0 watches nothing."""
    calls: list[str] = []
    measured: list[int] = []
    checked_thrice = threading.Event()

    def measure() -> int:
        measured.append(100 * 2**20)
        if len(measured) >= 3:
            checked_thrice.set()
        return measured[-1]

    within = MemoryCeiling(
        100, lambda used: calls.append("recorded"), interval_s=0.01,
        measure=measure, stop_process=lambda: calls.append("stopped"),
    )  # fmt: skip
    with within.watching():
        assert checked_thrice.wait(WAIT_S)
    with MemoryCeiling(0, lambda used: calls.append("recorded")).watching():
        pass
    assert calls == []


def test_memory_budget_kills_a_real_process(tmp_path: Path) -> None:
    """A process allocating past its budget is SIGKILLed after writing down why."""
    note = tmp_path / "why"
    code = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from worker.pipeline.guard import MemoryCeiling
        budget = MemoryCeiling(120, lambda used: Path({str(note)!r}).write_text(str(used)))
        hoard = []
        with budget.watching():
            for _ in range(100):
                hoard.append(bytearray(20 * 2**20))
                time.sleep(0.05)
        print("survived")
    """)
    root = Path(__file__).resolve().parents[2]
    argv = [sys.executable, "-c", code]
    done = subprocess.run(argv, check=False, cwd=root, capture_output=True, timeout=60)
    assert done.returncode == -9, done.stderr
    assert int(note.read_text()) > 120 * 2**20
    assert b"survived" not in done.stdout
    assert resident_bytes() > 0


def test_memory_error_is_poison_not_a_crash_of_the_worker() -> None:
    """A MemoryError inside a task becomes PoisonError (Celery would re-raise it in the worker)."""
    with pytest.raises(PoisonError, match=r"ran out of memory \(MemoryError\)"), classified():
        raise MemoryError


# --- time limits --------------------------------------------------------------------------------


def test_a_soft_time_limit_is_a_stage_failure() -> None:
    """SoftTimeLimitExceeded inside a step becomes StageTimeoutError naming the stage."""
    expected = pytest.raises(StageTimeoutError, match=r"gate liveness ran past its soft time")
    with expected, _timed("gate liveness", 72):
        raise SoftTimeLimitExceeded()


def test_a_step_that_swallowed_the_limit_still_fails() -> None:
    """A step that ran past the soft limit fails even if it caught the signal and returned."""
    with pytest.raises(StageTimeoutError, match="its result is not used"), _timed("gate", 0.05):
        time.sleep(0.06)


def test_a_step_just_within_the_limit_passes() -> None:
    """A step that ends before its soft limit is untouched."""
    with _timed("gate liveness", 5):
        pass


# --- the workflow -------------------------------------------------------------------------------


def _links(signature: Any) -> list[str]:
    return [link["task"] for link in signature.options.get("link_error", [])]


def test_every_stage_fails_into_the_error_callback() -> None:
    """The capture and the chord's callback (verdict, then publish: Celery calls its error
    callback when a gate fails) link `rlhealth.fail` with the lead and job; every task carries
    the lead and a deadline."""
    flow = workflow("e1", "e1", "jobs/a", deadline=123.0)
    capture, chord = flow.tasks
    assert _links(capture) == _links(chord.body) == ["rlhealth.fail"]
    errback = capture.options["link_error"][0]
    assert (errback["kwargs"]["lead"], errback["kwargs"]["job"]) == ("e1", "jobs/a")
    assert [t.name for t in chord.body.tasks] == ["rlhealth.verdict", "rlhealth.publish"]
    tasks = [capture, *chord.tasks, *chord.body.tasks]
    assert all(t.kwargs == {"lead": "e1", "deadline": 123.0} for t in tasks)


def test_heartbeat_finds_the_lead_of_every_held_task() -> None:
    """The leads of running, waiting and scheduled requests, and nothing from foreign ones."""
    requests = {
        "a": SimpleNamespace(kwargs={"lead": "e1", "deadline": 1.0}),
        "b": SimpleNamespace(kwargs={"lead": "e2"}),
        "c": SimpleNamespace(kwargs={}),
        "d": SimpleNamespace(kwargs=None),
    }
    assert held_leads(requests) == {"e1", "e2"}


class _Request:
    """Hashable like Celery's Request (its state keeps requests in weak sets)."""

    def __init__(self, task_id: str, lead: str) -> None:
        self.id, self.kwargs = task_id, {"lead": lead}


def test_heartbeat_renews_tasks_waiting_out_a_countdown() -> None:
    """A task held for a countdown (a retry, the second look) keeps its lease: Celery's own
    state functions file it, and the heartbeat finds it, however the version files it."""
    from celery.worker import state

    running, waiting = _Request("t1", "e-running"), _Request("t2", "e-waiting")
    state.task_reserved(running)
    state.task_scheduled(waiting)
    state.requests.pop("t2", None)  # as versions that keep scheduled requests apart do
    try:
        assert held_leads() == {"e-running", "e-waiting"}
    finally:
        state.requests.pop("t1", None)
        state.reserved_requests.discard(running)
        state.scheduled_requests.discard(waiting)


def test_failure_reasons_name_the_stage_and_the_cause() -> None:
    """The ERROR report's reason says which stage failed and how, for each kind of failure."""
    from celery.exceptions import TimeLimitExceeded

    from worker.pipeline.failures import EvidenceLostError, InfrastructureError, explain

    assert explain("capture", PoisonError("ran out of memory (MemoryError)")) == (
        "capture ran out of memory (MemoryError)"
    )
    killed = PoisonError("gate liveness was killed twice while running")
    assert explain("gate liveness", killed) == str(killed)
    assert "hard time limit (90 s)" in explain("gate dynamics", TimeLimitExceeded(90))
    assert explain("capture", SoftTimeLimitExceeded()) == "capture ran past its soft time limit"
    assert explain("verdict", ValueError("bad")) == "verdict failed: ValueError: bad"
    assert "retry deadline" in explain("capture", InfrastructureError("S3 away"))
    assert explain("capture", EvidenceLostError("gone")) == "capture: gone"
    assert explain("publish", None) == "publish failed (no error was recorded)"


def test_only_failures_a_new_workflow_can_get_past_are_sent_again() -> None:
    """Lost evidence after the capture, a Redis fault that escaped the retries and a first time
    limit are sent again; a capture that lost its event, a fault still there at the deadline, a
    second time limit or a bug are answered ERROR."""
    import redis

    from worker.pipeline.failures import EvidenceLostError, InfrastructureError
    from worker.pipeline.tasks import _recoverable

    assert _recoverable("gate liveness", EvidenceLostError("gone"))
    assert _recoverable("verdict", redis.exceptions.ConnectionError("away"))
    assert _recoverable("capture", Reject("OperationalError('refused')", False))
    assert not _recoverable("capture", EvidenceLostError("gone"))
    assert not _recoverable("capture", InfrastructureError("S3 away past the deadline"))
    assert _recoverable("gate liveness", StageTimeoutError("past"), first=True)
    assert not _recoverable("gate liveness", StageTimeoutError("past"), first=False)
    assert not _recoverable("capture", TimeLimitExceeded(300), first=False)
    assert not _recoverable("verdict", ValueError("bug"))
    assert not _recoverable("publish", None)
    from worker.pipeline.steps import CaptureBusyError

    assert _recoverable("capture", CaptureBusyError("under way"), first=True)
    assert not _recoverable("capture", CaptureBusyError("under way"), first=False)
