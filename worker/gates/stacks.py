"""Read `py-spy dump` output and decide whether live stacks prove a stall.

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

`judge_stacks` pairs the dumps of each process (the earliest and the newest with different
`captured_at`). Only live dumps count (DOMAIN.md section 6, "what established means"): with a
`DumpWindow`, a dump taken at or before the newest progress, more than MAX_EVIDENCE_AGE_S before
`now`, before the current attempt began, after `now` (beyond the clock tolerance), of a pod of an
earlier attempt, or whose header names another pid than its file makes its process *stale*.

The stall is **proven** when at least one process is parked in both dumps at the same frame and
nothing disproves it: a process whose primary stack changed between dumps is *moving* (possible
progress: a slow rank the others wait for) and blocks the proof, as does one whose dumps cannot be
read, one dumped only once (or twice at the same instant: it is not shown stuck) and a stale one.
A process whose stack is unchanged but not parked (*still*: an idle helper, a Ray worker, a vLLM
engine idle by design while the policy is wedged) shows no progress and does not block it.

Outside collectives, `StackFinding.still` says whether every trainer or coordinator process (not a
vLLM engine) is still, with identical stacks in two dumps at least MIN_STILL_GAP_S apart, and none
is parked, moving, unpaired, unreadable or stale. That alone proves nothing; the liveness gate
needs corroboration before it calls it a stall.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Final

from shared.models import Quote
from shared.times import duration_text
from worker.evidence.model import StackDump
from worker.evidence.quotes import quote

__all__ = [
    "MIN_STILL_GAP_S",
    "DumpWindow",
    "Frame",
    "Parking",
    "ParsedDump",
    "ProcessJudgement",
    "ProcessState",
    "StackFinding",
    "ThreadStack",
    "judge_stacks",
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

MIN_STILL_GAP_S: Final = 5.0
"""Two identical dumps outside a collective must be at least this far apart (the default probe
interval) to show a process still rather than caught twice in one slow frame."""


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


class ProcessState(StrEnum):
    PARKED = "parked"  # same parking frame in both dumps
    ENGINE_IDLE = "engine_idle"  # a vLLM engine with an unchanged, unparked stack
    STILL = "still"  # unchanged stack, not parked in a collective or a queue
    MOVING = "moving"  # the primary stack changed between dumps
    UNPAIRED = "unpaired"  # fewer than two dumps taken at different times
    UNREADABLE = "unreadable"  # no thread could be read from a dump
    STALE = "stale"  # a dump that is not live evidence (see DumpWindow)


BLOCKING: Final = frozenset(
    {ProcessState.MOVING, ProcessState.UNREADABLE, ProcessState.UNPAIRED, ProcessState.STALE}
)


@dataclass(frozen=True)
class DumpWindow:
    """When a dump is live evidence: after the newest progress, not older than the evidence age
    limit nor the current attempt, not after `now` (beyond the clock tolerance), not of a pod that
    belonged to an earlier attempt."""

    after: datetime | None = None  # the newest progress: a dump must be later
    not_before: datetime | None = None  # max(now - MAX_EVIDENCE_AGE_S, current attempt start)
    not_after: datetime | None = None  # now + the clock tolerance
    old_targets: frozenset[str] = frozenset()  # pods of earlier attempts

    def why_not(self, dump: StackDump) -> str | None:
        """Why `dump` is not live evidence, or None when it is."""
        at = dump.captured_at
        if at is None:
            return "dump time unknown"
        if dump.target in self.old_targets:
            return f"{dump.target} is a pod of an earlier attempt"
        if self.after is not None and at <= self.after:
            return f"dump taken {_ago(self.after, at)} the newest progress"
        if self.not_before is not None and at < self.not_before:
            return "dump older than MAX_EVIDENCE_AGE_S or the current attempt"
        if self.not_after is not None and at > self.not_after:
            return "dump dated after now"
        return None


def _ago(reference: datetime, at: datetime) -> str:
    gap = (reference - at).total_seconds()
    return "at" if gap == 0 else f"{duration_text(gap)} before"


@dataclass(frozen=True)
class ProcessJudgement:
    target: str
    pid: int
    state: ProcessState
    parking: Parking | None
    quotes: tuple[Quote, ...]
    detail: str
    gap_s: float = 0.0
    top: str | None = None  # the innermost frame of an unchanged stack


@dataclass(frozen=True)
class StackFinding:
    """What the stacks say as a whole."""

    proven: bool
    mechanism: str | None
    processes: tuple[ProcessJudgement, ...]
    quotes: tuple[Quote, ...]
    summary: str
    still: bool = False  # every trainer process still outside a collective (needs corroboration)
    still_frame: str | None = None  # the innermost frame they sit in


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


# --- classification -----------------------------------------------------------------------------


def _frame_kind(frame: Frame) -> ParkingKind | None:
    function = frame.function.rsplit(".", 1)[-1]
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
    return frame.function.rsplit(".", 1)[-1] in {"wait", "_wait"}


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


def _is_engine(thread: ThreadStack) -> bool:
    return any("vllm" in frame.file.lower() for frame in thread.frames)


def _signature(thread: ThreadStack) -> tuple[tuple[str, str, int | None], ...]:
    return tuple((f.function, f.file, f.line) for f in thread.frames)


# --- judging ------------------------------------------------------------------------------------


def _pair(dumps: Sequence[StackDump]) -> tuple[StackDump, StackDump, float] | None:
    """The earliest and newest dump of a process, and the seconds between them."""
    timed = sorted(
        ((d.captured_at, d) for d in dumps if d.captured_at is not None), key=lambda p: p[0]
    )
    if len(timed) < 2 or timed[0][0] == timed[-1][0]:
        return None
    return timed[0][1], timed[-1][1], (timed[-1][0] - timed[0][0]).total_seconds()


def _dump_quote(dump: StackDump, thread: ThreadStack, frame: Frame | None) -> Quote:
    top = frame or (thread.frames[0] if thread.frames else None)
    label = f"Thread {thread.ident} ({thread.status})"
    text = f"{label}: {top.text}" if top else f"{label}: no frames"
    line = top.dump_line if top else thread.header_line
    return quote(dump.source, text, line=line, timestamp=dump.captured_at)


def _foreign(dump: StackDump, parsed: ParsedDump) -> str | None:
    if parsed.pid is not None and parsed.pid != dump.pid:
        return f"{dump.source} holds pid {parsed.pid}, not {dump.pid}"
    return None


def _judge_pair(first: StackDump, last: StackDump, gap: float) -> ProcessJudgement:
    parsed = parse_dump(first.text), parse_dump(last.text)
    foreign = _foreign(first, parsed[0]) or _foreign(last, parsed[1])
    if foreign:
        return _judgement(first, ProcessState.STALE, None, (), foreign)
    a, b = primary_thread(parsed[0]), primary_thread(parsed[1])
    if a is None or b is None:
        return _judgement(first, ProcessState.UNREADABLE, None, (), "a dump holds no thread")
    park_a, park_b = parking(a), parking(b)
    quotes = (
        _dump_quote(first, a, park_a.named if park_a else None),
        _dump_quote(last, b, park_b.named if park_b else None),
    )
    if park_a and park_b and park_a.frame.text == park_b.frame.text:
        apart = duration_text(gap)
        detail = f"parked in {park_a.kind.value} `{park_a.named.text}` in both dumps {apart} apart"
        return _judgement(first, ProcessState.PARKED, park_a, quotes, detail)
    if _signature(a) != _signature(b):
        return _judgement(
            first, ProcessState.MOVING, None, quotes, f"stack changed in {duration_text(gap)}"
        )
    state = ProcessState.ENGINE_IDLE if _is_engine(a) else ProcessState.STILL
    top = a.frames[0].text if a.frames else "no frame"
    detail = f"unchanged for {duration_text(gap)} at `{top}`, not in a collective"
    return ProcessJudgement(first.target, first.pid, state, None, quotes, detail, gap, top)


def _judgement(
    dump: StackDump,
    state: ProcessState,
    park: Parking | None,
    quotes: tuple[Quote, ...],
    detail: str,
) -> ProcessJudgement:
    return ProcessJudgement(dump.target, dump.pid, state, park, quotes, detail)


def _judge_process(dumps: Sequence[StackDump], window: DumpWindow) -> ProcessJudgement:
    stale = next((why for d in dumps if (why := window.why_not(d))), None)
    if stale is not None:
        return _judgement(dumps[0], ProcessState.STALE, None, (), stale)
    pair = _pair(dumps)
    if pair is None:
        detail = f"{len(dumps)} dump(s), not two taken at different times"
        return _judgement(dumps[0], ProcessState.UNPAIRED, None, (), detail)
    return _judge_pair(*pair)


def _group(dumps: Sequence[StackDump]) -> list[list[StackDump]]:
    groups: dict[tuple[str, int], list[StackDump]] = {}
    for dump in dumps:
        groups.setdefault((dump.target, dump.pid), []).append(dump)
    return [sorted(group, key=lambda d: d.n) for group in groups.values()]


def _mechanism(parked: Sequence[ProcessJudgement]) -> str:
    kinds = {p.parking.kind for p in parked if p.parking}
    frames = sorted({p.parking.named.function for p in parked if p.parking})
    where = ", ".join(f"`{f}`" for f in frames)
    if kinds == {ParkingKind.QUEUE}:
        return f"coordinator deadlocked waiting on its own queue ({where})"
    return f"policy ranks wedged in a collective ({where}) with no progress between dumps"


def _describe(judgements: Sequence[ProcessJudgement]) -> str:
    parts = [f"{j.target} pid {j.pid}: {j.state.value} ({j.detail})" for j in judgements]
    return "; ".join(parts) if parts else "no stacks captured"


def _still_frame(judgements: Sequence[ProcessJudgement]) -> str | None:
    """The frame every trainer process sits in, when all of them are still long enough apart."""
    if any(j.state in BLOCKING or j.state is ProcessState.PARKED for j in judgements):
        return None
    still = [j for j in judgements if j.state is ProcessState.STILL]
    if not still or any(j.gap_s < MIN_STILL_GAP_S for j in still):
        return None
    return ", ".join(sorted({j.top for j in still if j.top}))


def judge_stacks(dumps: Sequence[StackDump], window: DumpWindow | None = None) -> StackFinding:
    """Whether the dumps prove a stall, with the quotes of every paired process."""
    groups = _group(dumps)
    judgements = tuple(_judge_process(group, window or DumpWindow()) for group in groups)
    parked = [j for j in judgements if j.state is ProcessState.PARKED]
    proven = bool(parked) and not any(j.state in BLOCKING for j in judgements)
    quotes = tuple(q for j in judgements for q in j.quotes)
    frame = None if proven else _still_frame(judgements)
    return StackFinding(
        proven=proven,
        mechanism=_mechanism(parked) if proven else None,
        processes=judgements,
        quotes=quotes,
        summary=_describe(judgements),
        still=frame is not None,
        still_frame=frame,
    )
