"""Alert → confirmed stall KILL through the pipeline, both looks, on a marin-iris LocalCluster.

    .venv/bin/python -m bench.bench_live_stall [--alerts 10] [--jobs 5] [--reobserve 60]
                                               [--probe-interval 2] [--spacing 5]
                                               [--one-at-a-time] [--json]

One redis-server, moto S3 server, `rl-health worker` (2 prefork) and `rl-health ingest`
(RLHEALTH_BACKEND=iris, RLHEALTH_COALESCE_S=0, RLHEALTH_REOBSERVE_S=`--reobserve`); `--jobs` toy
trainers of `testkit/toys/ray_node_trainer.py` parked in `all_reduce` on the cluster,
each beside two helpers that look like Ray's (a log monitor whose stack changes every second, a
dashboard agent's asyncio loop). `--alerts` alerts are published `--spacing` seconds apart, round
robin over the jobs, so they overlap (an alert for a job whose diagnosis is running joins it, and
its verdict answers both); with `--one-at-a-time` each is published once the previous one is
answered. Each alert's latency is publish → the signed verdict on the stream that names it; the
outcomes say each verdict and its second look (all should be `KILL (confirmed)`).

A LocalCluster's `ps` shows the whole machine: every look dumps the Python processes of every toy
node that matches RLHEALTH_PROBE_PROCESS_MATCH (at most 8), not only its own job's three — with
`--jobs 1` a look sees exactly one node, as in a container.

The figures: p50 and p95 of those latencies, the slowest, and the verdicts seen.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.bench_live import CLUSTER, services
from bench.bench_pipeline import Stack, Watcher, watching
from shared.alerts import publish_alert
from testkit.iris_cluster import (
    REPO,
    SHIM_COMMAND,
    IrisTestCluster,
    build_job_dir,
    start_cluster,
    toy_argv,
)
from worker.pipeline.store import store_from_settings

TOY = "ray_node_trainer"
WAIT_S = 900.0  # for the last verdict: alerts queue behind two prefork processes


def _env(cluster: IrisTestCluster, reobserve_s: float, probe_interval_s: float) -> dict[str, str]:
    return {
        "RLHEALTH_BACKEND": "iris",
        "RLHEALTH_CLUSTERS": json.dumps({CLUSTER: {"iris_controller_url": cluster.url}}),
        "RLHEALTH_IRIS_COMMAND": shlex.join(SHIM_COMMAND),
        "RLHEALTH_PROBE_INTERVAL_S": str(probe_interval_s),
        "RLHEALTH_PROBE_PROCESS_MATCH": TOY,
        "RLHEALTH_REOBSERVE_S": str(reobserve_s),
        "RLHEALTH_STALL_FLOOR_S": "2",  # the toys' steps last a fraction of a second
        "PYTHONPATH": str(REPO),
        "PYTHONWARNINGS": "ignore",
    }


def _wait_for_log(cluster: IrisTestCluster, job_id: str, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in cluster.cli("job", "logs", job_id).stdout:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{job_id} never logged {text!r}")
        time.sleep(1)


def _bundles(cluster: IrisTestCluster, root: Path, jobs: int) -> list[str]:
    """Toy nodes parked in all_reduce, their watcher bundles (quiet past the stall floor)."""
    ids = [cluster.submit(f"bench-node-{i}", toy_argv(TOY)) for i in range(jobs)]
    names = []
    for job_id in ids:
        cluster.wait_for(job_id, ["running"], timeout_s=180)
        _wait_for_log(cluster, job_id, "Finished: 'step'", 180)
        job_dir = build_job_dir(cluster, job_id, root, entrypoint=["python"], cluster_name=CLUSTER)
        names.append(job_dir.relative_to(root).as_posix())
    time.sleep(3)  # quiet past RLHEALTH_STALL_FLOOR_S
    return names


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _outcome(stack: Stack, watcher: Watcher, event_id: str) -> str:
    """The verdict answering `event_id` and the outcome of its second look (from its report)."""
    entry = next(e for e in watcher.entries if event_id in e.event_ids)
    settings = stack.settings
    key = entry.report_uri.removeprefix(f"s3://{settings.s3_bucket}/")
    if settings.s3_prefix:
        key = key.removeprefix(settings.s3_prefix.strip("/") + "/")
    report = json.loads(store_from_settings(settings).get(key))
    look = (report.get("second_look") or {}).get("outcome", "no second look")
    return f"{entry.verdict.value} ({look})"


def measure(stack: Stack, jobs: list[str], alerts: int, spacing_s: float | None) -> dict[str, Any]:
    """Publish `alerts` alerts `spacing_s` apart (None: each once the previous one is answered);
    publish → verdict for each."""
    published: dict[str, float] = {}
    with watching(stack) as watcher:
        for i in range(alerts):
            if i and spacing_s is not None:
                time.sleep(spacing_s)
            elif i and not watcher.wait(set(published), WAIT_S):
                break
            event_id = publish_alert(stack.redis, jobs[i % len(jobs)], settings=stack.settings)
            published[event_id] = time.perf_counter()
        if not watcher.wait(set(published), WAIT_S):
            missing = sorted(set(published) - set(watcher.answered))
            raise RuntimeError(f"no verdict within {WAIT_S:g} s for {missing}")
        latencies = [watcher.answered[e] - started for e, started in published.items()]
        outcomes = Counter(_outcome(stack, watcher, e) for e in published)
    return {
        "alerts": alerts,
        "jobs": len(jobs),
        "spacing_s": spacing_s,
        "p50_s": round(statistics.median(latencies), 1),
        "p95_s": round(_percentile(latencies, 0.95), 1),
        "max_s": round(max(latencies), 1),
        "min_s": round(min(latencies), 1),
        "outcomes": dict(outcomes),
    }


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    cluster = start_cluster()
    try:
        bundles = base / "bundles"
        jobs = _bundles(cluster, bundles, args.jobs)
        home = base / "pipeline"
        home.mkdir()
        with services(home, bundles, _env(cluster, args.reobserve, args.probe_interval)) as stack:
            spacing = None if args.one_at_a_time else args.spacing
            results = measure(stack, jobs, args.alerts, spacing)
        results["reobserve_s"] = args.reobserve
        results["probe_interval_s"] = args.probe_interval
        return results
    finally:
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--reobserve", type=float, default=60)
    parser.add_argument("--probe-interval", type=float, default=2)
    parser.add_argument("--spacing", type=float, default=5)
    parser.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="publish each alert once the previous one "
        "is answered (no queueing behind the two worker processes)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlhealth-bench-stall-") as tmp:
        results = run(args, Path(tmp))
    print(json.dumps(results, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
