"""The second look before a stall KILL, pure part (worker.second_look): two observations compared,
the report settled. Each thing that moves gives NO-KILL; nothing moving confirms the KILL with both
observations; a look that cannot see is ERROR; a job that ended is NO-KILL, nothing to kill."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from shared.models import Confidence, Quote, Report, SecondLookOutcome, Verdict
from tests.factories import NOW, evidence, logs
from tests.ray_node import AGENT, DRIVER, IDLE_WORKER, LOG_MONITOR
from tests.unit.test_gate_liveness import steady_steps, timer
from worker.diagnosis import judge
from worker.evidence.case import Evidence
from worker.evidence.model import (
    AttemptRecord,
    ControllerView,
    ParseSummary,
    ProbeCommand,
    ProbeEvidence,
    ProcessRecord,
    StackDump,
)
from worker.second_look import compare, observe, rests_on_stacks, settle

WEDGED = """\
Process {pid}: ray::PolicyWorker.train
Python v3.12.3 (/usr/bin/python3.12)

Thread {pid} (active): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2501)
    ppo_train (skyrl_train/workers/worker.py:655)
"""
MOVING = """\
Process {pid}: ray::PolicyWorker.train
Python v3.12.3 (/usr/bin/python3.12)

Thread {pid} (active): "MainThread"
    forward (torch/nn/modules/module.py:1501)
    ppo_train (skyrl_train/workers/worker.py:640)
"""
LATER = NOW + timedelta(seconds=60)
SUMMARY = ParseSummary(files=("finelog.log",), lines=1000)


def _dumps(
    at: datetime, pid: int = 4242, texts: tuple[str, str] = (WEDGED, WEDGED)
) -> tuple[StackDump, ...]:
    return tuple(
        StackDump(
            target="rl-job-0",
            pid=pid,
            n=n,
            source=f"probes/stacks/rl-job-0-pid{pid}-{n}.txt",
            captured_at=at - timedelta(seconds=20 - 10 * n),
            text=texts[n - 1].format(pid=pid),
        )
        for n in (1, 2)
    )


def _rows(extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    rows = [*steady_steps(30), timer("started", "policy_train", 29, 900, step=9)]
    return rows + (extra or [])


def _probe(
    at: datetime,
    *,
    state: str = "running",
    stacks: tuple[StackDump, ...] = (),
    attempts: tuple[AttemptRecord, ...] | None = None,
    commands: tuple[ProbeCommand, ...] = (),
    controller: bool = True,
) -> ProbeEvidence:
    view = ControllerView(job_id="/ops/rl-job", state=state) if controller else None
    return ProbeEvidence(
        directory="probes", captured_at=at, controller=view, stacks=stacks,
        attempts=attempts, commands=commands,
    )  # fmt: skip


def _look(
    *,
    now: datetime,
    rows: list[dict[str, Any]] | None = None,
    probes: ProbeEvidence | None = None,
    metrics: list[dict[str, Any]] | None = None,
    readable: bool = True,
) -> Evidence:
    tables = logs(timers=rows or _rows(), metrics=metrics or [], summary=SUMMARY)
    return evidence(now=now, log_tables=tables if readable else None, probes=probes)


def _first(**overrides: Any) -> Evidence:
    return _look(now=NOW, probes=_probe(NOW, stacks=_dumps(NOW)), **overrides)


def _second(**overrides: Any) -> Evidence:
    probes = overrides.pop("probes", None) or _probe(LATER, stacks=_dumps(LATER))
    return _look(now=LATER, probes=probes, **overrides)


def _judge(first: Evidence, second: Evidence) -> Any:
    return compare(observe(first), observe(second, prefix="second_look/"), 60.0)


@pytest.fixture
def killed() -> Report:
    report = judge(_first())
    assert report.verdict is Verdict.KILL and rests_on_stacks(report)
    return report


# --- nothing moved: the KILL stands, both observations quoted -----------------------------------


def test_still_wedged_confirms_the_kill_quoting_both_observations(killed: Report) -> None:
    """Same log, same controller, same stacks: KILL; the proof quotes the first dumps and the
    second look's (under second_look/), and the report records the look."""
    look = _judge(_first(), _second())
    assert look.outcome is SecondLookOutcome.CONFIRMED and look.moved == ()
    assert "still wedged" in look.summary and "all_reduce" in look.summary
    final = settle(killed, look)
    assert final.verdict is Verdict.KILL and final.kill_proof is not None
    sources = [q.source for q in final.kill_proof.evidence]
    assert any(s.startswith("probes/stacks/") for s in sources)
    assert any(s.startswith("second_look/probes/stacks/") for s in sources)
    assert final.second_look == look and "Confirmed by a second look 60 s later" in final.reasoning
    assert final.contract_dict()["second_look"]["outcome"] == "confirmed"


# --- each thing that moved: NO-KILL saying what -------------------------------------------------


def test_log_advanced_by_exactly_one_step_is_moved_and_not_at_all_is_not() -> None:
    """Step 9 → 10 (at the same time, so only the step moved) is movement; step 9 → 9 is not."""
    stamp = NOW - timedelta(minutes=29)
    step = {"key": "loss", "value": 1.0, "source": "finelog.log", "line": 901, "timestamp": stamp}
    first = _first(metrics=[{**step, "step": 9}])
    moved = _judge(first, _second(metrics=[{**step, "step": 10}]))
    still = _judge(first, _second(metrics=[{**step, "step": 9}]))
    assert moved.outcome is SecondLookOutcome.MOVED
    assert moved.moved == ("the log advanced from step 9 to step 10",)
    assert still.outcome is SecondLookOutcome.CONFIRMED


def test_progress_time_just_past_is_moved_and_equal_is_not() -> None:
    """A progress line one millisecond past the first look's newest is movement; one at the same
    instant is not."""
    newest = observe(_first()).progress_at
    assert newest is not None
    minutes_ago = (NOW - newest).total_seconds() / 60
    just_past = timer("started", "policy_train", minutes_ago - 0.001 / 60, 950)
    equal = timer("started", "policy_train", minutes_ago, 950)
    moved = _judge(_first(), _second(rows=_rows([just_past])))
    still = _judge(_first(), _second(rows=_rows([equal])))
    assert moved.outcome is SecondLookOutcome.MOVED and "the log advanced past" in moved.moved[0]
    assert still.outcome is SecondLookOutcome.CONFIRMED


def test_controller_state_change_is_moved() -> None:
    """running → pending (rescheduled) moved."""
    probes = _probe(LATER, state="pending", stacks=_dumps(LATER))
    look = _judge(_first(), _second(probes=probes))
    assert look.outcome is SecondLookOutcome.MOVED
    assert look.moved == ("the controller state changed from running to pending",)


def test_new_attempt_is_moved() -> None:
    """The controller's newest attempt went from 0 to 1."""

    def attempts(n: int) -> tuple[AttemptRecord, ...]:
        return tuple(AttemptRecord(task_id="/ops/rl-job/0", attempt_id=i, state="running")
                     for i in range(n + 1))  # fmt: skip

    first = _look(now=NOW, probes=_probe(NOW, stacks=_dumps(NOW), attempts=attempts(0)))
    second = _second(probes=_probe(LATER, stacks=_dumps(LATER), attempts=attempts(1)))
    look = _judge(first, second)
    assert look.outcome is SecondLookOutcome.MOVED
    assert look.moved == ("a new attempt: attempt /ops/rl-job/0:0 then /ops/rl-job/0:1",)
    lost = _second(probes=_probe(LATER, stacks=_dumps(LATER), attempts=None))
    blind = _judge(first, lost)
    assert blind.outcome is SecondLookOutcome.BLIND
    assert "the controller's attempt history could not be read" in blind.summary


def test_a_stack_that_differs_is_moved(killed: Report) -> None:
    """The second pair shows the rank in `forward`: NO-KILL, low confidence (only the stacks
    moved), the flip signal saying what moved and that a re-alert re-judges."""
    probes = _probe(LATER, stacks=_dumps(LATER, texts=(MOVING, MOVING)))
    look = _judge(_first(), _second(probes=probes))
    assert look.outcome is SecondLookOutcome.MOVED
    assert "stack changed from `all_reduce" in look.moved[0] and "to `forward" in look.moved[0]
    final = settle(killed, look)
    assert (final.verdict, final.confidence, final.kill_proof) == (
        Verdict.NO_KILL, Confidence.LOW, None,
    )  # fmt: skip
    assert "re-alert" in final.flip_signal and "forward" in final.flip_signal


def test_a_second_pair_that_moves_within_itself_is_moved() -> None:
    """The first new dump still wedged, the second one elsewhere: moved."""
    probes = _probe(LATER, stacks=_dumps(LATER, texts=(WEDGED, MOVING)))
    assert _judge(_first(), _second(probes=probes)).outcome is SecondLookOutcome.MOVED


def test_a_process_gone_or_new_is_moved() -> None:
    """The wedged pid is no longer there, another one is: both said."""
    probes = _probe(LATER, stacks=_dumps(LATER, pid=5151))
    look = _judge(_first(), _second(probes=probes))
    assert look.outcome is SecondLookOutcome.MOVED
    assert look.moved == ("rl-job-0 pid 4242 is gone", "rl-job-0 pid 5151 is new")


def test_the_log_moving_gives_medium_confidence(killed: Report) -> None:
    """Trustworthy progress (the log) moved: NO-KILL with medium confidence."""
    rows = _rows([timer("finished", "step", -0.5, 990, seconds=60.0, step=9)])
    final = settle(killed, _judge(_first(), _second(rows=rows)))
    assert (final.verdict, final.confidence) == (Verdict.NO_KILL, Confidence.MEDIUM)


# --- the job ended meanwhile: NO-KILL, nothing to kill -------------------------------------------


@pytest.mark.parametrize("state", ["succeeded", "failed", "killed"])
def test_a_job_that_went_terminal_is_no_kill_nothing_to_kill(killed: Report, state: str) -> None:
    """Whatever else the look could not see (no stacks of an ended job), terminal wins."""
    look = _judge(_first(), _second(probes=_probe(LATER, state=state)))
    assert look.outcome is SecondLookOutcome.TERMINAL
    assert f"the job went {state} meanwhile" in look.summary and "nothing to kill" in look.summary
    final = settle(killed, look)
    assert (final.verdict, final.kill_proof) == (Verdict.NO_KILL, None)
    assert "nothing to kill" in final.next_action


# --- the second look cannot see: ERROR ----------------------------------------------------------


def test_a_failed_py_spy_probe_is_error(killed: Report) -> None:
    """A py-spy dump that failed leaves the look blind, even though other dumps are there."""
    failed = ProbeCommand(argv=("py-spy", "dump", "--pid", "4243"), started_at=LATER, exit_code=1)
    probes = _probe(LATER, stacks=_dumps(LATER), commands=(failed,))
    look = _judge(_first(), _second(probes=probes))
    assert look.outcome is SecondLookOutcome.BLIND
    assert "py-spy dump --pid 4243` exited 1" in look.summary
    final = settle(killed, look)
    assert (final.verdict, final.confidence, final.kill_proof) == (
        Verdict.ERROR, Confidence.LOW, None,
    )  # fmt: skip
    assert "blind is not healthy" in final.reasoning


def test_a_failed_py_spy_probe_beats_a_log_that_moved() -> None:
    """Blind is checked before movement: a look that cannot see the stacks is ERROR."""
    failed = ProbeCommand(argv=("py-spy", "dump", "--pid", "4242"), started_at=LATER, exit_code=1)
    rows = _rows([timer("finished", "step", -0.5, 990, seconds=60.0, step=9)])
    look = _judge(_first(), _second(rows=rows, probes=_probe(LATER, commands=(failed,))))
    assert look.outcome is SecondLookOutcome.BLIND


def test_an_unreadable_log_is_error() -> None:
    look = _judge(_first(), _second(readable=False))
    assert look.outcome is SecondLookOutcome.BLIND
    assert "the trainer log is missing or empty" in look.summary


def test_no_live_probe_is_error() -> None:
    """No backend to probe with: the note says why."""
    second = _look(now=LATER, probes=None)
    look = _judge(_first(), second)
    assert look.outcome is SecondLookOutcome.BLIND and "no live probe was taken" in look.summary


def test_no_controller_state_is_error() -> None:
    look = _judge(_first(), _second(probes=_probe(LATER, stacks=_dumps(LATER), controller=False)))
    assert look.outcome is SecondLookOutcome.BLIND
    assert "the controller's state could not be read" in look.summary


def test_a_job_gone_without_a_terminal_state_is_error() -> None:
    """The local backend's `missing` (the pid is gone): not terminal, not seen."""
    look = _judge(_first(), _second(probes=_probe(LATER, state="missing")))
    assert look.outcome is SecondLookOutcome.BLIND
    assert "gone without a terminal state" in look.summary


# --- when a second look is due ------------------------------------------------------------------


def test_only_a_kill_whose_proof_quotes_stacks_needs_a_second_look(killed: Report) -> None:
    """A stall KILL does; the same report with a proof quoting only the log does not, nor does
    a NO-KILL."""
    assert killed.kill_proof is not None
    log_only = killed.kill_proof.model_copy(
        update={"rule": "crash_loop", "evidence": (Quote(source="finelog.log", text="boom"),)}
    )
    assert not rests_on_stacks(killed.model_copy(update={"kill_proof": log_only}))
    healthy = killed.model_copy(update={"verdict": Verdict.NO_KILL, "kill_proof": None})
    assert not rests_on_stacks(healthy)


# --- roles: only the processes that matter move -------------------------------------------------


def _ray(at: datetime, pid: int, *texts: str) -> tuple[StackDump, ...]:
    """Dumps of one process of a Ray node, the way `_dumps` dates them."""
    return tuple(
        StackDump(
            target="rl-job-0", pid=pid, n=n, source=f"probes/stacks/rl-job-0-pid{pid}-{n}.txt",
            captured_at=at - timedelta(seconds=20 - 10 * n), text=text,
        )
        for n, text in enumerate(texts, start=1)
    )  # fmt: skip


def _node(at: datetime, monitor_line: int, *extra: StackDump) -> ProbeEvidence:
    """The wedged rank beside a log monitor at `monitor_line` and a dashboard agent in select."""
    helpers = (
        *_ray(
            at, 301, LOG_MONITOR.dump(301, monitor_line), LOG_MONITOR.dump(301, monitor_line + 3)
        ),
        *_ray(at, 302, AGENT.dump(302, 468), AGENT.dump(302, 415)),
    )
    return _probe(at, stacks=(*_dumps(at), *helpers, *extra))


def test_helpers_that_move_come_or_go_are_ignored_and_the_kill_stands(killed: Report) -> None:
    """The log monitor moved on, the agent churned between waits and a new idle worker appeared:
    confirmed, the summary saying what was ignored, and no helper quoted."""
    idle = _ray(LATER, 9, IDLE_WORKER.dump(9), IDLE_WORKER.dump(9))
    first = _look(now=NOW, probes=_node(NOW, 520))
    look = _judge(first, _second(probes=_node(LATER, 580, *idle)))
    assert look.outcome is SecondLookOutcome.CONFIRMED, look.summary
    assert "ignored, not progress" in look.summary and "pid 301" in look.summary
    assert "pid 9 is new" in look.summary
    assert all("pid4242" in q.source for q in look.evidence if "stacks/" in q.source)
    assert settle(killed, look).verdict is Verdict.KILL


SIDECAR = 'Process 400: python sidecar.py\n\nThread 400 (idle): "MainThread"\n    {top}\n'


def test_an_unknown_process_at_work_is_movement_and_one_between_idle_waits_is_not() -> None:
    """Beside the same helpers, an unnamed process in two different compute frames moved; one
    that went from `select` to a connection's `_recv` only waited."""
    work = _look(now=NOW, probes=_node(NOW, 520, *_ray(NOW, 400, SIDECAR.format(top="a (s.py:1)"))))
    moved = _judge(
        work, _second(probes=_node(LATER, 580, *_ray(LATER, 400, SIDECAR.format(top="b (s.py:9)"))))
    )
    assert moved.outcome is SecondLookOutcome.MOVED
    assert moved.moved == ("rl-job-0 pid 400: stack changed from `a (s.py:1)` to `b (s.py:9)`",)
    select = SIDECAR.format(top="_PollLikeSelector.select (selectors.py:415)")
    recv = SIDECAR.format(top="Connection._recv (multiprocessing/connection.py:395)")
    waiting = _look(now=NOW, probes=_node(NOW, 520, *_ray(NOW, 400, select)))
    look = _judge(waiting, _second(probes=_node(LATER, 580, *_ray(LATER, 400, recv))))
    assert look.outcome is SecondLookOutcome.CONFIRMED, look.summary
    assert "only idle waits" in look.summary


def _failed_dump(pid: int) -> ProbeCommand:
    argv = ("iris", "task", "exec", "/ops/rl-job/0", "--", "py-spy", "dump", "--pid", str(pid))
    return ProbeCommand(
        argv=argv, started_at=LATER, exit_code=1, output=f"failed/stacks/rl-job-0-pid{pid}-2.txt"
    )


@pytest.mark.parametrize(
    ("pid", "outcome"), [(301, "confirmed"), (1, "confirmed"), (4242, "blind")]
)
def test_a_failed_dump_blinds_the_look_only_for_a_process_that_matters(
    pid: int, outcome: str
) -> None:
    """The log monitor's second dump failed, or the driver's beside the rank parked in a
    collective: noted, the KILL confirmed; the rank's: blind."""
    driver = _ray(NOW, 1, DRIVER.dump(1, 290), DRIVER.dump(1, 290))
    first = _look(now=NOW, probes=_node(NOW, 520, *driver))
    again = _node(LATER, 520, *_ray(LATER, 1, DRIVER.dump(1, 290), DRIVER.dump(1, 290)))
    kept = tuple(d for d in again.stacks if not (d.pid == pid and d.n == 2))
    probes = _probe(LATER, stacks=kept, commands=(_failed_dump(pid),))
    look = _judge(first, _second(probes=probes))
    assert look.outcome.value == outcome, look.summary
    if outcome == "confirmed":
        assert f"pid {pid}: `iris task exec" in look.summary


def test_a_failed_driver_dump_blinds_a_look_at_a_queue_deadlock() -> None:
    """Without ranks parked in a collective (a coordinator on its queue), the driver's failed
    dump is a hole: blind."""
    queue = (
        "Process {pid}: ray::AgenticRolloutCoordinator.run\n\n"
        'Thread {pid} (idle): "MainThread"\n    get (queue.py:180)\n    run (coordinator.py:40)\n'
    )
    first = _look(
        now=NOW,
        probes=_probe(
            NOW, stacks=(*_dumps(NOW, texts=(queue, queue)), *_ray(NOW, 1, DRIVER.dump(1, 290)))
        ),
    )
    driver = _ray(LATER, 1, DRIVER.dump(1, 290))  # its second dump failed
    second = _probe(
        LATER, stacks=(*_dumps(LATER, texts=(queue, queue)), *driver), commands=(_failed_dump(1),)
    )
    assert _judge(first, _second(probes=second)).outcome is SecondLookOutcome.BLIND


def test_the_driver_dumped_once_beside_ranks_in_a_collective_does_not_move_the_job() -> None:
    """The driver (in `ray.get`) dumped only in the first look and once in the second: the
    ranks still parked, the look confirms."""
    first = _look(
        now=NOW, probes=_probe(NOW, stacks=(*_dumps(NOW), *_ray(NOW, 1, DRIVER.dump(1, 290))))
    )
    second = _probe(LATER, stacks=(*_dumps(LATER), *_ray(LATER, 1, DRIVER.dump(1, 290))))
    assert _judge(first, _second(probes=second)).outcome is SecondLookOutcome.CONFIRMED
    moved = _probe(LATER, stacks=(*_dumps(LATER), *_ray(LATER, 1, DRIVER.dump(1, 291))))
    assert _judge(first, _second(probes=moved)).outcome is SecondLookOutcome.MOVED


def test_a_driver_whose_dumps_both_failed_is_not_gone() -> None:
    """processes.json names pid 1 the driver and both its dumps failed in the second look: it is
    not gone (no movement) and, beside the rank parked in a collective, not a hole."""
    first = _look(now=NOW, probes=_node(NOW, 520, *_ray(NOW, 1, DRIVER.dump(1, 290))))
    record = ProcessRecord(target="rl-job-0", pid=1, args=DRIVER.args, role="driver", why="x")
    failed = (_failed_dump(1), _failed_dump(1).model_copy(update={"output": None}))
    probes = _node(LATER, 520).model_copy(update={"commands": failed, "processes": (record,)})
    look = _judge(first, _second(probes=probes))
    assert look.outcome is SecondLookOutcome.CONFIRMED, look.summary
