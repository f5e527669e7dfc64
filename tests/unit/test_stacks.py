"""py-spy dump parsing and stall proof (worker.gates.stacks), judged by role."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from shared.models import Quote
from tests.factories import NOW
from tests.ray_node import (
    AGENT,
    DRIVER,
    ENGINE_QUEUE,
    IDLE_WORKER,
    LOG_MONITOR,
    RANK_COMPUTE,
    RAYLET_FAILED,
)
from tests.ray_node import RANK as RANK_PARKED
from worker.evidence.facts import ProbeFailure
from worker.evidence.model import StackDump
from worker.evidence.roles import Role, Roles, classify
from worker.gates.stacks import (
    MIN_STILL_GAP_S,
    DumpWindow,
    ParkingKind,
    ProcessState,
    StackFinding,
    judge_stacks,
    parking,
    parse_dump,
    primary_thread,
    stack_holes,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "stacks"

COORDINATOR = """\
Process 4242: python -m skyrl_train.entrypoints.main_base trainer.epochs=1
Python v3.12.3 (/usr/bin/python3.12)

Thread 4242 (idle): "MainThread"
    wait (threading.py:331)
    get (queue.py:180)
    run_loop (skyrl_train/fully_async_trainer.py:412)
        Arguments:
            self: <FullyAsyncTrainer at 0x7f3a2b1c4740>
    <module> (skyrl_train/entrypoints/main_base.py:88)
Thread 4301 (idle): "ThreadPoolExecutor-0_0"
    _worker (concurrent/futures/thread.py:89)
    run (threading.py:1012)
Thread 0x7F3A11FFE640 (active+gil): "ray_listener"
    poll (ray/_private/gcs_pubsub.py:250)
"""

RANK = """\
Process {pid}: ray::PolicyWorker.train
Python v3.12.3 (/usr/bin/python3.12)

Thread {pid} (active): "MainThread"
    {top}
    all_reduce (torch/distributed/distributed_c10d.py:2501)
    ppo_train (skyrl_train/workers/worker.py:655)
"""

ENGINE = """\
Process 777: ray::AsyncVLLMInferenceEngine
Python v3.12.3 (/usr/bin/python3.12)

Thread 777 (idle): "MainThread"
    select (selectors.py:468)
    run_engine_loop (vllm/engine/async_llm_engine.py:900)
"""


def dump(text: str, *, pid: int = 100, n: int = 1, seconds_ago: float = 30) -> StackDump:
    """A StackDump of `text` captured `seconds_ago` before NOW."""
    return StackDump(
        target="rl-job-0",
        pid=pid,
        n=n,
        source=f"probes/stacks/rl-job-0-pid{pid}-{n}.txt",
        captured_at=NOW - timedelta(seconds=seconds_ago),
        text=text,
    )


def rank(pid: int, top: str = "wait (torch/distributed/distributed_c10d.py:2550)") -> str:
    return RANK.format(pid=pid, top=top)


def test_parses_the_real_iris_pyspy_sample() -> None:
    """The captured Iris py-spy dump yields its pid, one idle thread and its two frames."""
    parsed = parse_dump((FIXTURES / "task_exec_pyspy_hung.txt").read_text())
    assert parsed.pid == 24491
    thread = primary_thread(parsed)
    assert thread is not None
    assert (thread.ident, thread.status) == ("24491", "idle")
    assert [f.text for f in thread.frames] == [
        "all_reduce_wait (<string>:3)",
        "<module> (<string>:5)",
    ]
    assert thread.frames[0].dump_line == 9


def test_real_sample_is_parked_in_a_collective() -> None:
    """The sample's `all_reduce_wait` frame classifies as a collective wait."""
    thread = primary_thread(parse_dump((FIXTURES / "task_exec_pyspy_hung.txt").read_text()))
    assert thread is not None
    park = parking(thread)
    assert park is not None
    assert park.kind is ParkingKind.COLLECTIVE
    assert park.frame.function == "all_reduce_wait"


def test_multi_thread_dump_picks_main_thread_and_skips_locals() -> None:
    """MainThread is primary, `--locals` lines are not frames, and queue.get is a queue wait."""
    parsed = parse_dump(COORDINATOR)
    assert len(parsed.threads) == 3
    main = primary_thread(parsed)
    assert main is not None and main.name == "MainThread"
    assert [f.function for f in main.frames] == ["wait", "get", "run_loop", "<module>"]
    park = parking(main)
    assert park is not None and park.kind is ParkingKind.QUEUE
    assert park.frame.text == "get (queue.py:180)"
    assert parsed.threads[2].ident == "0x7F3A11FFE640"


@pytest.mark.parametrize(
    ("frame_line", "kind"),
    [
        ("allreduce_coalesced (deepspeed/comm/torch.py:40)", ParkingKind.COLLECTIVE),
        ("barrier (torch/distributed/distributed_c10d.py:4100)", ParkingKind.COLLECTIVE),
        ("wait (torch/distributed/c10d_logger.py:80)", ParkingKind.COLLECTIVE),
        ("_wait_for_workers (skyrl_train/utils.py:10)", ParkingKind.COLLECTIVE),
        ("get (ray/util/queue.py:120)", ParkingKind.QUEUE),
        ("_wait (asyncio/tasks.py:520)", ParkingKind.QUEUE),
        ("forward (torch/nn/modules/linear.py:116)", None),
    ],
)
def test_frame_classification(frame_line: str, kind: ParkingKind | None) -> None:
    """Collective and queue waits are recognised by function and file; compute frames are not."""
    text = f'Process 1: python\n\nThread 1 (idle): "MainThread"\n    {frame_line}\n'
    thread = primary_thread(parse_dump(text))
    assert thread is not None
    park = parking(thread)
    assert (park.kind if park else None) is kind


def test_two_dumps_parked_in_all_reduce_prove_a_stall() -> None:
    """Two dumps of each rank, seconds apart, at the same collective frame prove the stall."""
    dumps = [
        dump(rank(100), pid=100, n=1, seconds_ago=30),
        dump(rank(100), pid=100, n=2, seconds_ago=20),
        dump(rank(101), pid=101, n=1, seconds_ago=29),
        dump(rank(101), pid=101, n=2, seconds_ago=19),
    ]
    finding = judge_stacks(dumps)
    assert finding.proven
    assert finding.mechanism is not None and "collective" in finding.mechanism
    assert {p.state for p in finding.processes} == {ProcessState.PARKED}
    assert len(finding.quotes) == 4
    first = finding.quotes[0]
    assert first.source == "probes/stacks/rl-job-0-pid100-1.txt"
    assert first.line == 6 and first.timestamp is not None  # the all_reduce frame
    assert "all_reduce (torch/distributed/distributed_c10d.py:2501)" in first.text


def test_coordinator_on_its_own_queue_is_a_deadlock() -> None:
    """A coordinator parked on queue.get in both dumps is named as a queue deadlock."""
    finding = judge_stacks(
        [dump(COORDINATOR, pid=4242, n=1, seconds_ago=12), dump(COORDINATOR, pid=4242, n=2)]
    )
    assert finding.proven
    assert finding.mechanism is not None and "queue" in finding.mechanism


def test_moving_stack_disproves_the_stall() -> None:
    """A rank whose stack changed between dumps is moving, so nothing is proven."""
    moved = rank(101, top="forward (torch/nn/modules/linear.py:116)")
    dumps = [
        dump(rank(100), pid=100, n=1, seconds_ago=30),
        dump(rank(100), pid=100, n=2, seconds_ago=20),
        dump(rank(101), pid=101, n=1, seconds_ago=30),
        dump(moved, pid=101, n=2, seconds_ago=20),
    ]
    finding = judge_stacks(dumps)
    assert not finding.proven
    states = {p.pid: p.state for p in finding.processes}
    assert states == {100: ProcessState.PARKED, 101: ProcessState.MOVING}


def test_single_dump_or_same_instant_proves_nothing() -> None:
    """One dump, or two taken at the same instant, is unpaired and proves nothing."""
    assert not judge_stacks([dump(rank(100))]).proven
    same = judge_stacks([dump(rank(100), n=1), dump(rank(100), n=2)])
    assert not same.proven
    assert same.processes[0].state is ProcessState.UNPAIRED


def test_idle_vllm_engine_does_not_block_the_proof() -> None:
    """An unchanged vLLM engine stack is idle by design and leaves the policy proof standing."""
    dumps = [
        dump(rank(100), pid=100, n=1, seconds_ago=30),
        dump(rank(100), pid=100, n=2, seconds_ago=20),
        dump(ENGINE, pid=777, n=1, seconds_ago=30),
        dump(ENGINE, pid=777, n=2, seconds_ago=20),
    ]
    finding = judge_stacks(dumps)
    assert finding.proven
    assert ProcessState.ENGINE_IDLE in {p.state for p in finding.processes}


def test_unreadable_dump_blocks_the_proof() -> None:
    """Text with no thread section is unreadable and never proves a stall."""
    finding = judge_stacks([dump("Error: Permission denied", n=1, seconds_ago=9), dump("", n=2)])
    assert not finding.proven
    assert finding.processes[0].state is ProcessState.UNREADABLE


IDLE_HELPER = """\
Process 888: python -m ray._private.workers.default_worker
Python v3.12.3 (/usr/bin/python3.12)

Thread 888 (idle): "MainThread"
    select (selectors.py:468)
    main_loop (ray/_private/worker.py:880)
"""


def test_idle_helper_process_does_not_block_the_proof() -> None:
    """A helper whose stack is unchanged outside any collective shows no progress: still proven."""
    dumps = [
        dump(rank(100), pid=100, n=1, seconds_ago=30),
        dump(rank(100), pid=100, n=2, seconds_ago=20),
        dump(IDLE_HELPER, pid=888, n=1, seconds_ago=30),
        dump(IDLE_HELPER, pid=888, n=2, seconds_ago=20),
    ]
    finding = judge_stacks(dumps)
    assert finding.proven
    assert {p.pid: p.state for p in finding.processes} == {
        100: ProcessState.PARKED,
        888: ProcessState.STILL,
    }


# --- live evidence only (DumpWindow) -------------------------------------------------------------


def _pair(pid: int = 100, *, target: str = "rl-job-0", first_s: float = 30) -> list[StackDump]:
    return [
        StackDump(
            target=target,
            pid=pid,
            n=n,
            source=f"probes/stacks/{target}-pid{pid}-{n}.txt",
            captured_at=NOW - timedelta(seconds=first_s - 10 * (n - 1)),
            text=rank(pid),
        )
        for n in (1, 2)
    ]


@pytest.mark.parametrize(
    ("window", "why"),
    [
        (DumpWindow(after=NOW - timedelta(seconds=25)), "before the newest progress"),
        (DumpWindow(not_before=NOW - timedelta(seconds=25)), "older than MAX_EVIDENCE_AGE_S"),
        (DumpWindow(not_after=NOW - timedelta(seconds=25)), "dated after now"),
        (DumpWindow(old_targets=frozenset({"rl-job-0"})), "pod of an earlier attempt"),
    ],
)
def test_dumps_outside_the_window_are_stale_and_prove_nothing(window: DumpWindow, why: str) -> None:
    """A pair with a dump before the newest progress, too old, after now, or of an earlier
    attempt's pod is stale: not proven, with the reason."""
    finding = judge_stacks(_pair(), window)
    assert not finding.proven
    assert finding.processes[0].state is ProcessState.STALE
    assert why in finding.processes[0].detail
    assert judge_stacks(_pair(), DumpWindow(after=NOW - timedelta(seconds=35))).proven


def test_a_dump_whose_header_names_another_pid_is_stale() -> None:
    """A file named for pid 100 holding pid 4242's dump is not that process's evidence."""
    dumps = [d.model_copy(update={"text": rank(4242)}) for d in _pair(100)]
    finding = judge_stacks(dumps)
    assert finding.processes[0].state is ProcessState.STALE
    assert "holds pid 4242" in finding.processes[0].detail


def test_an_unpaired_process_blocks_the_proof() -> None:
    """A rank dumped once beside a parked rank is not shown stuck: nothing is proven."""
    dumps = [*_pair(100), dump(rank(101), pid=101, n=1)]
    assert not judge_stacks(dumps).proven


STILL = """\
Process {pid}: python -m skyrl_train.entrypoints.main_base
Python v3.12.3 (/usr/bin/python3.12)

Thread {pid} (active): "MainThread"
    _poll_results (skyrl_train/generators/async_collector.py:212)
    run_loop (skyrl_train/fully_async_trainer.py:412)
"""


@pytest.mark.parametrize(
    ("gap", "still"), [(MIN_STILL_GAP_S + 1, True), (MIN_STILL_GAP_S - 1, False)]
)
def test_identical_stacks_outside_collectives_need_the_probe_interval(
    gap: float, still: bool
) -> None:
    """Every trainer process identical outside a collective is `still` only when its two dumps are
    at least MIN_STILL_GAP_S apart; it is never `proven` by itself."""
    dumps = [
        dump(STILL.format(pid=pid), pid=pid, n=n, seconds_ago=30 - gap * (n - 1))
        for pid in (100, 101)
        for n in (1, 2)
    ]
    finding = judge_stacks(dumps)
    assert not finding.proven
    assert finding.still is still
    if still:
        assert (
            finding.still_frame == "_poll_results (skyrl_train/generators/async_collector.py:212)"
        )


# --- proofs rest on the processes that matter (roles) --------------------------------------------


def node(pid: int, *texts: str, target: str = "rl-job-0") -> list[StackDump]:
    """Dumps of one process, ten seconds apart, the first thirty seconds before NOW."""
    return [
        StackDump(
            target=target,
            pid=pid,
            n=n,
            source=f"probes/stacks/{target}-pid{pid}-{n}.txt",
            captured_at=NOW - timedelta(seconds=30 - 10 * (n - 1)),
            text=text,
        )
        for n, text in enumerate(texts, start=1)
    ]


def parked_ranks(*pids: int) -> list[StackDump]:
    return [d for pid in pids for d in node(pid, RANK_PARKED.dump(pid), RANK_PARKED.dump(pid))]


def busy_helpers() -> list[StackDump]:
    """A log monitor and a dashboard agent whose frames change, an idle Ray worker."""
    return [
        *node(301, LOG_MONITOR.dump(301, 520), LOG_MONITOR.dump(301, 531)),
        *node(302, AGENT.dump(302, 468), AGENT.dump(302, 415)),
        *node(9, IDLE_WORKER.dump(9), IDLE_WORKER.dump(9)),
    ]


def failure(pid: int, n: int = 2, why: str = "exited 1") -> ProbeFailure:
    text = f"`iris task exec /ops/rl-job/0 -- py-spy dump --pid {pid}` {why}"
    cited = Quote(source="probes/probes.json", text=text, timestamp=NOW)
    return ProbeFailure("stacks", text, cited, pid=pid, target="rl-job-0")


def states(finding: StackFinding) -> dict[int, ProcessState]:
    return {p.pid: p.state for p in finding.processes}


def test_ranks_parked_beside_busy_helpers_are_proven_and_a_straggler_rank_is_not() -> None:
    """Helpers that change frames are noted, never movement, and their dumps are not quoted; a
    rank computing while the others wait in the collective still blocks the proof."""
    finding = judge_stacks([*parked_ranks(100, 101), *busy_helpers()])
    assert finding.proven, finding.summary
    assert states(finding)[301] is ProcessState.MOVING
    assert any("pid 301 (helper): moving, ignored" in note for note in finding.notes)
    assert {q.source.split("-pid")[1].split("-")[0] for q in finding.quotes} == {"100", "101"}
    straggler = node(101, RANK_COMPUTE.dump(101, 116), RANK_COMPUTE.dump(101, 120))
    blocked = judge_stacks([*parked_ranks(100), *straggler, *busy_helpers()])
    assert not blocked.proven
    assert [(j.pid, j.state) for j in blocked.holes] == [(101, ProcessState.MOVING)]


def test_a_driver_dumped_once_is_context_and_a_rank_dumped_once_is_not() -> None:
    """Every rank parked, the driver (in `ray.get`) dumped once: proven, the driver noted; a
    rank dumped once instead: not proven."""
    once = judge_stacks([*parked_ranks(100, 101), *node(1, DRIVER.dump(1, 290))])
    assert once.proven and states(once)[1] is ProcessState.UNPAIRED
    assert any("pid 1 (driver): unpaired" in note and "context" in note for note in once.notes)
    rank_once = judge_stacks([*parked_ranks(100), *node(101, RANK_PARKED.dump(101))])
    assert not rank_once.proven
    assert [(j.pid, j.state) for j in rank_once.holes] == [(101, ProcessState.UNPAIRED)]


def test_a_driver_that_leaves_its_frame_blocks_the_proof() -> None:
    """The driver moving on from `main` line 290 to 291 between dumps is movement."""
    moved = node(1, DRIVER.dump(1, 290), DRIVER.dump(1, 291))
    still = node(1, DRIVER.dump(1, 290), DRIVER.dump(1, 290))
    assert not judge_stacks([*parked_ranks(100, 101), *moved]).proven
    assert judge_stacks([*parked_ranks(100, 101), *still]).proven


def test_a_failed_dump_of_a_native_process_is_noted_and_of_a_rank_is_a_hole() -> None:
    """A raylet whose dump found no Python, a log monitor whose second dump timed out, or the
    driver's failed dump is noted and not quoted; a rank whose second dump failed blocks the
    proof."""
    native = Roles({
        ("rl-job-0", 55): classify("/opt/bin/sidecar", failures=[RAYLET_FAILED]),
        ("rl-job-0", 1): classify(DRIVER.args),
    })  # fmt: skip
    dumps = [*parked_ranks(100, 101), *node(301, LOG_MONITOR.dump(301, 520))]
    failed = [failure(55, 1), failure(55, 2), failure(301, 2, "timed out"), failure(1, 1)]
    finding = judge_stacks(dumps, roles=native, failed=failed)
    assert finding.proven, finding.summary
    assert all("probes.json" not in q.source for q in finding.quotes)  # the proof quotes dumps
    assert (
        states(finding)[55] is ProcessState.FAILED and states(finding)[301] is ProcessState.FAILED
    )
    assert any("pid 55 (native): failed, ignored" in note for note in finding.notes)
    rank = judge_stacks(
        [*parked_ranks(100), *node(101, RANK_PARKED.dump(101))], failed=[failure(101)]
    )
    assert not rank.proven
    assert [(j.pid, j.role, j.state) for j in rank.holes] == [(101, Role.RANK, ProcessState.FAILED)]


def test_an_unknown_process_between_idle_waits_does_not_block_and_one_at_work_does() -> None:
    """An unnamed process going from `select` to a connection's `_recv` waits idly: proven; the
    same process in two different compute frames: not proven."""
    sidecar = 'Process 400: python sidecar.py\n\nThread 400 (idle): "MainThread"\n    {top}\n'
    idle = node(
        400,
        sidecar.format(top="_PollLikeSelector.select (selectors.py:415)"),
        sidecar.format(top="Connection._recv (multiprocessing/connection.py:395)"),
    )
    busy = node(
        400,
        sidecar.format(top="tokenize (sidecar.py:40)"),
        sidecar.format(top="score (sidecar.py:71)"),
    )
    waiting = judge_stacks([*parked_ranks(100, 101), *idle])
    assert waiting.proven and states(waiting)[400] is ProcessState.IDLE
    working = judge_stacks([*parked_ranks(100, 101), *busy])
    assert not working.proven and states(working)[400] is ProcessState.MOVING


def test_an_engine_on_its_input_queue_proves_nothing_and_a_coordinator_on_its_queue_does() -> None:
    """A vLLM engine core waiting on its input queue is idle by design; the coordinator on its
    own queue is a deadlock."""
    engine = judge_stacks(node(777, ENGINE_QUEUE.dump(777), ENGINE_QUEUE.dump(777)))
    assert not engine.proven and states(engine)[777] is ProcessState.ENGINE_IDLE
    coordinator = judge_stacks(node(4242, COORDINATOR, COORDINATOR))
    assert coordinator.proven


def test_a_queue_deadlock_rests_on_the_coordinator_and_not_on_helpers() -> None:
    """Beside a coordinator parked on its queue, a helper dumped once is context; another
    entrypoint process dumped once is a hole (the deadlock rests on it)."""
    parked = node(4242, COORDINATOR, COORDINATOR)
    assert judge_stacks([*parked, *node(301, LOG_MONITOR.dump(301, 520))]).proven
    assert not judge_stacks([*parked, *node(1, DRIVER.dump(1, 290))]).proven


def test_still_rests_on_the_load_bearing_processes() -> None:
    """Every load-bearing process identical outside a collective is still beside busy helpers;
    an unknown process at work beside it is not."""
    driver = node(1, STILL.format(pid=1), STILL.format(pid=1))
    beside_helpers = judge_stacks([*driver, *busy_helpers()])
    assert beside_helpers.still and not beside_helpers.proven
    work = 'Process 400: python sidecar.py\n\nThread 400 (idle): "MainThread"\n    {top}\n'
    busy = node(400, work.format(top="tokenize (sidecar.py:40)"), work.format(top="x (a.py:1)"))
    assert not judge_stacks([*driver, *busy]).still


def test_stack_holes_keep_what_a_proof_needs() -> None:
    """A failed dump naming no pid is a hole; a helper's is not; the driver's is one only when
    the proof does not rest on ranks parked in a collective."""
    roles = Roles({
        ("rl-job-0", 301): classify(LOG_MONITOR.args),
        ("rl-job-0", 1): classify(DRIVER.args),
        ("rl-job-0", 100): classify(RANK_PARKED.args),
    })  # fmt: skip
    note = ProbeFailure("stacks", "no Python process found", Quote(source="p", text="n"))
    failures = [note, failure(301), failure(1), failure(100)]
    assert [f.pid for f in stack_holes(failures, roles, collective=True)] == [None, 100]
    assert [f.pid for f in stack_holes(failures, roles, collective=False)] == [None, 1, 100]
