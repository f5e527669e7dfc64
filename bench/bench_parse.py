"""Parse benchmark: the vectorised parser against an honest per-line baseline, on two logs,
side by side in one run.

Logs (generated, seeded): `generated` (`gen_finelog.py`: restarts, tracebacks, pprint-ed dicts,
truncated records) and `continuous` (`gen_continuous.py`: one attempt, a monotonic clock, half the
bytes vLLM stat lines, one-line records only). The baseline is `baseline_honest.py` (one compiled
pattern per record kind, a literal test to pick it; same row counts, asserted).

For each log, `--runs` rounds, each running the baseline and the parser alternately:
  - commands, as a user runs them, each a fresh process: `rl-health parse LOG --out DIR`
    against `python bench/baseline_honest.py LOG` (wall, CPU, peak RSS);
  - in process: `parse_log_file` against `baseline_tables` (wall);
and the ratio baseline / parser of the medians. Then an in-process re-parse after 1% growth
(`LogCache`) against the first parse, and (`--gb`) the peak RSS of `rl-health parse` on a big
generated log.

    python bench/bench_parse.py [--mb 200] [--runs 3] [--gb 1] [--logs generated continuous]
                                [--rl-health OTHER_BUILD] [--also NAME=CHECKOUT ...]
                                [--baseline-writes] [--fixed] [--fallback]

`--also main=/path/to/checkout` times `rl-health parse` of another checkout (its modules first on
the path) in the same rounds, so a change and main are compared side by side. `--baseline-writes`
makes the baseline write its tables as CSV too (`baseline_honest.py --out`), as the parser does.
`--fixed` also times both commands on a one-line log: the fixed cost (interpreter, imports, exit)
beside the cost per MB, and the log size at which the ratio would reach 3x. `--fallback` also
times this build with its native stat-line pass off (`RLHEALTH_PARSE_NATIVE=0`: the polars path
every line takes when the extension is not built).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.baseline_honest import baseline_tables, counts  # noqa: E402
from bench.gen_continuous import generate_continuous  # noqa: E402
from bench.gen_finelog import generate  # noqa: E402
from bench.gen_records import generate_dense, generate_noisy  # noqa: E402
from bench.hostile import Ran, run_command  # noqa: E402
from worker.evidence.log_cache import LogCache  # noqa: E402
from worker.evidence.logs import parse_log_file  # noqa: E402
from worker.evidence.model import LogTables  # noqa: E402

DATA = ROOT / "bench" / "data"
BASELINE = str(ROOT / "bench" / "baseline_honest.py")
GENERATORS: dict[str, Callable[[Path, float], Path]] = {
    "generated": generate,
    "continuous": generate_continuous,
    "dense": generate_dense,
    "noisy": generate_noisy,
}
COUNTED = ("metrics", "phases", "engines", "progress")


def log_path(name: str, megabytes: float) -> Path:
    """The generated log `name` of about `megabytes` MB (made once, then reused)."""
    stem = "finelog" if name == "generated" else name
    path = DATA / f"{stem}_{megabytes:g}mb.log"
    if not path.exists():
        GENERATORS[name](path, megabytes)
    return path


def child(argv: list[str]) -> Ran:
    """Run `argv` (output discarded) under the measuring wrapper of `bench.hostile`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHEALTH_")}
    ran = run_command(argv, env)
    if ran.code != 0:
        raise RuntimeError(f"{argv} exited {ran.code}: {ran.stderr[-500:]}")
    return ran


def _counts(tables: LogTables) -> dict[str, int]:
    return {name: getattr(tables, name).height for name in COUNTED}


def _timed(work: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    found = work()
    return time.perf_counter() - start, found


@dataclass
class Rounds:
    """The measures of one log over the rounds."""

    ours: list[Ran]
    base: list[Ran]
    lib: list[float]
    base_lib: list[float]
    others: dict[str, list[Ran]] = field(default_factory=dict)


_RUN = "import sys; from worker.cli import main; sys.argv[0] = 'rl-health'; main()"


def other_build(checkout: Path) -> list[str]:
    """The argv prefix that runs `rl-health` from `checkout` (its modules first on the path)."""
    return ["env", f"PYTHONPATH={checkout.resolve()}", sys.executable, "-P", "-c", _RUN]


@dataclass(frozen=True)
class Setup:
    """What each round runs."""

    rl_health: list[str]
    others: dict[str, list[str]]
    baseline_writes: bool = False
    in_process: bool = True


def _base_argv(path: Path, out: str, setup: Setup) -> list[str]:
    argv = [sys.executable, BASELINE, str(path)]
    return [*argv, "--out", out] if setup.baseline_writes else argv


def _commands(path: Path, rounds: Rounds, setup: Setup) -> None:
    target = str(path.resolve())
    with tempfile.TemporaryDirectory() as out:
        rounds.base.append(child(_base_argv(path, out + "/base", setup)))
        rounds.ours.append(child([*setup.rl_health, "parse", target, "--out", out + "/ours"]))
        for name, argv in setup.others.items():
            ran = child([*argv, "parse", target, "--out", f"{out}/{name}"])
            rounds.others.setdefault(name, []).append(ran)


def _round(path: Path, rounds: Rounds, setup: Setup) -> None:
    _commands(path, rounds, setup)
    if not setup.in_process:
        return
    wall, found = _timed(lambda: baseline_tables(path))
    rounds.base_lib.append(wall)
    base_counts = counts(found)  # type: ignore[arg-type]
    wall, tables = _timed(lambda: parse_log_file(path, "finelog.log"))
    rounds.lib.append(wall)
    ours = _counts(tables)  # type: ignore[arg-type]
    assert ours == {k: base_counts[k] for k in COUNTED}, (ours, base_counts)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _report(name: str, path: Path, r: Rounds) -> None:
    size = path.stat().st_size / 1e6
    ours_wall, base_wall = _median([c.wall for c in r.ours]), _median([c.wall for c in r.base])
    per_round = [b.wall / o.wall for b, o in zip(r.base, r.ours, strict=True)]
    lib_ratios = [b / o for b, o in zip(r.base_lib, r.lib, strict=True)]
    print(f"\n{name}: {path.name} ({size:.0f} MB), {len(r.ours)} rounds (medians)")
    print("| measure | parser | baseline | ratio baseline/parser |")
    print("|---|---|---|---|")
    print(
        f"| command wall s | {ours_wall:.2f} | {base_wall:.2f} | {base_wall / ours_wall:.2f}x "
        f"(rounds {min(per_round):.2f}-{max(per_round):.2f}) |"
    )
    ours_cpu, base_cpu = _median([c.cpu for c in r.ours]), _median([c.cpu for c in r.base])
    print(f"| command CPU s | {ours_cpu:.2f} | {base_cpu:.2f} | {base_cpu / ours_cpu:.2f}x |")
    ours_rss, base_rss = _median([c.rss_mb for c in r.ours]), _median([c.rss_mb for c in r.base])
    log_mib = path.stat().st_size / 2**20  # RSS is in MiB (ru_maxrss KiB / 1024)
    print(
        f"| command peak RSS MiB | {ours_rss:.0f} ({ours_rss / log_mib:.2f}x the log) | "
        f"{base_rss:.0f} | |"
    )
    for other, runs in r.others.items():
        wall, cpu = _median([c.wall for c in runs]), _median([c.cpu for c in runs])
        rss = _median([c.rss_mb for c in runs])
        print(
            f"| {other}: wall s, CPU s, peak RSS MiB | {wall:.2f}, {cpu:.2f}, {rss:.0f} | | "
            f"{base_wall / wall:.2f}x wall, {base_cpu / cpu:.2f}x CPU |"
        )
    if r.lib:
        lib, base_lib = _median(r.lib), _median(r.base_lib)
        print(
            f"| in process wall s | {lib:.2f} ({size / lib:.0f} MB/s) | {base_lib:.2f} | "
            f"{base_lib / lib:.2f}x (rounds {min(lib_ratios):.2f}-{max(lib_ratios):.2f}) |"
        )


def _tiny_log() -> Path:
    """A one-record log: what a command costs whatever the log (interpreter, imports, exit)."""
    path = DATA / "tiny.log"
    DATA.mkdir(parents=True, exist_ok=True)
    record = 'WANDB_MIRROR kind=train step=1 metrics={"reward/avg_raw_reward": 0.5}'
    path.write_text(f"[21:00:00] task=/ops/rl-bench/0 | {record}\n")
    return path


def _crossing(name: str, path: Path, r: Rounds, fixed: Rounds) -> None:
    """Fixed and per-MB wall costs of both commands, and the size at which the ratio is 3x."""
    size = path.stat().st_size / 1e6
    f_ours, f_base = _median([c.wall for c in fixed.ours]), _median([c.wall for c in fixed.base])
    ours, base = _median([c.wall for c in r.ours]), _median([c.wall for c in r.base])
    p_ours, p_base = (ours - f_ours) / size, (base - f_base) / size
    print(
        f"{name}: fixed wall {f_ours * 1000:.0f} ms (baseline {f_base * 1000:.0f} ms); per MB "
        f"{p_ours * 1000:.2f} ms (baseline {p_base * 1000:.2f} ms); ratio at large sizes "
        f"{p_base / p_ours:.2f}x"
    )
    if p_base > 3 * p_ours:
        at = (3 * f_ours - f_base) / (p_base - 3 * p_ours)
        print(f"{name}: the ratio reaches 3x at about {at:,.0f} MB of log")
    else:
        print(f"{name}: the ratio never reaches 3x (per-MB cost above a third of the baseline's)")


def regrowth(path: Path) -> tuple[float, float]:
    """First parse and re-parse after 1% growth, in process with a `LogCache`."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "finelog.log"
        shutil.copyfile(path, copy)
        cache = LogCache()
        first, _ = _timed(lambda: parse_log_file(copy, "finelog.log", cache=cache))
        growth = path.read_bytes()[: path.stat().st_size // 100]
        with copy.open("ab") as handle:
            handle.write(growth)
        again, _ = _timed(lambda: parse_log_file(copy, "finelog.log", cache=cache))
        return first, again


def main() -> None:
    """Run the benchmark and print its tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gb", type=float, default=0)
    parser.add_argument("--logs", nargs="*", default=list(GENERATORS), choices=list(GENERATORS))
    parser.add_argument("--rl-health", help="the command to time (default: this checkout's)")
    parser.add_argument("--also", nargs="*", default=[], metavar="NAME=CHECKOUT")
    parser.add_argument("--baseline-writes", action="store_true")
    parser.add_argument("--fixed", action="store_true")
    parser.add_argument("--no-in-process", action="store_true")
    parser.add_argument("--no-regrowth", action="store_true")
    parser.add_argument("--fallback", action="store_true")
    args = parser.parse_args()
    others = {name: other_build(Path(at)) for name, at in (a.split("=", 1) for a in args.also)}
    ours = [args.rl_health] if args.rl_health else other_build(ROOT)
    if args.fallback:  # the same build with the native pass off (the polars path)
        others["fallback"] = ["env", "RLHEALTH_PARSE_NATIVE=0", *ours]
    setup = Setup(ours, others, args.baseline_writes, not args.no_in_process)
    paths = {name: log_path(name, args.mb) for name in args.logs}
    results = {name: Rounds([], [], [], []) for name in args.logs}
    tiny = _tiny_log() if args.fixed else None
    fixed = Rounds([], [], [], [])
    load = os.getloadavg()
    for _ in range(args.runs):
        for name, path in paths.items():  # the logs alternate too
            _round(path, results[name], setup)
        if tiny is not None:
            _commands(tiny, fixed, setup)
    after = os.getloadavg()
    print(f"load average before: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; after: {after[0]:.1f} "
          f"{after[1]:.1f} {after[2]:.1f}; cores {os.cpu_count()}")  # fmt: skip
    for name, path in paths.items():
        _report(name, path, results[name])
        if tiny is not None:
            _crossing(name, path, results[name], fixed)
    if args.no_regrowth:
        return
    for name, path in paths.items():
        first, again = regrowth(path)
        print(
            f"\n{name}: re-parse after 1% growth {again:.2f} s = {again / first:.1%} of the first"
        )
    if args.gb > 0:
        big = log_path("generated", args.gb * 1000)
        with tempfile.TemporaryDirectory() as out:
            peak = child([*ours, "parse", str(big), "--out", out])
        size = big.stat().st_size / 1e6
        rss = f"peak RSS {peak.rss_mb:.0f} MiB"
        print(f"\nrl-health parse, {size:.0f} MB: {rss}, {peak.wall:.2f} s")


if __name__ == "__main__":
    main()
