"""The scenario corpus: one small factory per failure signature and per benign noise, each with the
verdict and gate statuses a careful on-call engineer would reach.

Each factory takes a root directory and returns a `Built` (job directory, probe directory or None,
the moment to judge at). The expectations live beside the factory in `SCENARIOS`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.scenarios.builder import JobBuilder, iso

T0 = datetime(2026, 7, 30, 18, 0, tzinfo=UTC)
STANDARD_ARGV = [
    "python",
    "-m",
    "skyrl_train.entrypoints.main_base",
    "trainer.epochs=20",
    "generator.num_inference_engines=4",
    "generator.max_num_seqs=64",
]
AGENTIC_ARGV = [
    "uv",
    "run",
    "python",
    "-m",
    "examples.train_integrations.harbor.entrypoints.main_harbor",
    "terminal_bench_config.trials_dir=s3://bucket/tmp/ttl=14d/rl-x/trace_jobs",
    "generator.n_concurrent_trials=64",
]


@dataclass(frozen=True)
class Built:
    job_dir: Path
    probes: Path | None
    now: datetime


@dataclass(frozen=True)
class Scenario:
    name: str
    build: Callable[[Path], Built]
    verdict: str
    gates: dict[str, str]
    restarts_count: int | None = None
    same_failure: bool | None = None
    mode: str | None = None
    text_contains: tuple[str, ...] = field(default=())


# --- metric shapes ---------------------------------------------------------------------------


def healthy_metrics(step: int, n: int = 20) -> dict[str, float]:
    progress = step / n
    return {
        "reward/avg_raw_reward": 0.2 + 0.4 * progress,
        "reward/avg_pass_at_5": 0.5 + 0.3 * progress,
        "policy/policy_loss": -0.0012 + 0.0001 * (step % 3),
        "policy/policy_entropy": 1.10 - 0.15 * progress,
        "policy/raw_grad_norm": 0.31 + 0.01 * (step % 4),
        "policy/tis/imp_ratio_mean": 0.98,
        "policy/tis/log_ratio_abs_mean": 0.07,
        "policy/tis/imp_ratio_capped_fraction": 0.0,
        "generate/tis/exact_match_fraction": 0.99,
        "generate/avg_num_tokens": 410.0 + step,
        "generate/max_num_tokens": 1024.0,
        "generate/min_num_tokens": 35.0,
    }


def with_metrics(**changes: float) -> Callable[[int], dict[str, float]]:
    return lambda step: healthy_metrics(step) | changes


def saturated(b: JobBuilder, moment: datetime) -> None:
    for engine in range(2):
        b.vllm(
            moment, engine=engine, pid=287294 + engine, running=48, waiting=6, kv=46.0, gen=2450.0
        )


def run_steps(
    b: JobBuilder,
    begin: datetime,
    steps: range,
    metrics: Callable[[int], dict[str, float]] = healthy_metrics,
    *,
    seconds: float = 120.0,
    engines: Callable[[JobBuilder, datetime], None] | None = saturated,
    phase_seconds: Callable[[int], dict[str, float]] | None = None,
) -> datetime:
    moment = begin
    for step in steps:
        for offset in range(5, int(seconds), 60):
            if engines is not None:
                engines(b, moment + timedelta(seconds=offset))
        moment = b.step(
            step,
            moment,
            seconds,
            metrics(step),
            phase_seconds=phase_seconds(step) if phase_seconds else None,
        )
    return moment


def start_attempt(b: JobBuilder, moment: datetime, resume: int | None = None) -> datetime:
    b.boundary(moment)
    b.resume(moment + timedelta(seconds=30), resume)
    return moment + timedelta(seconds=90)


def finish(
    b: JobBuilder, root: Path, now: datetime, *, probes: bool = False, **manifest: Any
) -> Built:
    manifest.setdefault("argv", STANDARD_ARGV)
    manifest.setdefault("synced_at", now - timedelta(minutes=2))
    b.manifest(**manifest)
    if probes and "probes.json" not in b.probe_files:
        header = {
            "captured_at": iso(now - timedelta(minutes=1)),
            "backend": "iris",
            "job_id": b.job_id,
            "commands": [],
        }
        b.probe("probes.json", header)
    job = b.write(mtime=manifest["synced_at"])
    probe_dir = b.write_probes(root / "probes" / b.name) if probes else None
    return Built(job, probe_dir, now)


def controller(
    b: JobBuilder, state: str, *, failures: int = 0, preemptions: int = 0, error: str = ""
) -> None:
    b.probe(
        "controller.json",
        {
            "job_id": b.job_id,
            "name": b.job_id,
            "state": state,
            "exit_code": 0,
            "error": error,
            "failure_count": failures,
            "preemption_count": preemptions,
            "task_count": 1,
            "completed_count": 1 if state == "succeeded" else 0,
            "task_state_counts": {state: 1},
            "tasks": [
                {
                    "task_id": f"{b.job_id}/0",
                    "index": "0",
                    "state": state,
                    "exit_code": None,
                    "worker_id": "worker-cw-7",
                    "error": error,
                }
            ],
        },
    )


def attempts(
    b: JobBuilder, rows: list[tuple[str, int | None, str, datetime, datetime | None]]
) -> None:
    b.probe(
        "attempts.json",
        [
            {
                "task_id": f"{b.job_id}/0",
                "attempt_id": i,
                "state": state,
                "exit_code": code,
                "error": error,
                "started_at_ms": int(start.timestamp() * 1000),
                "finished_at_ms": int(end.timestamp() * 1000) if end else None,
                "worker_id": f"worker-cw-{i}",
                "pod_name": f"iris-ops-{b.name}-0-{i}",
                "node_name": f"gpu-node-{i}",
                "terminal_reason": error or None,
            }
            for i, (state, code, error, start, end) in enumerate(rows)
        ],
    )


PARKED = """Process {pid}: python -m skyrl_train.entrypoints.main_base
Python v3.11.7 (/usr/bin/python3.11)

Thread {pid} (idle): "MainThread"
    wait (torch/distributed/distributed_c10d.py:4325)
    all_reduce (torch/distributed/distributed_c10d.py:2501)
    wrapper (torch/distributed/c10d_logger.py:83)
    _reduce_grads (skyrl_train/workers/fsdp/fsdp_worker.py:612)
    training_step (skyrl_train/workers/worker.py:744)
    train_critic_and_policy (skyrl_train/trainer.py:1121)
Thread 0x7F3A2C1FF640 (idle): "Thread-2 (_heartbeat)"
    wait (threading.py:324)
    _heartbeat (ray/_private/worker.py:1021)
"""


def stacks(b: JobBuilder, first: datetime, pids: tuple[int, ...] = (8455, 8456)) -> None:
    commands = []
    for n, moment in ((1, first), (2, first + timedelta(seconds=6))):
        for pid in pids:
            name = f"stacks/{b.name}-0-pid{pid}-{n}.txt"
            b.probe(name, PARKED.format(pid=pid))
            argv = [
                "iris",
                "task",
                "exec",
                f"{b.job_id}/0",
                "--",
                "py-spy",
                "dump",
                "--pid",
                str(pid),
            ]
            commands.append(
                {"argv": argv, "started_at": iso(moment), "exit_code": 0, "output": name}
            )
    b.probe(
        "probes.json",
        {"captured_at": iso(first), "backend": "iris", "job_id": b.job_id, "commands": commands},
    )


# --- standard-mode scenarios -----------------------------------------------------------------


def healthy_standard(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-healthy", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 21))
    return finish(b, root, end + timedelta(seconds=60))


def plateau(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-plateau", T0)
    end = run_steps(
        b, start_attempt(b, T0), range(1, 25), with_metrics(**{"reward/avg_raw_reward": 0.41})
    )
    return finish(b, root, end + timedelta(seconds=60))


def all_zero_reward(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-zero-reward", T0)
    zero = with_metrics(**{"reward/avg_raw_reward": 0.0, "reward/avg_pass_at_5": 0.0})
    end = run_steps(b, start_attempt(b, T0), range(1, 16), zero)
    return finish(b, root, end + timedelta(seconds=60))


def reward_collapse(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-collapse", T0)

    def metrics(step: int) -> dict[str, float]:
        reward = 0.62 if step <= 20 else 0.03
        entropy = 1.0 if step <= 20 else 0.02
        return healthy_metrics(step) | {
            "reward/avg_raw_reward": reward,
            "policy/policy_entropy": entropy,
        }

    end = run_steps(b, start_attempt(b, T0), range(1, 36), metrics)
    return finish(b, root, end + timedelta(seconds=60))


def entropy_collapse(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-entropy", T0)

    def metrics(step: int) -> dict[str, float]:
        entropy = 1.1 if step <= 8 else 0.01
        return healthy_metrics(step) | {
            "reward/avg_raw_reward": 0.30,
            "policy/policy_entropy": entropy,
        }

    end = run_steps(b, start_attempt(b, T0), range(1, 25), metrics)
    return finish(b, root, end + timedelta(seconds=60))


def nan_loss(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-nan", T0)

    def metrics(step: int) -> dict[str, float]:
        if step < 14:
            return healthy_metrics(step)
        return healthy_metrics(step) | {
            "policy/policy_loss": math.nan,
            "policy/raw_grad_norm": math.nan,
        }

    end = run_steps(b, start_attempt(b, T0), range(1, 18), metrics)
    return finish(b, root, end + timedelta(seconds=60))


def router_replay(root: Path) -> Built:
    b = JobBuilder(root, "rl-moe-router-replay", T0)
    broken = with_metrics(
        **{
            "policy/log_ratio_abs_max": 19.2,
            "policy/policy_loss": 9800.0,
            "policy/raw_grad_norm": 1.2e5,
            "policy/tis/imp_ratio_mean": 0.41,
            "generate/tis/exact_match_fraction": 0.62,
        }
    )
    end = run_steps(b, start_attempt(b, T0), range(1, 13), broken)
    return finish(b, root, end + timedelta(seconds=60))


def phase_inflation(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-bubble", T0)
    end = run_steps(
        b,
        start_attempt(b, T0),
        range(1, 25),
        phase_seconds=lambda step: {"sync_weights": 3.0 * step},
    )
    return finish(b, root, end + timedelta(seconds=60))


def generation_at_max(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-maxlen", T0)
    capped = with_metrics(**{"generate/avg_num_tokens": 1024.0, "generate/min_num_tokens": 1024.0})
    end = run_steps(b, start_attempt(b, T0), range(1, 15), capped)
    return finish(b, root, end + timedelta(seconds=60))


def no_usable_metrics(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-unparseable", T0)
    moment = start_attempt(b, T0)
    for step in range(1, 12):
        b.log(moment, f"step {step} done, loss=0.1 reward=0.3 (custom print)")
        b.log(moment, "Finished: 'step', time cost: 60.00s")
        moment += timedelta(seconds=60)
        saturated(b, moment)
    return finish(b, root, moment + timedelta(seconds=30))


def resume_past_end(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-complete", T0)
    moment = start_attempt(b, T0, resume=None)
    b.log(moment, "Training Step Progress: 0 / 20")
    end = run_steps(b, moment, range(1, 21))
    b.log(end, "Training Step Progress: 20 / 20")
    moment = start_attempt(b, end + timedelta(minutes=2), resume=20)
    b.log(moment, "Training Step Progress: 21 / 20")
    b.traceback(moment, ["skyrl_train/trainer.py"], "StopIteration")
    controller(b, "succeeded")
    return finish(b, root, moment + timedelta(minutes=3), probes=True, state="succeeded")


# --- liveness, restarts, resources ----------------------------------------------------------


def initializing(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-init", T0)
    moment = start_attempt(b, T0)
    b.log(moment, "Started: 'step'")
    b.log(moment, "Started: 'generate'")
    for i in range(6):
        b.vllm(moment + timedelta(minutes=2 * i), running=64, waiting=12, kv=38.0, gen=2100.0)
    return finish(b, root, T0 + timedelta(minutes=20))


def init_exceeded(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-init-stuck", T0)
    moment = start_attempt(b, T0)
    b.log(moment, "Started: 'step'")
    b.log(moment, "Started: 'generate'")
    return finish(b, root, T0 + timedelta(minutes=70))


def _stalled(b: JobBuilder, *, engines_busy: bool) -> datetime:
    end = run_steps(b, start_attempt(b, T0), range(1, 13))
    b.log(end, "Started: 'step'")
    for phase in ("generate", "postprocess_generator_output", "fwd_logprobs_values_reward"):
        b.log(end, f"Started: '{phase}'")
        b.log(end + timedelta(seconds=20), f"Finished: '{phase}', time cost: 20.00s")
        end += timedelta(seconds=20)
    b.log(end, "Started: 'train_critic_and_policy'")
    b.log(end, "Started: 'policy_train'")
    for i in range(25):
        if engines_busy:
            b.vllm(end + timedelta(minutes=2 * i), running=56, waiting=4, kv=52.0, gen=2300.0)
    return end


def stall_with_stacks(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-stalled", T0)
    quiet_since = _stalled(b, engines_busy=False)
    now = quiet_since + timedelta(minutes=50)
    controller(b, "running")
    stacks(b, now - timedelta(minutes=1))
    return finish(b, root, now, probes=True)


def stall_without_stacks(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-quiet", T0)
    quiet_since = _stalled(b, engines_busy=False)
    return finish(b, root, quiet_since + timedelta(minutes=50))


def colocated_deception(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-colocated", T0)
    quiet_since = _stalled(b, engines_busy=True)
    return finish(b, root, quiet_since + timedelta(minutes=50))


def slow_checkpoint(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-ckpt", T0)
    moment = start_attempt(b, T0)
    for cycle in range(3):
        moment = run_steps(b, moment, range(cycle * 5 + 1, cycle * 5 + 6))
        b.log(moment, "Started: 'save_checkpoints'")
        if cycle < 2:
            moment += timedelta(minutes=25)
            b.log(moment, "Finished: 'save_checkpoints', time cost: 1500.00s")
    return finish(b, root, moment + timedelta(minutes=20))


def crash_loop(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-oom", T0)
    rows = []
    moment = T0
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.63 GiB"
    for _ in range(3):
        start = moment
        moment = start_attempt(b, moment)
        b.log(moment, "Started: 'step'")
        b.log(moment, "Started: 'generate'")
        b.traceback(
            moment + timedelta(seconds=40), ["skyrl_train/workers/fsdp/fsdp_worker.py"], oom
        )
        moment += timedelta(minutes=3)
        rows.append(("failed", 1, f"Exit code: 1. stderr: {oom}", start, moment))
    controller(b, "failed", failures=3, error=f"Exit code: 1. stderr: {oom}")
    attempts(b, rows)
    return finish(b, root, moment + timedelta(minutes=5), probes=True, state="failed")


def config_parse_death(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-badconfig", T0)
    moment = T0
    for _ in range(3):
        moment = start_attempt(b, moment) - timedelta(seconds=60)
        b.raw(moment, "Could not override 'trainer.polcy.optimizer_config.lr'.")
        b.raw(moment, "To append to your config use +trainer.polcy.optimizer_config.lr=1e-6")
        b.traceback(
            moment,
            ["hydra/_internal/config_loader_impl.py"],
            "omegaconf.errors.ConfigAttributeError: Key 'polcy' is not in struct",
        )
        moment += timedelta(minutes=1)
    return finish(b, root, moment + timedelta(minutes=5), state="failed")


def preempted_recovered(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-preempted", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 13))
    second = end + timedelta(minutes=4)
    end = run_steps(b, start_attempt(b, second, resume=10), range(11, 26))
    controller(b, "running", preemptions=1)
    attempts(
        b,
        [
            (
                "preempted",
                None,
                "Pod evicted: node gpu-node-0 preempted",
                T0,
                end - timedelta(minutes=33),
            ),
            ("running", None, "", second, None),
        ],
    )
    return finish(b, root, end + timedelta(seconds=60), probes=True)


def terminal_but_fresh_log(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-ghost", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 16))
    controller(b, "killed", error="Terminated by user")
    return finish(b, root, end + timedelta(seconds=30), probes=True)


def running_without_pods(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-nopods", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 6))
    now = end + timedelta(minutes=40)
    return finish(b, root, now, artifacts={"pod_logs": "no pod yet"})


def stale_manifest(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-stale", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 15))
    now = end + timedelta(hours=3)
    return finish(b, root, now, synced_at=end + timedelta(minutes=1))


def starved_engines(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-starved", T0)

    def starved(builder: JobBuilder, moment: datetime) -> None:
        builder.vllm(moment, running=1, waiting=0, kv=0.4, gen=2.0)

    def waits(step: int) -> dict[str, float]:
        return {"generate": 1500.0}

    moment = start_attempt(b, T0)
    moment = run_steps(b, moment, range(1, 14), engines=starved, phase_seconds=waits)
    for i in range(8):
        b.raw(
            moment + timedelta(minutes=i),
            f"Generation Buffer Progress:  75%|███████▌  | 24/32 [{41 + i}:07<13:42, 102.80s/it]",
        )
    for i in range(8):
        starved(b, moment + timedelta(minutes=i))
    return finish(b, root, moment + timedelta(minutes=8))


def backpressure(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-sawtooth", T0)

    def sawtooth(builder: JobBuilder, moment: datetime) -> None:
        for i, running in enumerate((64, 40, 12, 2, 60, 38)):
            builder.vllm(
                moment + timedelta(seconds=15 * i),
                running=running,
                waiting=0,
                kv=3.0 + running * 0.6,
                gen=40.0 * running,
            )

    end = run_steps(
        b,
        start_attempt(b, T0),
        range(1, 16),
        with_metrics(**{"timing/wait_for_generation_buffer": 0.8}),
        engines=sawtooth,
    )
    return finish(b, root, end + timedelta(seconds=60))


def benign_noise(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-noisy", T0)
    moment = start_attempt(b, T0)
    for step in range(1, 16):
        b.raw(
            moment,
            "(EngineCore_0 pid=3121) INFO shm_broadcast.py:466 No available shared memory "
            "broadcast block found in 60 second.",
        )
        moment = run_steps(b, moment, range(step, step + 1))
    return finish(b, root, moment + timedelta(seconds=60))


def policy_oom_after_progress(root: Path) -> Built:
    b = JobBuilder(root, "rl-gsm8k-late-oom", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 12))
    b.log(end, "Started: 'step'")
    b.log(end, "Started: 'train_critic_and_policy'")
    b.traceback(
        end + timedelta(seconds=30),
        ["skyrl_train/workers/fsdp/fsdp_worker.py"],
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.00 GiB. "
        "GPU 0 has a total "
        "capacity of 79.11 GiB of which 3.12 GiB is free.",
    )
    b.log(end + timedelta(seconds=31), "Train loop failed", level="ERROR")
    controller(b, "failed", failures=1, error="Exit code: 1")
    attempts(b, [("failed", 1, "Exit code: 1", T0, end + timedelta(seconds=40))])
    return finish(b, root, end + timedelta(minutes=10), probes=True, state="failed")


def undeclared_mode(root: Path) -> Built:
    b = JobBuilder(root, "rl-mystery", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 15))
    return finish(b, root, end + timedelta(seconds=60), argv=None)


def undeclared_crash_loop(root: Path) -> Built:
    built = crash_loop(root)
    manifest_path = built.job_dir / "manifest.json"
    data = json.loads(manifest_path.read_text())
    data["job"]["entrypoint"] = None
    manifest_path.write_text(json.dumps(data))
    return built


# --- agentic scenarios -----------------------------------------------------------------------


def _trials(b: JobBuilder, start: datetime, n: int, *, every_s: float = 20, **kwargs: Any) -> None:
    for i in range(n):
        b.trial(f"fix-git-history__{i:07x}", start + timedelta(seconds=every_s * i), **kwargs)


def agentic_healthy(root: Path) -> Built:
    b = JobBuilder(root, "rl-tasktrove-healthy", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 16), seconds=600)
    for i in range(40):
        reward = 1.0 if i % 3 == 0 else 0.0
        b.trial(f"sanitize-git-repo__{i:07x}", T0 + timedelta(minutes=20 + i), reward=reward)
    b.trial(
        "blind-maze__00000aa",
        T0 + timedelta(minutes=70),
        reward=0.0,
        exception="AgentTimeoutError",
        message="Agent timed out after 900 s",
    )
    b.trial(
        "conda-env__00000bb",
        T0 + timedelta(minutes=71),
        reward=0.0,
        exception="ContextLengthExceededError",
        message="context 65000 > 64000",
    )
    return finish(b, root, end + timedelta(seconds=60), argv=AGENTIC_ARGV)


def daytona_quota(root: Path) -> Built:
    b = JobBuilder(root, "rl-tasktrove-quota", T0)
    zero = with_metrics(**{"reward/avg_raw_reward": 0.0, "reward/avg_pass_at_5": 0.0})
    moment = start_attempt(b, T0)
    for step in range(1, 13):
        b.batch(moment, 0, 32, {"DaytonaValidationError": 32})
        moment = run_steps(b, moment, range(step, step + 1), zero, seconds=90)
    _trials(  # every trial finished before the capture (none dated after `now`)
        b,
        T0 + timedelta(minutes=2),
        60,
        every_s=15,
        reward=0.0,
        exception="DaytonaValidationError",
        message="Snapshot quota exceeded. Maximum allowed: 100",
        turns=0,
        setup_s=1.0,
        agent_s=0.5,
        verifier_s=0.1,
    )
    return finish(b, root, moment + timedelta(seconds=60), argv=AGENTIC_ARGV)


def one_turn_trials(root: Path) -> Built:
    b = JobBuilder(root, "rl-tasktrove-oneturn", T0)
    flat = with_metrics(**{"reward/avg_raw_reward": 0.02})
    end = run_steps(b, start_attempt(b, T0), range(1, 13), flat, seconds=300)
    _trials(b, T0 + timedelta(minutes=10), 80, reward=0.0, turns=1, agent_s=30.0)
    return finish(b, root, end + timedelta(seconds=60), argv=AGENTIC_ARGV)


def sandbox_churn(root: Path) -> Built:
    b = JobBuilder(root, "rl-tasktrove-churn", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 16), seconds=600)
    for i in range(120):
        reward = 1.0 if i % 4 == 0 else 0.0
        b.trial(
            f"fix-git-history__{i:07x}",
            T0 + timedelta(minutes=20 + i),
            reward=reward,
            setup_s=95.0,
            agent_s=200.0,
        )
    return finish(b, root, end + timedelta(seconds=60), argv=AGENTIC_ARGV)


def startup_burst(root: Path) -> Built:
    b = JobBuilder(root, "rl-tasktrove-burst", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 16), seconds=600)
    for i in range(30):
        b.trial(
            f"burst__{i:07x}", T0 + timedelta(seconds=30 * i), reward=float(i % 2), setup_s=80.0
        )
    for i in range(100):
        b.trial(f"steady__{i:07x}", T0 + timedelta(minutes=30 + i), reward=float(i % 3 == 0))
    return finish(b, root, end + timedelta(seconds=60), argv=AGENTIC_ARGV)


def agentic_no_trials(root: Path) -> Built:
    b = JobBuilder(root, "rl-tasktrove-notrials", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 15), seconds=300)
    return finish(b, root, end + timedelta(seconds=60), argv=AGENTIC_ARGV)


PASS4 = {"liveness": "PASS", "resources": "PASS", "rollouts": "PASS", "dynamics": "PASS"}
STD = {**PASS4, "duty_cycle": "N/A"}
ALL_ERROR = dict.fromkeys(PASS4, "ERROR")
DEAD = {**ALL_ERROR, "liveness": "FAIL", "duty_cycle": "N/A"}
AGENTIC = {**PASS4, "duty_cycle": "PASS"}

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("healthy_standard", healthy_standard, "NO-KILL", STD, 0, mode="standard"),
    Scenario("plateau", plateau, "NO-KILL", STD, text_contains=("plateau",)),
    Scenario(
        "all_zero_reward", all_zero_reward, "KILL", STD | {"dynamics": "FAIL", "rollouts": "FAIL"}
    ),
    Scenario("reward_collapse", reward_collapse, "KILL", STD | {"dynamics": "FAIL"}),
    Scenario("entropy_collapse", entropy_collapse, "KILL", STD | {"dynamics": "FAIL"}),
    Scenario("nan_loss", nan_loss, "KILL", STD | {"dynamics": "FAIL"}),
    Scenario("router_replay", router_replay, "KILL", STD | {"dynamics": "FAIL"}),
    Scenario(
        "phase_inflation",
        phase_inflation,
        "NO-KILL",
        STD | {"dynamics": "FAIL"},
        text_contains=("sync_weights",),
    ),
    Scenario("generation_at_max", generation_at_max, "NO-KILL", STD | {"rollouts": "FAIL"}),
    Scenario(
        "no_usable_metrics",
        no_usable_metrics,
        "ERROR",
        STD | {"dynamics": "ERROR", "rollouts": "ERROR"},
        text_contains=("custom print",),
    ),
    Scenario("resume_past_end", resume_past_end, "NO-KILL", STD),
    Scenario("initializing", initializing, "NO-KILL", STD),
    Scenario("init_exceeded", init_exceeded, "ERROR", {**ALL_ERROR, "duty_cycle": "N/A"}),
    Scenario(
        "stall_with_stacks",
        stall_with_stacks,
        "KILL",
        STD | {"liveness": "FAIL"},
        text_contains=("all_reduce",),
    ),
    Scenario("stall_without_stacks", stall_without_stacks, "ERROR", STD | {"liveness": "ERROR"}),
    Scenario("colocated_deception", colocated_deception, "ERROR", STD | {"liveness": "ERROR"}),
    Scenario("slow_checkpoint", slow_checkpoint, "NO-KILL", STD),
    Scenario(
        "crash_loop",
        crash_loop,
        "KILL",
        DEAD | {"resources": "FAIL"},
        3,
        True,
        text_contains=("CONFIDENCE: medium",),
    ),
    Scenario(
        "config_parse_death", config_parse_death, "KILL", DEAD, 3, True, text_contains=("polcy",)
    ),
    Scenario("preempted_recovered", preempted_recovered, "NO-KILL", STD, 1, False),
    Scenario(
        "terminal_but_fresh_log", terminal_but_fresh_log, "ERROR", STD | {"liveness": "ERROR"}
    ),
    Scenario(
        "running_without_pods",
        running_without_pods,
        "ERROR",
        # 5 steps past the initialization grace: no learning-quality window (issue 8, item 8)
        STD | {"liveness": "ERROR", "dynamics": "ERROR"},
    ),
    Scenario("stale_manifest", stale_manifest, "ERROR", STD | {"liveness": "ERROR"}),
    Scenario("starved_engines", starved_engines, "NO-KILL", STD | {"resources": "FAIL"}),
    Scenario("backpressure", backpressure, "NO-KILL", STD),
    Scenario("benign_noise", benign_noise, "NO-KILL", STD),
    Scenario(
        "policy_oom_after_progress",
        policy_oom_after_progress,
        "KILL",
        STD | {"liveness": "FAIL", "resources": "FAIL"},
        text_contains=("policy rank",),
    ),
    Scenario(
        "undeclared_mode",
        undeclared_mode,
        "ERROR",
        PASS4 | {"rollouts": "ERROR", "duty_cycle": "ERROR"},
        mode="undeclared",
    ),
    Scenario(
        "undeclared_crash_loop",
        undeclared_crash_loop,
        "KILL",
        DEAD | {"resources": "FAIL", "duty_cycle": "ERROR"},
        3,
        True,
        mode="undeclared",
    ),
    Scenario("agentic_healthy", agentic_healthy, "NO-KILL", AGENTIC, mode="agentic"),
    Scenario(
        "daytona_quota", daytona_quota, "KILL", AGENTIC | {"rollouts": "FAIL", "dynamics": "FAIL"}
    ),
    Scenario("one_turn_trials", one_turn_trials, "KILL", AGENTIC | {"rollouts": "FAIL"}),
    Scenario("sandbox_churn", sandbox_churn, "NO-KILL", AGENTIC | {"duty_cycle": "FAIL"}),
    Scenario("startup_burst", startup_burst, "NO-KILL", AGENTIC),
    Scenario("agentic_no_trials", agentic_no_trials, "ERROR", AGENTIC | {"rollouts": "ERROR"}),
)
