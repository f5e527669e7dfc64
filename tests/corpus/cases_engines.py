"""vLLM engines as they really log: in Ray worker logs, silent when idle, wedged, dying, restarting.

Engine deaths use vLLM's own lines as users pasted them in public issues
(tests/fixtures/real_failures/vllm.toml: vllm-project/vllm#17276 "EngineCore encountered a fatal
error.", #42362 `EngineDeadError`, #17431 "EngineCore failed to start.", SkyRL#1673 "Engine core
initialization failed"). The wedge is the shape docs/domain.md#idle-engines describes: requests waiting,
none running, 0 tok/s, while `/health` stays 200.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from tests.corpus import raynode as rn
from tests.corpus.cases_stalls import ARGV, _into_phase
from tests.corpus.kit import (
    T0,
    Labelled,
    engine_line,
    healthy_run,
    noisy_steps,
    ray_worker_log,
    standard_finish,
)
from tests.scenarios.builder import JobBuilder
from tests.scenarios.catalog import Built, controller, run_steps, start_attempt

ARGV4 = [a.replace("num_inference_engines=2", "num_inference_engines=4") for a in ARGV]
FATAL = (
    "ERROR {stamp} [core.py:398] EngineCore encountered a fatal error.",
    "ERROR {stamp} [core.py:398] Traceback (most recent call last):",
    'ERROR {stamp} [core.py:398]   File "/usr/local/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 389, in run_engine_core',
    "ERROR {stamp} [core.py:398]     engine_core.run_busy_loop()",
    "ERROR {stamp} [core.py:398] RuntimeError: CUDA error: an illegal memory access was encountered",
    "ERROR {stamp} [async_llm.py:420] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
)
START_FAILED = (
    "ERROR {stamp} [core.py:396] EngineCore failed to start.",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{}}",
)


def _stamp(moment: datetime) -> str:
    return f"{moment:%m-%d %H:%M:%S}"


def _stats(
    start: datetime, end: datetime, engine: int, every_s: int = 60, **values: float
) -> list[str]:
    lines = []
    moment = start
    while moment <= end:
        lines.append(engine_line(moment, engine=engine, **values))  # type: ignore[arg-type]
        moment += timedelta(seconds=every_s)
    return lines


def _busy(start: datetime, end: datetime, engine: int) -> list[str]:
    return _stats(start, end, engine, running=52, waiting=4, kv=44.0, gen=2300.0)


def _quiet_run(b: JobBuilder) -> tuple[datetime, datetime]:
    """Twelve steps whose engine lines live only in Ray worker logs, then a step stuck in generate."""
    moment = start_attempt(b, T0)
    end = run_steps(b, moment, range(1, 13), engines=None)
    b.log(end, "Started: 'step'")
    b.log(end, "Started: 'generate'")
    return moment, end


# --- engine deaths --------------------------------------------------------------------------------


def every_engine_fatal(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-engines-dead", T0)
    start, stuck = _quiet_run(b)
    death = stuck + timedelta(minutes=3)
    now = stuck + timedelta(minutes=70)
    job = b.job_dir
    for engine, pid in enumerate((287294, 287295)):
        lines = _busy(start, death, engine) + [line.format(stamp=_stamp(death)) for line in FATAL]
        ray_worker_log(job, pid, lines)
    return standard_finish(b, root, now, argv=ARGV, artifacts={"ray_logs": "2 files"})


def one_engine_fatal(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-one-engine-dead", T0)
    start, stuck = _quiet_run(b)
    death = stuck + timedelta(minutes=3)
    now = stuck + timedelta(minutes=70)
    dead = _busy(start, death, 0) + [line.format(stamp=_stamp(death)) for line in FATAL]
    ray_worker_log(b.job_dir, 287294, dead)
    idle = [
        *_busy(start, death, 1),
        engine_line(
            death + timedelta(seconds=10),
            engine=1,
            running=0,
            waiting=0,
            kv=0.0,
            gen=0.0,
            prompt=0.0,
        ),
    ]
    ray_worker_log(b.job_dir, 287295, idle)
    return standard_finish(b, root, now, argv=ARGV, artifacts={"ray_logs": "2 files"})


def engine_died_job_recovered(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-engine-restarted", T0)
    moment = start_attempt(b, T0)
    middle = run_steps(b, moment, range(1, 8), engines=None)
    end = run_steps(b, middle + timedelta(minutes=4), range(8, 16), engines=None)
    first = _busy(moment, middle, 0) + [line.format(stamp=_stamp(middle)) for line in FATAL]
    ray_worker_log(b.job_dir, 287294, first)
    ray_worker_log(b.job_dir, 287311, _busy(middle + timedelta(minutes=4), end, 0))
    ray_worker_log(b.job_dir, 287295, _busy(moment, end, 1))
    return standard_finish(
        b, root, end + timedelta(minutes=1), argv=ARGV, artifacts={"ray_logs": "3 files"}
    )


# --- wedged, restarting, misdated -----------------------------------------------------------------


def one_engine_wedged(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-engine-wedged", T0)

    def engines(builder: JobBuilder, moment: datetime) -> None:
        wedged = moment > T0 + timedelta(minutes=12)
        for engine in range(4):
            if engine == 2 and wedged:
                builder.vllm(
                    moment, engine=2, pid=287296, running=0, waiting=17, kv=0.0, gen=0.0, prompt=0.0
                )
            else:
                builder.vllm(
                    moment,
                    engine=engine,
                    pid=287294 + engine,
                    running=48,
                    waiting=6,
                    kv=46.0,
                    gen=2450.0,
                )

    end = run_steps(b, start_attempt(b, T0), range(1, 21), engines=engines)
    return standard_finish(b, root, end + timedelta(minutes=1), argv=ARGV4)


def every_engine_wedged_with_stacks(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-engines-wedged", T0)
    end = healthy_run(b)
    b.log(end, "Started: 'step'")
    b.log(end, "Started: 'generate'")
    for minute in range(0, 50, 1):
        for engine in range(2):
            b.vllm(
                end + timedelta(minutes=minute, seconds=10),
                engine=engine,
                pid=287294 + engine,
                running=0,
                waiting=29,
                kv=0.0,
                gen=0.0,
                prompt=0.0,
            )
    now = end + timedelta(minutes=50)
    procs = [
        rn.driver(),
        rn.trainer_actor(2010, (rn.TRAINER_GENERATE,) * 2),
        *[rn.rank(3001 + i, (rn.IDLE_WORKER,) * 2) for i in range(4)],
        *rn.engines(),
        *rn.ray_helpers(),
    ]
    controller(b, "running")
    rn.Capture(
        procs, now - timedelta(minutes=3), only={p.pid for p in procs if not p.native}
    ).record(b)
    return standard_finish(b, root, now, probes=True, argv=ARGV)


def engine_restart_loop(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-engine-restart-loop", T0)
    moment = start_attempt(b, T0)
    end = run_steps(b, moment, range(1, 16), engines=None, seconds=180.0)
    ray_worker_log(b.job_dir, 287294, _busy(moment, end, 0))
    for attempt in range(9):
        at = moment + timedelta(minutes=3 + 4 * attempt)
        lines = [
            f"INFO {_stamp(at)} [core.py:75] Initializing a V1 LLM engine (v0.10.1) with config: model='Qwen/Qwen2.5-7B-Instruct'",
            *(line.format(stamp=_stamp(at + timedelta(seconds=40))) for line in START_FAILED),
        ]
        ray_worker_log(b.job_dir, 287400 + attempt, lines, pod=f"ray-worker-{attempt}")
    return standard_finish(
        b, root, end + timedelta(minutes=1), argv=ARGV, artifacts={"ray_logs": "10 files"}
    )


def engine_stats_after_now(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-engine-clock-ahead", T0)
    quiet_since = _into_phase(b, healthy_run(b), "train_critic_and_policy")
    now = quiet_since + timedelta(minutes=50)
    for i in range(8):
        b.vllm(
            now + timedelta(minutes=6, seconds=10 * i), running=50, waiting=3, kv=40.0, gen=2100.0
        )
    return standard_finish(b, root, now, argv=ARGV)


def wedge_shape_one_interval(root: Path) -> Built:
    b = JobBuilder(root, "rl-qwen-queue-filling", T0)

    def engines(builder: JobBuilder, moment: datetime) -> None:
        for engine in range(2):
            builder.vllm(
                moment,
                engine=engine,
                pid=287294 + engine,
                running=0,
                waiting=64,
                kv=0.0,
                gen=0.0,
                prompt=0.0,
            )
            builder.vllm(
                moment + timedelta(seconds=10),
                engine=engine,
                pid=287294 + engine,
                running=60,
                waiting=4,
                kv=51.0,
                gen=2500.0,
            )

    end = noisy_steps(b, start_attempt(b, T0), range(1, 15))
    end = run_steps(b, end, range(15, 17), engines=engines)
    return standard_finish(b, root, end + timedelta(minutes=1), argv=ARGV)


CASES: tuple[Labelled, ...] = (
    Labelled(
        "engines_all_fatal_in_ray_worker_logs",
        every_engine_fatal,
        "KILL",
        "both engines log `EngineCore encountered a fatal error` in their Ray worker logs (not in "
        "the finelog), their stat lines end there, the trainer silent 67 min in generate, "
        "controller running: the death line establishes it",
        {"liveness": "FAIL"},
    ),
    Labelled(
        "engine_one_of_two_fatal_trainer_quiet",
        one_engine_fatal,
        "ERROR",
        "one engine of two dead, the other idle; the trainer quiet: only stacks can say whether "
        "the trainer waits on the dead engine",
        {"liveness": "ERROR"},
    ),
    Labelled(
        "engine_died_job_recovered",
        engine_died_job_recovered,
        "NO-KILL",
        "an engine died at step 7, Ray restarted it (a new pid) and the trainer went on to step 15",
        {"liveness": "PASS"},
    ),
    Labelled(
        "engine_one_of_four_wedged",
        one_engine_wedged,
        "NO-KILL",
        "engine 2 shows Waiting 17, Running 0, 0 tok/s for every interval since minute 12 (its "
        "/health stays 200) while three engines and the trainer work: capacity lost, not death",
        {"liveness": "PASS", "resources": "FAIL"},
    ),
    Labelled(
        "engines_all_wedged_trainer_still",
        every_engine_wedged_with_stacks,
        "KILL",
        "both engines Waiting 29, Running 0, 0 tok/s every minute for 50 min; the trainer "
        "identical in ray.get(generate) in two live dumps: wedged outside a collective",
        {"liveness": "FAIL"},
    ),
    Labelled(
        "engine_restart_loop_nine_times",
        engine_restart_loop,
        "NO-KILL",
        "a second engine failed to start nine times (`EngineCore failed to start`) while one "
        "engine carries the run: it trains on half its capacity, which the report must say",
        {"liveness": "PASS", "resources": "FAIL"},
    ),
    Labelled(
        "engine_stat_lines_dated_after_now",
        engine_stats_after_now,
        "ERROR",
        "the trainer quiet 50 min; engine lines dated 6 min after now (a node clock ahead) are "
        "not fresh evidence of anything; no stacks",
        {"liveness": "ERROR"},
    ),
    Labelled(
        "engine_queue_filling_one_interval",
        wedge_shape_one_interval,
        "NO-KILL",
        "Waiting 64, Running 0 for one interval as a batch arrives, then running: not a wedge",
        {"liveness": "PASS", "resources": "PASS"},
    ),
)
