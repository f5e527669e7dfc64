"""Are the tables the same before and after a change? `rl-health parse` of every input, by two
builds, compared file by file (byte for byte) with the command's output.

    python bench/same_tables.py write OUT_DIR [--src CHECKOUT] [--mb 200] [--fallback]
    python bench/same_tables.py compare BEFORE_DIR AFTER_DIR

`write` parses the two benchmark logs (`bench_parse.log_path`), every log of tests/fixtures/logs,
and the small hostile inputs (`bench.hostile`), each into `OUT_DIR/<name>/` (its stdout and exit
code in `OUT_DIR/<name>.out`). `--src` runs the command from another checkout (its modules first
on the path), so a build of main and this tree can be compared in one run; `--fallback` runs it
with the native pass off (`RLHEALTH_PARSE_NATIVE=0`: the polars path reads every line).
`compare` lists every file that differs or exists on one side only, and exits 1 when any does.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.bench_parse import GENERATORS, log_path  # noqa: E402
from bench.hostile import INPUTS, build  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "logs"
HOSTILE = ("long_line", "metric_records", "many_keys", "deep_mirror", "gzip_finelog")
_RUN = "import sys; from worker.cli import main; sys.argv[0] = 'rl-health'; main()"


def inputs(megabytes: float, scratch: Path) -> dict[str, Path]:
    """Every input by name."""
    found = {name: log_path(name, megabytes) for name in GENERATORS}
    for path in sorted(FIXTURES.iterdir()):
        if path.suffix in {".log", ".out", ".txt"}:
            found[f"fixture-{path.stem}"] = path
    for item in INPUTS:
        if item.name in HOSTILE:
            found[f"hostile-{item.name}"] = build(item, scratch, full=False)
    return found


def write(out: Path, src: Path | None, megabytes: float, *, fallback: bool = False) -> None:
    """Parse every input with the build at `src` (default: this tree) into `out`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHEALTH_")}
    if fallback:
        env["RLHEALTH_PARSE_NATIVE"] = "0"
    env["PYTHONPATH"] = str(src or ROOT)
    env["COLUMNS"] = "200"
    with tempfile.TemporaryDirectory() as scratch:
        for name, path in inputs(megabytes, Path(scratch)).items():
            target = out / name
            done = subprocess.run(
                [sys.executable, "-c", _RUN, "parse", str(path), "--out", str(target)],
                capture_output=True,
                text=True,
                env=env,
                cwd=scratch,
                check=False,
            )
            text = done.stdout + "\n--- stderr\n" + done.stderr.replace(str(path), "<input>")
            (out / f"{name}.out").write_text(f"exit {done.returncode}\n{text}")
            print(f"{name}: exit {done.returncode}")


def compare(before: Path, after: Path) -> list[str]:
    """Every file that differs between the two trees, or is on one side only."""
    problems = []
    names = {p.relative_to(before) for p in before.rglob("*") if p.is_file()}
    names |= {p.relative_to(after) for p in after.rglob("*") if p.is_file()}
    for name in sorted(names):
        a, b = before / name, after / name
        if not (a.exists() and b.exists()):
            problems.append(f"{name}: only in {'before' if a.exists() else 'after'}")
        elif not filecmp.cmp(a, b, shallow=False):
            problems.append(f"{name}: differs")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("out", type=Path)
    w.add_argument("--src", type=Path)
    w.add_argument("--mb", type=float, default=200)
    w.add_argument("--fallback", action="store_true")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "write":
        write(args.out, args.src, args.mb, fallback=args.fallback)
        return
    problems = compare(args.before, args.after)
    print("\n".join(problems) or "identical")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
