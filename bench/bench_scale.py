"""Scale on one machine: 1, 2 and 4 worker processes and two ingests against one Redis.

    .venv/bin/python -m bench.bench_scale [--workers 1 2 4] [--jobs 100] [--alerts 1000]
                                          [--window 2] [--kill-workers 2] [--json]

Each worker process is what one pod of deploy/k8s runs: `rl-health worker --pool prefork
--concurrency 2`, in its own session (a process group, as a container is). Two `rl-health
ingest` share the alert stream's consumer group. redis-server and moto's S3 server on loopback.

storm    `--alerts` alerts over `--jobs` jobs (1 MB finelogs), published within `--window`
         seconds, RLHEALTH_COALESCE_S=300 so each job is diagnosed once: time from the first
         alert to the last verdict (and to the last HTML page, the work after it), verdicts per
         second, CPU seconds the workers used (their process groups), and the checks: every
         alert answered, one verdict per job, no alert answered by two diagnoses, no job
         diagnosed twice at once.
kill     the same storm with `--kill-workers` workers; once a tenth of the verdicts are out, one
         worker's whole process group is SIGKILLed (a pod lost with its node): its diagnoses are
         sent again by ingest's watchdog when their leases run out (RLHEALTH_LEASE_S=20 here,
         120 s by default), and every alert must still be answered, once.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.bench_pipeline import Stack as PipelineStack
from bench.bench_pipeline import Watcher, watching
from shared.alerts import publish_alert
from shared.streams import StreamNames
from testkit.bundles import write_job_bundle
from testkit.services import (
    RL_HEALTH,
    service_env,
    settings_from,
    start_moto,
    start_redis,
    stop,
    wait_for,
)
from worker.pipeline.app import make_app
from worker.pipeline.store import store_from_settings

CONCURRENCY = 2  # pool children per worker process, as in deploy/k8s/base/worker.yaml
INGESTS = 2
LEASE_S = 20  # short, so the kill run recovers within the bench's time
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Stack(PipelineStack):
    """The services of one run: the pipeline's, with every worker and ingest process."""

    env: dict[str, str]
    base: Path
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ingests: list[subprocess.Popen[bytes]] = field(default_factory=list)


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A process in its own session, so its whole group (pool children too) can be killed."""
    handle = log.open("wb")
    return subprocess.Popen(
        argv, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
    )


def _group_cpu_s(pgid: int) -> float:
    """CPU seconds of a process group: its live processes, and the children they reaped."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields from the state on: pgrp is the third
            total += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return total / _TICK


def _group_peak_rss_mb(pgid: int) -> float:
    """The largest peak resident size (VmHWM) of a process of the group."""
    peak = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[2]) != pgid:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except OSError:
            continue
    return round(peak / 1024, 1)


@contextmanager
def services(base: Path, workers: int) -> Iterator[Stack]:
    (base / "bundles").mkdir(parents=True, exist_ok=True)
    redis_process, redis_url = start_redis(base)
    moto_process, endpoint = start_moto(base / "moto.log")
    env = service_env(redis_url, endpoint, base / "bundles", base / "cache", 300)
    env["RLHEALTH_LEASE_S"] = str(LEASE_S)
    settings = settings_from(env)
    os.environ.update({k: v for k, v in env.items() if k.startswith(("RLHEALTH_", "AWS_"))})
    store_from_settings(settings).ensure_bucket()
    stack = Stack(settings, redis.Redis.from_url(redis_url), base / "bundles", env, base)
    stack.ingests = [
        _spawn([RL_HEALTH, "ingest", f"--consumer=ingest-{i}"], env, base / f"ingest-{i}.log")
        for i in range(INGESTS)
    ]
    for i in range(workers):
        argv = [RL_HEALTH, "worker", f"--concurrency={CONCURRENCY}", "--pool=prefork"]
        argv += ["--loglevel=WARNING", f"--hostname=w{i}@%h"]
        stack.workers.append(_spawn(argv, env, base / f"worker-{i}.log"))
    try:
        app = make_app(settings)

        def all_up() -> bool:
            return len(app.control.ping(timeout=1.0)) >= workers

        wait_for(all_up, 120, f"{workers} celery workers")
        yield stack
    finally:
        for process in (*stack.ingests, *stack.workers):
            stop(process, timeout=30)
        for process in (moto_process, redis_process):
            stop(process, timeout=20)


def _pages(stack: Stack) -> int:
    """HTML pages stored so far (the task after each verdict)."""
    store = store_from_settings(stack.settings)
    return sum(1 for key in store.keys("reports/") if key.endswith(".html"))


def _wait_for_pages(stack: Stack, jobs: int, timeout_s: float) -> float:
    """When every verdict's HTML page is stored, or the time-out (a page being drawn by a worker
    that was killed comes back only with the broker's visibility timeout, 900 s: the page task
    holds no lease)."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline and _pages(stack) < jobs:
        time.sleep(0.5)
    return time.perf_counter()


def _checks(stack: Stack, watcher: Watcher, ids: list[str], jobs: int) -> dict[str, Any]:
    """Every alert answered; one verdict per job; no alert in two diagnoses' answers; at most
    one diagnosis of a job in flight at once; leads whose workflow was sent again."""
    newest: dict[str, Any] = {}
    for entry in watcher.entries:
        newest[entry.event_id] = entry
    owners: dict[str, set[str]] = defaultdict(set)
    for lead, entry in newest.items():
        for event_id in entry.event_ids:
            owners[event_id].add(lead)
    per_job: dict[str, set[str]] = defaultdict(set)
    for entry in newest.values():
        per_job[entry.job_id].add(entry.event_id)
    names = StreamNames(stack.settings.stream_prefix)
    running: dict[str, set[str]] = defaultdict(set)
    peak = 0
    for _id, fields in stack.redis.xrange(names.diagnoses):
        job, lead = fields[b"job"].decode(), fields[b"event_id"].decode()
        if fields[b"phase"] == b"started":
            running[job].add(lead)
        else:
            running[job].discard(lead)
        peak = max(peak, len(running[job]))
    resent = sum(
        1 for lead in newest if int(stack.redis.hget(names.lead(lead), "redispatches") or 0) > 0
    )
    return {
        "all_answered": set(ids) <= set(owners),
        "verdicts": len(newest),
        "jobs_with_one_verdict": sum(1 for leads in per_job.values() if len(leads) == 1),
        "jobs": jobs,
        "alerts_answered_by_two_diagnoses": sum(1 for leads in owners.values() if len(leads) > 1),
        "peak_diagnoses_in_flight_per_job": peak,
        "leads_sent_again": resent,
    }


def _storm_ids(stack: Stack, jobs: int, alerts: int, window_s: float) -> tuple[list[str], float]:
    """Publish the storm; the ids and when it began."""
    names = [
        write_job_bundle(stack.bundle_root, f"scale-{i}", size_bytes=1_000_000) for i in range(jobs)
    ]
    targets = [names[i % jobs].relative_to(stack.bundle_root).as_posix() for i in range(alerts)]
    random.Random(7).shuffle(targets)
    began, ids = time.perf_counter(), []
    for i, job in enumerate(targets):
        time.sleep(max(0.0, began + window_s * i / alerts - time.perf_counter()))
        ids.append(publish_alert(stack.redis, job, settings=stack.settings))
    return ids, began


def storm(
    base: Path, workers: int, jobs: int, alerts: int, window_s: float, budget_s: float, kill: bool
) -> dict[str, Any]:
    """One storm against `workers` worker processes; with `kill`, one is SIGKILLed mid-storm."""
    with services(base, workers) as stack, watching(stack) as watcher:
        load = os.getloadavg()[0]
        cpu_before = {w.pid: _group_cpu_s(w.pid) for w in stack.workers}
        ids, began = _storm_ids(stack, jobs, alerts, window_s)
        killed_at = None
        if kill:
            while watcher.leads() < jobs // 10 and time.perf_counter() - began < budget_s:
                time.sleep(0.05)
            victim = stack.workers[0]
            killed_at = time.perf_counter() - began
            cpu_before.pop(victim.pid)
            os.killpg(victim.pid, signal.SIGKILL)
        complete = watcher.wait(set(ids), budget_s)
        last = max((watcher.answered.get(i, time.perf_counter()) for i in ids), default=began)
        answered_s = last - began
        drained_s = _wait_for_pages(stack, jobs, 60 if kill else budget_s) - began
        pages = _pages(stack)
        cpu = sum(_group_cpu_s(pid) - before for pid, before in cpu_before.items())
        peak_rss = max(_group_peak_rss_mb(pid) for pid in cpu_before)
        ingest_rss = max(_group_peak_rss_mb(process.pid) for process in stack.ingests)
        result = _checks(stack, watcher, ids, jobs)
    result |= {
        "workers": workers,
        "children": workers * CONCURRENCY,
        "load_before": round(load, 2),
        "complete_within_budget": complete,
        "last_verdict_after_s": round(answered_s, 2),
        "verdicts_per_s": round(result["verdicts"] / answered_s, 2),
        "last_page_after_s": round(drained_s, 2) if pages >= jobs else None,
        "pages_missing": jobs - pages,
        "worker_cpu_s": round(cpu, 1),
        "cpu_s_per_diagnosis": round(cpu / max(1, result["verdicts"]), 2),
        "peak_rss_mb_per_process": peak_rss,
        "ingest_peak_rss_mb": ingest_rss,
    }
    if killed_at is not None:
        result["killed_after_s"] = round(killed_at, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--alerts", type=int, default=1000)
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--budget", type=float, default=240.0)
    parser.add_argument("--kill-workers", type=int, default=2, help="0: no kill run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = [(n, False) for n in args.workers]
    if args.kill_workers:
        runs.append((args.kill_workers, True))
    results = []
    with tempfile.TemporaryDirectory(prefix="rlhealth-scale-") as tmp:
        for i, (workers, kill) in enumerate(runs):
            base = Path(tmp) / f"run-{i}"
            result = storm(base, workers, args.jobs, args.alerts, args.window, args.budget, kill)
            results.append({"run": "kill" if kill else "storm", **result})
            print(json.dumps(results[-1]), flush=True)
    if not args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
