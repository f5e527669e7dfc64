"""Measure each input of the hostile-input corpus (issue 11, `testkit/hostile.py`).

Every input is a job directory generated on the spot (nothing big is committed): a newest-
generation manifest and the hostile part. `full` is the size the issue reported, `small` a size
the unit tests run in seconds (with a small `RLHEALTH_PARSE_MEMORY_MB` where the input is about
memory, so the same code paths are taken).

    python -m bench.hostile list
    python -m bench.hostile run [--scale full|small] [--only NAME ...] [--rss-cap-mb 6000]
                                [--rl-health PATH] [--json]

`run` times `rl-health diagnose JOB --now ... --format json` and `rl-health parse JOB --out DIR`
for each input as child processes and records the exit code, the verdict, wall time and the
child's peak RSS (`wait4`), and whether a traceback was printed. `--rss-cap-mb` kills a child
whose RSS passes the cap (to measure an old build without exhausting a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from testkit.hostile import INPUTS, NOW, Input, Ran, build, run_command

__all__ = ["INPUTS", "NOW", "Input", "Ran", "Result", "build", "measure", "run_command"]


@dataclass(frozen=True)
class Result:
    """One command on one input."""

    input: str
    command: str
    exit_code: int
    wall_s: float
    peak_rss_mb: float
    verdict: str | None
    traceback: bool
    last_line: str
    killed_at_cap: bool = False


def _verdict(stdout: str) -> str | None:
    try:
        found = json.loads(stdout).get("verdict")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def measure(
    item: Input, job: Path, rl_health: str, scale: str, cap_mb: float | None
) -> list[Result]:
    """Both commands on one generated input."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHEALTH_")}
    memory = item.memory_mb.get(scale)
    if memory is not None:
        env["RLHEALTH_PARSE_MEMORY_MB"] = str(memory)
    results = []
    with tempfile.TemporaryDirectory(prefix="hostile-out-") as out:
        commands = {
            "diagnose": [rl_health, "diagnose", str(job), "--now", NOW, "--format", "json"],
            "parse": [rl_health, "parse", str(job), "--out", out],
        }
        for name, argv in commands.items():
            ran = run_command(argv, env, cap_mb)
            tail = [line for line in (ran.stderr or ran.stdout).splitlines() if line.strip()]
            results.append(
                Result(
                    input=item.name,
                    command=name,
                    exit_code=ran.code,
                    wall_s=round(ran.wall, 2),
                    peak_rss_mb=round(ran.rss_mb),
                    verdict=_verdict(ran.stdout) if name == "diagnose" else None,
                    traceback="Traceback (most recent call last)" in ran.stderr,
                    last_line=(tail[-1] if tail else "")[:160],
                    killed_at_cap=ran.killed,
                )
            )
    return results


def _table(results: list[Result], sizes: dict[str, int]) -> str:
    rows = [
        "| input | bytes | command | exit | verdict | wall s | peak RSS MB | traceback |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rss = f"> {r.peak_rss_mb:,.0f} (killed)" if r.killed_at_cap else f"{r.peak_rss_mb:,.0f}"
        rows.append(
            f"| {r.input} | {sizes.get(r.input, 0):,} | {r.command} | {r.exit_code} | "
            f"{r.verdict or ''} | {r.wall_s} | {rss} | {'yes' if r.traceback else 'no'} |"
        )
    return "\n".join(rows)


def _log_bytes(job: Path) -> int:
    path = job / "finelog.log"
    return path.stat().st_size if path.is_file() and not path.is_symlink() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["list", "run"])
    parser.add_argument("--scale", choices=["small", "full"], default="full")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--rss-cap-mb", type=float, default=None)
    parser.add_argument("--rl-health", default=str(Path(sys.executable).with_name("rl-health")))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    chosen = [i for i in INPUTS if args.only is None or i.name in args.only]
    if args.action == "list":
        for item in chosen:
            print(f"{item.name:16s} {item.what}")
        return
    results: list[Result] = []
    sizes: dict[str, int] = {}
    for item in chosen:
        with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
            job = build(item, Path(tmp), full=args.scale == "full")
            sizes[item.name] = _log_bytes(job)
            results += measure(item, job, args.rl_health, args.scale, args.rss_cap_mb)
        print(_table(results[-2:], sizes).splitlines()[-2:], file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=1))
    else:
        print(_table(results, sizes))


if __name__ == "__main__":
    main()
