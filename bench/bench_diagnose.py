"""Benchmark: `rl-health diagnose` on a job directory whose finelog is ~200 MB (target ≤ 3 s wall),
beside `rl-health parse` of the same log (target: diagnose within 1 s of parse).

The job directory holds a newest-generation manifest and one of the benchmark logs
(`bench_parse.log_path`: `generated` by default). Both commands of this checkout are timed as a
user runs them, alternately: a fresh process, interpreter start-up, imports, parse, and the gates
and report (diagnose) or the tables written (parse). Each run is a cold parse (no cache).

`--now` and the manifest's `synced_at` are a minute after the log's newest line (read from its
tail), so the evidence is fresh and none of it is dated after now: the verdict is a judgement of
the log, not ERROR for evidence from the future (issue 8) or stale evidence.

    python bench/bench_diagnose.py [--mb 200] [--runs 3] [--log generated|continuous|dense|noisy]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.bench_parse import GENERATORS, log_path, other_build  # noqa: E402

RL_HEALTH = other_build(ROOT)
_LOGURU = re.compile(rb"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.\d+ \|")


def now_after(log: Path, margin_s: float = 60) -> str:
    """`margin_s` after the newest loguru timestamp in the last 1 MB of `log` (UTC, ISO-8601)."""
    with log.open("rb") as handle:
        handle.seek(max(0, log.stat().st_size - 2**20))
        stamps = _LOGURU.findall(handle.read())
    newest = max(datetime.fromisoformat(s.decode()) for s in stamps).replace(tzinfo=UTC)
    return (newest + timedelta(seconds=margin_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _job_dir(base: Path, name: str, megabytes: float) -> tuple[Path, str]:
    log = log_path(name, megabytes)
    job = base / "jobs" / "cw-bench" / "ops" / "rl-bench"
    job.mkdir(parents=True)
    shutil.copyfile(log, job / "finelog.log")
    now = now_after(log)
    manifest = {
        "bundle_format": 1,
        "cluster": "cw-bench",
        "job_id": "/ops/rl-bench",
        "synced_at": now,
        "job": {
            "job_id": "/ops/rl-bench",
            "state": "running",
            "task_state": "running",
            "submitted_at_ms": 1774558800000,
            "finished_at_ms": None,
            "entrypoint": json.dumps({"argv": ["python", "-m", "skyrl_train.entrypoints.main"]}),
        },
        "artifacts": {"finelog": "bench", "pod_logs": "not requested", "errors": []},
    }
    (job / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return job, now


def _run(job: Path, now: str) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(
        [*RL_HEALTH, "diagnose", str(job), "--now", now, "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - start, json.loads(result.stdout)["verdict"]


def _parse(log: Path, out: Path) -> float:
    start = time.perf_counter()
    argv = [*RL_HEALTH, "parse", str(log), "--out", str(out)]
    subprocess.run(argv, capture_output=True, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--log", default="generated", choices=list(GENERATORS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlhealth-bench-") as tmp:
        job, now = _job_dir(Path(tmp), args.log, args.mb)
        size = (job / "finelog.log").stat().st_size / 1e6
        walls, parses = [], []
        for _ in range(args.runs):
            wall, verdict = _run(job, now)
            walls.append(wall)
            parses.append(_parse(job / "finelog.log", Path(tmp) / "out"))
        gaps = [d - p for d, p in zip(walls, parses, strict=True)]
        print(
            f"diagnose, {args.log} finelog {size:.0f} MB, --now {now}, {args.runs} runs: "
            f"verdict {verdict}"
        )
        print(
            f"  wall median {statistics.median(walls):.2f} s, min {min(walls):.2f} s, "
            f"max {max(walls):.2f} s (target ≤ 3 s)"
        )
        rounds = ", ".join(f"{g:+.2f}" for g in gaps)
        print(f"  parse of the same log: median {statistics.median(parses):.2f} s; diagnose - "
              f"parse per round: {rounds} s (target ≤ 1 s)")  # fmt: skip


if __name__ == "__main__":
    main()
