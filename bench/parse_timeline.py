"""Where the wall time of `rl-health parse` goes: a timeline of one run, by thread and phase.

    .venv/bin/python -m bench.parse_timeline LOG [--runs 5] [--events]

Each run is a fresh process that runs the command as a user does (`rl-health parse LOG --out
DIR`, in that process so its stages can be timed; the command's fast exit is turned into a
return). The stages are timed where the reader calls them: the native passes the prelude makes
while polars is imported, the prelude handing its reads over, each scan and chunk parse, the
stitching, the assembly of the tables and each table (or table part) written. Nothing the command
does is changed; the timing wrappers cost a few microseconds a call.

Printed for each run, and as medians over the runs:
- `start`: from the script's start to the first scan (interpreter start-up before the script
  is not counted: `bench_parse --fixed` measures the whole fixed cost);
- `pipeline`: from the first scan to the end of the last chunk parse, with how busy the scan
  thread and the main thread were in it (the share of its wall time spent in scans or in chunk
  parses);
- `tail`: from the end of the last chunk parse to the end of the command (stitching what is
  left, the tables assembled and written, the summary printed);
- `total`.
`--events` also prints every timed stage of the last run (thread, start, end, ms).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_T0 = time.perf_counter()
Event = tuple[str, str, float, float]  # thread, stage, start s, end s
_EVENTS: list[Event] = []


class _ExitError(Exception):
    """The command's `os._exit`, turned into a return."""


def _timed(owner: Any, name: str, label: str | None = None) -> None:
    """Replace `owner.name` with a wrapper that records each call."""
    inner: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            thread = threading.current_thread().name
            _EVENTS.append((thread, label or name, start - _T0, time.perf_counter() - _T0))

    setattr(owner, name, wrapper)


def _wrap_reader() -> None:
    """Time the reader's stages (their modules are imported by now: polars with them)."""
    from worker.evidence.logs import reader, write

    for name in ("scan", "parse_chunk", "stitch", "restitch", "build_tables"):
        _timed(reader, name)
    _timed(write, "write_frame")
    _timed(write, "_csv_part", "write_part")


def _one(log: Path, out: Path) -> list[Event]:
    """One run of the command in this process; its timed stages."""
    from worker.cli import main, parse_cmd
    from worker.evidence.logs import native, prelude

    _timed(native, "raw", "native_pass")  # the prelude's passes, before polars is imported
    _timed(prelude.Prelude, "take", "prelude_take")
    read_logs = parse_cmd._read_logs

    def read_logs_timed(*args: Any, **kwargs: Any) -> Any:
        _wrap_reader()
        return read_logs(*args, **kwargs)

    parse_cmd._read_logs = read_logs_timed  # type: ignore[assignment]

    def leave(code: int) -> None:
        raise _ExitError(code)

    os._exit = leave  # type: ignore[assignment]
    sys.argv = ["rl-health", "parse", str(log), "--out", str(out)]
    with contextlib.suppress(_ExitError, SystemExit):
        main()
    _EVENTS.append(("MainThread", "end", time.perf_counter() - _T0, time.perf_counter() - _T0))
    return _EVENTS


def _busy(events: list[Event], stage: str, start: float, stop: float) -> float:
    """Seconds of [start, stop] spent in `stage` (its calls do not overlap: one thread each)."""
    return sum(min(b, stop) - max(a, start) for _, s, a, b in events if s == stage and b > start)


def phases(events: list[Event]) -> dict[str, float]:
    """The phase figures of one run (seconds, and busy shares)."""
    scans = [e for e in events if e[1] == "scan"]
    parses = [e for e in events if e[1] == "parse_chunk"]
    end = max(b for *_, b in events)
    first = min(a for _, _, a, _ in scans)
    last = max(b for *_, b in parses)
    span = max(last - first, 1e-9)
    return {
        "start": first,
        "pipeline": last - first,
        "scan_busy": _busy(events, "scan", first, last) / span,
        "parse_busy": _busy(events, "parse_chunk", first, last) / span,
        "tail": end - last,
        "total": end,
        "scans": len(scans),
        "parses": len(parses),
    }


def _row(name: str, p: dict[str, float]) -> str:
    return (
        f"{name:>7}  start {p['start'] * 1000:5.0f} ms  pipeline {p['pipeline'] * 1000:5.0f} ms "
        f"(scan thread {p['scan_busy']:4.0%}, main {p['parse_busy']:4.0%}; "
        f"{p['scans']:.0f} scans, {p['parses']:.0f} parses)  tail {p['tail'] * 1000:4.0f} ms  "
        f"total {p['total'] * 1000:5.0f} ms"
    )


def _run_child(log: Path) -> list[Event]:
    with tempfile.TemporaryDirectory(prefix="rlh-timeline-") as out:
        argv = [sys.executable, "-m", "bench.parse_timeline", str(log), "--one", out]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the run failed ({done.returncode}): {done.stderr[-2000:]}")
    found: list[Event] = [tuple(e) for e in json.loads(done.stdout.splitlines()[-1])]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--events", action="store_true", help="every stage of the last run")
    parser.add_argument("--one", metavar="OUT", help=argparse.SUPPRESS)  # a child run
    args = parser.parse_args()
    if args.one:
        events = _one(args.log, Path(args.one))
        sys.stdout.flush()
        print("\n" + json.dumps(events))
        return
    runs = [_run_child(args.log) for _ in range(args.runs)]
    found = [phases(events) for events in runs]
    for i, p in enumerate(found, 1):
        print(_row(f"run {i}", p))
    print(_row("median", {k: statistics.median(p[k] for p in found) for k in found[0]}))
    if args.events:
        for thread, stage, a, b in sorted(runs[-1], key=lambda e: e[2]):
            took = (b - a) * 1000
            print(f"{thread[:12]:12} {a * 1000:7.1f} {b * 1000:7.1f} {took:6.1f}  {stage}")


if __name__ == "__main__":
    main()
