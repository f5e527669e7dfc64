"""Shared pieces of the labelled corpus: a labelled case, production noise, run shapes.

Noise lines are the shapes a SkyRL job on Ray prints between its records (each copied from a real
source: vLLM's request log and shared-memory broadcast wait, Ray's raylet worker-count warning,
PyTorch's NCCL barrier warning, SkyRL's tqdm step bar); the corpus writes them into every log
that should look like production, so a rule that only works on a clean log fails here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.scenarios.builder import JobBuilder, iso
from tests.scenarios.catalog import (
    STANDARD_ARGV,
    Built,
    finish,
    healthy_metrics,
    run_steps,
    start_attempt,
)

__all__ = [
    "ENGINE_IP",
    "T0",
    "Labelled",
    "engine_line",
    "noisy_steps",
    "ray_worker_log",
    "write_case",
]

T0 = datetime(2026, 7, 30, 18, 0, tzinfo=UTC)
ENGINE_IP = "10.128.26.194"


@dataclass(frozen=True)
class Labelled:
    """One case of the corpus: how to build it and the verdict the procedure gives."""

    name: str
    build: Callable[[Path], Built]
    verdict: str
    why: str
    gates: dict[str, str] = field(default_factory=dict)
    mode: str | None = None


def write_case(case: Labelled, out: Path) -> Path:
    """Build the case under `out/<name>/` and write its `case.json`."""
    folder = out / case.name
    built = case.build(folder)
    label: dict[str, object] = {"verdict": case.verdict}
    if case.gates:
        label["gates"] = case.gates
    body: dict[str, object] = {"job_dir": built.job_dir.relative_to(folder).as_posix()}
    body["now"] = iso(built.now)
    if built.probes is not None:
        body["probes"] = built.probes.relative_to(folder).as_posix()
    if case.mode:
        body["mode"] = case.mode
    body["why"] = case.why
    body["expected"] = label
    (folder / "case.json").write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    return folder


# --- engine stat lines ---------------------------------------------------------------------------


def engine_line(
    moment: datetime,
    *,
    engine: int = 0,
    running: int,
    waiting: int,
    kv: float,
    gen: float,
    prompt: float = 1200.0,
) -> str:
    """vLLM's stat-logger line as a Ray worker log holds it (no actor prefix there)."""
    return (
        f"INFO {moment:%m-%d %H:%M:%S} [loggers.py:248] Engine {engine:03d}: Avg prompt "
        f"throughput: {prompt:.1f} tokens/s, Avg generation throughput: {gen:.1f} tokens/s, "
        f"Running: {running} reqs, Waiting: {waiting} reqs, GPU KV cache usage: {kv:.1f}%, "
        "Prefix cache hit rate: 41.2%"
    )


def ray_worker_log(
    job: Path,
    pid: int,
    lines: list[str],
    *,
    pod: str = "ray-head",
    actor: str = "AsyncVLLMInferenceEngine",
) -> Path:
    """A Ray session worker log (`worker-<id>-<job>-<pid>.out`) of one actor."""
    folder = job / "ray_vllm_logs" / pod
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"worker-6c2f0d0e5b7b4a1f8e3d-01000000-{pid}.out"
    path.write_text(f":actor_name:{actor}\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- noise ---------------------------------------------------------------------------------------


def _vllm(moment: datetime, pid: int, text: str) -> str:
    return (
        f"(AsyncVLLMInferenceEngine pid={pid}, ip={ENGINE_IP}) INFO {moment:%m-%d %H:%M:%S} {text}"
    )


def noise(b: JobBuilder, moment: datetime, step: int, total: int) -> None:
    """The lines a real node prints between records: request logs, a tqdm bar, warnings."""
    request = f"cmpl-{step:04d}{moment:%H%M%S}a1f9c2"
    b.raw(moment, _vllm(moment, 287294, f"[async_llm.py:270] Added request {request}-0."))
    b.raw(
        moment,
        _vllm(moment, 287295, f"[async_llm.py:270] Added request {request}-1."),
    )
    if step % 3 == 0:
        b.raw(
            moment,
            f"(raylet) WARNING: 12 PYTHON worker processes have been started on node: "
            f"4b1e8f0c9d2a3e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b with address: {ENGINE_IP}. "
            "This could be a result of using a large number of actors, or due to tasks blocked "
            "in ray.get() calls (see https://github.com/ray-project/ray/issues/3644 for some "
            "discussion of workarounds).",
        )
    if step == 1:
        b.raw(
            moment,
            f"(PolicyWorker pid=3001, ip={ENGINE_IP}) [rank0]:[W730 {moment:%H:%M:%S}.512043 "
            "ProcessGroupNCCL.cpp:4561] [PG ID 0 PG GUID 0 Rank 0]  using GPU 0 to perform "
            "barrier as devices used by this process are currently unknown. This can "
            "potentially cause a hang if this rank to GPU mapping is incorrect.",
        )
    done = (step - 1) * 100 // total
    bar = "█" * (done // 10) + " " * (10 - done // 10)
    b.raw(
        moment,
        f"Training Step Progress:  {done:>2}%|{bar}| {step - 1}/{total} [{step * 2:02d}:00<{(total - step) * 2:02d}:00, 120.00s/it]",
    )


def noisy_steps(
    b: JobBuilder,
    begin: datetime,
    steps: range,
    metrics: Callable[[int], dict[str, float]] = healthy_metrics,
    *,
    total: int = 200,
    seconds: float = 120.0,
) -> datetime:
    """`run_steps` with a real node's noise printed during each step."""
    moment = begin
    for step in steps:
        noise(b, moment + timedelta(seconds=2), step, total)
        moment = run_steps(b, moment, range(step, step + 1), metrics, seconds=seconds)
    return moment


def healthy_run(b: JobBuilder, steps: int = 12, **kwargs: object) -> datetime:
    """A started attempt that trains `steps` steps with noise; returns when the last ended."""
    return noisy_steps(b, start_attempt(b, T0), range(1, steps + 1), **kwargs)  # type: ignore[arg-type]


def standard_finish(b: JobBuilder, root: Path, now: datetime, **manifest: object) -> Built:
    manifest.setdefault("argv", STANDARD_ARGV)
    return finish(b, root, now, **manifest)  # type: ignore[arg-type]


@dataclass
class RayJob(JobBuilder):
    """A job builder whose trainer lines carry the current driver's pid (`driver_pid`): a restart
    inside the log starts a new driver process, so its lines carry a new pid."""

    driver_pid: int = 8455

    def log(
        self, moment: datetime, message: str, *, actor: str | None = None, level: str = "INFO"
    ) -> None:
        super().log(
            moment, message, actor=actor or f"(skyrl_entrypoint pid={self.driver_pid})", level=level
        )

    def ray_started(self, moment: datetime) -> None:
        """Ray's own line when the driver starts a fresh local Ray instance (no actor prefix)."""
        stamp = f"{moment:%Y-%m-%d %H:%M:%S},{moment.microsecond // 1000:03d}"
        self.raw(
            moment,
            f"{stamp}\tINFO worker.py:1852 -- Started a local Ray instance. View the dashboard "
            "at \x1b[1m\x1b[32m127.0.0.1:8265 \x1b[39m\x1b[22m",
        )

    def restart(self, moment: datetime, pid: int, resume: int | None) -> datetime:
        """A new driver process: Ray started again, `Ray cluster initialized`, the resume line."""
        self.driver_pid = pid
        self.ray_started(moment)
        self.log(moment + timedelta(seconds=4), "Ray cluster initialized")
        self.resume(moment + timedelta(seconds=30), resume)
        return moment + timedelta(seconds=90)
