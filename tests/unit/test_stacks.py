"""py-spy dump parsing and stall proof (worker.gates.stacks)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from tests.factories import NOW
from worker.evidence.model import StackDump
from worker.gates.stacks import (
    MIN_STILL_GAP_S,
    DumpWindow,
    ParkingKind,
    ProcessState,
    judge_stacks,
    parking,
    parse_dump,
    primary_thread,
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
