"""Bundles crafted the way an adversarial reviewer would: each one a variation of a corpus scenario
that exercises one rule of "what established means" (docs/domain.md#what-established-means)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from tests.scenarios.builder import JobBuilder, iso
from tests.scenarios.catalog import (
    PARKED,
    STANDARD_ARGV,
    T0,
    Built,
    attempts,
    controller,
    finish,
    healthy_metrics,
    run_steps,
    start_attempt,
    with_metrics,
)

QUIET_MIN = 50  # minutes of silence in the stall bundles (the limit there is STALL_FLOOR_S, 10 min)

STILL = """Process {pid}: python -m skyrl_train.entrypoints.main_base
Python v3.11.7 (/usr/bin/python3.11)

Thread {pid} (active): "MainThread"
    _poll_results (skyrl_train/generators/async_collector.py:212)
    run_loop (skyrl_train/fully_async_trainer.py:412)
    train (skyrl_train/trainer.py:1121)
"""

MOVING = """Process {pid}: python -m skyrl_train.entrypoints.main_base
Python v3.11.7 (/usr/bin/python3.11)

Thread {pid} (active): "MainThread"
    forward (torch/nn/modules/linear.py:{line})
    train (skyrl_train/trainer.py:1121)
"""


def dumps(
    b: JobBuilder,
    first: datetime,
    *,
    pids: tuple[int, ...] = (8455, 8456),
    target: str | None = None,
    gap_s: float = 6.0,
    text: str | Callable[[int, int], str] = PARKED,
    failed: tuple[int, ...] = (),
    captured_at: datetime | None = None,
    once: tuple[int, ...] = (),
    roles: dict[int, tuple[str, str]] | None = None,
) -> None:
    """Two py-spy dumps of each pid, `gap_s` apart, recorded in probes.json; `failed` pids get a
    py-spy command that exited 1 and no output; `once` pids are dumped only the first time;
    `roles` ({pid: (args, role)}) are written to processes.json as a live backend records them."""
    name = target or f"{b.name}-0"
    commands: list[dict[str, Any]] = []
    for n, moment in ((1, first), (2, first + timedelta(seconds=gap_s))):
        for pid in (*pids, *failed, *(once if n == 1 else ())):
            argv = ["iris", "task", "exec", f"{b.job_id}/0", "--", "py-spy", "dump", "--pid"]
            out = f"stacks/{name}-pid{pid}-{n}.txt"
            ok = pid not in failed
            if ok:
                body = text(pid, n) if callable(text) else text.format(pid=pid)
                b.probe(out, body)
            commands.append(
                {
                    "argv": [*argv, str(pid)],
                    "started_at": iso(moment),
                    "exit_code": 0 if ok else 1,
                    "output": out if ok else None,
                }
            )
    header = {
        "captured_at": iso(captured_at or first),
        "backend": "iris",
        "job_id": b.job_id,
        "commands": commands,
    }
    b.probe("probes.json", header)
    if roles:
        records = [
            {"target": name, "pid": pid, "ppid": 1, "args": args, "role": role, "why": "crafted"}
            for pid, (args, role) in roles.items()
        ]
        b.probe("processes.json", records)


def quiet_run(
    b: JobBuilder,
    *,
    idle_engines: bool = False,
    engines_busy: bool = False,
    quiet_min: float = QUIET_MIN,
) -> datetime:
    """Twelve steps, then the next step's phases up to `policy_train`, then silence; returns when
    the silence began. Engines log 0 tok/s with nothing running (idle) or stay busy."""
    start = start_attempt(b, T0)
    return quiet_run_from(b, start, range(1, 13), idle_engines, engines_busy, quiet_min)


def quiet_run_from(
    b: JobBuilder,
    start: datetime,
    steps: range,
    idle_engines: bool = False,
    engines_busy: bool = False,
    quiet_min: float = QUIET_MIN,
) -> datetime:
    """`steps` from `start`, then the next step's phases up to `policy_train`, then silence
    (engine lines every two minutes of it, none after `quiet_min`; idle, every engine that
    generated before logs 0 tok/s, as vLLM does after its last interval with tokens)."""
    end = run_steps(b, start, steps)
    b.log(end, "Started: 'step'")
    for phase in ("generate", "postprocess_generator_output", "fwd_logprobs_values_reward"):
        b.log(end, f"Started: '{phase}'")
        b.log(end + timedelta(seconds=20), f"Finished: '{phase}', time cost: 20.00s")
        end += timedelta(seconds=20)
    b.log(end, "Started: 'train_critic_and_policy'")
    b.log(end, "Started: 'policy_train'")
    for i in range(1, int(quiet_min // 2)):
        moment = end + timedelta(minutes=2 * i)
        for engine in range(2) if idle_engines else ():  # both engines of `saturated`
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
        if engines_busy:
            b.vllm(moment, running=56, waiting=4, kv=52.0, gen=2300.0)
    return end


def stall(
    root: Path,
    name: str,
    *,
    dump_at: Callable[[datetime, datetime], datetime] = lambda quiet, now: (
        now - timedelta(minutes=1)
    ),
    idle_engines: bool = False,
    engines_busy: bool = False,
    quiet_min: float = QUIET_MIN,
    **dump_args: Any,
) -> Built:
    """The corpus stall: quiet `quiet_min` minutes, controller running, two dumps of each rank."""
    b = JobBuilder(root, name, T0)
    quiet_since = quiet_run(
        b, idle_engines=idle_engines, engines_busy=engines_busy, quiet_min=quiet_min
    )
    now = quiet_since + timedelta(minutes=quiet_min)
    controller(b, "running")
    dumps(b, dump_at(quiet_since, now), **dump_args)
    return finish(b, root, now, probes=True)


# --- item 1: stale stacks ------------------------------------------------------------------------


def stacks_days_old(root: Path) -> Built:
    return stall(root, "rl-stale-days", dump_at=lambda q, now: now - timedelta(days=3))


def stacks_before_next_step(root: Path) -> Built:
    """Dumps parked in all_reduce, then the job logged its next step, then fell quiet."""
    b = JobBuilder(root, "rl-stale-order", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 13))
    dumps(b, end - timedelta(minutes=3))
    end = run_steps(b, end, range(13, 14))
    b.log(end, "Started: 'step'")
    b.log(end, "Started: 'generate'")
    controller(b, "running")
    return finish(b, root, end + timedelta(minutes=QUIET_MIN), probes=True)


def stacks_of_previous_attempt(root: Path) -> Built:
    """Attempt 0 failed; dumps of attempt 0's pod while attempt 1 is quiet."""
    b = JobBuilder(root, "rl-stale-pod", T0)
    first_end = run_steps(b, start_attempt(b, T0), range(1, 6))
    second = first_end + timedelta(minutes=5)
    quiet_since = run_steps(b, start_attempt(b, second, resume=5), range(6, 13))
    b.log(quiet_since, "Started: 'step'")
    b.log(quiet_since, "Started: 'generate'")
    now = quiet_since + timedelta(minutes=QUIET_MIN)
    controller(b, "running", failures=1)
    oom = "torch.OutOfMemoryError: CUDA out of memory"
    attempts(b, [("failed", 1, oom, T0, first_end), ("running", None, "", second, None)])
    dumps(b, now - timedelta(minutes=1), target=f"iris-ops-{b.name}-0-0")
    return finish(b, root, now, probes=True)


# --- item 2: generic signatures ------------------------------------------------------------------


def generic_exit_codes(root: Path, *, error: str = "Exit code: 1") -> Built:
    """Three attempts that died at different steps with nothing but a generic error."""
    b = JobBuilder(root, "rl-generic-exit", T0)
    rows = []
    moment = T0
    for attempt, steps in enumerate((3, 7, 11)):
        start = moment
        moment = run_steps(b, start_attempt(b, moment, resume=None if attempt == 0 else 0),
                           range(1, steps))  # fmt: skip
        moment += timedelta(minutes=1)
        rows.append(("failed", 1, error, start, moment))
        moment += timedelta(minutes=2)
    controller(b, "failed", failures=3, error=error)
    attempts(b, rows)
    return finish(b, root, moment + timedelta(minutes=5), probes=True, state="failed")


def slurm_bare_failed(root: Path) -> Built:
    return generic_exit_codes(root, error="FAILED")


# --- items 3-5: dynamics -------------------------------------------------------------------------


def _run(root: Path, name: str, metrics: Callable[[int], dict[str, float]], n: int = 25) -> Built:
    b = JobBuilder(root, name, T0)
    end = run_steps(b, start_attempt(b, T0), range(1, n + 1), metrics)
    return finish(b, root, end + timedelta(seconds=60))


def one_inf_spike(root: Path) -> Built:
    """One inf grad norm at step 20, finite steps after it."""
    spike = float("inf")
    return _run(
        root,
        "rl-inf-spike",
        lambda s: healthy_metrics(s) | ({"policy/raw_grad_norm": spike} if s == 20 else {}),
    )


def short_entropy_collapse(root: Path) -> Built:
    """Entropy collapsed on the newest 6 steps only: the median of a 10-step window drags."""
    return _run(
        root,
        "rl-entropy-short",
        lambda s: (
            with_metrics(**{"reward/avg_raw_reward": 0.30})(s)
            | {"policy/policy_entropy": 1.0 if s <= 19 else 0.01}
        ),
    )


def entropy_recovering(root: Path) -> Built:
    """Entropy collapsed for 12 steps, the newest ones climbing back toward the line."""

    def metrics(step: int) -> dict[str, float]:
        entropy = 1.0 if step <= 8 else 0.004 + 0.0045 * max(0, step - 14)
        return healthy_metrics(step) | {
            "reward/avg_raw_reward": 0.30,
            "policy/policy_entropy": entropy,
        }

    return _run(root, "rl-entropy-recovering", metrics, n=24)


def tis_recovering(root: Path) -> Built:
    """The importance ratio out of range on every window step but climbing back into range."""

    def metrics(step: int) -> dict[str, float]:
        ratio = 0.5 if step <= 15 else 0.5 + 0.03 * (step - 15)  # 0.77 at step 24, < 0.79
        return healthy_metrics(step) | {"policy/tis/imp_ratio_mean": ratio}

    return _run(root, "rl-tis-recovering", metrics, n=24)


def length_recovering(root: Path) -> Built:
    """Response length collapsed then climbing back, every window step still under the line."""

    def metrics(step: int) -> dict[str, float]:
        tokens = 410.0 if step <= 14 else 5.0 + 8.0 * (step - 14)
        return healthy_metrics(step) | {"generate/avg_num_tokens": tokens}

    return _run(root, "rl-length-recovering", metrics, n=24)


# --- item 6: OOM ---------------------------------------------------------------------------------


def fresh_oom(root: Path) -> Built:
    """A CUDA OOM logged 30 s before the capture; nothing could have followed it yet."""
    b = JobBuilder(root, "rl-fresh-oom", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 13))
    b.log(end, "Started: 'step'")
    b.log(end, "Started: 'train_critic_and_policy'")
    b.traceback(
        end + timedelta(seconds=30),
        ["skyrl_train/workers/fsdp/fsdp_worker.py"],
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    )
    return finish(b, root, end + timedelta(seconds=60))


def vllm_oom_in_policy_phase(root: Path) -> Built:
    """A vLLM engine's OOM logged while the trainer's policy_train phase is open (colocated)."""
    b = JobBuilder(root, "rl-vllm-oom", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 13))
    b.log(end, "Started: 'step'")
    b.log(end, "Started: 'policy_train'")
    moment = end + timedelta(seconds=20)
    b.raw(
        moment,
        f"(AsyncVLLMInferenceEngine pid=287294, ip=10.128.26.194) ERROR {moment:%m-%d %H:%M:%S} "
        "[core.py:586] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB",
    )
    return finish(b, root, end + timedelta(minutes=1))


# --- item 7: time -------------------------------------------------------------------------------


def future_dated_line(root: Path, *, iris_prefix: bool = True) -> Built:
    """The corpus stall plus one trainer line whose own time is two hours after `now`."""
    b = JobBuilder(root, "rl-future-line" + ("" if iris_prefix else "-bare"), T0)
    b.iris_prefix = iris_prefix
    quiet_since = quiet_run(b)
    now = quiet_since + timedelta(minutes=QUIET_MIN)
    bogus = now + timedelta(hours=2)
    stamp = f"{bogus:%Y-%m-%d %H:%M:%S}.000"
    text = f"(skyrl_entrypoint pid=8455) {stamp} | INFO     | skyrl_train.trainer:train:210 - "
    text += "Finished: 'fwd_logprobs_values_reward', time cost: 20.00s"
    if iris_prefix:
        text = f"[{quiet_since:%H:%M:%S}] task={b.job_id}/0 | {text}"
    b.lines.append(text)
    controller(b, "running")
    dumps(b, now - timedelta(minutes=1))
    return finish(b, root, now, probes=True)


def trainer_local_time(root: Path, *, ahead_h: float = 2.0) -> Built:
    """The corpus stall, with the trainer's loguru clock `ahead_h` hours ahead of UTC."""
    b = JobBuilder(root, "rl-local-time", T0)
    original = b.log

    def shifted(moment: datetime, message: str, **kwargs: Any) -> None:
        stamp = moment + timedelta(hours=ahead_h)
        b.iris_prefix = False
        original(stamp, message, **kwargs)
        b.iris_prefix = True
        b.lines[-1] = f"[{moment:%H:%M:%S}] task={b.job_id}/0 | {b.lines[-1]}"

    b.log = shifted  # type: ignore[method-assign]
    quiet_since = quiet_run(b)
    now = quiet_since + timedelta(minutes=QUIET_MIN)
    controller(b, "running")
    dumps(b, now - timedelta(minutes=1))
    return finish(b, root, now, probes=True)


def now_before_evidence(root: Path) -> Built:
    """The corpus stall judged at a `now` seventy minutes before its newest lines."""
    built = stall(root, "rl-now-early")
    return Built(built.job_dir, built.probes, built.now - timedelta(minutes=QUIET_MIN + 70))


# --- item 9: failed probes and disagreements -----------------------------------------------------


def stall_with_failed_probe(root: Path) -> Built:
    """The corpus stall, but the py-spy dump of a third rank failed (exit 1)."""
    return stall(root, "rl-probe-failed", failed=(8457,))


def manifest_names_another_job(root: Path) -> Built:
    """A healthy run whose manifest names another job than its directory."""
    b = JobBuilder(root, "rl-identity", T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 21))
    built = finish(b, root, end + timedelta(seconds=60))
    path = built.job_dir / "manifest.json"
    data = json.loads(path.read_text())
    data["job_id"] = data["job"]["job_id"] = "/ops/rl-some-other-job"
    path.write_text(json.dumps(data))
    return built


# --- item 10: a stall outside collectives --------------------------------------------------------


def still_stall(root: Path, *, idle_engines: bool = True, engines_busy: bool = False) -> Built:
    """Every trainer process identical outside any collective, engines idle, no trial."""
    return stall(
        root,
        "rl-still" + ("-idle" if idle_engines else "") + ("-busy" if engines_busy else ""),
        text=STILL,
        idle_engines=idle_engines,
        engines_busy=engines_busy,
    )


def moving_stall(root: Path) -> Built:
    """Identical outside collectives for one rank, the other moving between dumps."""
    return stall(
        root,
        "rl-moving",
        text=lambda pid, n: MOVING.format(pid=pid, line=100 + n * (pid % 2)),
        idle_engines=True,
    )


__all__ = [
    "STANDARD_ARGV",
    "dumps",
    "entropy_recovering",
    "fresh_oom",
    "future_dated_line",
    "generic_exit_codes",
    "length_recovering",
    "manifest_names_another_job",
    "moving_stall",
    "now_before_evidence",
    "one_inf_spike",
    "quiet_run",
    "quiet_run_from",
    "short_entropy_collapse",
    "slurm_bare_failed",
    "stacks_before_next_step",
    "stacks_days_old",
    "stacks_of_previous_attempt",
    "stall",
    "stall_with_failed_probe",
    "still_stall",
    "tis_recovering",
    "trainer_local_time",
    "vllm_oom_in_policy_phase",
]
