"""Pipeline benchmark on real services: 2 prefork workers, one ingest, redis-server, moto S3.

    .venv/bin/python -m bench.bench_pipeline [--latency-alerts 20] [--storm-jobs 100]
                                             [--storm-alerts 1000] [--storm-window 10] [--json]

latency  alerts published one at a time on bundles with a 50 MB finelog (bench/gen_finelog.py),
         RLHEALTH_COALESCE_S=0 so each one is diagnosed: alert → verdict-on-stream p50 / p99.
storm    1,000 alerts over 100 jobs (1 MB finelogs) spread evenly over 10 s, COALESCE_S=300:
         verdicts, event ids answered, diagnoses per job, peak diagnoses in flight per job, time
         until the last alert is answered.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from shared.alerts import publish_alert
from shared.settings import Settings
from shared.streams import StreamNames, read_entry
from testkit.bundles import write_job_bundle
from testkit.gen_finelog import generate
from testkit.services import (
    RL_HEALTH,
    service_env,
    settings_from,
    spawn,
    start_moto,
    start_redis,
    stop,
    wait_for,
)
from worker.pipeline.app import make_app
from worker.pipeline.store import store_from_settings


@dataclass
class Stack:
    settings: Settings
    redis: Any
    bundle_root: Path


@contextmanager
def services(
    base: Path,
    coalesce_s: float,
    extra_env: dict[str, str] | None = None,
    loglevel: str = "WARNING",
) -> Iterator[Stack]:
    """redis-server, moto, `rl-health worker` (2 prefork) and `rl-health ingest`; `extra_env`
    adds or overrides settings; the worker logs to `base/worker.log` at `loglevel`."""
    (base / "bundles").mkdir(parents=True, exist_ok=True)
    redis_process, redis_url = start_redis(base)
    moto_process, endpoint = start_moto(base / "moto.log")
    env = service_env(redis_url, endpoint, base / "bundles", base / "cache", coalesce_s)
    env.update(extra_env or {})
    settings = settings_from(env)
    import os

    os.environ.update({k: v for k, v in env.items() if k.startswith(("RLHEALTH_", "AWS_"))})
    store_from_settings(settings).ensure_bucket()
    worker_argv = [RL_HEALTH, "worker", "--concurrency", "2", "--pool", "prefork"]
    worker = spawn([*worker_argv, "--loglevel", loglevel], env, base / "worker.log")
    ingest = spawn([RL_HEALTH, "ingest"], env, base / "ingest.log")
    try:
        wait_for(lambda: bool(make_app(settings).control.ping(timeout=0.5)), 60, "celery worker")
        yield Stack(settings, redis.Redis.from_url(redis_url), base / "bundles")
    finally:
        for process in (ingest, worker, moto_process, redis_process):
            stop(process, timeout=20)


@dataclass
class Watcher:
    """Records when each event id is first answered on the verdict stream."""

    stack: Stack
    answered: dict[str, float] = field(default_factory=dict)
    entries: list[Any] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        stream, last = StreamNames(self.stack.settings.stream_prefix).verdicts, "0-0"
        while not self.stopping.is_set():
            reply = self.stack.redis.xread({stream: last}, count=500, block=200)
            for _stream, items in reply or ():
                for entry_id, fields in items:
                    last = entry_id
                    entry = read_entry(fields, self.stack.settings.verdict_keys())
                    self.entries.append(entry)
                    now = time.perf_counter()
                    for event_id in entry.event_ids:
                        self.answered.setdefault(event_id, now)

    def leads(self) -> int:
        """How many diagnoses have answered so far (one entry per lead)."""
        return len({entry.event_id for entry in self.entries})

    def wait(self, ids: set[str], timeout: float) -> bool:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if ids <= self.answered.keys():
                return True
            time.sleep(0.005)
        return False


@contextmanager
def watching(stack: Stack) -> Iterator[Watcher]:
    watcher = Watcher(stack)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        yield watcher
    finally:
        watcher.stopping.set()
        thread.join(5)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _big_bundles(root: Path, count: int, megabytes: float) -> list[str]:
    jobs = []
    for i in range(count):
        job_dir = write_job_bundle(root, f"big-{i}")
        generate(job_dir / "finelog.log", megabytes, seed=7 + i)
        jobs.append(job_dir.relative_to(root).as_posix())
    return jobs


def latency(base: Path, alerts: int, megabytes: float, warmup: int) -> dict[str, Any]:
    """Alert → verdict-on-stream latency, one alert at a time, after `warmup` cold-start alerts."""
    with services(base, coalesce_s=0) as stack, watching(stack) as watcher:
        jobs = _big_bundles(stack.bundle_root, 4, megabytes)
        samples = []
        for i in range(warmup + alerts):
            started = time.perf_counter()
            event_id = publish_alert(stack.redis, jobs[i % len(jobs)], settings=stack.settings)
            if not watcher.wait({event_id}, 60):
                raise RuntimeError(f"no verdict for {event_id} within 60 s")
            samples.append(watcher.answered[event_id] - started)
    cold, warm = samples[:warmup], samples[warmup:]
    return {
        "alerts": alerts,
        "finelog_mb": megabytes,
        "p50_s": round(statistics.median(warm), 3),
        "p99_s": round(_percentile(warm, 0.99), 3),
        "max_s": round(max(warm), 3),
        "cold_start_s": [round(value, 3) for value in cold],
    }


def _peak_in_flight(stack: Stack) -> int:
    running: dict[str, int] = defaultdict(int)
    peak = 0
    for _id, fields in stack.redis.xrange(StreamNames(stack.settings.stream_prefix).diagnoses):
        job = fields[b"job"].decode()
        running[job] += 1 if fields[b"phase"] == b"started" else -1
        peak = max(peak, running[job])
    return peak


def storm(base: Path, jobs: int, alerts: int, window_s: float, budget_s: float) -> dict[str, Any]:
    """An alert storm: `alerts` over `jobs` jobs within `window_s` seconds."""
    with services(base, coalesce_s=300) as stack, watching(stack) as watcher:
        names = [
            write_job_bundle(stack.bundle_root, f"storm-{i}", size_bytes=1_000_000)
            for i in range(jobs)
        ]
        targets = [names[i % jobs].relative_to(stack.bundle_root).as_posix() for i in range(alerts)]
        random.Random(7).shuffle(targets)
        started, ids = time.perf_counter(), []
        for i, job in enumerate(targets):
            time.sleep(max(0.0, started + window_s * i / alerts - time.perf_counter()))
            ids.append(publish_alert(stack.redis, job, settings=stack.settings))
        published_s = time.perf_counter() - started
        complete = watcher.wait(set(ids), budget_s)
        elapsed = max(watcher.answered.get(i, time.perf_counter()) for i in ids) - started
        latest: dict[str, Any] = {}
        for entry in watcher.entries:
            latest[entry.event_id] = entry
        answered_by_latest = {i for entry in latest.values() for i in entry.event_ids}
        peak = _peak_in_flight(stack)
    return {
        "jobs": jobs,
        "alerts": alerts,
        "published_within_s": round(published_s, 2),
        "all_answered": complete,
        "answered": len(set(ids) & answered_by_latest),
        "verdicts": len(latest),
        "stream_entries": len(watcher.entries),
        "peak_in_flight_per_job": peak,
        "last_answer_after_s": round(elapsed, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-alerts", type=int, default=20)
    parser.add_argument("--latency-mb", type=float, default=50)
    parser.add_argument("--latency-warmup", type=int, default=2)
    parser.add_argument("--storm-jobs", type=int, default=100)
    parser.add_argument("--storm-alerts", type=int, default=1000)
    parser.add_argument("--storm-window", type=float, default=10)
    parser.add_argument("--storm-budget", type=float, default=60)
    parser.add_argument("--skip", choices=["latency", "storm"], action="append", default=[])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rlhealth-bench-") as tmp:
        if "latency" not in args.skip:
            results["latency"] = latency(
                Path(tmp) / "latency", args.latency_alerts, args.latency_mb, args.latency_warmup
            )
        if "storm" not in args.skip:
            results["storm"] = storm(
                Path(tmp) / "storm",
                args.storm_jobs,
                args.storm_alerts,
                args.storm_window,
                args.storm_budget,
            )
    print(json.dumps(results, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
