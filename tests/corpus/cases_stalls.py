"""Stalls judged from a whole process table, and the look-alikes that must not be called one.

A stall KILL needs live stacks (docs/domain.md#what-established-means): two dumps of the
load-bearing processes (the policy ranks, the driver or coordinator the proof rests on) taken after
the newest progress. A real Ray node's table also holds Ray's helpers (their frames always move), native processes whose py-spy
dump fails, vLLM engines idle on their input queue, and idle workers: none of them proves or
disproves a stall (docs/domain.md#processes-and-roles).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

from tests.corpus import raynode as rn
from tests.corpus.kit import T0, Labelled, healthy_run, standard_finish
from tests.scenarios.builder import JobBuilder
from tests.scenarios.catalog import AGENTIC_ARGV, Built, controller

ARGV = [
    "python",
    "-m",
    "skyrl_train.entrypoints.main_base",
    "trainer.epochs=20",
    "trainer.placement.policy_num_gpus_per_node=4",
    "generator.num_inference_engines=2",
    "generator.max_num_seqs=64",
]
QUIET = timedelta(minutes=50)
TRAINER_TRAIN = (
    "get_objects (ray/_private/worker.py:893)",
    "get (ray/_private/worker.py:2771)",
    "wrapper (ray/_private/client_mode_hook.py:103)",
    "ppo_train (skyrl_train/workers/worker_dispatch.py:188)",
    "train_critic_and_policy (skyrl_train/trainer.py:1121)",
    "train (skyrl_train/trainer.py:262)",
    "skyrl_entrypoint (skyrl_train/entrypoints/main_base.py:301)",
    "actor_method_executor (ray/_private/function_manager.py:689)",
    "main_loop (ray/_private/worker.py:879)",
)
TRAINER_SYNC = (
    "get_objects (ray/_private/worker.py:893)",
    "get (ray/_private/worker.py:2771)",
    "wrapper (ray/_private/client_mode_hook.py:103)",
    "update_named_weights (skyrl_train/inference_engines/inference_engine_client.py:214)",
    "sync_weights (skyrl_train/trainer.py:1190)",
    "train (skyrl_train/trainer.py:281)",
    "skyrl_entrypoint (skyrl_train/entrypoints/main_base.py:301)",
    "main_loop (ray/_private/worker.py:879)",
)
RANK_SYNC = (
    "get_objects (ray/_private/worker.py:893)",
    "get (ray/_private/worker.py:2771)",
    "wrapper (ray/_private/client_mode_hook.py:103)",
    "update_named_weights (skyrl_train/inference_engines/ray_wrapped_inference_engine.py:77)",
    "sync_weights_to_engines (skyrl_train/workers/fsdp/fsdp_worker.py:233)",
    "main_loop (ray/_private/worker.py:879)",
)


# --- the run up to the stall ---------------------------------------------------------------------


def _engine_idle_lines(b: JobBuilder, moment: datetime) -> None:
    """vLLM's last INFO interval after generation stops: 0 tok/s, nothing running; then silence
    (an idle interval after an idle one is logged at DEBUG)."""
    for engine in range(2):
        b.vllm(
            moment,
            engine=engine,
            pid=287294 + engine,
            running=0,
            waiting=0,
            kv=0.0,
            gen=0.0,
            prompt=0.0,
        )


def _into_phase(b: JobBuilder, start: datetime, last_phase: str) -> datetime:
    """A new step that finishes the early phases, then opens `last_phase` and goes quiet."""
    phases = (
        ("generate", 66.0),
        ("postprocess_generator_output", 1.2),
        ("convert_to_training_input", 1.2),
        ("fwd_logprobs_values_reward", 15.6),
        ("compute_advantages_and_returns", 1.2),
    )
    moment = start
    b.log(moment, "Started: 'step'")
    for phase, seconds in phases:
        if phase == last_phase:
            break
        b.log(moment, f"Started: '{phase}'")
        moment += timedelta(seconds=seconds)
        b.log(moment, f"Finished: '{phase}', time cost: {seconds:.2f}s")
    _engine_idle_lines(b, moment + timedelta(seconds=8))
    b.log(moment, f"Started: '{last_phase}'")
    if last_phase == "train_critic_and_policy":
        b.log(moment, "Started: 'policy_train'")
    return moment


def _stall(
    root: Path,
    name: str,
    procs: Sequence[rn.Proc],
    *,
    phase: str = "train_critic_and_policy",
    quiet: timedelta = QUIET,
    before_now: timedelta = timedelta(minutes=3),
    argv: Sequence[str] = ARGV,
    **capture: object,
) -> Built:
    b = JobBuilder(root, name, T0)
    quiet_since = _into_phase(b, healthy_run(b), phase)
    now = quiet_since + quiet
    controller(b, "running")
    rn.Capture(list(procs), now - before_now, **capture).record(b)  # type: ignore[arg-type]
    return standard_finish(b, root, now, probes=True, argv=list(argv))


def _ranks(
    frames: Sequence[tuple[str, ...] | str | None] = (rn.RANK_COLLECTIVE,) * 2,
) -> list[rn.Proc]:
    return [rn.rank(3001 + i, frames) for i in range(4)]


def _table(ranks: list[rn.Proc], trainer: tuple[str, ...] = TRAINER_TRAIN) -> list[rn.Proc]:
    return [
        rn.driver(),
        rn.trainer_actor(2010, (trainer, trainer)),
        *ranks,
        *rn.engines(),
        *rn.ray_helpers(),
    ]


def _python(procs: Sequence[rn.Proc]) -> set[int]:
    return {p.pid for p in procs if not p.native}


# --- KILL: the stall is proven on the processes that carry it -------------------------------------


def ranks_beside_helpers(root: Path) -> Built:
    procs = _table(_ranks())
    return _stall(root, "rl-qwen-fsdp-hang", procs, only=_python(procs))


def native_dumps_failed(root: Path) -> Built:
    ranks = [rn.rank(3001 + i, (rn.RANK_REDUCE_SCATTER,) * 2, "ppo_train") for i in range(4)]
    return _stall(root, "rl-qwen-megatron-hang", _table(ranks))


def helper_dump_timed_out(root: Path) -> Built:
    procs = _table(_ranks())
    return _stall(root, "rl-qwen-agent-timeout", procs, only=_python(procs), timeouts={131})


def driver_dumped_once(root: Path) -> Built:
    procs = _table(_ranks())
    return _stall(root, "rl-qwen-driver-once", procs, only=_python(procs), once={1}, gap_s=60.0)


def still_with_silent_idle_engines(root: Path) -> Built:
    ranks = [rn.rank(3001 + i, (RANK_SYNC,) * 2, "sync_weights_to_engines") for i in range(4)]
    procs = _table(ranks, TRAINER_SYNC)
    return _stall(root, "rl-qwen-sync-wedge", procs, phase="sync_weights", only=_python(procs))


def coordinator_queue_deadlock(root: Path) -> Built:
    b = JobBuilder(root, "rl-tasktrove-coordinator", T0)
    end = healthy_run(b, seconds=300.0)
    for i in range(60):
        b.trial(
            f"sanitize-git-repo__{i:07x}", T0 + timedelta(minutes=3 + i), reward=float(i % 3 == 0)
        )
    quiet_since = _into_phase(b, end, "generate")
    now = quiet_since + QUIET
    coordinator = rn.Proc(2020, 1, "ray::AsyncRolloutCoordinator.run", (rn.COORDINATOR_QUEUE,) * 2)
    procs = [
        rn.driver(),
        rn.trainer_actor(2010, (rn.TRAINER_GENERATE,) * 2),
        coordinator,
        *rn.engines(),
        *rn.ray_helpers(),
    ]
    controller(b, "running")
    rn.Capture(procs, now - timedelta(minutes=3), only=_python(procs)).record(b)
    return standard_finish(b, root, now, probes=True, argv=AGENTIC_ARGV)


# --- not KILL: the stacks do not carry a proof -----------------------------------------------------


def straggler_rank_computing(root: Path) -> Built:
    ranks = [*_ranks()[:3], rn.rank(3004, rn.RANK_COMPUTE)]
    procs = _table(ranks)
    return _stall(root, "rl-qwen-straggler", procs, only=_python(procs))


def rank_dump_permission_denied(root: Path) -> Built:
    ranks = [*_ranks()[:3], rn.rank(3004, (rn.PYSPY_NO_PERMISSION,) * 2)]
    procs = _table(ranks)
    return _stall(root, "rl-qwen-ptrace-denied", procs, only=_python(procs))


def rank_dumped_once(root: Path) -> Built:
    procs = _table(_ranks())
    return _stall(root, "rl-qwen-rank-once", procs, only=_python(procs), once={3002})


def parked_but_log_advancing(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-busy-collective", T0)
    end = healthy_run(b, steps=14)
    now = end + timedelta(minutes=2)
    procs = _table(_ranks())
    controller(b, "running")
    rn.Capture(procs, now - timedelta(seconds=50), gap_s=5.0, only=_python(procs)).record(b)
    return standard_finish(b, root, now, probes=True, argv=ARGV)


def dumps_before_newest_step(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-old-dumps", T0)
    procs = _table(_ranks())
    rn.Capture(procs, T0 + timedelta(minutes=20), only=_python(procs)).record(b)
    quiet_since = _into_phase(b, healthy_run(b), "train_critic_and_policy")
    controller(b, "running")
    return standard_finish(b, root, quiet_since + timedelta(minutes=12), probes=True, argv=ARGV)


def quiet_without_stacks(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-quiet", T0)
    quiet_since = _into_phase(b, healthy_run(b), "train_critic_and_policy")
    return standard_finish(b, root, quiet_since + QUIET, argv=ARGV)


def still_but_engines_generating(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-still-busy-engines", T0)
    quiet_since = _into_phase(b, healthy_run(b), "sync_weights")
    for i in range(20):
        b.vllm(
            quiet_since + timedelta(minutes=2 * i + 1), running=40, waiting=0, kv=31.0, gen=1900.0
        )
    now = quiet_since + QUIET
    ranks = [rn.rank(3001 + i, (RANK_SYNC,) * 2, "sync_weights_to_engines") for i in range(4)]
    procs = _table(ranks, TRAINER_SYNC)
    controller(b, "running")
    rn.Capture(procs, now - timedelta(minutes=3), only=_python(procs)).record(b)
    return standard_finish(b, root, now, probes=True, argv=ARGV)


def still_engine_stopped_mid_generation(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-engine-cut", T0)
    end = healthy_run(b)
    b.log(end, "Started: 'step'")
    b.log(end, "Started: 'generate'")
    for engine in range(2):
        b.vllm(
            end + timedelta(seconds=10),
            engine=engine,
            pid=287294 + engine,
            running=61,
            waiting=3,
            kv=48.0,
            gen=2200.0,
        )
    now = end + QUIET
    procs = [
        rn.driver(),
        rn.trainer_actor(2010, (rn.TRAINER_GENERATE,) * 2),
        *_ranks((rn.IDLE_WORKER,) * 2),
        *rn.engines(),
        *rn.ray_helpers(),
    ]
    controller(b, "running")
    rn.Capture(procs, now - timedelta(minutes=3), only=_python(procs)).record(b)
    return standard_finish(b, root, now, probes=True, argv=ARGV)


def still_quiet_short_of_twice(root: Path) -> Built:
    ranks = [rn.rank(3001 + i, (RANK_SYNC,) * 2, "sync_weights_to_engines") for i in range(4)]
    procs = _table(ranks, TRAINER_SYNC)
    return _stall(
        root,
        "rl-qwen-still-early",
        procs,
        phase="sync_weights",
        quiet=timedelta(minutes=18),
        only=_python(procs),
    )


LIVENESS_FAIL = {"liveness": "FAIL"}
LIVENESS_ERROR = {"liveness": "ERROR"}

CASES: tuple[Labelled, ...] = (
    Labelled(
        "stall_fsdp_ranks_beside_ray_helpers",
        ranks_beside_helpers,
        "KILL",
        "four FSDP ranks parked in one all_reduce in two dumps 30 s apart, quiet 50 min; the "
        "dashboard agent and log monitor change frames between dumps as they always do",
        LIVENESS_FAIL,
    ),
    Labelled(
        "stall_megatron_native_dumps_failed",
        native_dumps_failed,
        "KILL",
        "ranks parked in reduce_scatter; py-spy failed on raylet and gcs_server (not Python)",
        LIVENESS_FAIL,
    ),
    Labelled(
        "stall_helper_dump_timed_out",
        helper_dump_timed_out,
        "KILL",
        "ranks parked in all_reduce; the dashboard agent's dumps timed out (a helper)",
        LIVENESS_FAIL,
    ),
    Labelled(
        "stall_driver_dumped_once",
        driver_dumped_once,
        "KILL",
        "every rank parked in all_reduce in two dumps 60 s apart; the driver (in ray.get) dumped "
        "once: context, not a hole",
        LIVENESS_FAIL,
    ),
    Labelled(
        "stall_still_engines_silent_after_idle_line",
        still_with_silent_idle_engines,
        "KILL",
        "trainer and ranks identical in ray.get during sync_weights, quiet 50 min; each engine's "
        "last INFO line 0 tok/s then silence (vLLM logs idle intervals at DEBUG)",
        LIVENESS_FAIL,
    ),
    Labelled(
        "stall_coordinator_queue_deadlock",
        coordinator_queue_deadlock,
        "KILL",
        "agentic: the rollout coordinator parked on its own queue in both dumps, no trial "
        "finished and no log line for 50 min; Ray helpers moving beside it",
        LIVENESS_FAIL,
        mode="agentic",
    ),
    Labelled(
        "straggler_rank_still_computing",
        straggler_rank_computing,
        "ERROR",
        "three ranks parked in all_reduce but the fourth is in forward/backward, frames "
        "changing: a straggler the others wait for, not a proven stall",
        LIVENESS_ERROR,
    ),
    Labelled(
        "rank_dump_permission_denied",
        rank_dump_permission_denied,
        "ERROR",
        "three ranks parked, py-spy refused on the fourth rank (ptrace): a rank is a hole",
        LIVENESS_ERROR,
    ),
    Labelled(
        "rank_dumped_once",
        rank_dumped_once,
        "ERROR",
        "one rank dumped once: it is not shown stuck",
        LIVENESS_ERROR,
    ),
    Labelled(
        "parked_in_collective_but_log_advancing",
        parked_but_log_advancing,
        "NO-KILL",
        "ranks caught in all_reduce twice 5 s apart while the log finished a step 2 min ago: a "
        "collective is where ranks spend time; the log says it advances",
        {"liveness": "PASS"},
    ),
    Labelled(
        "stall_dumps_taken_before_newest_step",
        dumps_before_newest_step,
        "ERROR",
        "quiet 12 min but the only dumps were taken before the newest step: not live evidence",
        LIVENESS_ERROR,
    ),
    Labelled(
        "quiet_without_stacks",
        quiet_without_stacks,
        "ERROR",
        "quiet 50 min in policy_train, no live probe: a stall needs live stacks",
        LIVENESS_ERROR,
    ),
    Labelled(
        "still_but_engines_generating",
        still_but_engines_generating,
        "ERROR",
        "identical stacks outside a collective, but the engines generate after the newest step",
        LIVENESS_ERROR,
    ),
    Labelled(
        "still_engine_stopped_logging_mid_generation",
        still_engine_stopped_mid_generation,
        "ERROR",
        "identical stacks in generate; each engine's last line shows 2200 tok/s then nothing: "
        "not the idle silence of vLLM (its last interval would print 0 tok/s)",
        LIVENESS_ERROR,
    ),
    Labelled(
        "still_quiet_short_of_twice_the_limit",
        still_quiet_short_of_twice,
        "ERROR",
        "identical stacks outside a collective and silent engines, but quiet 18 min: under twice "
        "the 10 min stall limit that a wedge outside collectives needs",
        LIVENESS_ERROR,
    ),
)
