"""py-spy dumps of the processes in a SkyRL node's process table under Ray
(docs/domain.md#processes-and-roles), as templates: `{pid}` is the process id, `{line}` a line
number that changes while a helper works.

Sources. The idle Ray worker's frames (`main_loop (ray/_private/worker.py:1066)` under
`<module> (ray/_private/workers/default_worker.py:323)`) and its GC thread are copied from a real
`py-spy dump` in https://github.com/verl-project/verl/issues/7180. The others follow the same
format with the files of Ray 2.4x (the log monitor, the dashboard agent's asyncio loop as py-spy
0.4 prints it on this machine, the driver's `ray.get`), SkyRL (`skyrl_train/...`) and vLLM
(`vllm/v1/engine/core.py`), and the rank's collective is the one of `tests/scenarios/catalog.py`.
Command lines are what `ps -ww -eo pid,ppid,args` shows on such a node (Ray renames its workers
`ray::<Actor>.<method>` and idle ones `ray::IDLE`). `RAYLET_FAILED` is py-spy 0.4.3's own output
for a process without a Python interpreter, captured here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AGENT",
    "DRIVER",
    "ENGINE",
    "ENGINE_QUEUE",
    "IDLE_WORKER",
    "LOG_MONITOR",
    "RANK",
    "RANK_COMPUTE",
    "RAYLET_FAILED",
    "Template",
]


@dataclass(frozen=True)
class Template:
    """One process: its `ps` command line and its dump (`{pid}`, `{line}` filled by `dump`)."""

    args: str
    text: str

    def dump(self, pid: int, line: int = 0) -> str:
        return self.text.format(pid=pid, args=self.args, line=line)


RANK = Template(
    "ray::PolicyWorker.ppo_train",
    """\
Process {pid}: {args}
Python v3.12.3 (/usr/bin/python3.12)

Thread {pid} (idle): "MainThread"
    wait (torch/distributed/distributed_c10d.py:4325)
    all_reduce (torch/distributed/distributed_c10d.py:2501)
    wrapper (torch/distributed/c10d_logger.py:83)
    _reduce_grads (skyrl_train/workers/fsdp/fsdp_worker.py:612)
    training_step (skyrl_train/workers/worker.py:744)
    ppo_train (skyrl_train/workers/worker.py:655)
    actor_method_executor (ray/_private/function_manager.py:696)
    main_loop (ray/_private/worker.py:1066)
    <module> (ray/_private/workers/default_worker.py:323)
Thread 0x7F3A2C1FF640 (idle): "Thread-2 (_heartbeat)"
    wait (threading.py:324)
    _heartbeat (ray/_private/worker.py:1021)
""",
)

RANK_COMPUTE = Template(
    RANK.args,
    """\
Process {pid}: {args}
Python v3.12.3 (/usr/bin/python3.12)

Thread {pid} (active+gil): "MainThread"
    forward (torch/nn/modules/linear.py:{line})
    _call_impl (torch/nn/modules/module.py:1562)
    training_step (skyrl_train/workers/worker.py:731)
    ppo_train (skyrl_train/workers/worker.py:655)
    actor_method_executor (ray/_private/function_manager.py:696)
    main_loop (ray/_private/worker.py:1066)
    <module> (ray/_private/workers/default_worker.py:323)
""",
)

DRIVER = Template(
    "python -m skyrl_train.entrypoints.main_base trainer.epochs=20 generator.backend=vllm",
    """\
Process {pid}: {args}
Python v3.12.3 (/usr/bin/python3.12)

Thread {pid} (idle): "MainThread"
    get (ray/_private/worker.py:2771)
    wrapper (ray/_private/client_mode_hook.py:103)
    auto_init_wrapper (ray/_private/auto_init_hook.py:21)
    main (skyrl_train/entrypoints/main_base.py:{line})
    <module> (skyrl_train/entrypoints/main_base.py:320)
""",
)

IDLE_WORKER = Template(
    "ray::IDLE",
    """\
Process {pid}: {args}
Python v3.12.3 (/usr/bin/python3.12)

Thread {pid} (idle): "MainThread"
    main_loop (ray/_private/worker.py:1066)
    <module> (ray/_private/workers/default_worker.py:323)
Thread 867770 (idle): "PythonGCThread"
    wait (threading.py:355)
    wait (threading.py:655)
    run (ray/_private/gc_collect_manager.py:29)
    _bootstrap_inner (threading.py:1075)
    _bootstrap (threading.py:1032)
""",
)

LOG_MONITOR = Template(
    "/usr/bin/python3 -u /usr/local/lib/python3.12/site-packages/ray/_private/log_monitor.py"
    " --session-dir=/tmp/ray/session_2026-07-30_21-00-00_000000_1 --gcs-address=10.0.0.7:6379",
    """\
Process {pid}: {args}
Python v3.12.3 (/usr/bin/python3.12)

Thread {pid} (idle): "MainThread"
    run (ray/_private/log_monitor.py:{line})
    <module> (ray/_private/log_monitor.py:587)
""",
)

AGENT = Template(
    "/usr/bin/python3 -u /usr/local/lib/python3.12/site-packages/ray/dashboard/agent.py"
    " --node-ip-address=10.0.0.7 --metrics-export-port=54120 --dashboard-agent-port=52365",
    """\
Process {pid}: {args}
Python v3.12.3 (/usr/bin/python3.12)

Thread {pid} (idle): "MainThread"
    select (selectors.py:{line})
    _run_once (asyncio/base_events.py:1898)
    run_forever (asyncio/base_events.py:608)
    run_until_complete (asyncio/base_events.py:641)
    run (asyncio/runners.py:118)
    <module> (ray/dashboard/agent.py:451)
""",
)

ENGINE = Template(
    "ray::AsyncVLLMInferenceEngine.generate",
    """\
Process {pid}: {args}
Python v3.12.3 (/usr/bin/python3.12)

Thread {pid} (idle): "MainThread"
    select (selectors.py:468)
    _run_once (asyncio/base_events.py:1898)
    run_forever (asyncio/base_events.py:608)
    main_loop (ray/_private/worker.py:1066)
    <module> (ray/_private/workers/default_worker.py:323)
""",
)

ENGINE_QUEUE = Template(
    "VLLM::EngineCore_0",
    """\
Process {pid}: {args}
Python v3.12.3 (/usr/bin/python3.12)

Thread {pid} (idle): "MainThread"
    wait (threading.py:359)
    get (queue.py:180)
    _process_input_queue (vllm/v1/engine/core.py:624)
    run_busy_loop (vllm/v1/engine/core.py:600)
    run_engine_core (vllm/v1/engine/core.py:565)
""",
)

RAYLET_FAILED = (
    "Error: Failed to find python version from target process\n\nStack backtrace:\n"
    "   0: anyhow::error::<impl anyhow::Error>::msg\n"
    "   1: py_spy::python_process_info::get_python_version\n"
)
"""What `py-spy dump` (0.4.3) prints for a native process such as the raylet (exit 1)."""
