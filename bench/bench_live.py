"""Alert → verdict through the pipeline with live probes from a marin-iris LocalCluster, beside the
same pipeline without probes (RLHEALTH_BACKEND=none), measured in one run.

    .venv/bin/python -m bench.bench_live [--alerts 10] [--warmup 1] [--mb 50] [--jobs 2]
                                         [--probe-interval 5] [--json]

Each mode runs its own redis-server, moto S3 server, `rl-health worker` (2 prefork) and
`rl-health ingest`, with RLHEALTH_COALESCE_S=0 so each alert is diagnosed and
RLHEALTH_REOBSERVE_S=0 (no second look), on the same bundles:
`--jobs` toy trainers hung in `all_reduce` on the LocalCluster, each bundle's finelog replaced by
`--mb` MB from bench/gen_finelog.py (quiet for months, so the capture policy asks for the attempt
history and two `py-spy dump`s per process, `--probe-interval` seconds apart, and an nvidia-smi
query). Alerts are published one at a time; the figures are alert → verdict-on-stream p50 / p99
after `--warmup` cold-start alerts, the verdicts seen, and the ratio live / none.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from bench.bench_pipeline import Stack, watching
from shared.alerts import publish_alert
from testkit.gen_finelog import generate
from testkit.iris_cluster import (
    REPO,
    SHIM_COMMAND,
    IrisTestCluster,
    build_job_dir,
    start_cluster,
    toy_argv,
)
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

CLUSTER = "iris-local"


def _live_env(cluster: IrisTestCluster, probe_interval_s: float) -> dict[str, str]:
    return {
        "RLHEALTH_BACKEND": "iris",
        "RLHEALTH_CLUSTERS": json.dumps({CLUSTER: {"iris_controller_url": cluster.url}}),
        "RLHEALTH_IRIS_COMMAND": shlex.join(SHIM_COMMAND),
        "RLHEALTH_PROBE_INTERVAL_S": str(probe_interval_s),
        "RLHEALTH_PROBE_PROCESS_MATCH": "hung_trainer",
        "RLHEALTH_REOBSERVE_S": "0",
        "PYTHONPATH": str(REPO),
        "PYTHONWARNINGS": "ignore",
    }


@contextmanager
def services(base: Path, bundles: Path, extra: dict[str, str]) -> Iterator[Stack]:
    """redis-server, moto, `rl-health worker` (2 prefork) and `rl-health ingest`, COALESCE_S=0."""
    redis_process, redis_url = start_redis(base)
    moto_process, endpoint = start_moto(base / "moto.log")
    env = {**service_env(redis_url, endpoint, bundles, base / "cache", 0), **extra}
    settings = settings_from(env)
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    store_from_settings(settings).ensure_bucket()
    argv = [RL_HEALTH, "worker", "--concurrency", "2", "--pool", "prefork", "--loglevel", "WARNING"]
    worker = spawn(argv, env, base / "worker.log")
    ingest = spawn([RL_HEALTH, "ingest"], env, base / "ingest.log")
    try:
        wait_for(lambda: bool(make_app(settings).control.ping(timeout=0.5)), 90, "celery worker")
        yield Stack(settings, redis.Redis.from_url(redis_url), bundles)
    finally:
        for process in (ingest, worker, moto_process, redis_process):
            stop(process, timeout=20)


def _bundles(cluster: IrisTestCluster, root: Path, jobs: int, megabytes: float) -> list[str]:
    """Hung toy trainers on the cluster, their watcher bundles with a big generated finelog."""
    names = []
    for i in range(jobs):
        job_id = cluster.submit(f"bench-hung-{i}", toy_argv("hung_trainer"))
        cluster.wait_for(job_id, ["running"], timeout_s=120)
        job_dir = build_job_dir(cluster, job_id, root, entrypoint=["python"], cluster_name=CLUSTER)
        generate(job_dir / "finelog.log", megabytes, seed=7 + i)
        names.append(job_dir.relative_to(root).as_posix())
    return names


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(stack: Stack, jobs: list[str], alerts: int, warmup: int) -> dict[str, Any]:
    """Alert → verdict latency, one alert at a time, after `warmup` cold-start alerts."""
    samples: list[float] = []
    verdicts: Counter[str] = Counter()
    with watching(stack) as watcher:
        for i in range(warmup + alerts):
            started = time.perf_counter()
            event_id = publish_alert(stack.redis, jobs[i % len(jobs)], settings=stack.settings)
            if not watcher.wait({event_id}, 300):
                raise RuntimeError(f"no verdict for {event_id} within 300 s")
            samples.append(watcher.answered[event_id] - started)
            entry = next(e for e in watcher.entries if event_id in e.event_ids)
            verdicts[entry.verdict.value] += 1 if i >= warmup else 0
    warm = samples[warmup:]
    return {
        "alerts": alerts,
        "p50_s": round(statistics.median(warm), 3),
        "p99_s": round(_percentile(warm, 0.99), 3),
        "max_s": round(max(warm), 3),
        "cold_start_s": [round(value, 3) for value in samples[:warmup]],
        "verdicts": dict(verdicts),
    }


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    cluster = start_cluster()
    try:
        shared_root = base / "bundles"
        jobs = _bundles(cluster, shared_root, args.jobs, args.mb)
        results: dict[str, Any] = {"finelog_mb": args.mb, "jobs": args.jobs}
        modes = {
            "none": {"RLHEALTH_BACKEND": "none", "RLHEALTH_REOBSERVE_S": "0"},
            "iris": _live_env(cluster, args.probe_interval),
        }
        for mode, extra in modes.items():
            home = base / mode
            home.mkdir()
            with services(home, shared_root, extra) as stack:
                results[mode] = measure(stack, jobs, args.alerts, args.warmup)
        none, live = results["none"], results["iris"]
        results["live_over_none_p50"] = round(live["p50_s"] / none["p50_s"], 2)
        results["live_over_none_p99"] = round(live["p99_s"] / none["p99_s"], 2)
        results["probe_interval_s"] = args.probe_interval
        return results
    finally:
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--mb", type=float, default=50)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--probe-interval", type=float, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlhealth-bench-live-") as tmp:
        results = run(args, Path(tmp))
    print(json.dumps(results, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
