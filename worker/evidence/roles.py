"""Who each dumped process is: a policy rank, the driver, a coordinator, an inference engine, a
Ray or system helper, a native binary, or unknown (docs/domain.md#processes-and-roles).

A stall proof and the second look judge the *load-bearing* processes — the ranks and the driver or
coordinator a proof rests on. Helpers change frames all the time (asyncio `select`, socket `recv`,
`poll`): that is not progress, and a helper dumped once, or whose dump failed, neither proves nor
disproves anything. Engines and unknown processes stay conservative: their movement may be work.

`classify` reads, first match wins:

1. the command line (the `ps` listing's `args`, else the dump's `Process N: <cmd>` header):
   Ray's and torchrun's helpers (raylet, gcs_server, plasma, the dashboard and its agent, the log
   monitor, the autoscaler monitor, the runtime-env agent, `ray::IDLE` workers, torchrun's elastic
   agent) → helper; vLLM/SGLang engines (`AsyncVLLMInferenceEngine`, `EngineCore_*`, `VLLM::`,
   `RayWorkerWrapper`, `vllm.entrypoints`) → engine; policy, critic, reference and reward workers
   (`ray::...PolicyWorker...`, FSDP, Megatron, DeepSpeed, Ray Train workers, verl's `WorkerDict`),
   and the children of torchrun → rank;
2. the frames: a primary thread in a collective (any dump) → rank;
3. the command line again: a rollout coordinator → coordinator; the SkyRL entrypoint
   (`skyrl_entrypoint`, `main_base`, `main_harbor`, `entrypoints.main_...`) → driver;
4. the frames again: vLLM files → engine; a helper's script (`log_monitor.py`, `dashboard/`,
   `autoscaler/.../monitor.py`, `runtime_env/agent`) → helper; a Ray worker with nothing but
   Ray's own `main_loop` on its primary thread → helper (an idle worker); a coordinator's or the
   entrypoint's files → coordinator or driver; `ray.get` called from the process's own module →
   driver;
5. pid 1 (the task's first process) → driver;
6. a failed dump saying the target has no Python interpreter → native;
7. otherwise unknown.

The live backends classify every probed process once its dumps are taken and record the role in
the probe directory's `processes.json` (`roles_of` prefers that record), so a replay of frozen
evidence agrees with the diagnosis that took it; older probe directories are classified from their
dumps alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import PurePath
from typing import Final

from worker.evidence.model import ProbeEvidence, ProcessRecord
from worker.evidence.pyspy import (
    ParkingKind,
    ParsedDump,
    ThreadStack,
    parking,
    parse_dump,
    primary_thread,
)

__all__ = [
    "CONTEXT",
    "LOAD_BEARING",
    "Classification",
    "Role",
    "Roles",
    "classify",
    "roles_of",
]


class Role(StrEnum):
    RANK = "rank"
    DRIVER = "driver"
    COORDINATOR = "coordinator"
    ENGINE = "engine"
    HELPER = "helper"
    NATIVE = "native"
    UNKNOWN = "unknown"


LOAD_BEARING: Final = frozenset({Role.RANK, Role.DRIVER, Role.COORDINATOR})
"""The processes a stall proof rests on."""
CONTEXT: Final = frozenset({Role.HELPER, Role.NATIVE})
"""Processes whose frames are never progress and whose missing dumps are never a hole."""


@dataclass(frozen=True)
class Classification:
    """A process's role and why it was given."""

    role: Role
    why: str


# --- the command line -----------------------------------------------------------------------------

_NATIVE_HELPERS: Final = {
    "raylet": "Ray's raylet",
    "gcs_server": "Ray's GCS server",
    "plasma_store_server": "Ray's plasma store",
    "plasma_store": "Ray's plasma store",
}
_HELPER_ARGS: Final = (
    (re.compile(r"ray/_private/log_monitor\.py|\blog_monitor\.py"), "Ray's log monitor"),
    (re.compile(r"autoscaler/_private/monitor\.py|ray/_private/monitor\.py"), "Ray's monitor"),
    (re.compile(r"dashboard/agent\.py"), "Ray's dashboard agent"),
    (re.compile(r"dashboard/dashboard\.py|^ray-dashboard-"), "Ray's dashboard"),
    (re.compile(r"runtime_env/agent/main\.py|runtime_env_agent"), "Ray's runtime-env agent"),
    (re.compile(r"^ray::IDLE"), "an idle Ray worker (`ray::IDLE`)"),
    (re.compile(r"^ray::(JobSupervisor|_StatsActor|DashboardActor)"), "a Ray system actor"),
    (re.compile(r"\btorchrun\b|torch\.distributed\.(run|launch)\b"), "torchrun's elastic agent"),
)
_ENGINE_ARGS: Final = re.compile(
    r"VLLMInferenceEngine|EngineCore|^VLLM::|RayWorkerWrapper|vllm\.entrypoints|"
    r"vllm/entrypoints|^sglang::|sglang\.launch_server|SGLangInferenceEngine",
    re.IGNORECASE,
)
_RANK_ARGS: Final = re.compile(
    r"^ray::[\w.]*(PolicyWorker|CriticWorker|RefWorker|RewardWorker|FSDP|Megatron|DeepSpeed|"
    r"RayTrainWorker|TrainWorker|WorkerDict)"
)
_TORCHRUN: Final = re.compile(r"\btorchrun\b|torch\.distributed\.(run|launch)\b")
_COORDINATOR: Final = re.compile(r"[Cc]oordinator")
_DRIVER: Final = re.compile(
    r"skyrl_entrypoint|entrypoints[./]main_\w+|\bmain_base\b|\bmain_harbor\b"
)


def _program(args: str) -> str:
    first = args.split(None, 1)[0] if args.strip() else ""
    return PurePath(first).name


def _by_command(args: str, parent_args: str | None) -> Classification | None:
    """Rules 1: helpers, engines and ranks named by their command line."""
    native = _NATIVE_HELPERS.get(_program(args))
    if native:
        return Classification(Role.HELPER, f"{native} (native), by its command line")
    for pattern, what in _HELPER_ARGS:
        if pattern.search(args):
            return Classification(Role.HELPER, f"{what}, by its command line")
    if _ENGINE_ARGS.search(args):
        return Classification(Role.ENGINE, f"an inference engine: `{_short(args)}`")
    if _RANK_ARGS.search(args):
        return Classification(Role.RANK, f"a training worker: `{_short(args)}`")
    if parent_args and _TORCHRUN.search(parent_args):
        return Classification(Role.RANK, "a child of torchrun")
    return None


def _by_name(args: str) -> Classification | None:
    """Rules 3: the coordinator and the driver named by their command line."""
    if _COORDINATOR.search(args):
        return Classification(Role.COORDINATOR, f"a rollout coordinator: `{_short(args)}`")
    if _DRIVER.search(args):
        return Classification(Role.DRIVER, f"the entrypoint: `{_short(args)}`")
    return None


def _short(args: str, limit: int = 80) -> str:
    one_line = " ".join(args.split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


# --- the frames -----------------------------------------------------------------------------------

_HELPER_FILES: Final = (
    (re.compile(r"(^|/)log_monitor\.py$"), "Ray's log monitor"),
    (re.compile(r"autoscaler/_private/monitor\.py$|ray/_private/monitor\.py$"), "Ray's monitor"),
    (re.compile(r"(^|/)dashboard/"), "Ray's dashboard or its agent"),
    (re.compile(r"runtime_env/agent/"), "Ray's runtime-env agent"),
)
_RAY_FILE: Final = re.compile(r"(^|/)ray/")
_COORDINATOR_FILE: Final = re.compile(r"coordinator", re.IGNORECASE)
_DRIVER_FILE: Final = re.compile(r"entrypoints/main_\w+\.py$|skyrl_entrypoint")


def _primaries(dumps: Sequence[ParsedDump]) -> list[ThreadStack]:
    return [thread for dump in dumps if (thread := primary_thread(dump)) is not None]


def _in_collective(threads: Sequence[ThreadStack]) -> str | None:
    for thread in threads:
        park = parking(thread)
        if park is not None and park.kind is ParkingKind.COLLECTIVE:
            return park.named.text
    return None


def _idle_ray_worker(thread: ThreadStack) -> bool:
    """Only Ray's own worker loop on the primary thread: an idle worker, not an actor at work."""
    names = {frame.name for frame in thread.frames}
    return "main_loop" in names and all(_RAY_FILE.search(f.file) for f in thread.frames)


def _driver_frames(thread: ThreadStack) -> bool:
    """The entrypoint's files, or `ray.get` called from the process's own module."""
    if any(_DRIVER_FILE.search(frame.file) for frame in thread.frames):
        return True
    in_get = any(
        f.name == "get" and f.file.endswith("ray/_private/worker.py") for f in thread.frames
    )
    outermost = thread.frames[-1] if thread.frames else None
    return in_get and outermost is not None and not _RAY_FILE.search(outermost.file)


def _by_frames(threads: Sequence[ThreadStack]) -> Classification | None:
    """Rules 4: engines, helpers, an idle Ray worker, the coordinator and the driver by frames."""
    files = [frame.file for thread in threads for frame in thread.frames]
    if any("vllm" in file.lower() for file in files):
        return Classification(Role.ENGINE, "vLLM frames")
    for pattern, what in _HELPER_FILES:
        if any(pattern.search(file) for file in files):
            return Classification(Role.HELPER, f"{what}, by its frames")
    if threads and all(_idle_ray_worker(thread) for thread in threads):
        return Classification(Role.HELPER, "an idle Ray worker (only `main_loop`)")
    if any(_COORDINATOR_FILE.search(file) for file in files):
        return Classification(Role.COORDINATOR, "a coordinator's frames")
    if any(_driver_frames(thread) for thread in threads):
        return Classification(Role.DRIVER, "the entrypoint's frames (waits in `ray.get`)")
    return None


# --- failed dumps ---------------------------------------------------------------------------------

_NO_PYTHON: Final = re.compile(
    r"not a python process|failed to find python version|no python interpreter|"
    r"failed to find a python interpreter",
    re.IGNORECASE,
)


def _native(failures: Iterable[str]) -> Classification | None:
    for text in failures:
        if _NO_PYTHON.search(text):
            return Classification(Role.NATIVE, "py-spy found no Python interpreter in it")
    return None


# --- the whole ------------------------------------------------------------------------------------


def classify(
    args: str | None,
    dumps: Sequence[str] = (),
    *,
    pid: int | None = None,
    parent_args: str | None = None,
    failures: Sequence[str] = (),
) -> Classification:
    """The role of one process from its command line, its dumps' text and its failed dumps'
    output (module docstring: the rules, first match wins)."""
    parsed = [parse_dump(text) for text in dumps]
    command = args if args and args.strip() else next((p.command for p in parsed if p.command), "")
    threads = _primaries(parsed)
    found = _by_command(command, parent_args)
    if found is None and (frame := _in_collective(threads)) is not None:
        found = Classification(Role.RANK, f"its primary thread sits in `{frame}`")
    found = found or _by_name(command) or _by_frames(threads)
    if found is None and pid == 1:
        found = Classification(Role.DRIVER, "the task's first process (pid 1)")
    return found or _native(failures) or Classification(Role.UNKNOWN, "nothing names it")


@dataclass(frozen=True)
class Roles:
    """The role of each process of one capture, keyed by (target, pid)."""

    known: Mapping[tuple[str, int], Classification] = field(default_factory=dict)

    def get(self, target: str | None, pid: int) -> Classification | None:
        """The process's role, None when nothing is known of it; a target of None matches the
        pid on any one target."""
        if target is not None:
            return self.known.get((target, pid))
        same_pid = [c for (_, p), c in self.known.items() if p == pid]
        return same_pid[0] if len(same_pid) == 1 else None

    def of(self, target: str | None, pid: int) -> Classification:
        """The process's role; when nothing is known of it, what its pid alone says (pid 1 is
        the driver), else unknown."""
        return self.get(target, pid) or classify(None, pid=pid)


def _recorded(record: ProcessRecord) -> Classification | None:
    try:
        role = Role(record.role) if record.role else None
    except ValueError:
        return None
    return Classification(role, record.why or "recorded") if role else None


def _failure_texts(probes: ProbeEvidence) -> dict[tuple[str, int], list[str]]:
    """Each process's failed dumps' reasons (py-spy's error, e.g. no Python interpreter)."""
    found: dict[tuple[str, int], list[str]] = {}
    for command in probes.commands:
        pid, target = command.dumped()
        if command.exit_code != 0 and command.why and pid is not None and target is not None:
            found.setdefault((target, pid), []).append(command.why)
    return found


def roles_of(probes: ProbeEvidence | None) -> Roles:
    """Every dumped or recorded process's role: the probe directory's record first (what the
    diagnosis that took it decided), else classified from its command line (`processes.json`
    or the recorded `ps` listing), its dumps and its failed dumps' reasons."""
    if probes is None:
        return Roles()
    texts: dict[tuple[str, int], list[str]] = {}
    for dump in probes.stacks:
        texts.setdefault((dump.target, dump.pid), []).append(dump.text)
    failures = _failure_texts(probes)
    known: dict[tuple[str, int], Classification] = {}
    records = {(r.target, r.pid): r for r in probes.processes}
    for key in {*texts, *records, *failures}:
        record = records.get(key)
        recorded = _recorded(record) if record is not None else None
        args = record.args if record is not None else None
        known[key] = recorded or classify(
            args, texts.get(key, ()), pid=key[1], failures=failures.get(key, ())
        )
    return Roles(known)
