"""The boundary corpus: for every threshold and every proof rule, one bundle just past it and one
just short of it, identical otherwise. Values everywhere else sit clear of every threshold.

Each `Pair` names what it pins (a threshold of docs/domain.md's table or a proof rule of
`worker.gates.proofs`), the two bundles, and the verdict and gate statuses of each.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from tests import ray_node
from tests.scenarios import crafted, in_log, issue27
from tests.scenarios import engine_lines as eng
from tests.scenarios import real_lines as real
from tests.scenarios.builder import JobBuilder
from tests.scenarios.catalog import (
    AGENTIC_ARGV,
    T0,
    Built,
    attempts,
    controller,
    crash_loop,
    finish,
    healthy_metrics,
    run_steps,
    saturated,
    start_attempt,
)

Build = Callable[[Path], Built]
Metrics = Callable[[int], dict[str, float]]

STD = {
    "liveness": "PASS",
    "resources": "PASS",
    "rollouts": "PASS",
    "dynamics": "PASS",
    "duty_cycle": "N/A",
}
AGENTIC = STD | {"duty_cycle": "PASS"}


@dataclass(frozen=True)
class Side:
    build: Build
    verdict: str
    gates: dict[str, str]


@dataclass(frozen=True)
class Pair:
    name: str
    pins: str  # the threshold or proof rule
    past: Side
    short: Side


def side(build: Build, verdict: str, **gates: str) -> Side:
    base = AGENTIC if gates.pop("agentic", "") else STD
    return Side(build, verdict, base | gates)


# --- bundles -------------------------------------------------------------------------------------


def standard(
    name: str,
    *,
    n: int = 20,
    metrics: Metrics = healthy_metrics,
    seconds: float = 120.0,
    phase_seconds: Callable[[int], dict[str, float]] | None = None,
    engines: Callable[[JobBuilder, datetime], None] | None = saturated,
    tail: Callable[[JobBuilder, datetime], datetime] | None = None,
) -> Build:
    """A standard run of `n` steps; `tail` may log more and returns the moment to judge at."""

    def build(root: Path) -> Built:
        b = JobBuilder(root, name, T0)
        end = run_steps(
            b,
            start_attempt(b, T0),
            range(1, n + 1),
            metrics,
            seconds=seconds,
            phase_seconds=phase_seconds,
            engines=engines,
        )
        now = tail(b, end) if tail else end + timedelta(seconds=60)
        return finish(b, root, now)

    return build


def with_(**values: float) -> Metrics:
    return lambda step: healthy_metrics(step) | values


def after(
    split: int, before: dict[str, float], later: Callable[[int], dict[str, float]]
) -> Metrics:
    """Healthy metrics with `before` up to step `split`, then `later(step)`."""
    return lambda s: healthy_metrics(s) | (before if s <= split else later(s))


def quiet(name: str, minutes: float, **stall: Any) -> Build:
    """The crafted stall, quiet `minutes`; without `text` no dumps are taken."""
    if "text" not in stall and not stall.pop("dumps", False):
        return _quiet_without_stacks(name, minutes, **stall)
    return lambda root: crafted.stall(root, name, quiet_min=minutes, **stall)


def _quiet_without_stacks(name: str, minutes: float, seconds: float = 120.0) -> Build:
    def build(root: Path) -> Built:
        b = JobBuilder(root, name, T0)
        end = run_steps(b, start_attempt(b, T0), range(1, 13), seconds=seconds)
        b.log(end, "Started: 'step'")
        b.log(end, "Started: 'generate'")
        controller(b, "running")
        return finish(b, root, end + timedelta(minutes=minutes), probes=True)

    return build


def previous_pod(current: bool) -> Build:
    """Attempt 0 failed, attempt 1 quiet 50 min; dumps of attempt 1's pod, or of attempt 0's."""

    def build(root: Path) -> Built:
        b = JobBuilder(root, f"rl-pod-{'current' if current else 'previous'}", T0)
        first_end = run_steps(b, start_attempt(b, T0), range(1, 6))
        second = first_end + timedelta(minutes=5)
        quiet_since = crafted.quiet_run_from(b, start_attempt(b, second, resume=5), range(6, 13))
        now = quiet_since + timedelta(minutes=crafted.QUIET_MIN)
        controller(b, "running", failures=1)
        oom = "torch.OutOfMemoryError: CUDA out of memory"
        attempts(b, [("failed", 1, oom, T0, first_end), ("running", None, "", second, None)])
        pod = f"iris-ops-{b.name}-0-{1 if current else 0}"
        crafted.dumps(b, now - timedelta(minutes=1), target=pod)
        return finish(b, root, now, probes=True)

    return build


def death(after_progress: bool) -> Build:
    """Quiet 50 min; an actor death after the newest advancement, or before the last step."""

    def build(root: Path) -> Built:
        b = JobBuilder(root, f"rl-death-{'after' if after_progress else 'before'}", T0)
        line = "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing"
        end = run_steps(b, start_attempt(b, T0), range(1, 12))
        if not after_progress:
            b.log(end, line, level="ERROR")
        end = run_steps(b, end, range(12, 13))
        b.log(end, "Started: 'step'")
        b.log(end, "Started: 'generate'")
        if after_progress:
            b.log(end + timedelta(minutes=2), line, level="ERROR")
        controller(b, "running")
        return finish(b, root, end + timedelta(minutes=crafted.QUIET_MIN), probes=True)

    return build


def oom(minutes_after: float, *, step_after: bool = False) -> Build:
    """A policy OOM in step 13, then a finished step, or `minutes_after` of silence."""

    def build(root: Path) -> Built:
        name = f"rl-oom-{'step' if step_after else int(minutes_after)}"
        b = JobBuilder(root, name, T0)
        end = run_steps(b, start_attempt(b, T0), range(1, 13))
        b.log(end, "Started: 'step'")
        b.log(end, "Started: 'train_critic_and_policy'")
        b.traceback(
            end + timedelta(seconds=30),
            ["skyrl_train/workers/fsdp/fsdp_worker.py"],
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        )
        if step_after:
            end = run_steps(b, end + timedelta(minutes=1), range(13, 14))
            return finish(b, root, end + timedelta(minutes=minutes_after))
        return finish(b, root, end + timedelta(seconds=30, minutes=minutes_after))

    return build


def agentic(name: str, *, turns: int = 6, failing: int = 0, trials: int = 50) -> Build:
    """An agentic run; `failing` trials of `trials` fail with a sandbox start timeout."""

    def build(root: Path) -> Built:
        b = JobBuilder(root, name, T0)
        end = run_steps(b, start_attempt(b, T0), range(1, 16), seconds=600)
        for i in range(trials):
            bad = i < failing
            b.trial(
                f"fix-git-history__{i:07x}",
                T0 + timedelta(minutes=20 + i),
                reward=0.0 if bad else float(i % 2),
                exception="EnvironmentStartTimeoutError" if bad else None,
                message="Environment start timed out after 600 s" if bad else "",
                turns=turns,
            )
        return finish(b, root, end + timedelta(seconds=60), argv=AGENTIC_ARGV)

    return build


def initializing(minutes: float) -> Build:
    def build(root: Path) -> Built:
        b = JobBuilder(root, f"rl-init-{int(minutes)}", T0)
        moment = start_attempt(b, T0)
        b.log(moment, "Started: 'step'")
        b.log(moment, "Started: 'generate'")
        for i in range(int(minutes // 2)):
            b.vllm(moment + timedelta(minutes=2 * i), running=64, waiting=12, kv=38.0, gen=2100.0)
        return finish(b, root, T0 + timedelta(minutes=minutes))

    return build


def synced(minutes: float) -> Build:
    """Steps of six minutes, the manifest synced with the newest line `minutes` ago, no probe."""

    def build(root: Path) -> Built:
        b = JobBuilder(root, f"rl-synced-{int(minutes)}", T0)
        end = run_steps(b, start_attempt(b, T0), range(1, 13), seconds=360.0)
        now = end + timedelta(minutes=minutes)
        return finish(b, root, now, synced_at=end)

    return build


def future_line(seconds: float) -> Build:
    """A healthy run plus one trainer line (no Iris prefix) dated `seconds` after `now`."""

    def build(root: Path) -> Built:
        b = JobBuilder(root, f"rl-future-{int(seconds)}", T0)
        end = run_steps(b, start_attempt(b, T0), range(1, 21))
        now = end + timedelta(seconds=60)
        b.iris_prefix = False
        b.log(now + timedelta(seconds=seconds), "Started: 'step'")
        return finish(b, root, now)

    return build


def starved(tokens_per_s: float) -> Build:
    """The corpus starvation with engines generating `tokens_per_s` while the trainer waits."""

    def build(root: Path) -> Built:
        b = JobBuilder(root, f"rl-starved-{int(tokens_per_s * 10)}", T0)

        def engine(builder: JobBuilder, moment: datetime) -> None:
            builder.vllm(moment, running=1, waiting=0, kv=0.4, gen=tokens_per_s)

        moment = run_steps(
            b,
            start_attempt(b, T0),
            range(1, 14),
            engines=engine,
            phase_seconds=lambda step: {"generate": 1500.0},
        )
        for i in range(8):
            b.raw(
                moment + timedelta(minutes=i),
                "Generation Buffer Progress:  75%|███████▌  | 24/32 "
                f"[{41 + i}:07<13:42, 102.80s/it]",
            )
            engine(b, moment + timedelta(minutes=i))
        return finish(b, root, moment + timedelta(minutes=8))

    return build


def _nan_on(steps: range) -> Metrics:
    return lambda s: healthy_metrics(s) | ({"policy/policy_loss": math.nan} if s in steps else {})


def _flat_reward(level: float) -> Metrics:
    return lambda s: healthy_metrics(s) | {"reward/avg_raw_reward": level}


def _reward_after(split: int, level: Callable[[int], float]) -> Metrics:
    return lambda s: healthy_metrics(s) | {"reward/avg_raw_reward": 0.6 if s <= split else level(s)}


def _entropy_after(split: int, level: Callable[[int], float]) -> Metrics:
    return lambda s: (
        healthy_metrics(s)
        | {
            "reward/avg_raw_reward": 0.30,
            "policy/policy_entropy": 1.0 if s <= split else level(s),
        }
    )


def _tokens_after(split: int, level: Callable[[int], float]) -> Metrics:
    return lambda s: (
        healthy_metrics(s) | {"generate/avg_num_tokens": 400.0 if s <= split else level(s)}
    )


def _buffer_wait(late: float) -> Metrics:
    return lambda s: (
        healthy_metrics(s) | {"timing/wait_for_generation_buffer": 1.0 if s <= 12 else late}
    )


def _loop(name: str, *failures: real.RealLine) -> Build:
    """Three failed attempts (logs only, job failed), attempt i dying on `failures[i]`."""
    return lambda root: real.loop(root, name, [[f.text] for f in failures])


def _engines_dead(name: str, dead: int, silent_min: float) -> Build:
    """Two engines; the first `dead` of them log their death line (vLLM's own words, behind the
    engine actor's prefix), then `silent_min` of silence."""
    texts = (real.ENGINE_DIED.text, real.ENGINE_DIED_DP1.text)
    deaths = [(i, texts[i]) for i in range(dead)]
    return lambda root: real.engine_death(root, name, engines=2, dead=deaths, silent_min=silent_min)


def _trainer_dead(name: str, silent_min: float) -> Build:
    return lambda root: real.trainer_death(
        root, name, text=real.FATAL_ABORT.text, silent_min=silent_min
    )


def _config_then(name: str, silent_min: float, *, step_after: bool = False) -> Build:
    return lambda root: real.config_then(root, name, silent_min=silent_min, step_after=step_after)


def _died_at_start(
    name: str, silent_min: float, *, death: bool = True, logs_on_min: int = 0
) -> Build:
    """The only attempt dying before its first step on a model path missing from the image
    (XrayGLM#89's FileNotFoundError), or (`death` False) still initialising without a death line;
    the driver logging on for `logs_on_min` after it; judged `silent_min` after the newest line,
    the controller running."""
    lines = [issue27.MODEL_FILE_MISSING.text] if death else []
    return lambda root: issue27.died_at_start(
        root, name, lines=lines, silent_min=silent_min, logs_on_min=logs_on_min
    )


def _provider(name: str, named_steps: int) -> Build:
    return lambda root: issue27.provider_on_most_trials(root, name, named_steps=named_steps)


def _agreement(name: str, window_reward: float) -> Build:
    return lambda root: issue27.collapse_with_trials(root, name, window_reward=window_reward)


# Three attempts dying at start-up: the trainer never stepped, so only liveness can judge.
LOOP = {"liveness": "FAIL", "resources": "ERROR", "rollouts": "ERROR", "dynamics": "ERROR"}


# --- the pairs ------------------------------------------------------------------------------------

# --- a Ray node's process table (docs/domain.md#processes-and-roles): ranks, driver, helpers --

NODE = (8455, 8456, 301, 302)  # two ranks, Ray's log monitor and dashboard agent
RAYLET = ("/opt/venv/lib/python3.12/site-packages/ray/core/src/ray/raylet/raylet", "native")
RANK_ROLE = (ray_node.RANK.args, "rank")


def _node_text(pid: int, n: int) -> str:
    """Ranks parked in all_reduce, helpers whose frames change between dumps, the driver in
    `ray.get`, and pid 8457 a rank computing (a straggler)."""
    helpers = {
        301: ray_node.LOG_MONITOR.dump(301, 520 + 11 * n),
        302: ray_node.AGENT.dump(302, 468 if n == 1 else 415),
        1: ray_node.DRIVER.dump(1, 290),
        8457: ray_node.RANK_COMPUTE.dump(8457, 100 + n),
    }
    return helpers.get(pid) or ray_node.RANK.dump(pid)


ERROR = "ERROR"
KILL = "KILL"
NO_KILL = "NO-KILL"

PAIRS: tuple[Pair, ...] = (
    Pair(
        "quiet_vs_stall_floor",
        "STALL_FLOOR_S (600 s): quiet 11 min vs 9 min, no stacks",
        side(quiet("rl-floor-11", 11), ERROR, liveness="ERROR"),
        side(quiet("rl-floor-9", 9), NO_KILL),
    ),
    Pair(
        "quiet_vs_stall_factor",
        "STALL_FACTOR (4 x p90 of the open phase, 200 s): quiet 14 min vs 12.5 min",
        side(quiet("rl-factor-14", 14, seconds=364.0), ERROR, liveness="ERROR"),
        side(quiet("rl-factor-12", 12.5, seconds=364.0), NO_KILL),
    ),
    Pair(
        "stall_stacks_quiet",
        "stall_stacks: parked dumps with quiet 11 min vs 9 min",
        side(quiet("rl-stacks-11", 11, dumps=True), KILL, liveness="FAIL"),
        side(quiet("rl-stacks-9", 9, dumps=True), NO_KILL),
    ),
    Pair(
        "stall_stacks_order",
        "stall_stacks: both dumps after the newest progress (1 min after vs 1 min before)",
        side(
            quiet("rl-order-after", 14, dumps=True, dump_at=lambda q, n: q + timedelta(minutes=1)),
            KILL,
            liveness="FAIL",
        ),
        side(
            quiet("rl-order-before", 14, dumps=True, dump_at=lambda q, n: q - timedelta(minutes=1)),
            ERROR,
            liveness="ERROR",
        ),
    ),
    Pair(
        "stall_stacks_age",
        "stall_stacks: MAX_EVIDENCE_AGE_S (900 s): dumps 14 min vs 16 min before now",
        side(
            quiet("rl-age-14", 50, dumps=True, dump_at=lambda q, n: n - timedelta(minutes=14)),
            KILL,
            liveness="FAIL",
        ),
        side(
            quiet("rl-age-16", 50, dumps=True, dump_at=lambda q, n: n - timedelta(minutes=16)),
            ERROR,
            liveness="ERROR",
        ),
    ),
    Pair(
        "stall_stacks_attempt",
        "stall_stacks: dumps of the current attempt's pod vs of the previous attempt's",
        side(previous_pod(current=True), KILL, liveness="FAIL"),
        side(previous_pod(current=False), ERROR, liveness="ERROR"),
    ),
    Pair(
        "stall_stacks_probe_failed",
        "stall_stacks: every py-spy probe succeeded vs one failed",
        side(quiet("rl-probes-ok", 50, dumps=True), KILL, liveness="FAIL"),
        side(quiet("rl-probes-failed", 50, dumps=True, failed=(8457,)), ERROR, liveness="ERROR"),
    ),
    Pair(
        "stall_stacks_helpers",
        "stall_stacks: ranks parked beside Ray helpers that change frames vs beside a rank at work",
        side(quiet("rl-helpers-busy", 50, text=_node_text, pids=NODE), KILL, liveness="FAIL"),
        side(
            quiet("rl-helpers-straggler", 50, text=_node_text, pids=(*NODE, 8457)),
            ERROR,
            liveness="ERROR",
        ),
    ),
    Pair(
        "stall_stacks_context_once",
        "stall_stacks: beside ranks parked in a collective, the driver dumped once vs a rank",
        side(quiet("rl-once-driver", 50, text=_node_text, once=(1,)), KILL, liveness="FAIL"),
        side(quiet("rl-once-rank", 50, text=_node_text, once=(8457,)), ERROR, liveness="ERROR"),
    ),
    Pair(
        "stall_stacks_failed_role",
        "stall_stacks: the failed py-spy dump is of a native process vs of a rank",
        side(
            quiet("rl-failed-native", 50, dumps=True, failed=(55,), roles={55: RAYLET}),
            KILL,
            liveness="FAIL",
        ),
        side(
            quiet("rl-failed-rank", 50, dumps=True, failed=(8457,), roles={8457: RANK_ROLE}),
            ERROR,
            liveness="ERROR",
        ),
    ),
    Pair(
        "stall_still_gap",
        "stall_still: MIN_STILL_GAP_S (5 s): identical dumps 6 s vs 4 s apart",
        side(
            quiet("rl-still-gap6", 50, text=crafted.STILL, idle_engines=True, gap_s=6.0),
            KILL,
            liveness="FAIL",
        ),
        side(
            quiet("rl-still-gap4", 50, text=crafted.STILL, idle_engines=True, gap_s=4.0),
            ERROR,
            liveness="ERROR",
        ),
    ),
    Pair(
        "stall_still_quiet",
        "stall_still: STILL_QUIET_FACTOR (2 x the 10 min limit): quiet 21 min vs 19 min",
        side(
            quiet("rl-still-21", 21, text=crafted.STILL, idle_engines=True), KILL, liveness="FAIL"
        ),
        side(
            quiet("rl-still-19", 19, text=crafted.STILL, idle_engines=True),
            ERROR,
            liveness="ERROR",
        ),
    ),
    Pair(
        "stall_still_engines",
        "stall_still: engines at 0 tok/s with nothing running vs engines busy",
        side(
            quiet("rl-still-idle", 50, text=crafted.STILL, idle_engines=True),
            KILL,
            liveness="FAIL",
        ),
        side(
            quiet("rl-still-busy", 50, text=crafted.STILL, engines_busy=True),
            ERROR,
            liveness="ERROR",
        ),
    ),
    Pair(
        "stall_still_silent_engines",
        "stall_still: every engine's last stat line (before the newest advancement, in its own Ray "
        "worker log) at 0 tok/s vs 1 tok/s, then silence",
        side(lambda r: eng.silent_stall(r, "rl-silent-0", last_gen=0.0), KILL, liveness="FAIL"),
        side(lambda r: eng.silent_stall(r, "rl-silent-1", last_gen=1.0), ERROR, liveness="ERROR"),
    ),
    Pair(
        "process_death_order",
        "process_death: the death line after the newest advancement vs before it",
        side(death(after_progress=True), KILL, liveness="FAIL"),
        side(death(after_progress=False), ERROR, liveness="ERROR"),
    ),
    Pair(
        "non_finite_persistence",
        "NON_FINITE_PERSIST_STEPS (3): NaN loss on the newest 3 steps vs 2",
        side(standard("rl-nan-3", metrics=_nan_on(range(18, 21))), KILL, dynamics="FAIL"),
        side(standard("rl-nan-2", metrics=_nan_on(range(19, 21))), ERROR, dynamics="ERROR"),
    ),
    Pair(
        "non_finite_newest",
        "non_finite: NaN through the newest step vs NaN then one finite step",
        side(standard("rl-nan-end", metrics=_nan_on(range(18, 21))), KILL, dynamics="FAIL"),
        side(standard("rl-nan-then-finite", metrics=_nan_on(range(17, 20))), NO_KILL),
    ),
    Pair(
        "min_window",
        "MIN_WINDOW_STEPS (10): a healthy run of 10 steps vs 9",
        side(standard("rl-window-10", n=10), NO_KILL),
        side(standard("rl-window-9", n=9), ERROR, dynamics="ERROR"),
    ),
    Pair(
        "zero_reward_window",
        "zero_reward: every reward 0 over 10 steps vs 9 (a window)",
        side(
            standard("rl-zero-10", n=10, metrics=with_(**{"reward/avg_raw_reward": 0.0})),
            KILL,
            dynamics="FAIL",
            rollouts="FAIL",
        ),
        side(
            standard("rl-zero-9", n=9, metrics=with_(**{"reward/avg_raw_reward": 0.0})),
            ERROR,
            dynamics="ERROR",
        ),
    ),
    Pair(
        "collapse_ratio",
        "COLLAPSE_RATIO (0.2): reward at 0.19 vs 0.21 of its best window for 15 steps",
        side(
            standard("rl-ratio-19", n=35, metrics=_reward_after(20, lambda s: 0.114)),
            KILL,
            dynamics="FAIL",
        ),
        side(standard("rl-ratio-21", n=35, metrics=_reward_after(20, lambda s: 0.126)), NO_KILL),
    ),
    Pair(
        "collapse_length",
        "reward_collapse: collapsed for 10 steps (the window) vs 9",
        side(
            standard("rl-collapse-10", n=30, metrics=_reward_after(20, lambda s: 0.03)),
            KILL,
            dynamics="FAIL",
        ),
        side(standard("rl-collapse-9", n=29, metrics=_reward_after(20, lambda s: 0.03)), NO_KILL),
    ),
    Pair(
        "collapse_recovery",
        "reward_collapse: flat under the line vs trending back to it within a window",
        side(
            standard("rl-collapse-flat", n=35, metrics=_reward_after(20, lambda s: 0.03)),
            KILL,
            dynamics="FAIL",
        ),
        side(
            standard(
                "rl-collapse-rising",
                n=35,
                metrics=_reward_after(20, lambda s: 0.03 + max(0, s - 25) * 0.0085),
            ),
            NO_KILL,
        ),
    ),
    Pair(
        "entropy_ratio",
        "ENTROPY_COLLAPSE_RATIO (0.05): entropy at 0.045 vs 0.055 of its early median",
        side(
            standard("rl-entropy-45", n=24, metrics=_entropy_after(12, lambda s: 0.045)),
            KILL,
            dynamics="FAIL",
        ),
        side(standard("rl-entropy-55", n=24, metrics=_entropy_after(12, lambda s: 0.055)), NO_KILL),
    ),
    Pair(
        "entropy_length",
        "entropy_collapse: under the line on all 10 window steps vs 9 of them",
        side(
            standard("rl-entropy-len10", n=24, metrics=_entropy_after(14, lambda s: 0.01)),
            KILL,
            dynamics="FAIL",
        ),
        side(
            standard("rl-entropy-len9", n=24, metrics=_entropy_after(15, lambda s: 0.01)), NO_KILL
        ),
    ),
    Pair(
        "entropy_recovery",
        "entropy_collapse: flat under the line vs trending back to it",
        side(
            standard("rl-entropy-flat", n=24, metrics=_entropy_after(8, lambda s: 0.004)),
            KILL,
            dynamics="FAIL",
        ),
        side(
            standard(
                "rl-entropy-rising",
                n=24,
                metrics=_entropy_after(8, lambda s: 0.004 + 0.0045 * max(0, s - 14)),
            ),
            NO_KILL,
        ),
    ),
    Pair(
        "tis_ratio_mean",
        "TIS_RATIO_MEAN_MIN (0.79): importance-ratio mean 0.78 vs 0.80 on every step",
        side(
            standard("rl-tis-78", metrics=with_(**{"policy/tis/imp_ratio_mean": 0.78})),
            KILL,
            dynamics="FAIL",
        ),
        side(standard("rl-tis-80", metrics=with_(**{"policy/tis/imp_ratio_mean": 0.80})), NO_KILL),
    ),
    Pair(
        "tis_log_ratio",
        "TIS_LOG_RATIO_ABS_MAX (0.1): mean |log ratio| 0.11 vs 0.09",
        side(
            standard("rl-logr-11", metrics=with_(**{"policy/tis/log_ratio_abs_mean": 0.11})),
            KILL,
            dynamics="FAIL",
        ),
        side(
            standard("rl-logr-09", metrics=with_(**{"policy/tis/log_ratio_abs_mean": 0.09})),
            NO_KILL,
        ),
    ),
    Pair(
        "tis_exact_match",
        "TIS_EXACT_MATCH_MIN (0.95): exact-match fraction 0.94 vs 0.96",
        side(
            standard("rl-exact-94", metrics=with_(**{"generate/tis/exact_match_fraction": 0.94})),
            KILL,
            dynamics="FAIL",
        ),
        side(
            standard("rl-exact-96", metrics=with_(**{"generate/tis/exact_match_fraction": 0.96})),
            NO_KILL,
        ),
    ),
    Pair(
        "tis_recovery",
        "off_policy: the ratio flat out of range vs climbing back into it",
        side(
            standard(
                "rl-tis-flat",
                n=24,
                metrics=after(14, {}, lambda s: {"policy/tis/imp_ratio_mean": 0.5}),
            ),
            KILL,
            dynamics="FAIL",
        ),
        side(
            standard(
                "rl-tis-rising",
                n=24,
                metrics=after(
                    14, {}, lambda s: {"policy/tis/imp_ratio_mean": 0.5 + 0.03 * (s - 15)}
                ),
            ),
            NO_KILL,
        ),
    ),
    Pair(
        "length_collapse_ratio",
        "COLLAPSE_RATIO for response length: 0.19 vs 0.21 of the earlier median, every step",
        side(
            standard("rl-len-19", n=24, metrics=_tokens_after(14, lambda s: 76.0)),
            KILL,
            rollouts="FAIL",
        ),
        side(standard("rl-len-21", n=24, metrics=_tokens_after(14, lambda s: 84.0)), NO_KILL),
    ),
    Pair(
        "phase_inflation",
        "PHASE_INFLATION (3): sync_weights last/first window median 3.3 vs 2.7",
        side(
            standard(
                "rl-sync-33",
                n=24,
                phase_seconds=lambda s: {"sync_weights": 4.8 if s <= 12 else 15.84},
            ),
            NO_KILL,
            dynamics="FAIL",
        ),
        side(
            standard(
                "rl-sync-27",
                n=24,
                phase_seconds=lambda s: {"sync_weights": 4.8 if s <= 12 else 12.96},
            ),
            NO_KILL,
        ),
    ),
    Pair(
        "buffer_wait_share",
        "BUFFER_WAIT_SHARE (0.05): an inflated buffer wait at 0.06 vs 0.04 of the step",
        side(standard("rl-wait-6", n=24, metrics=_buffer_wait(7.2)), NO_KILL, dynamics="FAIL"),
        side(standard("rl-wait-4", n=24, metrics=_buffer_wait(4.8)), NO_KILL),
    ),
    Pair(
        "signature_specific",
        "crash_loop: one specific signature on every attempt vs only `exit code 1`",
        side(
            crash_loop,
            KILL,
            liveness="FAIL",
            resources="FAIL",
            rollouts="ERROR",
            dynamics="ERROR",
        ),
        side(crafted.generic_exit_codes, NO_KILL, liveness="FAIL"),
    ),
    Pair(
        "signature_normalised",
        "crash_loop: one NCCL failure from two reports (other path, line, version, rank) on "
        "every attempt vs another NCCL message under the same exception type on one of them",
        side(
            _loop(
                "rl-sig-same", real.NCCL_UNHANDLED, real.NCCL_UNHANDLED_VERL, real.NCCL_UNHANDLED
            ),
            KILL,
            **LOOP,
        ),
        side(
            _loop("rl-sig-other", real.NCCL_UNHANDLED, real.NCCL_INVALID, real.NCCL_UNHANDLED),
            ERROR,
            **LOOP,
        ),
    ),
    Pair(
        "signature_failure_class",
        "crash_loop: the attempt's failure is hard or configuration class: NCCL's unhandled CUDA "
        "error (hard) vs its remote-process-exited error (transient) on every attempt",
        side(_loop("rl-class-hard", *(real.NCCL_UNHANDLED,) * 3), KILL, **LOOP),
        side(_loop("rl-class-transient", *(real.NCCL_REMOTE_EXITED,) * 3), ERROR, **LOOP),
    ),
    Pair(
        "signature_generic_entry",
        "crash_loop: a specific failure on every attempt vs only torchrun's ChildFailedError (a "
        "generic catalogue entry: a wrapper, never a signature, though it names an exception)",
        side(_loop("rl-generic-specific", *(real.NCCL_UNHANDLED,) * 3), KILL, **LOOP),
        side(_loop("rl-generic-child", *(real.CHILD_FAILED,) * 3), ERROR, **LOOP),
    ),
    Pair(
        "logged_death_silence",
        "logged_death: every engine's death line, then silence 11 min vs 9 min (the 10 min limit)",
        side(_engines_dead("rl-engines-11", 2, 11), KILL, liveness="FAIL"),
        side(_engines_dead("rl-engines-9", 2, 9), ERROR, liveness="ERROR"),
    ),
    Pair(
        "logged_death_engines",
        "logged_death: a death line of every engine (2 of 2) vs of some engines (1 of 2), then "
        "3 h of silence",
        side(_engines_dead("rl-engines-all", 2, 180), KILL, liveness="FAIL"),
        side(_engines_dead("rl-engines-some", 1, 180), ERROR, liveness="ERROR"),
    ),
    Pair(
        "logged_death_trainer",
        "logged_death: the trainer's abort (`terminate called after throwing`), then silence "
        "11 min vs 9 min",
        side(_trainer_dead("rl-abort-11", 11), KILL, liveness="FAIL"),
        side(_trainer_dead("rl-abort-9", 9), ERROR, liveness="ERROR"),
    ),
    Pair(
        "logged_death_worker_logs",
        "logged_death: engines seen only in their own Ray worker logs, a fatal line in each (2 of "
        "2) vs in one (1 of 2), then 11 min of silence",
        side(
            lambda r: eng.death(r, "rl-ray-all", engines=2, dead=2, silent_min=11),
            KILL,
            liveness="FAIL",
        ),
        side(
            lambda r: eng.death(r, "rl-ray-one", engines=2, dead=1, silent_min=11),
            ERROR,
            liveness="ERROR",
        ),
    ),
    Pair(
        "logged_death_worker_silence",
        "logged_death: every engine's fatal line in its own Ray worker log, then silence 11 min "
        "vs 9 min",
        side(
            lambda r: eng.death(r, "rl-ray-11", engines=2, dead=2, silent_min=11),
            KILL,
            liveness="FAIL",
        ),
        side(
            lambda r: eng.death(r, "rl-ray-9", engines=2, dead=2, silent_min=9),
            ERROR,
            liveness="ERROR",
        ),
    ),
    Pair(
        "config_failure_every_attempt",
        "config_failure: a key not in the struct config ends every attempt (3 of 3) vs the "
        "newest attempt dying of something else",
        side(_loop("rl-config-all", *(real.KEY_NOT_IN_STRUCT,) * 3), KILL, **LOOP),
        side(
            _loop(
                "rl-config-two",
                real.KEY_NOT_IN_STRUCT,
                real.KEY_NOT_IN_STRUCT,
                real.ATTRIBUTE_ERROR,
            ),
            ERROR,
            **LOOP,
        ),
    ),
    Pair(
        "config_failure_silence",
        "config_failure: a running attempt's configuration failure, then silence 11 min vs 9 min",
        side(_config_then("rl-config-11", 11), KILL, liveness="FAIL"),
        side(_config_then("rl-config-9", 9), NO_KILL),
    ),
    Pair(
        "config_failure_ends_attempt",
        "config_failure: the configuration failure ended the attempt (11 min of silence) vs the "
        "trainer went on and finished the step",
        side(_config_then("rl-config-ended", 11), KILL, liveness="FAIL"),
        side(_config_then("rl-config-caught", 11, step_after=True), NO_KILL),
    ),
    Pair(
        "oom_progress_after",
        "cuda_fatal: an OOM then 11 min of silence vs an OOM then a finished step",
        side(oom(11), KILL, liveness="ERROR", resources="FAIL"),
        side(oom(1, step_after=True), NO_KILL, resources="FAIL"),
    ),
    Pair(
        "oom_fresh",
        "cuda_fatal: STALL_FLOOR_S after an OOM with nothing after it: 11 min vs 9 min",
        side(oom(11), KILL, liveness="ERROR", resources="FAIL"),
        side(oom(9), ERROR, resources="ERROR"),
    ),
    Pair(
        "engine_wedged_logged",
        "engine_wedged: STALL_FLOOR_S (600 s): one engine of two logs Waiting 23, Running 0, "
        "0 tok/s every minute for 11 min vs 9 min",
        side(
            lambda r: eng.wedged(r, "rl-wedge-11", engines=2, wedged=1, wedge_min=11),
            NO_KILL,
            resources="FAIL",
        ),
        side(lambda r: eng.wedged(r, "rl-wedge-9", engines=2, wedged=1, wedge_min=9), NO_KILL),
    ),
    Pair(
        "engine_wedged_silent",
        "engine_wedged: STALL_FLOOR_S (600 s): one engine's last line Waiting 23, Running 0, "
        "0 tok/s, then no line for 11 min vs 9 min while the other engine logs",
        side(
            lambda r: eng.wedged(r, "rl-wsil-11", engines=2, wedged=1, wedge_min=11, logged=False),
            NO_KILL,
            resources="FAIL",
        ),
        side(
            lambda r: eng.wedged(r, "rl-wsil-9", engines=2, wedged=1, wedge_min=9, logged=False),
            NO_KILL,
        ),
    ),
    Pair(
        "engines_wedged_trainer",
        "every engine wedged: nothing advanced since (ERROR: a stall needs live stacks) vs the "
        "trainer still stepping (capacity lost)",
        side(
            lambda r: eng.wedged(
                r, "rl-wall-stop", engines=2, wedged=2, wedge_min=11, trainer_stops=True
            ),
            ERROR,
            liveness="ERROR",
            resources="ERROR",
        ),
        side(
            lambda r: eng.wedged(r, "rl-wall-go", engines=2, wedged=2, wedge_min=11),
            NO_KILL,
            resources="FAIL",
        ),
    ),
    Pair(
        "engine_start_failures",
        "ENGINE_START_FAILURES (3): one engine's own log shows 3 vs 2 failed starts",
        side(lambda r: eng.restart_loop(r, "rl-starts-3", failures=3), NO_KILL, resources="FAIL"),
        side(lambda r: eng.restart_loop(r, "rl-starts-2", failures=2), NO_KILL),
    ),
    Pair(
        "one_turn",
        "ONE_TURN_MEDIAN (1.5): median turns 1 vs 2",
        side(agentic("rl-turns-1", turns=1), KILL, agentic="y", rollouts="FAIL"),
        side(agentic("rl-turns-2", turns=2), NO_KILL, agentic="y"),
    ),
    Pair(
        "same_cause_share",
        "SAME_CAUSE_SHARE (0.9): 46 of 50 trials (92%) vs 44 (88%) fail with one sandbox cause",
        side(agentic("rl-cause-92", failing=46), NO_KILL, agentic="y", rollouts="FAIL"),
        side(agentic("rl-cause-88", failing=44), NO_KILL, agentic="y"),
    ),
    Pair(
        "systemic_trainer_names",
        "systemic_trials: 56 of 60 trials refused by the sandbox provider, the trainer's reward "
        "positive; its batch lines name DaytonaValidationError on each of its newest 10 vs on 9 "
        "of them",
        side(_provider("rl-named-10", 10), KILL, agentic="y", rollouts="FAIL"),
        side(_provider("rl-named-9", 9), NO_KILL, agentic="y", rollouts="FAIL"),
    ),
    Pair(
        "config_death_initialising",
        "config_failure: the only attempt died before its first step on a file missing from the "
        "image, then 12 min of silence vs the same attempt without the death line (initialising)",
        side(_died_at_start("rl-start-died", 12), KILL, liveness="FAIL"),
        side(_died_at_start("rl-start-init", 12, death=False), NO_KILL),
    ),
    Pair(
        "config_death_pending",
        "config_death_pending: a death before the first step, then silence 11 min vs 9 min (the "
        "10 min limit): KILL, else ERROR — never the initialisation PASS",
        side(_died_at_start("rl-start-11", 11), KILL, liveness="FAIL"),
        side(_died_at_start("rl-start-9", 9), ERROR, liveness="ERROR"),
    ),
    Pair(
        "config_death_silence",
        "config_failure: after a death before the first step the log is silent 12 min vs goes "
        "on for 11 min (the driver still starting up), then 1 min: the silence is the log's",
        side(_died_at_start("rl-start-silent", 12), KILL, liveness="FAIL"),
        side(_died_at_start("rl-start-logs-on", 1, logs_on_min=11), ERROR, liveness="ERROR"),
    ),
    Pair(
        "trial_agreement_rewards",
        "trainer-trial agreement: the trainer's reward collapsed; the trials over its newest 10 "
        "steps earn 0.09 vs 0.11 (COLLAPSE_RATIO 0.2 of the best trial window's 0.5)",
        side(_agreement("rl-agree-09", 0.09), KILL, agentic="y", dynamics="FAIL"),
        side(_agreement("rl-agree-11", 0.11), ERROR, agentic="y", dynamics="FAIL"),
    ),
    Pair(
        "init_grace",
        "INIT_GRACE_S (2700 s): no step 46 min vs 44 min after the attempt began",
        side(
            initializing(46),
            ERROR,
            liveness="ERROR",
            resources="PASS",
            rollouts="ERROR",
            dynamics="ERROR",
        ),
        side(initializing(44), NO_KILL),
    ),
    Pair(
        "evidence_age",
        "MAX_EVIDENCE_AGE_S (900 s): manifest and newest line 16 min vs 14 min old, no probe",
        side(synced(16), ERROR, liveness="ERROR"),
        side(synced(14), NO_KILL),
    ),
    Pair(
        "clock_tolerance",
        "CLOCK_TOLERANCE_S (60 s): a trainer line dated 70 s vs 50 s after now",
        side(future_line(70), ERROR, liveness="ERROR"),
        side(future_line(50), NO_KILL),
    ),
    Pair(
        "starved_tokens",
        "STARVED_TOKENS_PER_S (10): quiet engines at 9.5 vs 10.5 tok/s while the trainer waits",
        side(starved(9.5), NO_KILL, resources="FAIL"),
        side(starved(10.5), NO_KILL),
    ),
    Pair(
        "in_log_crash_loop",
        "crash_loop on in-log restarts (a death, then Ray starting and a new driver pid resuming; "
        "no Iris setup line, no attempt history): the third attempt dies of the same OOM at step "
        "6 vs trains past the earlier peak to step 12",
        side(
            lambda root: in_log.crash_loop(root, "rl-inlog-loop", last_recovers=False),
            KILL,
            resources="FAIL",
            dynamics="ERROR",
        ),
        side(
            lambda root: in_log.crash_loop(root, "rl-inlog-ok", last_recovers=True),
            NO_KILL,
            resources="FAIL",
        ),
    ),
    Pair(
        "replayed_line",
        "replayed lines (REPLAY_TOLERANCE_S 60 s over the usual lag): after 40 min of silence, a "
        "`Finished: 'step'` written 61 s vs 59 s before it was collected",
        side(
            lambda root: in_log.replayed_step(root, "rl-late-61", late_s=61),
            ERROR,
            liveness="ERROR",
        ),
        side(lambda root: in_log.replayed_step(root, "rl-late-59", late_s=59), NO_KILL),
    ),
)
