"""What a live capture of a SkyRL task on a Ray node looks like: its process table and py-spy dumps.

The shapes are real: `ps -ww -eo pid,ppid,args` as the live backends record it
(`raw/ps-<task>.txt`); Ray's process titles (`ray::<Actor>.<method>`, `ray::IDLE`, the native
`raylet` and `gcs_server` under `ray/core/src/ray/`, the dashboard, its agent, the log monitor, the
runtime-env agent); vLLM's engine-core process title (`VLLM::EngineCore_DP0`); py-spy's dump layout
and its error for a process with no Python interpreter ("Error: Failed to find python version from
target process"). Frames are those these processes sit in (Ray's `main_loop` of an idle worker,
asyncio's `select` in the dashboard agent, the log monitor's polling loop, the driver's
`ray.get`, vLLM's engine core waiting on its input queue, FSDP ranks in a c10d collective).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tests.scenarios.builder import JobBuilder, iso

SITE = "/usr/local/lib/python3.11/site-packages"
PYTHON = "/usr/bin/python3.11"
SESSION = "/tmp/ray/session_2026-07-30_17-58-02_512312_1"
CONTROLLER_URL = "--controller-url=http://iris-controller.cw-rno2a.internal:10000"
PYSPY_NOT_PYTHON = "Error: Failed to find python version from target process"
PYSPY_NO_PERMISSION = (
    "Permission Denied: Try running again with elevated permissions by going 'sudo env "
    '"PATH=$PATH" !!\''
)


def _frames(*frames: str) -> str:
    return "".join(f"    {frame}\n" for frame in frames)


def dump(pid: int, command: str, *frames: str, status: str = "idle", extra: str = "") -> str:
    """A `py-spy dump` of one process: header, the main thread's frames, optional threads."""
    return (
        f"Process {pid}: {command}\nPython v3.11.7 ({PYTHON})\n\n"
        f'Thread {pid} ({status}): "MainThread"\n{_frames(*frames)}{extra}'
    )


HEARTBEAT = 'Thread 0x7F3A2C1FF640 (idle): "Thread-2 (_heartbeat)"\n' + _frames(
    "wait (threading.py:324)", "_heartbeat (ray/_private/worker.py:1021)"
)


# --- the load-bearing processes -----------------------------------------------------------------

RANK_COLLECTIVE = (
    "wait (torch/distributed/distributed_c10d.py:4325)",
    "all_reduce (torch/distributed/distributed_c10d.py:2501)",
    "wrapper (torch/distributed/c10d_logger.py:83)",
    "_reduce_grads (skyrl_train/workers/fsdp/fsdp_worker.py:612)",
    "training_step (skyrl_train/workers/worker.py:744)",
    "ppo_train (skyrl_train/workers/worker.py:801)",
    "_resume_span (ray/util/tracing/tracing_helper.py:463)",
    "actor_method_executor (ray/_private/function_manager.py:689)",
    "main_loop (ray/_private/worker.py:879)",
    "<module> (ray/_private/workers/default_worker.py:289)",
)
RANK_REDUCE_SCATTER = (
    "reduce_scatter_tensor (torch/distributed/distributed_c10d.py:3970)",
    "wrapper (torch/distributed/c10d_logger.py:83)",
    "_reduce_grad (torch/distributed/fsdp/_runtime_utils.py:852)",
    "_post_backward_hook (torch/distributed/fsdp/_runtime_utils.py:757)",
    "backward (torch/autograd/__init__.py:266)",
    "training_step (skyrl_train/workers/worker.py:731)",
    "ppo_train (skyrl_train/workers/worker.py:801)",
    "main_loop (ray/_private/worker.py:879)",
)
RANK_COMPUTE = (
    (
        "_conv_forward (torch/nn/modules/linear.py:125)",
        "forward (transformers/models/qwen2/modeling_qwen2.py:291)",
        "_call_impl (torch/nn/modules/module.py:1747)",
        "training_step (skyrl_train/workers/worker.py:722)",
        "ppo_train (skyrl_train/workers/worker.py:801)",
        "main_loop (ray/_private/worker.py:879)",
    ),
    (
        "backward (torch/autograd/graph.py:825)",
        "backward (torch/_tensor.py:626)",
        "training_step (skyrl_train/workers/worker.py:731)",
        "ppo_train (skyrl_train/workers/worker.py:801)",
        "main_loop (ray/_private/worker.py:879)",
    ),
)
RANK_STILL = (
    "get_objects (ray/_private/worker.py:893)",
    "get (ray/_private/worker.py:2771)",
    "wrapper (ray/_private/client_mode_hook.py:103)",
    "auto_func (ray/_private/auto_init_hook.py:21)",
    "broadcast_to_inference_engines (skyrl_train/workers/fsdp/fsdp_worker.py:201)",
    "sync_weights (skyrl_train/workers/worker.py:412)",
    "main_loop (ray/_private/worker.py:879)",
)
DRIVER_GET = (
    "get_objects (ray/_private/worker.py:893)",
    "get (ray/_private/worker.py:2771)",
    "wrapper (ray/_private/client_mode_hook.py:103)",
    "auto_func (ray/_private/auto_init_hook.py:21)",
    "main (skyrl_train/entrypoints/main_base.py:318)",
    "decorated_main (hydra/main.py:94)",
    "<module> (skyrl_train/entrypoints/main_base.py:322)",
    "_run_code (runpy.py:88)",
    "_run_module_as_main (runpy.py:198)",
)
TRAINER_GENERATE = (
    "get_objects (ray/_private/worker.py:893)",
    "get (ray/_private/worker.py:2771)",
    "wrapper (ray/_private/client_mode_hook.py:103)",
    "generate (skyrl_train/generators/skyrl_gym_generator.py:388)",
    "train (skyrl_train/trainer.py:230)",
    "skyrl_entrypoint (skyrl_train/entrypoints/main_base.py:301)",
    "actor_method_executor (ray/_private/function_manager.py:689)",
    "main_loop (ray/_private/worker.py:879)",
)
COORDINATOR_QUEUE = (
    "wait (threading.py:324)",
    "get (queue.py:180)",
    "_next_finished (skyrl_train/generators/async_coordinator.py:144)",
    "run (skyrl_train/generators/async_coordinator.py:97)",
    "main_loop (ray/_private/worker.py:879)",
)


# --- engines and helpers ------------------------------------------------------------------------

ENGINE_CORE_IDLE = (
    "wait (threading.py:327)",
    "get (queue.py:180)",
    "_process_input_queue (vllm/v1/engine/core.py:686)",
    "run_busy_loop (vllm/v1/engine/core.py:664)",
    "run_engine_core (vllm/v1/engine/core.py:639)",
    "run (multiprocessing/process.py:108)",
    "_bootstrap (multiprocessing/process.py:314)",
)
ENGINE_ACTOR_LOOP = (
    "select (selectors.py:468)",
    "_run_once (asyncio/base_events.py:1898)",
    "run_forever (asyncio/base_events.py:608)",
    "run_until_complete (asyncio/base_events.py:641)",
    "main_loop (ray/_private/worker.py:879)",
)
IDLE_WORKER = (
    "main_loop (ray/_private/worker.py:879)",
    "<module> (ray/_private/workers/default_worker.py:289)",
)
AGENT_LOOPS = (
    (
        "select (selectors.py:468)",
        "_run_once (asyncio/base_events.py:1898)",
        "run_forever (asyncio/base_events.py:608)",
        "run_until_complete (asyncio/base_events.py:641)",
        "run (asyncio/runners.py:118)",
        "<module> (ray/dashboard/agent.py:452)",
    ),
    (
        "_recv (multiprocessing/connection.py:395)",
        "_recv_bytes (multiprocessing/connection.py:430)",
        "recv_bytes (multiprocessing/connection.py:216)",
        "_get_gpu_usage (ray/dashboard/modules/reporter/reporter_agent.py:612)",
        "_run_once (asyncio/base_events.py:1936)",
        "run_forever (asyncio/base_events.py:608)",
        "<module> (ray/dashboard/agent.py:452)",
    ),
)
LOG_MONITOR_LOOPS = (
    (
        "sleep (time.py)",
        "run (ray/_private/log_monitor.py:531)",
        "<module> (ray/_private/log_monitor.py:612)",
    ),
    (
        "check_log_files_and_publish_updates (ray/_private/log_monitor.py:427)",
        "run (ray/_private/log_monitor.py:527)",
        "<module> (ray/_private/log_monitor.py:612)",
    ),
)


@dataclass(frozen=True)
class Proc:
    """One process of the task: pid, parent, command line and the frames of each dump.

    `frames` has one entry per dump (a process that sits still repeats the same frames); an entry
    that is a string is a failed dump's output (py-spy's error); `timeout` marks a dump that timed
    out (exit_code null)."""

    pid: int
    ppid: int
    args: str
    frames: tuple[tuple[str, ...] | str | None, ...]
    native: bool = False

    def text(self, n: int) -> str | None:
        shown = self.frames[min(n, len(self.frames) - 1)]
        if shown is None or isinstance(shown, str):
            return shown
        return dump(self.pid, self.args, *shown, extra=HEARTBEAT if "ray::" in self.args else "")


def rank(
    pid: int, frames: Sequence[tuple[str, ...] | str | None], method: str = "ppo_train"
) -> Proc:
    return Proc(pid, 1, f"ray::PolicyWorker.{method}", tuple(frames))


def driver(
    pid: int = 1, frames: Sequence[tuple[str, ...] | str | None] = (DRIVER_GET, DRIVER_GET)
) -> Proc:
    args = f"{PYTHON} -m skyrl_train.entrypoints.main_base trainer.epochs=20 generator.num_inference_engines=2"
    return Proc(pid, 0, args, tuple(frames))


def trainer_actor(pid: int, frames: Sequence[tuple[str, ...] | str | None]) -> Proc:
    return Proc(pid, 1, "ray::skyrl_entrypoint", tuple(frames))


def ray_helpers(moving: bool = True) -> list[Proc]:
    """Ray's own processes on the head node: natives, the dashboard, its agent, the log monitor,
    the runtime-env agent and two idle workers. With `moving`, the Python helpers' frames differ
    between dumps, as they always do on a real node."""
    agent = AGENT_LOOPS if moving else (AGENT_LOOPS[0], AGENT_LOOPS[0])
    monitor = LOG_MONITOR_LOOPS if moving else (LOG_MONITOR_LOOPS[0],) * 2
    return [
        Proc(
            58,
            1,
            f"{SITE}/ray/core/src/ray/gcs/gcs_server --log_dir={SESSION}/logs --gcs_server_port=6379 "
            "--node-ip-address=10.128.26.194 --session-name=session_2026-07-30_17-58-02_512312_1",
            (PYSPY_NOT_PYTHON, PYSPY_NOT_PYTHON),
            native=True,
        ),
        Proc(
            112,
            1,
            f"{SITE}/ray/core/src/ray/raylet/raylet --raylet_socket_name={SESSION}/sockets/raylet "
            f"--store_socket_name={SESSION}/sockets/plasma_store --object_manager_port=0 "
            "--min_worker_port=10002 --max_worker_port=19999 --node_ip_address=10.128.26.194",
            (PYSPY_NOT_PYTHON, PYSPY_NOT_PYTHON),
            native=True,
        ),
        Proc(
            131,
            1,
            f"{PYTHON} -u {SITE}/ray/dashboard/agent.py --node-ip-address=10.128.26.194 "
            f"--metrics-export-port=8080 --log-dir={SESSION}/logs --session-dir={SESSION}",
            agent,
        ),
        Proc(
            133,
            1,
            f"{PYTHON} -u {SITE}/ray/_private/log_monitor.py --session-dir={SESSION} "
            f"--logs-dir={SESSION}/logs --gcs-address=10.128.26.194:6379",
            monitor,
        ),
        Proc(
            140,
            112,
            f"{PYTHON} -u {SITE}/ray/_private/runtime_env/agent/main.py --node-ip-address=10.128.26.194 "
            "--runtime-env-agent-port=58712",
            (ENGINE_ACTOR_LOOP, ENGINE_ACTOR_LOOP),
        ),
        Proc(201, 112, "ray::IDLE", (IDLE_WORKER, IDLE_WORKER)),
        Proc(202, 112, "ray::IDLE", (IDLE_WORKER, IDLE_WORKER)),
    ]


def engines(pids: Sequence[int] = (3301, 3302)) -> list[Proc]:
    """Each vLLM engine: its Ray actor (an asyncio loop) and its engine-core process."""
    found = []
    for index, pid in enumerate(pids):
        found.append(Proc(pid, 112, "ray::AsyncVLLMInferenceEngine", (ENGINE_ACTOR_LOOP,) * 2))
        found.append(Proc(pid + 50, pid, f"VLLM::EngineCore_DP{index}", (ENGINE_CORE_IDLE,) * 2))
    return found


def ps_listing(procs: Sequence[Proc]) -> str:
    rows = ["    PID    PPID COMMAND"]
    rows += [f"{p.pid:>7} {p.ppid:>7} {p.args}" for p in sorted(procs, key=lambda p: p.pid)]
    rows.append(f"{99999:>7} {1:>7} ps -ww -eo pid,ppid,args")
    return "\n".join(rows) + "\n"


def _exec(task: str, *probe: str) -> list[str]:
    return ["iris", CONTROLLER_URL, "task", "exec", task, "--timeout", "30", "--", *probe]


@dataclass
class Capture:
    """A live capture of one task: the process table and `dumps` rounds of py-spy, `gap_s` apart."""

    procs: list[Proc]
    first: datetime
    gap_s: float = 30.0
    dumps: int = 2
    only: set[int] = field(default_factory=set)  # pids dumped (default: every process)
    once: set[int] = field(default_factory=set)  # pids dumped in the first round only
    timeouts: set[int] = field(default_factory=set)  # pids whose every dump timed out

    def record(self, b: JobBuilder, *, state: str = "running") -> None:
        """Write `raw/ps-*.txt`, the dumps and `probes.json` into the builder's probe files."""
        task = f"{b.job_id}/0"
        safe = task.strip("/").replace("/", "_")
        commands: list[dict[str, Any]] = []
        ps_name = f"raw/ps-{safe}.txt"
        b.probe(ps_name, ps_listing(self.procs))
        commands.append(
            {
                "argv": _exec(task, "ps", "-ww", "-eo", "pid,ppid,args"),
                "started_at": iso(self.first - timedelta(seconds=2)),
                "exit_code": 0,
                "output": ps_name,
            }
        )
        for n in range(self.dumps):
            moment = self.first + timedelta(seconds=self.gap_s * n)
            for proc in self.procs:
                if self.only and proc.pid not in self.only:
                    continue
                if n > 0 and proc.pid in self.once:
                    continue
                commands.append(self._dump(b, task, safe, proc, n, moment))
        header = {
            "captured_at": iso(self.first),
            "backend": "iris",
            "job_id": b.job_id,
            "commands": commands,
        }
        b.probe("probes.json", header)

    def _dump(
        self, b: JobBuilder, task: str, safe: str, proc: Proc, n: int, moment: datetime
    ) -> dict[str, Any]:
        """One py-spy command as the Recorder keeps it: stdout under `stacks/` on success, the
        failure text (stdout, stderr, why) under `failed/stacks/` otherwise."""
        name = f"stacks/{safe}-pid{proc.pid}-{n + 1}.txt"
        argv = _exec(task, "py-spy", "dump", "--pid", str(proc.pid))
        text = None if proc.pid in self.timeouts else proc.text(n)
        if text is not None and text.startswith("Process "):
            b.probe(name, text)
            return {"argv": argv, "started_at": iso(moment), "exit_code": 0, "output": name}
        why = "timed out" if text is None else f"exited 1: {text}"
        b.probe(f"failed/{name}", f"\n--- stderr ---\n{text or ''}\n--- {why}\n")
        return {
            "argv": argv,
            "started_at": iso(moment),
            "exit_code": None if text is None else 1,
            "output": f"failed/{name}",
        }
