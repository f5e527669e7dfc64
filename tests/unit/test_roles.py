"""Who each dumped process is (worker.evidence.roles): real Ray, SkyRL and vLLM process names and
frames give ranks, the driver, engines and helpers; the recorded role wins on replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ray_node import (
    AGENT,
    DRIVER,
    ENGINE,
    ENGINE_QUEUE,
    IDLE_WORKER,
    LOG_MONITOR,
    RANK,
    RAYLET_FAILED,
)
from worker.evidence.model import ProbeEvidence, ProcessRecord, StackDump
from worker.evidence.roles import Role, classify, roles_of

FIXTURES = Path(__file__).parents[1] / "fixtures" / "stacks"
RAY = "/usr/local/lib/python3.12/site-packages/ray"


@pytest.mark.parametrize(
    ("args", "role"),
    [
        ("ray::PolicyWorker.ppo_train", Role.RANK),
        ("ray::FSDPCriticWorker.__init__", Role.RANK),
        ("ray::RefWorker.forward", Role.RANK),
        ("ray::WorkerDict.actor_rollout_update_actor", Role.RANK),
        ("python -m skyrl_train.entrypoints.main_base trainer.epochs=20", Role.DRIVER),
        ("python -m skyrl_train.entrypoints.main_base generator.backend=sglang", Role.DRIVER),
        ("python -m examples.harbor.entrypoints.main_harbor", Role.DRIVER),
        ("ray::skyrl_entrypoint", Role.DRIVER),
        ("ray::AgenticRolloutCoordinator.run", Role.COORDINATOR),
        ("ray::AsyncVLLMInferenceEngine.generate", Role.ENGINE),
        ("VLLM::EngineCore_0", Role.ENGINE),
        ("python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B", Role.ENGINE),
        (f"{RAY}/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/ray/raylet", Role.HELPER),
        (f"{RAY}/core/src/ray/gcs/gcs_server --log_dir=/tmp/ray/logs", Role.HELPER),
        (f"/usr/bin/python3 -u {RAY}/_private/log_monitor.py --session-dir=/tmp/ray", Role.HELPER),
        (f"/usr/bin/python3 -u {RAY}/dashboard/agent.py --node-ip-address=10.0.0.7", Role.HELPER),
        (f"/usr/bin/python3 {RAY}/dashboard/dashboard.py --host=0.0.0.0", Role.HELPER),
        (f"/usr/bin/python3 -u {RAY}/autoscaler/_private/monitor.py --logs-dir=/tmp", Role.HELPER),
        (f"/usr/bin/python3 -u {RAY}/_private/runtime_env/agent/main.py", Role.HELPER),
        ("ray::IDLE", Role.HELPER),
        ("/usr/bin/python3 /opt/venv/bin/torchrun --nproc-per-node=8 train.py", Role.HELPER),
        ("python train.py --lr 1e-6", Role.UNKNOWN),
    ],
)
def test_command_lines_of_a_ray_node_name_their_role(args: str, role: Role) -> None:
    """The `ps` command line alone names ranks, the driver, engines and Ray's helpers; a plain
    script is unknown."""
    assert classify(args).role is role


def test_a_process_parked_in_a_collective_is_a_rank() -> None:
    """The real Iris toy (`python -c ...` in `all_reduce_wait`) is a rank by its frames, and so
    is a process named like the driver whose primary thread sits in `all_reduce`."""
    sample = (FIXTURES / "task_exec_pyspy_hung.txt").read_text()
    found = classify(None, [sample])
    assert found.role is Role.RANK and "all_reduce_wait" in found.why
    driver_named = RANK.dump(8455).replace(RANK.args, DRIVER.args)
    assert classify(DRIVER.args, [driver_named]).role is Role.RANK
    assert classify(DRIVER.args, [DRIVER.dump(1)]).role is Role.DRIVER


def test_the_dump_header_names_the_process_when_no_listing_was_kept() -> None:
    """Without a `ps` command line the dump's `Process N: <cmd>` header is read."""
    assert classify(None, [LOG_MONITOR.dump(301, 520)]).role is Role.HELPER
    assert classify(None, [AGENT.dump(302, 468)]).role is Role.HELPER
    assert classify(None, [ENGINE_QUEUE.dump(777)]).role is Role.ENGINE
    assert classify(None, [IDLE_WORKER.dump(9)]).role is Role.HELPER


def test_a_ray_worker_only_in_main_loop_is_an_idle_helper_and_one_at_work_is_not() -> None:
    """`default_worker.py` with nothing but Ray's `main_loop` on its primary thread is an idle
    worker; the same worker running a task's own code is not a helper."""
    worker = f"/usr/bin/python3 {RAY}/_private/workers/default_worker.py --node-ip-address=10.0.0.7"
    idle = IDLE_WORKER.dump(9).replace("ray::IDLE", worker)
    busy = idle.replace(
        "    main_loop (ray/_private/worker.py:1066)",
        "    score (my_reward/model.py:88)\n    main_loop (ray/_private/worker.py:1066)",
    )
    assert classify(worker, [idle]).role is Role.HELPER
    assert classify(worker, [busy]).role is Role.UNKNOWN


def test_ray_get_from_the_process_own_module_is_the_driver() -> None:
    """A script waiting in `ray.get` from its own `main` is the driver; pid 1 is the driver."""
    script = DRIVER.dump(4000, 290).replace("skyrl_train/entrypoints/main_base.py", "train.py")
    assert classify("python train.py", [script]).role is Role.DRIVER
    assert classify("python train.py", pid=1).role is Role.DRIVER
    assert classify("python train.py", pid=2).role is Role.UNKNOWN


def test_a_dump_that_finds_no_python_makes_the_process_native_and_a_timeout_does_not() -> None:
    """py-spy's "Failed to find python version" names a native process; a timed-out dump of an
    unnamed process leaves it unknown."""
    assert classify("/opt/bin/sidecar", failures=[RAYLET_FAILED]).role is Role.NATIVE
    assert classify("/opt/bin/sidecar", failures=["--- timed out after 60s"]).role is Role.UNKNOWN


def test_children_of_torchrun_are_ranks() -> None:
    """A plain `python train.py` whose parent is torchrun is a rank."""
    parent = "/usr/bin/python3 /opt/venv/bin/torchrun --nproc-per-node=8 train.py"
    assert classify("python train.py", parent_args=parent).role is Role.RANK
    assert classify("python train.py", parent_args="bash run.sh").role is Role.UNKNOWN


def test_the_recorded_role_wins_over_the_dumps() -> None:
    """`processes.json`'s role is what the diagnosis that took the dumps decided: a replay uses it;
    a process it does not list is classified from its dumps, one with neither by its pid."""
    dumps = tuple(
        StackDump(target="rl-job-0", pid=pid, n=1, source=f"probes/stacks/rl-job-0-pid{pid}-1.txt",
                  captured_at=None, text=text)
        for pid, text in ((41, ENGINE.dump(41)), (42, RANK.dump(42)))
    )  # fmt: skip
    record = ProcessRecord(target="rl-job-0", pid=41, args="x", role="helper", why="recorded why")
    roles = roles_of(ProbeEvidence(directory="probes", stacks=dumps, processes=(record,)))
    assert (roles.of("rl-job-0", 41).role, roles.of("rl-job-0", 41).why) == (
        Role.HELPER,
        "recorded why",
    )
    assert roles.of("rl-job-0", 42).role is Role.RANK
    assert roles.of(None, 42).role is Role.RANK  # a failed dump may not name its target
    assert roles.of("rl-job-0", 43).role is Role.UNKNOWN
    assert roles.of("rl-job-0", 1).role is Role.DRIVER  # never dumped: its pid alone says it
