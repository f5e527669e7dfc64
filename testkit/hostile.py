"""The hostile-input corpus (issue 11), and a runner that measures one command.

Every input is a job directory generated on the spot (nothing big is committed): a newest-
generation manifest and the hostile part. `full` is the size the issue reported, `small` a size
the unit tests run in seconds (with a small `RLHEALTH_PARSE_MEMORY_MB` where the input is about
memory, so the same code paths are taken). `run_command` runs a command under a small wrapper
that reports its peak RSS and CPU time (and kills it past an RSS cap); `bench/hostile.py` measures
every input with it, the tests check what the commands answer.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["INPUTS", "NOW", "Input", "Ran", "build", "run_command"]

NOW = "2026-03-27T08:00:00Z"
_MB = 1_000_000
_SUBMITTED_MS = 1774558800000  # 2026-03-26T21:00:00Z
_IRIS = "[21:00:00] task=/ops/hostile/0 | "


@dataclass(frozen=True)
class Input:
    """One hostile input: what it is, how to build it at each scale, the memory setting."""

    name: str
    what: str
    build: Callable[[Path, bool], None]  # (job directory, full size?)
    memory_mb: dict[str, int | None]  # RLHEALTH_PARSE_MEMORY_MB per scale (None: the default)


def _manifest(job: Path, artifacts: dict[str, Any] | None = None) -> None:
    name = job.name
    manifest = {
        "bundle_format": 1,
        "cluster": "cw-hostile",
        "job_id": f"/ops/{name}",
        "synced_at": "2026-03-27T07:59:00Z",
        "job": {
            "job_id": f"/ops/{name}",
            "state": "running",
            "task_state": "running",
            "submitted_at_ms": _SUBMITTED_MS,
            "finished_at_ms": None,
            "entrypoint": json.dumps({"argv": ["python", "-m", "skyrl_train.entrypoints.main"]}),
        },
        "artifacts": artifacts or {"finelog": "synced", "pod_logs": "not requested", "errors": []},
    }
    (job / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def _write_repeated(path: Path, head: bytes, unit: bytes, size: int, tail: bytes = b"") -> None:
    """`head`, then `unit` repeated to about `size` bytes, then `tail`, written in 8 MB blocks."""
    block = unit * max(1, (8 * _MB) // len(unit))
    with path.open("wb") as handle:
        handle.write(head)
        written = len(head)
        while written < size:
            part = block[: size - written]
            handle.write(part)
            written += len(part)
        handle.write(tail)


def _long_line(job: Path, full: bool) -> None:
    """One line of 300 MB (16 MB small) without a newline: an unclosed WANDB_MIRROR record."""
    _manifest(job)
    head = (_IRIS + "WANDB_MIRROR kind=train step=1 metrics={").encode()
    _write_repeated(job / "finelog.log", head, b'"policy/k": 1.0, ', (300 if full else 16) * _MB)


def _sparse(size: int) -> Callable[[Path, bool], None]:
    def build(job: Path, full: bool) -> None:
        _manifest(job)
        with (job / "finelog.log").open("wb") as handle:
            handle.truncate(size if full else 32 * _MB)

    build.__doc__ = f"A sparse finelog of {size // _MB:,} MB of NUL bytes (32 MB small)."
    return build


def _record(step: int, keys: list[str]) -> bytes:
    body = ", ".join(f'"{key}": {0.5 + (step % 97) / 1000:.6f}' for key in keys)
    return f"{_IRIS}WANDB_MIRROR kind=train step={step} metrics={{{body}}}\n".encode()


def _metric_records(job: Path, full: bool) -> None:
    """2.2 GB (40 MB small) of WANDB_MIRROR records, 37 metrics each, one step a line."""
    _manifest(job)
    keys = [f"policy/k{i}" for i in range(24)] + [f"generate/g{i}" for i in range(12)]
    keys.append("reward/avg_raw_reward")
    size = (2200 if full else 40) * _MB
    with (job / "finelog.log").open("wb") as handle:
        step, written, block = 0, 0, []
        while written < size:
            step += 1
            line = _record(step, keys)
            block.append(line)
            written += len(line)
            if len(block) == 10_000:
                handle.write(b"".join(block))
                block.clear()
        handle.write(b"".join(block))


def _many_keys(n_keys: int) -> Callable[[Path, bool], None]:
    def build(job: Path, full: bool) -> None:
        _manifest(job)
        keys = n_keys if full else n_keys // 10
        per_record = 100
        with (job / "finelog.log").open("wb") as handle:
            for step in range(1, keys // per_record + 1):
                names = [f"k{step * per_record + i:06d}" for i in range(per_record)]
                handle.write(_record(step, names))

    build.__doc__ = f"{n_keys:,} distinct metric keys (a tenth small), 100 new keys a record."
    return build


def _deep(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def _deep_manifest(job: Path, full: bool) -> None:
    """manifest.json nested 100,000 levels deep."""
    (job / "manifest.json").write_text(_deep(100_000), encoding="utf-8")
    (job / "finelog.log").write_bytes(_record(1, ["reward/avg_raw_reward"]))


def _deep_trial(job: Path, full: bool) -> None:
    """One Harbor trial result.json nested 100,000 levels deep (the other trial is fine)."""
    _manifest(job)
    (job / "finelog.log").write_bytes(_record(1, ["reward/avg_raw_reward"]))
    for name, text in (("t-deep", _deep(100_000)), ("t-ok", '{"trial_name": "t-ok"}')):
        trial = job / "trace_jobs" / "run" / name
        trial.mkdir(parents=True)
        (trial / "result.json").write_text(text, encoding="utf-8")


def _deep_mirror(job: Path, full: bool) -> None:
    """A WANDB_MIRROR record whose metrics nest 100,000 levels deep."""
    _manifest(job)
    line = f"{_IRIS}WANDB_MIRROR kind=train step=1 metrics={_deep(100_000)}\n"
    (job / "finelog.log").write_text(line, encoding="utf-8")


def _gzip(job: Path, full: bool) -> None:
    """A gzip-compressed finelog (a real log, 20 MB before compression; 2 MB small)."""
    _manifest(job)
    lines = b"".join(_record(step, ["reward/avg_raw_reward"]) for step in range(1, 2001))
    raw = lines * max(1, (20 if full else 2) * _MB // len(lines))
    (job / "finelog.log").write_bytes(gzip.compress(raw, compresslevel=1))


def _symlink_loop(job: Path, full: bool) -> None:
    """finelog.log is a symlink to itself."""
    _manifest(job)
    (job / "finelog.log").symlink_to("finelog.log")


def _huge_int(job: Path, full: bool) -> None:
    """One trial result.json holds a 400-digit integer (the other trial is fine)."""
    _manifest(job)
    (job / "finelog.log").write_bytes(_record(1, ["reward/avg_raw_reward"]))
    big = "1" + "0" * 400
    results = {
        "t-huge": f'{{"trial_name": "t-huge", "agent_result": {{"n_input_tokens": {big}}}}}',
        "t-ok": '{"trial_name": "t-ok"}',
    }
    for name, text in results.items():
        trial = job / "trace_jobs" / "run" / name
        trial.mkdir(parents=True)
        (trial / "result.json").write_text(text, encoding="utf-8")


INPUTS: tuple[Input, ...] = (
    Input(
        "long_line", "one 300 MB line without a newline", _long_line, {"small": 64, "full": None}
    ),
    Input("nul_256mb", "a 256 MB sparse file of NUL bytes", _sparse(256 * _MB), {"small": 256}),
    Input("nul_2gb", "a 2 GB sparse file of NUL bytes", _sparse(2048 * _MB), {"small": 256}),
    Input(
        "metric_records",
        "2.2 GB of WANDB_MIRROR records (37 metrics a line)",
        _metric_records,
        {"small": 256},
    ),
    Input("many_keys", "300,000 distinct metric keys (6.8 MB)", _many_keys(300_000), {}),
    Input("many_keys_17mb", "750,000 distinct metric keys (17 MB)", _many_keys(750_000), {}),
    Input("deep_manifest", "manifest.json nested 100,000 deep", _deep_manifest, {}),
    Input("deep_trial", "a trial result.json nested 100,000 deep", _deep_trial, {}),
    Input("deep_mirror", "a WANDB_MIRROR record nested 100,000 deep", _deep_mirror, {}),
    Input("gzip_finelog", "a gzip-compressed finelog", _gzip, {}),
    Input("symlink_loop", "finelog.log symlinked to itself", _symlink_loop, {}),
    Input("huge_int_trial", "a 400-digit integer in one trial file", _huge_int, {}),
)


def build(item: Input, root: Path, *, full: bool) -> Path:
    """Generate `item` as `<root>/<name>/`; the job directory."""
    job = root / item.name
    job.mkdir(parents=True)
    item.build(job, full)
    return job


# A child's peak RSS (`ru_maxrss`) starts from its parent's at `exec` (Linux keeps the larger
# high-water mark): a command started by a big process (pytest, a benchmark holding tables)
# would report the parent's memory. So every command runs under this small wrapper (an
# interpreter without `site`, ~10 MB), which reports its child's peak to a file.
_WRAPPER = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[2:]).returncode
use = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "w").write(f"{use.ru_maxrss} {use.ru_utime + use.ru_stime}")
sys.exit(code)
"""


@dataclass(frozen=True)
class Ran:
    """One command: exit code, wall and CPU seconds, peak RSS (MB), output, killed at a cap."""

    code: int
    wall: float
    cpu: float
    rss_mb: float
    stdout: str
    stderr: str
    killed: bool = False


def _children(pid: int) -> list[int]:
    try:
        return [int(n) for n in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _watch(wrapper: int, cap_mb: float, stop: threading.Event, killed: list[bool]) -> None:
    """Kill the wrapper's child when its RSS passes `cap_mb` (checked every 50 ms)."""
    page = os.sysconf("SC_PAGE_SIZE")
    while not stop.wait(0.05):
        for pid in _children(wrapper):
            try:
                rss_mb = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page / 2**20
            except (OSError, ValueError, IndexError):
                continue
            if rss_mb > cap_mb:
                killed.append(True)
                os.kill(pid, signal.SIGKILL)
                return


def run_command(argv: list[str], env: dict[str, str], cap_mb: float | None = None) -> Ran:
    """Run `argv` under the measuring wrapper (and the RSS cap, when given)."""
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.NamedTemporaryFile("r") as usage,
    ):
        started = time.perf_counter()
        wrapper = [sys.executable, "-S", "-c", _WRAPPER, usage.name, *argv]
        process = subprocess.Popen(wrapper, stdout=out, stderr=err, env=env)
        stop, killed = threading.Event(), list[bool]()
        watcher = None
        if cap_mb is not None:
            watcher = threading.Thread(target=_watch, args=(process.pid, cap_mb, stop, killed))
            watcher.start()
        code = process.wait()
        wall = time.perf_counter() - started
        stop.set()
        if watcher is not None:
            watcher.join()
        rss_kb, cpu = usage.read().split()
        out.seek(0)
        err.seek(0)
        return Ran(
            code=code,
            wall=wall,
            cpu=float(cpu),
            rss_mb=int(rss_kb) / 1024,
            stdout=out.read().decode("utf-8", "replace"),
            stderr=err.read().decode("utf-8", "replace"),
            killed=bool(killed),
        )
