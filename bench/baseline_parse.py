"""A straightforward one-pass Python baseline: `re` + `json` + `ast` per line.

It follows the same rules as `worker.evidence.logs` (prefix stripping, step context, stitching,
phases, tracebacks) closely enough to give the same row counts for metrics, phases, engines and
errors on the benchmark log; it exists only to be timed against the vectorised parser.

    python bench/baseline_parse.py bench/data/finelog_200mb.log
"""

from __future__ import annotations

import ast
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["baseline_counts"]

SGR = re.compile(r"\x1b\[[0-9;]*m")
PREFIX = re.compile(
    r"^(?:\[\d\d:\d\d:\d\d\] task=(\S+) \| ?)?"
    r"(?:\((?:[^\s()]+ )?pid=(\d+)(?:, ip=([^\s()]+))?\) ?)?"
)
HEADER = re.compile(
    r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \| *[A-Z]+ *\| \S+ - ?"
    r"|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?)"
)
MIRROR = re.compile(r"WANDB_MIRROR kind=(\w+) step=(-?\d+) metrics=(\{.*\})\s*$")
TIMER = re.compile(r"^(Started|Finished): '([^']+)'(?:, time cost: ([-+\d.eE]+)s)?")
ENGINE = re.compile(r"Avg prompt throughput.*Running: \d+ reqs")
REWARD = re.compile(r"(reward/[^\s:,]+|avg_final_rewards|avg_response_length): ([^\s,]+)")
PROGRESS = re.compile(r"Training Step Progress:\s*(?:\d+%\|[^|]*\|\s*)?(\d+)\s*/\s*(\d+)")
RESUMED = re.compile(r"Resuming from global_step:?\s*(\d+)")
ERRORS = (
    "CUDA out of memory",
    "OutOfMemoryError",
    "CUDA error",
    "INTERNAL ASSERT",
    "Watchdog caught collective operation timeout",
    "ProcessGroupNCCL's watchdog got stuck",
    "ActorDiedError",
    "WorkerCrashedError",
    "RayTaskError",
    "Train loop failed",
    "Could not override '",
    "No available shared memory broadcast block",
    "ImagePullBackOff",
)
NOT_ENDS = ("Traceback", "During handling", "The above exception", ">", "│", "└", "File ")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclass
class _State:
    completed: int = 0
    post: bool = False
    attempt: int = 0
    seen: bool = False
    line: int = 0
    metrics: dict[tuple[int, str], tuple[bool, int, int]] = field(default_factory=dict)
    timers: dict[tuple[int, str], float] = field(default_factory=dict)
    engines: int = 0
    errors: int = 0
    blocks: dict[str, list[str]] = field(default_factory=dict)
    tracebacks: set[str] = field(default_factory=set)

    def put(self, step: int, values: dict[str, Any], explicit: bool) -> None:
        for key, value in values.items():
            number = _number(value.strip("'\"") if isinstance(value, str) else value)
            if number is None:
                continue
            rank = (explicit, self.attempt, self.line)
            old = self.metrics.get((step, key))
            if old is None or rank >= old:
                self.metrics[(step, key)] = rank

    def inferred_step(self) -> int:
        return self.completed if self.post else self.completed + 1


def _dict(state: _State, text: str) -> None:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return
    if not isinstance(value, dict):
        return
    if "trainer/global_step" in value:
        step = int(value["trainer/global_step"])
        state.put(step, value, explicit=True)
        state.completed = step
    elif "policy_loss" in value or "final_loss" in value:
        state.put(state.inferred_step(), {f"policy/{k}": v for k, v in value.items()}, False)


def _mirror(state: _State, msg: str) -> None:
    match = MIRROR.search(msg)
    if match is None:
        return
    try:
        values = json.loads(match.group(3))
    except json.JSONDecodeError:
        return
    if match.group(1) == "train":
        step = int(match.group(2))
        state.put(step, values, explicit=True)
        state.completed = step


def _timer(state: _State, msg: str) -> None:
    match = TIMER.match(msg)
    if match is None:
        return
    event, phase, seconds = match.groups()
    is_step = phase == "step"
    step = state.completed + 1 if (is_step or not state.post) else state.completed
    if event == "Finished" and seconds is not None:
        state.timers[(step, phase)] = float(seconds)
    if is_step:
        state.post = event == "Finished"
        state.completed += event == "Finished"


def _markers(state: _State, msg: str) -> None:
    if msg.startswith("[iris setup] step 1/"):
        state.attempt += state.seen
        state.completed, state.post = 0, False
    elif "No checkpoint found" in msg:
        state.completed = 0
    elif (match := RESUMED.search(msg) or PROGRESS.search(msg)) is not None:
        state.completed = int(match.group(1))


def _message(state: _State, actor: str, msg: str) -> None:
    if msg.startswith("{'"):
        if msg.rstrip().endswith("}"):
            _dict(state, msg)
        else:
            state.blocks[actor] = [msg]
    elif "WANDB_MIRROR kind=" in msg:
        _mirror(state, msg)
    elif msg.startswith(("Started: '", "Finished: '")):
        _timer(state, msg)
    elif msg.startswith("reward/") or "avg_final_rewards: " in msg:
        state.put(state.inferred_step(), _rewards(msg), explicit=False)
    elif ENGINE.search(msg):
        state.engines += 1
    else:
        _markers(state, msg)
    if msg.startswith("Traceback (most recent call last)"):
        state.tracebacks.add(actor)
    if msg.startswith("Traceback (most recent call last)") or any(e in msg for e in ERRORS):
        state.errors += 1


def _rewards(msg: str) -> dict[str, Any]:
    pairs = REWARD.findall(msg)
    return {(k if k.startswith("reward/") else f"loss/{k}"): v for k, v in pairs}


def _continuation(state: _State, actor: str, text: str) -> bool:
    block = state.blocks.get(actor)
    if block is None or not text.startswith(" '"):
        return False
    block.append(text)
    if text.rstrip().endswith("}"):
        del state.blocks[actor]
        _dict(state, " ".join(block))
    return True


def _line(state: _State, raw: str) -> None:
    state.line += 1
    text = SGR.sub("", raw).rstrip()
    prefix = PREFIX.match(text)
    actor = "|".join(g or "" for g in prefix.groups()) if prefix else ""
    text = text[prefix.end() :] if prefix else text
    header = HEADER.match(text)
    msg = text[header.end() :] if header else text
    ends = text and not text[0].isspace() and not text.startswith(NOT_ENDS)
    if actor in state.tracebacks and ends:
        state.tracebacks.discard(actor)
    if not _continuation(state, actor, text):
        _message(state, actor, msg)
    state.seen = state.seen or bool(raw.strip())


def _phases(state: _State) -> int:
    covered = set(state.timers)
    timing = {
        (step, key.removeprefix("timing/"))
        for step, key in state.metrics
        if key.startswith("timing/")
    }
    return len(covered | timing)


def baseline_counts(path: Path) -> dict[str, int]:
    """Row counts of metrics, phases, engines and errors, read line by line."""
    state = _State()
    with path.open(encoding="utf-8", errors="replace", newline="\n") as handle:
        for raw in handle:
            _line(state, raw.rstrip("\n"))
    return {
        "metrics": len(state.metrics),
        "phases": _phases(state),
        "engines": state.engines,
        "errors": state.errors,
    }


if __name__ == "__main__":
    print(baseline_counts(Path(sys.argv[1])))
