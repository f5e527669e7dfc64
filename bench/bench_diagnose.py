"""Benchmark: `rl-health diagnose` on a job directory whose finelog is ~200 MB (target ≤ 3 s wall).

The job directory holds a newest-generation manifest and the generated finelog of
`bench/gen_finelog.py` (Iris and Ray prefixes, trainer timers, WANDB_MIRROR records, vLLM stat
lines, tracebacks). The command is timed as a user runs it: a fresh process, interpreter start-up,
imports, parse, gates and rendering included. Each run is a cold parse (no cache directory).

`--now` and the manifest's `synced_at` are a minute after the log's newest line (read from its
tail), so the evidence is fresh and none of it is dated after now: the verdict is a judgement of
the log, not ERROR for evidence from the future (issue 8) or stale evidence.

    python bench/bench_diagnose.py [--mb 200] [--runs 3]
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
sys.path[:0] = [str(ROOT / "bench")]

from gen_finelog import generate  # noqa: E402

DATA = ROOT / "bench" / "data"
RL_HEALTH = str(Path(sys.executable).with_name("rl-health"))
_LOGURU = re.compile(rb"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.\d+ \|")


def now_after(log: Path, margin_s: float = 60) -> str:
    """`margin_s` after the newest loguru timestamp in the last 1 MB of `log` (UTC, ISO-8601)."""
    with log.open("rb") as handle:
        handle.seek(max(0, log.stat().st_size - 2**20))
        stamps = _LOGURU.findall(handle.read())
    newest = max(datetime.fromisoformat(s.decode()) for s in stamps).replace(tzinfo=UTC)
    return (newest + timedelta(seconds=margin_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _job_dir(base: Path, megabytes: float) -> tuple[Path, str]:
    log = DATA / f"finelog_{megabytes:g}mb.log"
    if not log.exists():
        generate(log, megabytes)
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
        [RL_HEALTH, "diagnose", str(job), "--now", now, "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - start, json.loads(result.stdout)["verdict"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlhealth-bench-") as tmp:
        job, now = _job_dir(Path(tmp), args.mb)
        size = (job / "finelog.log").stat().st_size / 1e6
        walls = []
        for _ in range(args.runs):
            wall, verdict = _run(job, now)
            walls.append(wall)
        print(f"diagnose, finelog {size:.0f} MB, --now {now}, {args.runs} runs: verdict {verdict}")
        print(f"  wall median {statistics.median(walls):.2f} s, min {min(walls):.2f} s, "
              f"max {max(walls):.2f} s (target ≤ 3 s)")  # fmt: skip


if __name__ == "__main__":
    main()
