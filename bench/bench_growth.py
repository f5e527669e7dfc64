"""Re-diagnosis of a grown log through the pipeline: redis-server, moto S3, `rl-health worker`
(2 prefork) and `rl-health ingest`, as in bench/bench_pipeline.py.

    .venv/bin/python -m bench.bench_growth [--mb 1000] [--grow-pct 1] [--json] [--keep-log FILE]

One job with a `--mb` MB finelog (bench/gen_finelog.py, written under a temporary directory and
deleted afterwards). After one warm-up alert on a small job (the prefork children's imports), the
times from publishing an alert to its verdict on the stream:

first    the whole log parsed (the job's log cache is empty)
second   after the log grew by `--grow-pct` %: only the appended bytes are parsed (the worker's
         disk holds the job's log cache)
cold     after it grew by as much again, with the worker's disk cache removed (log cache, frozen
         evidence copies, table parts): the job's log cache (its manifest and parts) and the
         evidence's new parts come from S3 (the worker processes still hold the parts they
         thawed in memory)

`second_ratio` is second / first (issue 12's target: at most 0.15); `cold_ratio` likewise. Every
alert is diagnosed (RLHEALTH_COALESCE_S=0); the capture time limit is raised so a slow machine
does not cut the first capture. `stages_s` splits each diagnosis into its task times from the
worker's log (capture, the slowest gate and all gates, verdict), `cache` quotes the worker's log
cache line of each capture (bytes parsed and reused, the log cache's parts read from and written
to S3), `captures` the phases of each capture (collect, freeze, store, and the wait for the
log cache's S3 copy written meanwhile), `thaws` each worker process's thaw of each frozen
evidence (its time, the table parts taken from the process's part cache and those read).

The HTML report is drawn by its own task after publish (docs/pipeline.md): each timing ends at
the verdict, and the next alert is sent once the previous diagnosis's page is stored (a grown
log's next alert comes minutes later, not while the page is drawn); `stages_s` gives its task's
time as `html`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.bench_pipeline import Stack, Watcher, services, watching
from shared.alerts import publish_alert
from testkit.bundles import write_job_bundle
from testkit.gen_finelog import generate

__all__ = ["growth"]

_LOGURU: re.Pattern[bytes] = re.compile(rb"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.\d{3} \|")
_TIMEOUT_S = 1800.0
_SUCCEEDED: re.Pattern[str] = re.compile(
    r"/([\w-]+)\] Task rlhealth\.(\w+)\[[^\]]*\] succeeded in ([\d.]+)s"
)
_DRAWN: re.Pattern[str] = re.compile(r"Task rlhealth\.html\[[^\]]*\] succeeded")


def _split(path: Path, grow_pct: float) -> list[bytes]:
    """Cut the log's last 2 x `grow_pct` % off (at line ends) and return it as two growths."""
    size = path.stat().st_size
    step = int(size * grow_pct / 100)
    with path.open("r+b") as handle:
        handle.seek(size - 2 * step - 65536)
        tail = handle.read()
    cut = tail.index(b"\n", 65536) + 1
    middle = tail.index(b"\n", cut + step) + 1
    with path.open("r+b") as handle:
        handle.truncate(size - len(tail) + cut)
    return [tail[cut:middle], tail[middle:]]


def _last_time(path: Path) -> datetime:
    """The newest loguru time in the log's last 1 MB (the alert is judged as of just after it)."""
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - 2**20))
        found = _LOGURU.findall(handle.read())
    return datetime.strptime(found[-1].decode(), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)


def _timed(stack: Stack, watcher: Watcher, job: str, now: datetime | None, log: Path) -> float:
    """Alert → verdict; then waits for the diagnosis's HTML page (not timed)."""
    started = time.perf_counter()
    event_id = publish_alert(stack.redis, job, settings=stack.settings, now=now)
    if not watcher.wait({event_id}, _TIMEOUT_S):
        raise RuntimeError(f"no verdict for {event_id} within {_TIMEOUT_S:.0f} s")
    took = watcher.answered[event_id] - started
    pages, deadline = len(watcher.entries), time.perf_counter() + _TIMEOUT_S
    while len(_DRAWN.findall(log.read_text(errors="replace"))) < pages:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"no HTML page for {event_id} within {_TIMEOUT_S:.0f} s")
        time.sleep(0.05)
    return took


def _stages(log: str) -> list[dict[str, float | str]]:
    """Each diagnosis's task times from the worker's log (alerts run one at a time): capture,
    the slowest gate and all gates, verdict; a diagnosis ends with its publish, after which its
    HTML page is drawn (`html`). `capture_in` names the pool process that captured (a process
    other than the previous capture's holds none of the job's parsed rows in memory)."""
    found: list[dict[str, float | str]] = []
    current: dict[str, float] = {"capture": 0.0, "gate_max": 0.0, "gates": 0.0, "verdict": 0.0}
    process = ""
    for worker, task, seconds in _SUCCEEDED.findall(log):
        took = float(seconds)
        if task == "gate":
            current["gate_max"] = max(current["gate_max"], took)
            current["gates"] += took
        elif task in ("capture", "verdict"):
            current[task] += took
            process = worker if task == "capture" else process
        elif task == "publish":
            found.append({name: round(value, 2) for name, value in current.items()})
            found[-1]["capture_in"] = process
            current = dict.fromkeys(current, 0.0)
        elif task == "html" and found:
            found[-1]["html"] = round(took, 2)
    return found


def _cache_lines(log: str) -> list[str]:
    return [line.split("] ", 1)[-1] for line in log.splitlines() if "log cache (" in line][1:]


def _capture_lines(log: str) -> list[str]:
    """Each capture's phases (collect, freeze, store, the wait for the log cache's S3 copy)."""
    return [line.split("] ", 1)[-1] for line in log.splitlines() if "] captured " in line][1:]


def _thaw_lines(log: str) -> list[str]:
    """Each worker process's thaw of each frozen evidence (the warm-up's first): its time and
    the parts it took from the process's part cache or read."""
    return [line.split("] ", 1)[-1] for line in log.splitlines() if "] thawed " in line]


def _verdicts(watcher: Watcher) -> list[str]:
    return [entry.verdict.value for entry in watcher.entries]


def growth(
    base: Path, megabytes: float, grow_pct: float, keep_log: Path | None = None
) -> dict[str, Any]:
    """The three timings and their ratios (`keep_log`: a copy of the worker's log there)."""
    extra = {"RLHEALTH_CAPTURE_TIME_LIMIT_S": "3600", "RLHEALTH_GATE_TIME_LIMIT_S": "900"}
    with (
        services(base, coalesce_s=0, extra_env=extra, loglevel="INFO") as stack,
        watching(stack) as watcher,
    ):
        small = write_job_bundle(stack.bundle_root, "warm-up").relative_to(stack.bundle_root)
        log_path = base / "worker.log"
        _timed(stack, watcher, small.as_posix(), None, log_path)
        job_dir = write_job_bundle(stack.bundle_root, "grown")
        log = generate(job_dir / "finelog.log", megabytes * (1 + 2 * grow_pct / 100))
        growths = _split(log, grow_pct)
        job = job_dir.relative_to(stack.bundle_root).as_posix()
        sizes, times = [log.stat().st_size], {}
        times["first"] = _timed(stack, watcher, job, _last_time(log), log_path)
        for label, extra_bytes in zip(("second", "cold"), growths, strict=True):
            with log.open("ab") as handle:
                handle.write(extra_bytes)
            sizes.append(log.stat().st_size)
            if label == "cold":
                for folder in ("logs", "evidence", "parts"):  # the worker's whole disk cache
                    shutil.rmtree(base / "cache" / folder, ignore_errors=True)
            times[label] = _timed(stack, watcher, job, _last_time(log), log_path)
        verdicts = _verdicts(watcher)
    if keep_log is not None:
        shutil.copyfile(base / "worker.log", keep_log)
    stages = _stages((base / "worker.log").read_text(errors="replace"))[1:]  # not the warm-up
    return {
        "finelog_bytes": sizes,
        "first_s": round(times["first"], 2),
        "second_s": round(times["second"], 2),
        "cold_s": round(times["cold"], 2),
        "second_ratio": round(times["second"] / times["first"], 3),
        "cold_ratio": round(times["cold"] / times["first"], 3),
        "verdicts": verdicts,
        "stages_s": dict(zip(("first", "second", "cold"), stages, strict=False)),
        "cache": _cache_lines((base / "worker.log").read_text(errors="replace")),
        "captures": _capture_lines((base / "worker.log").read_text(errors="replace")),
        "thaws": _thaw_lines((base / "worker.log").read_text(errors="replace")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=1000)
    parser.add_argument("--grow-pct", type=float, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep-log", type=Path, help="copy the worker's log to this file")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rlhealth-bench-growth-") as tmp:
        result = growth(Path(tmp), args.mb, args.grow_pct, args.keep_log)
    result["loadavg_before"] = [round(x, 2) for x in load_before]
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
