"""Run one drill by name and print (and save) its figures: how docs/reliability.md was made.

    .venv/bin/python -m tests.drills DRILL [--runs N] [--down S] [--env NAME=VALUE ...]

DRILL is one of the names in `DRILLS`. `DRILL_PRODUCT=/path/to/another/checkout` runs that
checkout's code (e.g. an export of main) with this checkout's environment. Figures are saved to
`$DRILL_RESULTS/<drill>.json` (default `drill-results/` under the current folder).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.drills import drills
from tests.drills.drills import Session

Drill = Callable[[Session, argparse.Namespace], dict[str, Any]]

DRILLS: dict[str, Drill] = {
    "worker-child-gate": lambda s, a: drills.worker_kill(
        s, runs=a.runs, task="rlhealth.gate", main_process=False
    ),
    "worker-child-capture": lambda s, a: drills.worker_kill(
        s, runs=a.runs, task="rlhealth.capture", main_process=False
    ),
    "worker-main-gate": lambda s, a: drills.worker_kill(
        s, runs=a.runs, task="rlhealth.gate", main_process=True, settle_s=a.settle
    ),
    "worker-main-capture": lambda s, a: drills.worker_kill(
        s, runs=a.runs, task="rlhealth.capture", main_process=True, settle_s=a.settle
    ),
    "redis-restart": lambda s, a: drills.redis_outage(
        s, runs=a.runs, down_s=a.down, crash=False, quick_s=a.quick
    ),
    "redis-crash": lambda s, a: drills.redis_outage(
        s, runs=a.runs, down_s=a.down, crash=True, quick_s=a.quick
    ),
    "s3-down": lambda s, a: drills.s3_outage(
        s, runs=a.runs, down_s=a.down, lose=False, quick_s=a.quick
    ),
    "s3-lost": lambda s, a: drills.s3_outage(
        s, runs=a.runs, down_s=a.down, lose=True, quick_s=a.quick
    ),
    "ingest-kill": lambda s, a: drills.ingest_kill(s, runs=a.runs),
    "poison": lambda s, a: drills.poison(s, runs=a.runs),
    "soft-limit-gate": lambda s, a: drills.time_limit(
        s, runs=a.runs, task="rlhealth.gate", stall_s=a.stall, kind="soft"
    ),
    "hard-limit-gate": lambda s, a: drills.time_limit(
        s, runs=a.runs, task="rlhealth.gate", stall_s=a.stall, kind="hard"
    ),
    "soft-limit-capture": lambda s, a: drills.time_limit(
        s, runs=a.runs, task="rlhealth.capture", stall_s=a.stall, kind="soft"
    ),
    "hard-limit-capture": lambda s, a: drills.time_limit(
        s, runs=a.runs, task="rlhealth.capture", stall_s=a.stall, kind="hard"
    ),
    "memory": lambda s, a: drills.memory(s, runs=a.runs, log_mb=a.log_mb),
    "containment": lambda s, a: drills.containment(s),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("drill", choices=sorted(DRILLS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--down", type=float, default=5, help="outage length (s)")
    parser.add_argument("--stall", type=float, default=20, help="time-limit drills: stop (s)")
    parser.add_argument("--settle", type=float, default=1200, help="main-process kill: wait (s)")
    parser.add_argument("--quick", type=float, default=600, help="outages: wait for answers (s)")
    parser.add_argument("--memory-limit-mb", type=int, help="run the worker in a memory cgroup")
    parser.add_argument("--log-mb", type=int, default=700, help="memory: the records' size")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the services")
    parser.add_argument("--tag", default="", help="suffix of the result file")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    workdir = Path(tempfile.mkdtemp(prefix=f"drill-{args.drill}-"))
    started = time.time()
    with drills.session(workdir, env=env, worker_memory_limit_mb=args.memory_limit_mb) as s:
        figures = DRILLS[args.drill](s, args)
        figures["product"] = s.stack.product.label
    figures["command"] = " ".join(["python -m tests.drills", *sys.argv[1:]])
    figures["wall_s"] = round(time.time() - started, 1)
    figures["load_average"] = Path("/proc/loadavg").read_text().split()[:3]
    out = Path(os.environ.get("DRILL_RESULTS") or "drill-results")
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{args.drill}{args.tag}.json"
    target.write_text(json.dumps(figures, indent=1, default=str))
    print(json.dumps(figures, indent=1, default=str))


if __name__ == "__main__":
    main()
