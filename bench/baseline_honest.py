"""An honest per-line baseline: what a user would write to get the same tables with `re`.

One pass over the lines; one cheap literal test picks the record kind and one compiled pattern per
kind reads it (`json` for WANDB_MIRROR records, `ast.literal_eval` for a policy dict or a console
dict, which pprint spreads over lines: those are gathered until the line that closes them).
No prefix stripping, no per-line work a user would not write: lines of no kind cost one or two
`in` tests. It keeps the same rows the parser keeps (engine stat rows with their fields, one metric
per step and key, the newest phase timer per step and phase, progress rows) so that the row
counts can be compared; times are kept as the strings the log prints (no conversion).

    python bench/baseline_honest.py bench/data/continuous_200mb.log [--out DIR]

With `--out` it also writes the tables as CSV (the `csv` module), as `rl-health parse` does.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Tables", "baseline_tables"]

ENGINE = re.compile(
    r"pid=(\d+)(?:, ip=([^\s)]+))?\)\S* (?:INFO|WARNING) (\d\d-\d\d \d\d:\d\d:\d\d) \S+ "
    r"Engine (\d+): Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: "
    r"([\d.]+) tokens/s, Running: (\d+) reqs, (?:Swapped: \d+ reqs, )?Waiting: (\d+) reqs, "
    r"GPU KV cache usage: ([\d.]+)%, Prefix cache hit rate: ([\d.]+)%"
)
MIRROR = re.compile(r"WANDB_MIRROR kind=(\w+) step=(-?\d+) metrics=(\{.*\})\s*$")
TIMER = re.compile(r" - (Started|Finished): '([^']+)'(?:, time cost: ([-+\d.eE]+)s)?")
POLICY = re.compile(r" - (\{'(?:final_loss|policy_loss)'.*\})\s*$")
DICT_START = re.compile(r" - (\{'.*)$")
REWARD = re.compile(r"(reward/[^\s:,]+|avg_final_rewards|avg_response_length): ([^\s,]+)")
PROGRESS = re.compile(r"Training Step Progress: (\d+) / (\d+)")
RESUMED = re.compile(r"Resuming from global_step:?\s*(\d+)")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclass
class Tables:
    """What one pass keeps."""

    engines: list[tuple[Any, ...]] = field(default_factory=list)
    metrics: dict[tuple[int, str], tuple[float, int]] = field(default_factory=dict)
    timers: dict[tuple[int, str], tuple[float, int]] = field(default_factory=dict)
    progress: list[tuple[int, int, int]] = field(default_factory=list)
    errors: int = 0
    completed: int = 0
    post: bool = False
    open_dict: list[str] | None = None  # a console dict printed over several lines

    def put(self, step: int, values: dict[str, Any], line: int, prefix: str = "") -> None:
        for key, value in values.items():
            number = _number(value)
            if number is not None:
                self.metrics[(step, prefix + key)] = (number, line)

    def phases(self) -> int:
        timing = {(s, k[7:]) for s, k in self.metrics if k.startswith("timing/")}
        return len(timing | set(self.timers))


def _timer(t: Tables, line: str, n: int) -> None:
    match = TIMER.search(line)
    if match is None:
        return
    event, phase, seconds = match.groups()
    is_step = phase == "step"
    step = t.completed + 1 if (is_step or not t.post) else t.completed
    if event == "Finished" and seconds is not None:
        t.timers[(step, phase)] = (float(seconds), n)
    if is_step:
        t.post = event == "Finished"
        t.completed += event == "Finished"


def _mirror(t: Tables, line: str, n: int) -> None:
    match = MIRROR.search(line)
    if match is None or match.group(1) != "train":
        return
    try:
        values = json.loads(match.group(3))
    except ValueError:
        return
    step = int(match.group(2))
    t.put(step, values, n)
    t.completed = step


def _policy(t: Tables, line: str, n: int) -> None:
    match = POLICY.search(line)
    if match is None:
        return
    try:
        values = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError):
        return
    t.put(t.completed if t.post else t.completed + 1, values, n, "policy/")


def _rewards(t: Tables, line: str, n: int) -> None:
    step = t.completed if t.post else t.completed + 1
    for key, value in REWARD.findall(line):
        name = key if key.startswith("reward/") else f"loss/{key}"
        t.put(step, {name: value}, n)


def _console(t: Tables, text: str, n: int) -> None:
    try:
        values = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return
    if isinstance(values, dict) and "trainer/global_step" in values:
        step = int(values["trainer/global_step"])
        t.put(step, values, n)
        t.completed = step


def _dict_line(t: Tables, line: str, n: int) -> None:
    """A line of an open console dict: its text after the process prefix."""
    assert t.open_dict is not None
    at = line.find(" '")
    t.open_dict.append(line[at:].rstrip() if at >= 0 else "")
    if line.rstrip().endswith("}"):
        text, t.open_dict = " ".join(t.open_dict), None
        _console(t, text, n)


def _progress(t: Tables, line: str, n: int) -> None:
    match = PROGRESS.search(line)
    if match is not None:
        done = int(match.group(1))
        t.progress.append((n, done, int(match.group(2))))
        t.completed = done


def _other(t: Tables, line: str, n: int) -> None:
    """The rare kinds: a user tests their literals only on lines that hold none of the above."""
    if "Started: '" in line or "Finished: '" in line:
        _timer(t, line, n)
    elif "WANDB_MIRROR" in line:
        _mirror(t, line, n)
    elif "reward/" in line or "avg_final_rewards" in line:
        _rewards(t, line, n)
    elif "Training Step Progress" in line:
        _progress(t, line, n)
    elif "_loss'" in line:
        _policy(t, line, n)
    elif "{'" in line and (m := DICT_START.search(line)):
        t.open_dict = [m.group(1).rstrip()]
    elif "No checkpoint found" in line or "[iris setup] step 1/" in line:
        t.completed, t.post = 0, False
    elif "Resuming from global_step" in line and (m := RESUMED.search(line)):
        t.completed = int(m.group(1))
    if "Error" in line or "Traceback" in line:
        t.errors += 1


def baseline_tables(path: Path) -> Tables:
    """The tables of `path`, read line by line."""
    t = Tables()
    engines = t.engines
    with path.open(encoding="utf-8", errors="replace", newline="\n") as handle:
        for n, line in enumerate(handle, 1):
            if "Avg prompt throughput" in line:
                match = ENGINE.search(line)
                if match is not None:
                    pid, ip, ts, idx, prompt, gen, run, wait, kv, hit = match.groups()
                    engine = f"{pid}@{ip}/{idx}" if ip else f"{pid}/{idx}"
                    engines.append(
                        (ts, engine, int(run), int(wait), float(kv), float(gen), float(prompt),
                         float(hit), n)
                    )  # fmt: skip
            elif t.open_dict is not None:
                _dict_line(t, line, n)
            else:
                _other(t, line, n)
    return t


def counts(t: Tables) -> dict[str, int]:
    """Row counts comparable with the parser's tables."""
    return {
        "metrics": len(t.metrics),
        "phases": t.phases(),
        "engines": len(t.engines),
        "progress": len(t.progress),
    }


def write_csv(t: Tables, out: Path) -> None:
    """The tables as CSV files, as a user would write them."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "engines.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["timestamp", "engine", "running", "waiting", "kv_cache_pct",
                         "generation_tokens_per_s", "prompt_tokens_per_s",
                         "prefix_cache_hit_pct", "line"])  # fmt: skip
        writer.writerows(t.engines)
    with (out / "metrics.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", "key", "value", "line"])
        writer.writerows((s, k, v, n) for (s, k), (v, n) in sorted(t.metrics.items()))
    with (out / "phases.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", "phase", "seconds", "line"])
        writer.writerows((s, p, v, n) for (s, p), (v, n) in sorted(t.timers.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tables = baseline_tables(args.path)
    if args.out is not None:
        write_csv(tables, args.out)
    print(counts(tables), file=sys.stderr)


if __name__ == "__main__":
    main()
