"""Read `py-spy dump` output: the process header, its threads and their frames, and where a
thread waits.

A dump looks like::

    Process 24491: /opt/venv/bin/python train.py      (the command may run over several lines)
    Python v3.11.7 (/usr/bin/python3.11)

    Thread 24491 (idle): "MainThread"
        wait (threading.py:320)                         (innermost frame first)
        get (queue.py:171)
    Thread 0x7F3A2B1C4740 (active+gil): "Thread-1"
        all_reduce (torch/distributed/distributed_c10d.py:2050)

Frames are `function (file:line)` indented by four spaces (native frames may lack the line);
deeper-indented lines (`--locals`) are ignored.

A process's *primary thread* is the one named `MainThread`, else the thread whose id is the pid,
else the first thread. Its *parking frame* is the innermost frame that waits on:

- a collective: a function named like `all_reduce`/`allreduce`, `all_gather`, `reduce_scatter`,
  `broadcast`, `barrier`, `all_to_all`, `nccl...`, a `_wait_for_...` function, or a `wait` in a
  `torch/distributed` / `c10d` file;
- its own queue: `get` in a `queue.py`/`queues.py` file (stdlib, multiprocessing, asyncio, or a Ray
  queue actor, whose `ray.get` sits inside `ray/util/queue.py`), a `Queue.get` frame, or asyncio's
  `_wait`.

A thread *waits idly* when its innermost frame is a waiting primitive of an event loop or a
connection (`select`, `poll`, `recv`, `sleep`, `accept`, `get`, `wait`, asyncio's `_run_once`, Ray's
`main_loop`...) in the standard library or a runtime (`selectors.py`, `asyncio/`, `socket.py`,
`multiprocessing/`, `threading.py`, `ray/`, `grpc/`, `zmq/`): what a helper does between messages.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

__all__ = [
    "Frame",
    "Parking",
    "ParkingKind",
    "ParsedDump",
    "ThreadStack",
    "idle_wait",
    "parking",
    "parse_dump",
    "primary_thread",
]

_PROCESS = re.compile(r"^Process (?P<pid>\d+):\s*(?P<command>.*)$")
_THREAD = re.compile(
    r"^Thread (?P<ident>\S+) \((?P<status>[^)]*)\)(?::\s*\"(?P<name>[^\"]*)\")?\s*$"
)
_FRAME = re.compile(r"^ {4}(?! )(?P<function>.+?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)\s*$")

_COLLECTIVE_FUNCTION = re.compile(
    r"all_?reduce|all_?gather|reduce_scatter|broadcast|barrier|all_?to_?all|nccl|^_wait_for_",
    re.IGNORECASE,
)
_DISTRIBUTED_FILE = re.compile(r"torch/distributed|c10d|distributed_c10d", re.IGNORECASE)
_QUEUE_FILE = re.compile(r"(^|/)(queue|queues)\.py$")

IDLE_FUNCTIONS: Final = frozenset(
    {
        "select", "poll", "epoll", "_poll", "wait", "_wait", "sleep", "accept", "recv",
        "_recv", "recv_into", "recv_bytes", "_recv_bytes", "read", "readline", "readinto",
        "acquire", "get", "_run_once", "run_forever", "main_loop", "_worker", "join",
    }
)  # fmt: skip
"""Innermost functions of a thread that waits for something to do."""
_IDLE_FILE: Final = re.compile(
    r"(^|/)(selectors|socket|ssl|threading|queue|subprocess|time)\.py$"
    r"|(^|/)(asyncio|multiprocessing|concurrent|ray|grpc|zmq|uvloop|aiohttp)/"
)


@dataclass(frozen=True)
class Frame:
    """One stack frame and the 1-based line of the dump it was read from."""

    function: str
    file: str
    line: int | None
    dump_line: int

    @property
    def text(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{self.function} ({where})"

    @property
    def name(self) -> str:
        """The function's own name (`select` of `_PollLikeSelector.select`)."""
        return self.function.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class ThreadStack:
    """One thread of a dump, innermost frame first."""

    ident: str
    status: str  # idle | active | active+gil | ...
    name: str | None
    header_line: int
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class ParsedDump:
    pid: int | None
    command: str
    threads: tuple[ThreadStack, ...]


class ParkingKind(StrEnum):
    COLLECTIVE = "collective"
    QUEUE = "queue"


@dataclass(frozen=True)
class Parking:
    """Where a thread waits: the kind of wait and the innermost frame that shows it."""

    kind: ParkingKind
    frame: Frame
    named: Frame


# --- parsing ------------------------------------------------------------------------------------


def _header(lines: Sequence[str]) -> tuple[int | None, str]:
    for text in lines:
        match = _PROCESS.match(text)
        if match:
            return int(match["pid"]), match["command"].strip()
    return None, ""


def _thread_blocks(lines: Sequence[str]) -> list[tuple[int, re.Match[str], list[Frame]]]:
    blocks: list[tuple[int, re.Match[str], list[Frame]]] = []
    for number, text in enumerate(lines, start=1):
        thread = _THREAD.match(text)
        if thread:
            blocks.append((number, thread, []))
            continue
        frame = _FRAME.match(text)
        if frame and blocks:
            line = int(frame["line"]) if frame["line"] else None
            blocks[-1][2].append(Frame(frame["function"], frame["file"], line, number))
    return blocks


def parse_dump(text: str) -> ParsedDump:
    """Parse one `py-spy dump`; text that is not a dump gives a dump without threads."""
    lines = text.splitlines()
    pid, command = _header(lines)
    threads = tuple(
        ThreadStack(
            ident=match["ident"],
            status=match["status"],
            name=match["name"],
            header_line=number,
            frames=tuple(frames),
        )
        for number, match, frames in _thread_blocks(lines)
    )
    return ParsedDump(pid=pid, command=command, threads=threads)


def primary_thread(dump: ParsedDump) -> ThreadStack | None:
    """`MainThread`, else the thread whose id is the pid, else the first thread."""
    for thread in dump.threads:
        if thread.name == "MainThread":
            return thread
    pid_ids = {str(dump.pid), hex(dump.pid or 0).lower()}
    for thread in dump.threads:
        if thread.ident.lower() in pid_ids:
            return thread
    return dump.threads[0] if dump.threads else None


# --- where a thread waits -----------------------------------------------------------------------


def _frame_kind(frame: Frame) -> ParkingKind | None:
    function = frame.name
    if _COLLECTIVE_FUNCTION.search(function):
        return ParkingKind.COLLECTIVE
    if function == "wait" and _DISTRIBUTED_FILE.search(frame.file):
        return ParkingKind.COLLECTIVE
    if function == "get" and (_QUEUE_FILE.search(frame.file) or "Queue.get" in frame.function):
        return ParkingKind.QUEUE
    if function == "_wait" and "asyncio" in frame.file:
        return ParkingKind.QUEUE
    return None


def _generic_wait(frame: Frame) -> bool:
    return frame.name in {"wait", "_wait"}


def parking(thread: ThreadStack) -> Parking | None:
    """The innermost frame of the thread that waits in a collective or on a queue.

    `frame` (the innermost such frame) is what two dumps are compared on; `named` is the frame
    the report names: a named collective (`all_reduce` under a c10d `wait`) when there is one.
    """
    found = [(frame, kind) for frame in thread.frames if (kind := _frame_kind(frame))]
    if not found:
        return None
    named = next((frame for frame, _ in found if not _generic_wait(frame)), found[0][0])
    return Parking(found[0][1], found[0][0], named)


def idle_wait(thread: ThreadStack) -> bool:
    """Whether the thread's innermost frame is an event loop's or a connection's idle wait (and
    not a collective): a helper between messages, not work."""
    if not thread.frames:
        return False
    top = thread.frames[0]
    if _frame_kind(top) is ParkingKind.COLLECTIVE:
        return False
    return top.name in IDLE_FUNCTIONS and bool(_IDLE_FILE.search(top.file))
