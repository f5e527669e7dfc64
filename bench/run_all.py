"""Run every benchmark, one after another, as `make bench` does.

    python -m bench.run_all

Each benchmark prints its own table; the results, with these commands, are recorded in
docs/performance.md. Run on a quiet machine: the absolute targets (MB/s, seconds) are sensitive
to other load, the ratios measured side by side in one run much less so.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = (
    [sys.executable, "bench/bench_parse.py", "--mb", "200", "--runs", "3", "--gb", "1"],
    [sys.executable, "bench/bench_diagnose.py", "--mb", "200", "--runs", "3"],
    [sys.executable, "-m", "bench.bench_pipeline"],
    [sys.executable, "-m", "bench.bench_growth", "--mb", "1000"],
    [sys.executable, "-m", "bench.bench_live", "--alerts", "10", "--warmup", "1", "--mb", "50"],
)


def main() -> None:
    for argv in BENCHMARKS:
        print("$", " ".join(argv[1:]), flush=True)
        subprocess.run(argv, cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
