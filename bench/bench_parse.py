"""Benchmark of the vectorised log parser against the per-line Python baseline.

Measures, in one run:
  (a) `parse_log_file` in process, `python -m worker.evidence.logs FILE --out DIR` as a subprocess
      (import + parse + write), and `bench/baseline_parse.py`: seconds, MB/s, speed ratio; the row
      counts of metrics/phases/engines/errors must match;
  (b) peak RSS of a child process parsing a 1 GB log (`--gb 0` skips it);
  (c) an in-process re-parse with a `LogCache` after the file grew by 1%, against the first parse.

    python bench/bench_parse.py [--mb 200] [--gb 1]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from baseline_parse import baseline_counts  # noqa: E402
from gen_finelog import generate  # noqa: E402

from worker.evidence.logs import LogCache, parse_log_file  # noqa: E402
from worker.evidence.model import LogTables  # noqa: E402

DATA = ROOT / "bench" / "data"
COUNTED = ("metrics", "phases", "engines", "errors")
RSS_CHILD = """
import resource, sys
from pathlib import Path
from worker.evidence.logs import parse_log_file
tables = parse_log_file(Path(sys.argv[1]), "finelog.log")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _log(megabytes: float) -> Path:
    path = DATA / f"finelog_{megabytes:g}mb.log"
    if not path.exists():
        generate(path, megabytes)
    return path


def _counts(tables: LogTables) -> dict[str, int]:
    return {name: getattr(tables, name).height for name in COUNTED}


def _timed_library(path: Path) -> tuple[float, dict[str, int]]:
    start = time.perf_counter()
    tables = parse_log_file(path, "finelog.log")
    return time.perf_counter() - start, _counts(tables)


def _timed_subprocess(path: Path) -> float:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        command = [sys.executable, "-m", "worker.evidence.logs", str(path), "--out", out]
        subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
        return time.perf_counter() - start


def _timed_baseline(path: Path) -> tuple[float, dict[str, int]]:
    start = time.perf_counter()
    counts = baseline_counts(path)
    return time.perf_counter() - start, counts


def _peak_rss_mb(path: Path) -> float:
    done = subprocess.run(
        [sys.executable, "-c", RSS_CHILD, str(path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout.split()[-1]) / 1024


def _regrowth(path: Path) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "finelog.log"
        shutil.copyfile(path, copy)
        cache = LogCache()
        start = time.perf_counter()
        parse_log_file(copy, "finelog.log", cache=cache)
        first = time.perf_counter() - start
        growth = path.read_bytes()[: path.stat().st_size // 100]
        with copy.open("ab") as handle:
            handle.write(growth)
        start = time.perf_counter()
        parse_log_file(copy, "finelog.log", cache=cache)
        return first, time.perf_counter() - start


def _row(name: str, value: str, target: str) -> None:
    print(f"| {name:<44} | {value:>14} | {target:>10} |")


def main() -> None:
    """Run the benchmark and print a table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--gb", type=float, default=1)
    args = parser.parse_args()
    path = _log(args.mb)
    size_mb = path.stat().st_size / 1e6
    lib_s, lib_counts = _timed_library(path)
    sub_s = _timed_subprocess(path)
    base_s, base_counts = _timed_baseline(path)
    assert lib_counts == base_counts, (lib_counts, base_counts)
    first, again = _regrowth(path)
    print(f"log: {path} ({size_mb:.0f} MB); rows {lib_counts}")
    _row("measure", "value", "target")
    _row("library parse_log_file (s)", f"{lib_s:.2f}", "")
    _row("library MB/s", f"{size_mb / lib_s:.0f}", ">= 250")
    _row("subprocess python -m worker.evidence.logs (s)", f"{sub_s:.2f}", "")
    _row("subprocess MB/s (import+parse+write)", f"{size_mb / sub_s:.0f}", "")
    _row("baseline re/json/ast per line (s)", f"{base_s:.2f}", "")
    _row("speed ratio baseline / library", f"{base_s / lib_s:.1f}x", ">= 4x")
    _row("re-parse after 1% growth / first parse", f"{again / first:.1%}", "<= 10%")
    if args.gb > 0:
        big = _log(args.gb * 1000)
        label = f"peak RSS parsing {big.stat().st_size / 1e9:.2f} GB (MB)"
        _row(label, f"{_peak_rss_mb(big):.0f}", "<= 1500")


if __name__ == "__main__":
    main()
