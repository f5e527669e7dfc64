"""Where a capture's time goes, in one process: S3 requests, Redis round trips and phases.

    .venv/bin/python -m bench.capture_requests [--mb 1000] [--grow-pct 1] [--json]

redis-server and moto's S3 server (as the integration tests start them) behind one `Pipeline`
(`worker.pipeline.steps`), no Celery: one job with a `--mb` MB finelog (bench/gen_finelog.py,
under a temporary directory), captured three times as `bench.bench_growth` does it — *first*
(no cache), *second* (the log grew by `--grow-pct` %, the disk holds the job's log cache) and
*cold* (grown as much again, the disk cache removed: log cache, frozen copies, table parts; the
process's memory kept, as a worker process keeps it; `--fresh-process` drops it, as for a
capture that lands on the other pool process). For each capture: its wall time, the S3
requests by operation (counted on the boto3 client's `before-send` event, one per HTTP request,
pagination and retries included), the Redis round trips (commands and pipelines), and the time
spent in each phase (wrapped functions, inclusive, so nested phases overlap).

Not a timed test: the counts are exact, the times one run's on a shared machine.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from bench.bench_growth import _last_time, _split
from shared.models import Event
from testkit.bundles import write_job_bundle
from testkit.gen_finelog import generate
from testkit.services import (
    service_env,
    settings_from,
    start_moto,
    start_redis,
    stop,
)
from worker.pipeline import capture, claim, evidence_store, logcache, parts, steps
from worker.pipeline.store import S3Store, store_from_settings

__all__ = ["Counted", "counted_captures"]

# (owner, attribute, phase name): the functions whose inclusive time is reported
_PHASES: list[tuple[Any, str, str]] = [
    (evidence_store.EvidenceStore, "whole", "frozen_whole (marker + parts HEAD)"),
    (steps.EventArchive, "load", "load_event"),
    (evidence_store, "clear_prefix", "clear"),
    (capture.CaptureService, "_collect", "collect (logs read through the cache)"),
    (logcache._SharedCopy, "pull", "logcache pull"),
    (logcache._SharedCopy, "push", "logcache push"),
    (logcache._SharedCopy, "_expire", "logcache expire"),
    (logcache.JobLogCache, "_tidy", "logcache tidy"),
    (logcache, "shareable", "logcache redaction check"),
    (parts, "stored_parts", "stored_parts (list job's parts, in a thread)"),
    (evidence_store, "_frozen_files", "freeze (to local files)"),
    (parts.SharedParts, "keep", "parts keep (upload + disk copy)"),
    (claim.CaptureClaim, "held", "claim held"),
]


class Counted:
    """S3 requests by operation, Redis round trips by command, time by phase."""

    def __init__(self) -> None:
        self.s3: Counter[str] = Counter()
        self.redis: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()

    def snapshot(self) -> tuple[Counter[str], Counter[str], Counter[str]]:
        return Counter(self.s3), Counter(self.redis), Counter(self.seconds)


def _count_s3(store: S3Store, counted: Counted) -> None:
    def before_send(**kwargs: Any) -> None:
        request = kwargs.get("request")
        name = str(kwargs.get("event_name", "")).rsplit(".", 1)[-1]
        counted.s3[getattr(request, "method", "?") if name == "s3" else name] += 1

    def before_call(model: Any, **kwargs: Any) -> None:
        counted.s3[f"call {model.name}"] += 1

    store.client.meta.events.register("before-call.s3", before_call)
    store.client.meta.events.register("before-send.s3", before_send)


def _count_redis(client: Any, counted: Counted) -> None:
    inner = client.execute_command

    def execute_command(*args: Any, **options: Any) -> Any:
        counted.redis[str(args[0]).upper()] += 1
        return inner(*args, **options)

    client.execute_command = execute_command
    pipe_execute = redis.client.Pipeline.execute

    def execute(self: Any, raise_on_error: bool = True) -> Any:
        counted.redis["PIPELINE"] += 1
        return pipe_execute(self, raise_on_error)

    redis.client.Pipeline.execute = execute  # type: ignore[method-assign]


def _timer(owner: Any, name: str, label: str, counted: Counted) -> None:
    inner = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            counted.seconds[label] += time.perf_counter() - started

    setattr(owner, name, timed)


def _instrument(counted: Counted) -> None:
    from worker.evidence import frozen

    for owner, name, label in [*_PHASES, (frozen, "_digests", "part digests")]:
        _timer(owner, name, label, counted)


@contextmanager
def _services(base: Path) -> Iterator[dict[str, str]]:
    redis_process, redis_url = start_redis(base)
    moto_process, endpoint = start_moto(base / "moto.log")
    try:
        env = service_env(redis_url, endpoint, base / "bundles", base / "cache", 0)
        os.environ.update({k: v for k, v in env.items() if k.startswith(("RLHEALTH_", "AWS_"))})
        yield env
    finally:
        stop(moto_process)
        stop(redis_process)


def _event(job: str, now: datetime, label: str) -> Event:
    stamp = datetime.now(UTC)
    event_id = f"evt-{stamp:%Y%m%dT%H%M%S}-{label}"
    return Event(event_id=event_id, job_dir=job, published_at=stamp, now=now)


def _diff(after: Counter[str], before: Counter[str]) -> dict[str, float]:
    return {k: round(v - before.get(k, 0), 3) for k, v in sorted(after.items()) if v != before[k]}


def counted_captures(
    base: Path,
    megabytes: float,
    grow_pct: float,
    profile: dict[str, Path] | None = None,
    fresh_process: bool = False,
) -> dict[str, Any]:
    """The three captures' wall times, S3 requests, Redis round trips and phase times;
    `profile` names a cProfile output file for the captures to profile; `fresh_process` takes
    the second and cold captures as another pool process would (no entry or part in memory)."""
    profile = profile or {}
    counted = Counted()
    _instrument(counted)
    with _services(base) as env:
        settings = settings_from(env)
        store = store_from_settings(settings)
        store.ensure_bucket()
        _count_s3(store, counted)
        client = redis.Redis.from_url(settings.redis_url)
        _count_redis(client, counted)
        pipeline = steps.Pipeline(settings, store, client)
        job_dir = write_job_bundle(settings.bundle_root, "grown")
        log = generate(job_dir / "finelog.log", megabytes * (1 + 2 * grow_pct / 100))
        growths = _split(log, grow_pct)
        job = job_dir.relative_to(settings.bundle_root).as_posix()
        result: dict[str, Any] = {}
        for label, extra in (("first", b""), ("second", growths[0]), ("cold", growths[1])):
            with log.open("ab") as handle:
                handle.write(extra)
            if label == "cold":
                for folder in ("logs", "evidence", "parts"):
                    shutil.rmtree(base / "cache" / folder, ignore_errors=True)
            if fresh_process and label != "first":  # another pool process: nothing in memory
                logcache._KEPT._items.clear()
                pipeline = steps.Pipeline(settings, store, client)
            event = _event(job, _last_time(log), label)
            pipeline.events.archive(event)
            before = counted.snapshot()
            started = time.perf_counter()
            if label in profile:
                with cProfile.Profile() as profiler:
                    pipeline.capture(event.event_id, event.event_id, claim=f"claim-{label}")
                profiler.dump_stats(str(profile[label]))
            else:
                pipeline.capture(event.event_id, event.event_id, claim=f"claim-{label}")
            took = time.perf_counter() - started
            after = counted.snapshot()
            result[label] = {
                "wall_s": round(took, 3),
                "s3": _diff(after[0], before[0]),
                "redis": _diff(after[1], before[1]),
                "phases_s": _diff(after[2], before[2]),
            }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=1000)
    parser.add_argument("--grow-pct", type=float, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--fresh-process", action="store_true", help="second and cold without the first's memory"
    )
    parser.add_argument(
        "--profile", metavar="DIR", type=Path, help="write <DIR>/<capture>.prof (cProfile)"
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rlhealth-bench-requests-") as tmp:
        named = ("first", "second", "cold")
        profile = {n: args.profile / f"{n}.prof" for n in named} if args.profile else None
        result = counted_captures(Path(tmp), args.mb, args.grow_pct, profile, args.fresh_process)
    result["loadavg_before"] = [round(x, 2) for x in load_before]
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
