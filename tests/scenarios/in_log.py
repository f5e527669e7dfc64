"""Bundles of issue 27 (findings 6 and 7): restarts the log shows without Iris's setup lines, and a
chunk the log shipper sent again.

A restart is written as SkyRL under Ray writes one: Ray's start-up line of the launcher, then the
driver (`skyrl_entrypoint`, a new pid each attempt) loading its checkpoint and resuming; the
attempt ends with PyTorch's OOM traceback and the driver's `Train loop failed`. The start-up lines
are the verbatim ones of `tests/fixtures/start_lines.toml`, the OOM line pytorch/pytorch#16417's
(`tests/fixtures/real_failures/cuda.toml`). No attempt history is captured: the manifest says
running, as it does while a process supervisor inside the pod restarts the trainer.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from tests.log_lines import start_line
from tests.scenarios.builder import JobBuilder
from tests.scenarios.catalog import T0, Built, finish, run_steps

OOM = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a "
    "total capacity of 23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this "
    "process has 23.60 GiB memory in use. Of the allocated memory 22.90 GiB is allocated by "
    "PyTorch, and 194.87 MiB is reserved by PyTorch but unallocated."
)
DRIVER_PID = 8455


def start(b: JobBuilder, moment: datetime, attempt: int, resume: int | None) -> datetime:
    """Ray's start-up line, then the driver (a new pid each attempt) starting from scratch or
    resuming from `resume`; returns when its first step begins."""
    b.trainer = f"(skyrl_entrypoint pid={DRIVER_PID + 1000 * attempt})"
    b.raw(moment, start_line("ray_local"))
    moment += timedelta(seconds=20)
    if resume is None:
        b.log(moment, start_line("scratch"))
    else:
        b.log(moment, f"Loading checkpoint from: s3://bucket/ckpt/{b.name}/global_step_{resume}")
        b.log(moment, f"Resuming from global_step: {resume}")
    return moment + timedelta(seconds=70)


def die_of_oom(b: JobBuilder, moment: datetime) -> datetime:
    """The next step opens, the policy OOMs in `train_critic_and_policy`, the driver's train loop
    fails; returns a minute after."""
    b.log(moment, "Started: 'step'")
    b.log(moment, "Started: 'train_critic_and_policy'")
    b.traceback(moment + timedelta(seconds=30), ["skyrl_train/workers/fsdp/fsdp_worker.py"], OOM)
    b.log(moment + timedelta(seconds=31), "Train loop failed", level="ERROR")
    return moment + timedelta(minutes=1)


def crash_loop(root: Path, name: str, *, last_recovers: bool) -> Built:
    """Steps 1-5, then an OOM in step 6; two restarts resume from the step 4 checkpoint, finish
    step 5 again and die of the same OOM in step 6, or the last one trains on to step 12. Read as
    one attempt, each restart's step 5 was progress after the OOM before it (issue 27)."""
    b = JobBuilder(root, name, T0)
    moment = die_of_oom(b, run_steps(b, start(b, T0, 0, None), range(1, 6)))
    for attempt in (1, 2):
        resumed = start(b, moment + timedelta(minutes=2), attempt, 4)
        if attempt == 2 and last_recovers:
            end = run_steps(b, resumed, range(5, 13))
            return finish(b, root, end + timedelta(minutes=1))
        moment = die_of_oom(b, run_steps(b, resumed, range(5, 6)))
    return finish(b, root, moment + timedelta(minutes=5))


def oom_then_recovery(root: Path) -> Built:
    """Steps 1-8, an OOM in step 9; one restart resumes from step 8 and trains steps 9-12."""
    b = JobBuilder(root, "rl-gsm8k-oom-once", T0)
    moment = die_of_oom(b, run_steps(b, start(b, T0, 0, None), range(1, 9)))
    end = run_steps(b, start(b, moment + timedelta(minutes=2), 1, 8), range(9, 13))
    return finish(b, root, end + timedelta(minutes=1))


def replayed_step(root: Path, name: str, *, late_s: float | None) -> Built:
    """Twelve steps, then forty minutes of silence; a minute before `now` the log shipper sends
    a chunk: step 12's last lines again, as they were written (`late_s` None), or one
    `Finished: 'step'` line written `late_s` seconds before it was collected."""
    b = JobBuilder(root, name, T0)
    end = run_steps(b, start(b, T0, 0, None), range(1, 13))
    collected = end + timedelta(minutes=40)
    if late_s is None:
        for text in b.lines[-3:]:  # `Finished: 'step'`, the policy dict, the mirror record
            b.raw(collected, text.split(" | ", 1)[1])
    else:
        written = collected - timedelta(seconds=late_s)
        b.log(collected, "Finished: 'step', time cost: 120.00s", written=written)
    return finish(b, root, collected + timedelta(minutes=1))
