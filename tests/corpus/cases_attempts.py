"""Attempts seen only in the log, log chunks the shipper sent twice, and the real Iris captures.

A restart inside the log (no Iris `[iris setup]` line) is a shutdown, a new driver pid, Ray started
again and a resume line (docs/domain.md#attempts); steps after it belong to the new attempt. A log
shipper that re-sends a chunk gives lines whose own time is older than their Iris prefix time:
such a line is never fresh progress. The two `iris_localcluster_*` cases are the real output of
marin-iris 0.2.20 against a LocalCluster (tests/corpus/real/SOURCES.txt).
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.corpus.cases_stalls import ARGV
from tests.corpus.kit import T0, Labelled, RayJob, noisy_steps, standard_finish
from tests.scenarios.builder import iso
from tests.scenarios.catalog import Built, run_steps

REAL = Path(__file__).parent / "real"
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 has a total "
    "capacity of 79.11 GiB of which 3.12 GiB is free. Including non-PyTorch memory, this process "
    "has 75.98 GiB memory in use."
)
KEY_ERROR = "KeyError: 'response_mask'"


def _die(b: RayJob, moment: datetime, final: str, where: str) -> datetime:
    b.traceback(moment, [where], final)
    b.log(moment + timedelta(seconds=1), "Train loop failed", level="ERROR")
    return moment + timedelta(seconds=20)


def _loop(
    root: Path, name: str, final: str, where: str, *, died_at_step: int, now_after: timedelta
) -> Built:
    """Three attempts in one log, each resuming from the step-5 checkpoint and dying the same way."""
    b = RayJob(root, name, T0)
    moment = b.restart(T0, 8455, None)
    moment = noisy_steps(b, moment, range(1, died_at_step))
    for pid in (9120, 9788):
        b.log(moment, "Started: 'step'")
        moment = _die(b, moment + timedelta(seconds=40), final, where)
        moment = b.restart(moment + timedelta(seconds=30), pid, 5)
        moment = run_steps(b, moment, range(6, died_at_step))
    b.log(moment, "Started: 'step'")
    moment = _die(b, moment + timedelta(seconds=40), final, where)
    return standard_finish(b, root, moment + now_after, argv=ARGV)


def in_log_oom_loop(root: Path) -> Built:
    return _loop(
        root,
        "rl-qwen-inlog-oom-loop",
        OOM,
        "skyrl_train/workers/fsdp/fsdp_worker.py",
        died_at_step=7,
        now_after=timedelta(minutes=14),
    )


def in_log_code_error_loop(root: Path) -> Built:
    return _loop(
        root,
        "rl-qwen-inlog-keyerror-loop",
        KEY_ERROR,
        "skyrl_train/utils/ppo_utils.py",
        died_at_step=6,
        now_after=timedelta(minutes=13),
    )


def oom_then_recovered(root: Path) -> Built:
    b = RayJob(root, "rl-qwen-oom-recovered", T0)
    moment = noisy_steps(b, b.restart(T0, 8455, None), range(1, 7))
    b.log(moment, "Started: 'step'")
    moment = _die(b, moment + timedelta(seconds=40), OOM, "skyrl_train/workers/fsdp/fsdp_worker.py")
    moment = b.restart(moment + timedelta(seconds=30), 9120, 5)
    end = noisy_steps(b, moment, range(6, 17))
    return standard_finish(b, root, end + timedelta(minutes=1), argv=ARGV)


def preempted_in_log(root: Path) -> Built:
    b = RayJob(root, "rl-qwen-sigterm-resumed", T0)
    moment = noisy_steps(b, b.restart(T0, 8455, None), range(1, 9))
    b.raw(moment, "*** SIGTERM received at time=1785434400 on cpu 12 ***")
    b.log(
        moment + timedelta(seconds=1),
        "Received SIGTERM: shutting down Ray workers",
        level="WARNING",
    )
    moment = b.restart(moment + timedelta(minutes=6), 9120, 5)
    end = noisy_steps(b, moment, range(6, 18))
    return standard_finish(b, root, end + timedelta(minutes=1), argv=ARGV)


# --- replayed chunks ------------------------------------------------------------------------------


def _replay(b: RayJob, first: int, last: int, at: datetime) -> None:
    """The shipper re-sends the lines of an earlier chunk: their own (loguru) times as written,
    the Iris prefix time of their second collection."""
    start = next(
        i for i, line in enumerate(b.lines) if f"WANDB_MIRROR kind=train step={first} " in line
    )
    end = next(
        i for i, line in enumerate(b.lines) if f"WANDB_MIRROR kind=train step={last} " in line
    )
    for line in b.lines[start - 30 : end + 1]:
        b.lines.append(f"[{at:%H:%M:%S}]" + line[len("[HH:MM:SS]") :])


def replayed_chunk_newest(root: Path) -> Built:
    b = RayJob(root, "rl-qwen-replayed-tail", T0)
    end = noisy_steps(b, b.restart(T0, 8455, None), range(1, 14))
    b.log(end, "Started: 'step'")
    b.log(end, "Started: 'train_critic_and_policy'")
    now = end + timedelta(minutes=45)
    _replay(b, 11, 13, now - timedelta(minutes=3))
    return standard_finish(b, root, now, argv=ARGV)


def replayed_chunk_then_progress(root: Path) -> Built:
    b = RayJob(root, "rl-qwen-replayed-middle", T0)
    end = noisy_steps(b, b.restart(T0, 8455, None), range(1, 10))
    _replay(b, 6, 8, end)
    end = noisy_steps(b, end + timedelta(seconds=30), range(10, 18))
    return standard_finish(b, root, end + timedelta(minutes=1), argv=ARGV)


def constant_clock_offset(root: Path) -> Built:
    b = RayJob(root, "rl-qwen-local-time", T0)
    end = noisy_steps(b, b.restart(T0, 8455, None), range(1, 16))
    shifted = []
    for line in b.lines:
        prefix, _, rest = line.partition(" | ")
        moment = datetime.strptime(prefix[1:9], "%H:%M:%S")
        stamp = T0.replace(
            hour=moment.hour, minute=moment.minute, second=moment.second
        ) + timedelta(hours=2)
        shifted.append(f"[{stamp:%H:%M:%S}] task={b.job_id}/0 | {rest}" if rest else line)
    b.lines[:] = shifted
    return standard_finish(b, root, end + timedelta(hours=2, minutes=1), argv=ARGV)


# --- the real Iris captures ------------------------------------------------------------------------


def _attempts_from_csv(text: str, task: str) -> list[dict[str, object]]:
    names = {"3": "running", "4": "succeeded", "5": "failed"}
    rows = [r for r in csv.DictReader(io.StringIO(text)) if r["task_id"] == task]
    return [
        {
            "task_id": r["task_id"],
            "attempt_id": int(r["attempt_id"]),
            "state": names[r["state"]],
            "exit_code": int(r["exit_code"]) if r["exit_code"] else None,
            "error": r["error"],
            "started_at_ms": int(r["started_at_ms"]),
            "finished_at_ms": int(r["finished_at_ms"]) if r["finished_at_ms"] else None,
        }
        for r in rows
    ]


def _iris_case(
    root: Path, job: str, state: str, now: datetime, dumps: list[tuple[datetime, str]]
) -> Built:
    job_dir = root / "jobs" / "iris-local" / "ops" / job
    job_dir.mkdir(parents=True)
    shutil.copy(REAL / f"job_logs_{job}.txt", job_dir / "finelog.log")
    submitted = {"crashloop": 1796206344156, "hung": 1796206344201}[job]
    manifest = {
        "bundle_format": 1,
        "cluster": "iris-local",
        "job_id": f"/ops/{job}",
        "kind": "rl",
        "synced_at": iso(now - timedelta(minutes=1)),
        "job": {
            "job_id": f"/ops/{job}",
            "state": state,
            "task_state": state,
            "submitted_at_ms": submitted,
            "entrypoint": json.dumps({"argv": ARGV}),
        },
        "artifacts": {"finelog": "1 lines", "pod_logs": "not requested (terminal)", "errors": []},
    }
    (job_dir / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    probes = root / "probes" / job
    (probes / "stacks").mkdir(parents=True)
    shutil.copy(REAL / f"job_summary_{job}.json", probes / "controller.json")
    attempts = _attempts_from_csv((REAL / "query_task_attempts.csv").read_text(), f"/ops/{job}/0")
    (probes / "attempts.json").write_text(json.dumps(attempts, indent=2), encoding="utf-8")
    commands = []
    for n, (moment, text) in enumerate(dumps, start=1):
        name = f"stacks/ops_{job}_0-pid24491-{n}.txt"
        (probes / name).write_text(text, encoding="utf-8")
        argv = [
            "iris",
            "--controller-url=http://127.0.0.1:10000",
            "task",
            "exec",
            f"/ops/{job}/0",
            "--",
            "py-spy",
            "dump",
            "--pid",
            "24491",
        ]
        commands.append({"argv": argv, "started_at": iso(moment), "exit_code": 0, "output": name})
    header = {
        "captured_at": iso(now - timedelta(minutes=1)),
        "backend": "iris",
        "job_id": f"/ops/{job}",
        "commands": commands,
    }
    (probes / "probes.json").write_text(json.dumps(header, indent=2), encoding="utf-8")
    return Built(job_dir, probes, now)


def iris_crashloop(root: Path) -> Built:
    now = datetime(2026, 12, 2, 10, 18, tzinfo=UTC)
    return _iris_case(root, "crashloop", "failed", now, [])


def iris_hung(root: Path) -> Built:
    now = datetime(2026, 12, 2, 11, 20, tzinfo=UTC)
    dump = (REAL / "task_exec_pyspy_hung.txt").read_text(encoding="utf-8")
    first = now - timedelta(minutes=2)
    return _iris_case(
        root, "hung", "running", now, [(first, dump), (first + timedelta(seconds=30), dump)]
    )


CASES: tuple[Labelled, ...] = (
    Labelled(
        "crash_loop_in_log_cuda_oom",
        in_log_oom_loop,
        "KILL",
        "three attempts visible only in the log (new driver pid, Ray started again, resume from "
        "step 5), each dying on the same CUDA OOM at step 6 before passing the checkpoint",
    ),
    Labelled(
        "crash_loop_in_log_keyerror",
        in_log_code_error_loop,
        "KILL",
        "three in-log attempts each dying on `KeyError: 'response_mask'` in the same step",
    ),
    Labelled(
        "oom_then_in_log_restart_recovered",
        oom_then_recovered,
        "NO-KILL",
        "one CUDA OOM at step 6, a restart resumed from step 5 and trained ten steps past it",
        {"liveness": "PASS"},
    ),
    Labelled(
        "sigterm_then_in_log_restart_resumed",
        preempted_in_log,
        "NO-KILL",
        "SIGTERM (a node drained), a new driver resumed from step 5 and trains on",
        {"liveness": "PASS"},
    ),
    Labelled(
        "replayed_chunk_is_the_newest_text",
        replayed_chunk_newest,
        "ERROR",
        "the trainer quiet 45 min in policy_train; 3 min ago the shipper re-sent steps 11-13 "
        "(own times 45 min older than their prefix): not fresh progress; no stacks",
        {"liveness": "ERROR"},
    ),
    Labelled(
        "replayed_chunk_then_real_progress",
        replayed_chunk_then_progress,
        "NO-KILL",
        "a chunk of steps 6-8 re-sent once mid-run; real steps continue to a minute ago",
        {"liveness": "PASS"},
    ),
    Labelled(
        "constant_two_hour_offset_healthy",
        constant_clock_offset,
        "NO-KILL",
        "the Iris prefix times run a constant 2 h ahead of the trainer's own times (a zone "
        "setting): a clock fact, not a replay; the run advances",
        {"liveness": "PASS"},
    ),
    Labelled(
        "iris_localcluster_crashloop_real_text",
        iris_crashloop,
        "KILL",
        "real marin-iris output: three attempts failing with the same CUDA OOM, job failed",
    ),
    Labelled(
        "iris_localcluster_hung_real_text",
        iris_hung,
        "KILL",
        "real marin-iris output: `Started: 'policy_train'` then 67 min silent, the process in "
        "all_reduce_wait in two live dumps 30 s apart (the real py-spy text, unchanged)",
        {"liveness": "FAIL"},
    ),
)
