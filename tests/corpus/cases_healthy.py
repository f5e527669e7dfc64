"""Healthy jobs that look alarming, and the states where the only honest answer is ERROR.

Each NO-KILL here is a shape that fools a naive rule: a long checkpoint save, engines silent
between generations, benign vLLM and NCCL warnings, a lone NCCL watchdog line, a preemption
recovered, a resume past max_steps, a start-up burst of slow sandboxes, a long model load.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from tests.corpus import raynode as rn
from tests.corpus.cases_stalls import ARGV, _table
from tests.corpus.kit import T0, Labelled, healthy_run, noisy_steps, standard_finish
from tests.scenarios.builder import JobBuilder
from tests.scenarios.catalog import (
    AGENTIC_ARGV,
    Built,
    attempts,
    controller,
    run_steps,
    start_attempt,
)


def healthy_noisy(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-healthy", T0)
    end = healthy_run(b, steps=20)
    return standard_finish(b, root, end + timedelta(seconds=70), argv=ARGV)


def healthy_with_stacks(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-healthy-probed", T0)
    end = healthy_run(b, steps=16)
    now = end + timedelta(minutes=1)
    ranks = [rn.rank(3001 + i, rn.RANK_COMPUTE) for i in range(4)]
    procs = _table(ranks)
    controller(b, "running")
    rn.Capture(
        procs, now - timedelta(seconds=40), gap_s=5.0, only={p.pid for p in procs if not p.native}
    ).record(b)
    return standard_finish(b, root, now, probes=True, argv=ARGV)


def long_checkpoint(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-checkpoint", T0)
    moment = start_attempt(b, T0)
    for cycle in range(3):
        moment = noisy_steps(b, moment, range(cycle * 5 + 1, cycle * 5 + 6))
        b.log(moment, "Started: 'save_checkpoints'")
        if cycle < 2:
            moment += timedelta(minutes=24)
            b.log(moment, "Finished: 'save_checkpoints', time cost: 1440.00s")
    return standard_finish(b, root, moment + timedelta(minutes=22), argv=ARGV)


def engines_silent_while_training(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-colocated-idle", T0)

    def engines(builder: JobBuilder, moment: object) -> None:
        return None

    moment = start_attempt(b, T0)
    for step in range(1, 16):
        for engine in range(2):
            b.vllm(
                moment + timedelta(seconds=20),
                engine=engine,
                pid=287294 + engine,
                running=60,
                waiting=8,
                kv=55.0,
                gen=2600.0,
            )
            b.vllm(
                moment + timedelta(seconds=72),
                engine=engine,
                pid=287294 + engine,
                running=0,
                waiting=0,
                kv=0.0,
                gen=0.0,
                prompt=0.0,
            )
        moment = run_steps(b, moment, range(step, step + 1), engines=engines)
    return standard_finish(b, root, moment + timedelta(minutes=1), argv=ARGV)


def benign_warnings(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-benign-warnings", T0)
    moment = start_attempt(b, T0)
    for step in range(1, 16):
        b.raw(
            moment,
            f"(AsyncVLLMInferenceEngine pid=287294, ip=10.128.26.194) INFO {moment:%m-%d %H:%M:%S} "
            "[shm_broadcast.py:466] No available shared memory broadcast block found in 60 second. "
            "This typically happens when some processes are hanging or doing some time-consuming "
            "work (e.g. compilation).",
        )
        moment = noisy_steps(b, moment, range(step, step + 1))
    return standard_finish(b, root, moment + timedelta(minutes=1), argv=ARGV)


def watchdog_line_then_progress(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-watchdog-warning", T0)
    moment = noisy_steps(b, start_attempt(b, T0), range(1, 9))
    b.raw(
        moment,
        "(PolicyWorker pid=3002, ip=10.128.26.194) [rank1]:[E730 18:19:02.771093 "
        "ProcessGroupNCCL.cpp:1854] [PG ID 0 PG GUID 0(default_pg) Rank 1] Heartbeat monitor "
        "timed out! Process will be terminated after dumping debug info. workMetaList_.size()=0",
    )
    end = noisy_steps(b, moment + timedelta(seconds=30), range(9, 17))
    return standard_finish(b, root, end + timedelta(minutes=1), argv=ARGV)


def preempted_recovered(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-preempted", T0)
    end = noisy_steps(b, start_attempt(b, T0), range(1, 11))
    second = end + timedelta(minutes=5)
    end = noisy_steps(b, start_attempt(b, second, resume=10), range(11, 20))
    controller(b, "running", preemptions=1)
    attempts(
        b,
        [
            (
                "preempted",
                None,
                "Worker preempted: node gpu-node-0 reclaimed",
                T0,
                second - timedelta(minutes=2),
            ),
            ("running", None, "", second, None),
        ],
    )
    return standard_finish(b, root, end + timedelta(minutes=1), probes=True, argv=ARGV)


def resume_past_end(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-complete", T0)
    moment = start_attempt(b, T0, resume=None)
    end = noisy_steps(b, moment, range(1, 21), total=20)
    b.log(end, "Training Step Progress: 20 / 20")
    moment = start_attempt(b, end + timedelta(minutes=2), resume=20)
    b.log(moment, "Training Step Progress: 21 / 20")
    b.traceback(moment, ["skyrl_train/trainer.py"], "StopIteration")
    controller(b, "succeeded")
    return standard_finish(
        b, root, moment + timedelta(minutes=3), probes=True, state="succeeded", argv=ARGV
    )


def initialising_long_load(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-loading", T0)
    moment = start_attempt(b, T0)
    b.log(moment, "Loading checkpoint shards: 100%|██████████| 30/30 [11:42<00:00, 23.41s/it]")
    b.log(moment + timedelta(minutes=12), "Started: 'step'")
    b.log(moment + timedelta(minutes=12), "Started: 'generate'")
    for i in range(8):
        b.vllm(moment + timedelta(minutes=12 + i), running=64, waiting=30, kv=61.0, gen=2800.0)
    return standard_finish(b, root, T0 + timedelta(minutes=21), argv=ARGV)


def agentic_healthy_some_timeouts(root: Path) -> Built:
    b = JobBuilder(root, "rl-tasktrove-healthy", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 16), seconds=600)
    for i in range(60):
        timeout = i % 15 == 0
        b.trial(
            f"sanitize-git-repo__{i:07x}",
            T0 + timedelta(minutes=20 + i),
            reward=0.0 if timeout else float(i % 3 == 0),
            exception="AgentTimeoutError" if timeout else None,
            message="Agent timed out after 900.0 seconds" if timeout else "",
        )
    return standard_finish(b, root, end + timedelta(minutes=1), argv=AGENTIC_ARGV)


def startup_sandbox_burst(root: Path) -> Built:
    b = JobBuilder(root, "rl-tasktrove-burst", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 16), seconds=600)
    for i in range(30):
        b.trial(
            f"burst__{i:07x}", T0 + timedelta(seconds=30 * i), reward=float(i % 2), setup_s=85.0
        )
    for i in range(100):
        b.trial(f"steady__{i:07x}", T0 + timedelta(minutes=30 + i), reward=float(i % 3 == 0))
    return standard_finish(b, root, end + timedelta(minutes=1), argv=AGENTIC_ARGV)


# --- only ERROR is honest ---------------------------------------------------------------------------


def stale_bundle(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-stale-bundle", T0)
    end = noisy_steps(b, start_attempt(b, T0), range(1, 15))
    return standard_finish(
        b, root, end + timedelta(hours=3), synced_at=end + timedelta(minutes=1), argv=ARGV
    )


def undeclared_mode(root: Path) -> Built:
    b = JobBuilder(root, "rl-mystery", T0)
    end = noisy_steps(b, start_attempt(b, T0), range(1, 15))
    return standard_finish(b, root, end + timedelta(minutes=1), argv=None)


def terminal_but_advancing(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-ghost", T0)
    end = noisy_steps(b, start_attempt(b, T0), range(1, 15))
    controller(b, "killed", error="Terminated by user")
    return standard_finish(b, root, end + timedelta(seconds=40), probes=True, argv=ARGV)


def manifest_of_another_job(root: Path) -> Built:
    built = healthy_noisy(root)
    path = built.job_dir / "manifest.json"
    data = json.loads(path.read_text())
    data["job_id"] = "/ops/rl-qwen-other"
    data["job"]["job_id"] = "/ops/rl-qwen-other"
    path.write_text(json.dumps(data, indent=2))
    return built


PASS = {"liveness": "PASS"}

CASES: tuple[Labelled, ...] = (
    Labelled(
        "healthy_ray_node_noise",
        healthy_noisy,
        "NO-KILL",
        "twenty steps with a real node's request logs, tqdm bars and raylet warnings",
        PASS,
    ),
    Labelled(
        "healthy_probed_ranks_computing",
        healthy_with_stacks,
        "NO-KILL",
        "live stacks show ranks in forward/backward and Ray helpers moving; a step finished a minute ago",
        PASS,
    ),
    Labelled(
        "long_checkpoint_save_open",
        long_checkpoint,
        "NO-KILL",
        "save_checkpoints open 22 min; it took 24 min twice before",
        PASS,
    ),
    Labelled(
        "engines_silent_while_training",
        engines_silent_while_training,
        "NO-KILL",
        "engines print a 0 tok/s line after each generate and nothing while the policy trains",
        PASS,
    ),
    Labelled(
        "benign_vllm_and_nccl_warnings",
        benign_warnings,
        "NO-KILL",
        "shared-memory broadcast waits and an NCCL barrier warning each step",
        PASS,
    ),
    Labelled(
        "lone_nccl_heartbeat_line_then_progress",
        watchdog_line_then_progress,
        "NO-KILL",
        "one NCCL heartbeat-monitor line at step 8, eight steps since: one line is not a wedge",
        PASS,
    ),
    Labelled(
        "preempted_attempt_then_resumed",
        preempted_recovered,
        "NO-KILL",
        "attempt 0 preempted, attempt 1 resumed from step 10 and passed it",
        PASS,
    ),
    Labelled(
        "resume_past_max_steps_succeeded",
        resume_past_end,
        "NO-KILL",
        "a resume at step 20 of 20 stopped with StopIteration; the job succeeded",
    ),
    Labelled(
        "initialising_after_long_model_load",
        initialising_long_load,
        "NO-KILL",
        "12 min loading shards, the first generate running for 9 min; within the 45 min grace",
        PASS,
    ),
    Labelled(
        "agentic_healthy_occasional_agent_timeouts",
        agentic_healthy_some_timeouts,
        "NO-KILL",
        "one trial in fifteen times out (a valid reward of 0); the rest score",
        mode="agentic",
    ),
    Labelled(
        "agentic_startup_sandbox_burst",
        startup_sandbox_burst,
        "NO-KILL",
        "slow sandbox set-up in the first 15 minutes only",
        mode="agentic",
    ),
    Labelled(
        "stale_bundle_three_hours",
        stale_bundle,
        "ERROR",
        "the watcher last synced three hours ago: nothing says what the job does now",
        {"liveness": "ERROR"},
    ),
    Labelled(
        "undeclared_mode_no_entrypoint",
        undeclared_mode,
        "ERROR",
        "no entrypoint and no declared mode: the mode-specific gates cannot be judged",
    ),
    Labelled(
        "killed_by_controller_but_log_advancing",
        terminal_but_advancing,
        "ERROR",
        "the controller says killed while the log advanced 40 s ago",
        {"liveness": "ERROR"},
    ),
    Labelled(
        "manifest_names_another_job",
        manifest_of_another_job,
        "ERROR",
        "the manifest names another job than its directory",
    ),
)
