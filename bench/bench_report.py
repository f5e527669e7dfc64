"""Benchmark: what the report costs (text, JSON, HTML and each of its plots) as the log grows.

    .venv/bin/python -m bench.bench_report [--mb 50 1000] [--runs 3] [--profile] [--json]

For each `--mb` size, a job directory holds the generated finelog of `bench/gen_finelog.py`
(cached under `bench/data/`, as `bench/bench_diagnose.py` does) and a manifest; its Evidence is
collected and judged once, in this process, as `rl-health diagnose` does. Then, side by side in
the same run, each rendering of that one report is timed `--runs` times (the median is printed):
the text and JSON reports, the whole HTML report, the plots' shared context (window, event
lines) and each plot on its own. The last columns divide the largest size's figure by the
smallest's: a rendering whose cost is bounded stays near 1x however many rows the tables hold.

Run from an older checkout (`PYTHONPATH=<checkout> .venv/bin/python -m bench.bench_report`, this
file copied there), it times the text, JSON and HTML reports only (and prints 0 points drawn): the
"before" figures in docs/performance.md's git history were taken that way from main.

Only rendering is timed: not the parse, the gates, the freeze or the store. `--profile` prints the
cProfile of one HTML rendering at the largest size (the 25 costliest functions, cumulative).
It also times, in fresh processes, the import of the plotting modules (matplotlib): paid once per
process, by the worker before it forks its pool since `reports.html` imports them.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.bench_diagnose import now_after
from bench.bench_parse import DATA
from bench.gen_finelog import generate
from reports import plots as plots_module
from reports.html import render_html
from reports.json_report import render_json
from reports.text import render_text
from shared.models import Report
from worker.diagnosis import collect_evidence, judge
from worker.evidence.case import Evidence

__all__ = ["measure"]

_TABLES = ("metrics", "phases", "engines")


def _job(base: Path, megabytes: float) -> tuple[Path, datetime]:
    """A job directory holding the `megabytes` MB finelog and a manifest synced at `now`."""
    log = DATA / f"finelog_{megabytes:g}mb.log"
    if not log.exists():
        generate(log, megabytes)
    job = base / f"jobs/cw-bench/{megabytes:g}/rl-bench"
    job.mkdir(parents=True)
    shutil.copyfile(log, job / "finelog.log")
    now = now_after(log)
    manifest = {
        "bundle_format": 1,
        "cluster": "cw-bench",
        "job_id": f"/{megabytes:g}/rl-bench",
        "synced_at": now,
        "job": {"job_id": f"/{megabytes:g}/rl-bench", "state": "running", "task_state": "running"},
        "artifacts": {"finelog": "generated", "pod_logs": "not requested", "errors": []},
    }
    (job / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return job, datetime.fromisoformat(now.replace("Z", "+00:00"))


def _median_s(work: Callable[[], object], runs: int) -> dict[str, float]:
    """Median wall and CPU (user + system, every thread of this process) seconds of `runs`."""
    walls, cpus = [], []
    for _ in range(runs):
        started, cpu = time.perf_counter(), time.process_time()
        work()
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
    return {"wall": round(statistics.median(walls), 4), "cpu": round(statistics.median(cpus), 4)}


def _pieces(report: Report, evidence: Evidence) -> dict[str, Callable[[], object]]:
    """Every rendering timed: the three reports, the plots' context, then each plot alone."""
    pieces: dict[str, Callable[[], object]] = {
        "text": lambda: render_text(report),
        "json": lambda: render_json(report),
        "html": lambda: render_html(report, evidence),
    }
    if not hasattr(plots_module, "plan"):  # a checkout from before this bench: the whole only
        return pieces
    ctx, draws = plots_module.plan(evidence)
    pieces["plots: context"] = lambda: plots_module.plan(evidence)
    for slug, draw in draws:
        pieces[f"plot {slug}"] = lambda draw=draw: draw(ctx)  # type: ignore[misc]
    return pieces


def _points(evidence: Evidence) -> dict[str, str]:
    """Each plot's caption note of the points it drew (e.g. `1,000 of 40,000 points`)."""
    plots = plots_module.render_plots(evidence)
    return {p.slug: f"{getattr(p, 'points', 0):,} of {getattr(p, 'rows', 0):,}" for p in plots}


_IMPORT = (
    "import time; import polars, pydantic, shared.models; t = time.perf_counter(); "
    "import reports.plots; print(time.perf_counter() - t)"
)


def _import_s(runs: int) -> float:
    """Median seconds a fresh process takes to import the plotting modules (matplotlib), beyond
    polars and the models: paid once per process, on the first page drawn unless imported first."""
    took = [
        float(subprocess.run([sys.executable, "-c", _IMPORT], capture_output=True, check=True,
                             text=True).stdout)
        for _ in range(runs)
    ]  # fmt: skip
    return round(statistics.median(took), 3)


def _profile(report: Report, evidence: Evidence) -> str:
    profiler = cProfile.Profile()
    profiler.runcall(render_html, report, evidence)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
    return out.getvalue()


def measure(base: Path, sizes: list[float], runs: int, profile: bool) -> dict[str, Any]:
    """Per size: the log's bytes, the tables' rows, each rendering's median seconds, the points
    each plot drew; and the largest / smallest ratio of each rendering."""
    found: dict[str, Any] = {"runs": runs, "import_plots_s": _import_s(runs), "sizes": {}}
    for megabytes in sizes:
        job, now = _job(base, megabytes)
        evidence = collect_evidence(job, now=now)
        report = judge(evidence)
        logs = evidence.logs
        assert logs is not None, "the generated log was not read"
        render_html(report, evidence)  # warm: matplotlib's font cache and imports
        found["sizes"][f"{megabytes:g}"] = {
            "log_mb": round((job / "finelog.log").stat().st_size / 1e6, 1),
            "verdict": report.verdict.value,
            "rows": {name: getattr(logs, name).height for name in _TABLES},
            "seconds": {
                name: _median_s(work, runs) for name, work in _pieces(report, evidence).items()
            },
            "points": _points(evidence),
            "html_kb": round(len(render_html(report, evidence).encode()) / 1024),
        }
        if profile and megabytes == max(sizes):
            found["profile"] = _profile(report, evidence)
        shutil.rmtree(job)
    small, large = (found["sizes"][f"{m:g}"]["seconds"] for m in (min(sizes), max(sizes)))
    found["ratio_largest_to_smallest"] = {
        name: round(large[name]["wall"] / small[name]["wall"], 2) if small[name]["wall"] else None
        for name in small
    }
    found["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return found


def _table(found: dict[str, Any]) -> str:
    sizes = list(found["sizes"])
    head = ["rendering", *(f"{s} MB wall / cpu (s)" for s in sizes), "wall ratio"]
    lines = [" | ".join(head)]
    for name, ratio in found["ratio_largest_to_smallest"].items():
        times = [found["sizes"][s]["seconds"][name] for s in sizes]
        cells = [f"{t['wall']:.3f} / {t['cpu']:.3f}" for t in times]
        lines.append(" | ".join([name, *cells, f"{ratio}x"]))
    for size in sizes:
        entry = found["sizes"][size]
        lines.append(
            f"{size} MB: log {entry['log_mb']} MB, verdict {entry['verdict']}, rows "
            f"{entry['rows']}, html {entry['html_kb']} KiB, points drawn {entry['points']}"
        )
    lines.append(f"import of the plotting modules in a fresh process: {found['import_plots_s']} s")
    lines.append(f"load average at the end: {found['load_average']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[50.0, 1000.0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlhealth-bench-report-") as tmp:
        found = measure(Path(tmp), sorted(args.mb), args.runs, args.profile)
    profile = found.pop("profile", None)
    print(json.dumps(found, indent=2) if args.json else _table(found))
    if profile:
        print(profile)


if __name__ == "__main__":
    main()
