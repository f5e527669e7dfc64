"""Bundles for issue 27's engine findings: engines read from their own Ray worker logs
(`ray_vllm_logs/<pod>/worker-*-<pid>.out`, no process prefix, nothing forwarded to the finelog),
engines that fall silent after their last stat line, wedge, die or fail to start.

vLLM text is real: the stat line of vLLM's logger (the builder's `stat_line`), and failure lines of
`tests/fixtures/real_failures/vllm.toml` with their own clock replaced by the scenario's —
`EngineCore encountered a fatal error.` (vllm-project/vllm#17276), `EngineCore failed to start.`
(vllm-project/vllm#17431), `RuntimeError: Engine core initialization failed. See root cause
above. Failed core proc(s): {}` (NovaSky-AI/SkyRL#1673).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from tests.scenarios import crafted
from tests.scenarios.builder import JobBuilder, stat_line
from tests.scenarios.catalog import T0, Built, controller, finish, run_steps, start_attempt
from tests.scenarios.real_lines import ENGINE_PID, engines_argv

Stat = dict[str, float]
BUSY: Stat = {"running": 48, "waiting": 6, "kv": 46.0, "gen": 2450.0}
IDLE: Stat = {"running": 0, "waiting": 0, "kv": 0.0, "gen": 0.0, "prompt": 0.0}
WEDGED: Stat = {"running": 0, "waiting": 23, "kv": 97.5, "gen": 0.0, "prompt": 0.0}

FATAL = "ERROR {clock} [core.py:398] EngineCore encountered a fatal error."
FAILED_TO_START = "ERROR {clock} [core.py:396] EngineCore failed to start."
INIT_FAILED = (
    "RuntimeError: Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {{}}"
)


def clock(moment: datetime) -> str:
    """vLLM's own time of a line: `MM-DD HH:MM:SS`."""
    return f"{moment:%m-%d %H:%M:%S}"


def stat(b: JobBuilder, engine: int, moment: datetime, values: Stat) -> None:
    """A stat line in engine `engine`'s own Ray worker log."""
    line = stat_line(
        moment,
        running=int(values["running"]),
        waiting=int(values["waiting"]),
        kv=values["kv"],
        gen=values["gen"],
        prompt=values.get("prompt", 1200.0),
    )
    b.worker_log(ENGINE_PID + engine, line)


def fleet(
    n: int, shape: Callable[[int, datetime], Stat | None] = lambda _e, _m: BUSY
) -> Callable[[JobBuilder, datetime], None]:
    """An engines callback for `run_steps`: each of `n` engines logs `shape(engine, moment)` (no
    line when None) in its own worker log."""

    def log(b: JobBuilder, moment: datetime) -> None:
        for engine in range(n):
            values = shape(engine, moment)
            if values is not None:
                stat(b, engine, moment, values)

    return log


def _generate_open(b: JobBuilder, end: datetime) -> None:
    b.log(end, "Started: 'step'")
    b.log(end, "Started: 'generate'")


def death(root: Path, name: str, *, engines: int, dead: int, silent_min: float) -> Built:
    """Twelve steps on `engines` engines seen only in their own Ray worker logs; the next step's
    `generate` opens, every engine logs once more, and two minutes later the first `dead` of them
    log vLLM's fatal error in their own log; then nothing for `silent_min`, controller running."""
    b = JobBuilder(root, name, T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 13), engines=fleet(engines))
    _generate_open(b, end)
    fleet(engines)(b, end + timedelta(seconds=30))
    died = end + timedelta(minutes=2)
    for engine in range(dead):
        b.worker_log(ENGINE_PID + engine, FATAL.format(clock=clock(died)))
    controller(b, "running")
    return finish(
        b, root, died + timedelta(minutes=silent_min), probes=True, argv=engines_argv(engines)
    )


def silent_stall(root: Path, name: str, *, last_gen: float) -> Built:
    """The corpus stall outside collectives (every trainer process identical in two dumps, quiet
    50 min) on two engines seen only in their worker logs: when generation ends each engine logs
    one line at `last_gen` tok/s with nothing running or waiting, before the trainer's newest
    advancement, and then nothing (vLLM logs intervals without tokens at DEBUG)."""
    b = JobBuilder(root, name, T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 13), engines=fleet(2))
    for engine in range(2):
        stat(b, engine, end + timedelta(seconds=10), IDLE | {"gen": last_gen})
    b.log(end, "Started: 'step'")
    for phase in ("generate", "postprocess_generator_output", "fwd_logprobs_values_reward"):
        b.log(end, f"Started: '{phase}'")
        b.log(end + timedelta(seconds=20), f"Finished: '{phase}', time cost: 20.00s")
        end += timedelta(seconds=20)
    b.log(end, "Started: 'train_critic_and_policy'")
    b.log(end, "Started: 'policy_train'")
    now = end + timedelta(minutes=50)
    controller(b, "running")
    crafted.dumps(b, now - timedelta(minutes=1), text=crafted.STILL)
    return finish(b, root, now, probes=True, argv=engines_argv(2))


def wedged(
    root: Path, name: str, *, engines: int, wedged: int, wedge_min: int, logged: bool = True,
    trainer_stops: bool = False,
) -> Built:  # fmt: skip
    """A run of 20 two-minute steps; `engines` engines (worker logs only) log a line every minute
    for its 40 minutes. The first `wedged` of them hold 23 requests with none running at 0 tok/s
    over the last `wedge_min` minutes: a line every minute (`logged`: the run spans `wedge_min`
    minutes) or one line and then nothing while the others go on (silent `wedge_min` minutes).
    With `trainer_stops` the trainer's last step ends before the wedge begins and its next
    `generate` stays open."""
    b = JobBuilder(root, name, T0)
    start = start_attempt(b, T0)
    began = 39 - wedge_min  # the minute of the first wedged line

    def shape(engine: int, minute: int) -> Stat | None:
        if engine >= wedged or minute < began:
            return BUSY
        return WEDGED if logged or minute == began else None

    steps = range(1, 1 + began // 2) if trainer_stops else range(1, 21)
    end = run_steps(b, start, steps, engines=None)
    if trainer_stops:
        _generate_open(b, end)
    for minute in range(40):
        moment = start + timedelta(minutes=minute, seconds=5)
        for engine in range(engines):
            values = shape(engine, minute)
            if values is not None:
                stat(b, engine, moment, values)
    controller(b, "running")
    now = start + timedelta(minutes=40, seconds=30)
    return finish(b, root, now, probes=True, argv=engines_argv(engines))


def restart_loop(root: Path, name: str, *, failures: int) -> Built:
    """A healthy run of 20 steps on two engines (worker logs only) and a third engine whose own
    log shows `failures` failed starts (vLLM's core line and the client's RuntimeError, one pair
    a start, five minutes apart) and never a stat line."""
    b = JobBuilder(root, name, T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 21), engines=fleet(2))
    for i in range(failures):
        moment = T0 + timedelta(minutes=5 + 5 * i)
        b.worker_log(ENGINE_PID + 2, FAILED_TO_START.format(clock=clock(moment)))
        b.worker_log(ENGINE_PID + 2, INIT_FAILED)
    controller(b, "running")
    return finish(b, root, end + timedelta(seconds=60), probes=True, argv=engines_argv(3))


def clock_ahead(root: Path, name: str, *, ahead_s: float) -> Built:
    """A healthy run whose engine forwards its stat lines to the finelog with its own clock
    `ahead_s` ahead of the Iris prefix (a node clock ahead), the newest line logged at `now`."""
    b = JobBuilder(root, name, T0)

    def ahead(builder: JobBuilder, moment: datetime) -> None:
        line = stat_line(
            moment + timedelta(seconds=ahead_s), running=48, waiting=6, kv=46.0, gen=2450.0
        )
        prefix = f"(AsyncVLLMInferenceEngine pid={ENGINE_PID}, ip=10.128.26.194)"
        builder.raw(moment, f"{prefix} {line}")

    end = run_steps(b, start_attempt(b, T0), range(1, 21), engines=ahead)
    now = end + timedelta(seconds=60)
    ahead(b, now)
    controller(b, "running")
    return finish(b, root, now, probes=True)
