"""Decide whether live stacks prove a stall, judging the processes that matter.

Dumps are read by `worker.evidence.pyspy` (the primary thread, its parking frame, an idle wait)
and each process is given a role by `worker.evidence.roles` (rank, driver, coordinator, engine,
helper, native, unknown), from the probe directory's `processes.json` when it has one.

`judge_stacks` pairs the dumps of each process (the earliest and the newest with different
`captured_at`). Only live dumps count (docs/domain.md#what-established-means): with a
`DumpWindow`, a dump taken at or before the newest progress, more than MAX_EVIDENCE_AGE_S before
`now`, before the current attempt began, after `now` (beyond the clock tolerance), of a pod of an
earlier attempt, or whose header names another pid than its file makes its process *stale*.
A process with a failed `py-spy dump` is *failed*.

The stall is **proven** when at least one load-bearing process (a rank, the driver or a
coordinator; an engine too when it sits in a collective) is parked in both dumps at the same
frame and nothing disproves it (docs/domain.md#processes-and-roles):

- a rank that moved (possible progress: a straggler the others wait for), or that is unpaired
  (dumped once, or twice at the same instant: not shown stuck), unreadable, stale or failed,
  blocks the proof: the proof rests on every rank;
- a driver or coordinator that moved blocks it; unpaired, unreadable, stale or failed it blocks a
  queue deadlock (which rests on the coordinator) but is only noted beside ranks parked in a
  collective (the driver waiting in `ray.get` is context there);
- an engine or an unknown process that moved blocks it, unless every dump of it shows only an
  event loop's idle waits (`select`, `recv`, `poll`...: *idle*); unpaired, unreadable, stale or
  failed it blocks it (nothing says it does not matter);
- a helper (Ray's raylet, GCS, dashboard and agent, log monitor, idle workers, torchrun's agent)
  or a native process never blocks it and never proves it: whatever its dumps show is noted.

A process whose stack is unchanged but not parked (*still*), an engine idle by design (unchanged,
or parked on its input queue) show no progress and do not block it.

Outside collectives, `StackFinding.still` says whether every load-bearing process is still, with
identical stacks in two dumps at least MIN_STILL_GAP_S apart, and nothing parked or blocking.
That alone proves nothing; the liveness gate needs corroboration before it calls it a stall.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Final

from shared.models import Quote
from shared.times import duration_text
from worker.evidence.facts import ProbeFailure
from worker.evidence.model import StackDump
from worker.evidence.pyspy import (
    Frame,
    Parking,
    ParkingKind,
    ParsedDump,
    ThreadStack,
    idle_wait,
    parking,
    parse_dump,
    primary_thread,
)
from worker.evidence.quotes import quote
from worker.evidence.roles import CONTEXT, LOAD_BEARING, Classification, Role, Roles, classify

__all__ = [
    "MIN_STILL_GAP_S",
    "DumpWindow",
    "Frame",
    "Parking",
    "ParkingKind",
    "ParsedDump",
    "ProcessJudgement",
    "ProcessState",
    "StackFinding",
    "ThreadStack",
    "judge_stacks",
    "parking",
    "parse_dump",
    "primary_thread",
    "rests_on_collective",
    "stack_holes",
]

MIN_STILL_GAP_S: Final = 5.0
"""Two identical dumps outside a collective must be at least this far apart (the default probe
interval) to show a process still rather than caught twice in one slow frame."""

COLLECTIVE_MECHANISM: Final = "wedged in a collective"
"""The words of a `stall_stacks` mechanism that rests on processes parked in a collective."""


class ProcessState(StrEnum):
    PARKED = "parked"  # same parking frame in both dumps
    ENGINE_IDLE = "engine_idle"  # an engine unchanged, or waiting on its input queue
    STILL = "still"  # unchanged stack, not parked in a collective or a queue
    IDLE = "idle"  # the stack changed, but only between an event loop's idle waits
    MOVING = "moving"  # the primary stack changed between dumps
    UNPAIRED = "unpaired"  # fewer than two dumps taken at different times
    UNREADABLE = "unreadable"  # no thread could be read from a dump
    STALE = "stale"  # a dump that is not live evidence (see DumpWindow)
    FAILED = "failed"  # a py-spy dump of it failed


MISSING: Final = frozenset(
    {ProcessState.UNREADABLE, ProcessState.UNPAIRED, ProcessState.STALE, ProcessState.FAILED}
)
"""States of a process whose dumps do not show what it does."""


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
    role: Role = Role.UNKNOWN
    why: str = ""  # why it has that role

    @property
    def label(self) -> str:
        return f"{self.target} pid {self.pid} ({self.role.value})"


@dataclass(frozen=True)
class StackFinding:
    """What the stacks say as a whole."""

    proven: bool
    mechanism: str | None
    processes: tuple[ProcessJudgement, ...]
    quotes: tuple[Quote, ...]  # the dumps of the processes the judgement rests on
    summary: str
    still: bool = False  # every load-bearing process still outside a collective
    still_frame: str | None = None  # the innermost frame they sit in
    notes: tuple[str, ...] = ()  # context that neither proves nor disproves (helpers, a driver)
    holes: tuple[ProcessJudgement, ...] = field(default=())  # what blocks the proof


# --- one process ----------------------------------------------------------------------------------


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


def _signature(thread: ThreadStack) -> tuple[tuple[str, str, int | None], ...]:
    return tuple((f.function, f.file, f.line) for f in thread.frames)


@dataclass(frozen=True)
class _Process:
    """The dumps and failed dumps of one process, and its role."""

    target: str
    pid: int
    dumps: tuple[StackDump, ...]
    failures: tuple[ProbeFailure, ...]
    role: Classification

    def judged(
        self,
        state: ProcessState,
        detail: str,
        park: Parking | None = None,
        quotes: tuple[Quote, ...] = (),
        *,
        gap_s: float = 0.0,
        top: str | None = None,
    ) -> ProcessJudgement:
        return ProcessJudgement(
            self.target, self.pid, state, park, quotes, detail, gap_s, top,
            self.role.role, self.role.why,
        )  # fmt: skip


def _unchanged(
    process: _Process, a: ThreadStack, quotes: tuple[Quote, ...], gap: float
) -> ProcessJudgement:
    state = ProcessState.ENGINE_IDLE if process.role.role is Role.ENGINE else ProcessState.STILL
    top = a.frames[0].text if a.frames else "no frame"
    detail = f"unchanged for {duration_text(gap)} at `{top}`, not in a collective"
    return process.judged(state, detail, None, quotes, gap_s=gap, top=top)


def _parked(
    process: _Process, park: Parking, quotes: tuple[Quote, ...], gap: float
) -> ProcessJudgement:
    apart = duration_text(gap)
    detail = f"parked in {park.kind.value} `{park.named.text}` in both dumps {apart} apart"
    if process.role.role is Role.ENGINE and park.kind is ParkingKind.QUEUE:
        detail = f"waiting on its input queue `{park.named.text}` ({apart} apart)"
        return process.judged(ProcessState.ENGINE_IDLE, detail, None, quotes, gap_s=gap)
    return process.judged(ProcessState.PARKED, detail, park, quotes, gap_s=gap)


def _changed(
    process: _Process, a: ThreadStack, b: ThreadStack, quotes: tuple[Quote, ...], gap: float
) -> ProcessJudgement:
    if process.role.role in {Role.ENGINE, Role.UNKNOWN} and idle_wait(a) and idle_wait(b):
        detail = f"only idle waits, `{a.frames[0].text}` then `{b.frames[0].text}`"
        return process.judged(ProcessState.IDLE, detail, None, quotes, gap_s=gap)
    return process.judged(
        ProcessState.MOVING, f"stack changed in {duration_text(gap)}", None, quotes, gap_s=gap
    )


def _judge_pair(
    process: _Process, first: StackDump, last: StackDump, gap: float
) -> ProcessJudgement:
    parsed = parse_dump(first.text), parse_dump(last.text)
    foreign = _foreign(first, parsed[0]) or _foreign(last, parsed[1])
    if foreign:
        return process.judged(ProcessState.STALE, foreign)
    a, b = primary_thread(parsed[0]), primary_thread(parsed[1])
    if a is None or b is None:
        return process.judged(ProcessState.UNREADABLE, "a dump holds no thread")
    park_a, park_b = parking(a), parking(b)
    quotes = (
        _dump_quote(first, a, park_a.named if park_a else None),
        _dump_quote(last, b, park_b.named if park_b else None),
    )
    if park_a and park_b and park_a.frame.text == park_b.frame.text:
        return _parked(process, park_a, quotes, gap)
    if _signature(a) != _signature(b):
        return _changed(process, a, b, quotes, gap)
    return _unchanged(process, a, quotes, gap)


def _judge_process(process: _Process, window: DumpWindow) -> ProcessJudgement:
    if process.failures:
        texts = "; ".join(f.text for f in process.failures)
        quotes = tuple(f.quote for f in process.failures)
        return process.judged(ProcessState.FAILED, f"py-spy failed: {texts}", quotes=quotes)
    stale = next((why for d in process.dumps if (why := window.why_not(d))), None)
    if stale is not None:
        return process.judged(ProcessState.STALE, stale)
    pair = _pair(process.dumps)
    if pair is None:
        detail = f"{len(process.dumps)} dump(s), not two taken at different times"
        return process.judged(ProcessState.UNPAIRED, detail)
    return _judge_pair(process, *pair)


def _processes(
    dumps: Sequence[StackDump], failed: Sequence[ProbeFailure], roles: Roles | None
) -> list[_Process]:
    groups: dict[tuple[str, int], list[StackDump]] = {}
    for dump in dumps:
        groups.setdefault((dump.target, dump.pid), []).append(dump)
    failures: dict[tuple[str, int], list[ProbeFailure]] = {}
    for failure in failed:
        if failure.pid is not None:
            failures.setdefault(_failure_key(failure, groups), []).append(failure)
    return [
        _Process(
            target, pid, tuple(sorted(groups.get((target, pid), ()), key=lambda d: d.n)),
            tuple(failures.get((target, pid), ())),
            _role(roles, target, pid, groups.get((target, pid), ())),
        )
        for target, pid in sorted({*groups, *failures})
    ]  # fmt: skip


def _failure_key(
    failure: ProbeFailure, groups: dict[tuple[str, int], list[StackDump]]
) -> tuple[str, int]:
    """The process a failed dump was of: its named target, else the one dumped pid it names."""
    assert failure.pid is not None
    if failure.target is not None:
        return failure.target, failure.pid
    same = [key for key in groups if key[1] == failure.pid]
    return same[0] if len(same) == 1 else ("?", failure.pid)


def _role(roles: Roles | None, target: str, pid: int, dumps: Sequence[StackDump]) -> Classification:
    """The recorded or derived role; classified from the dumps when nothing is known of it."""
    found = roles.get(target if target != "?" else None, pid) if roles is not None else None
    return found or classify(None, [d.text for d in dumps], pid=pid)


# --- the whole ------------------------------------------------------------------------------------


def _proves(judgement: ProcessJudgement) -> bool:
    """Parked, and a process a proof may rest on (an engine only in a collective)."""
    if judgement.state is not ProcessState.PARKED or judgement.parking is None:
        return False
    if judgement.role is Role.ENGINE:
        return judgement.parking.kind is ParkingKind.COLLECTIVE
    return judgement.role in LOAD_BEARING


def _blocks(judgement: ProcessJudgement, collective: bool) -> bool:
    """Whether the process keeps the stacks from proving a stall (module docstring)."""
    if judgement.role in CONTEXT:
        return False
    if judgement.state is ProcessState.MOVING:
        return True
    if judgement.state not in MISSING:
        return False
    return not (collective and judgement.role in {Role.DRIVER, Role.COORDINATOR})


def _quoted(judgement: ProcessJudgement, collective: bool) -> bool:
    """Whether the judgement quotes the process: not a helper's or a native one's dumps, nor the
    failed dump of a driver that is only context."""
    if judgement.role in CONTEXT:
        return False
    return judgement.state not in MISSING or _blocks(judgement, collective)


def _note(judgement: ProcessJudgement) -> str | None:
    """A process that neither proves nor blocks, but whose dumps say something worth noting."""
    if judgement.role in CONTEXT and judgement.state in {ProcessState.MOVING, *MISSING}:
        return (
            f"{judgement.label}: {judgement.state.value}, ignored ({judgement.why}: not progress)"
        )
    if judgement.state in MISSING:
        return (
            f"{judgement.label}: {judgement.state.value} ({judgement.detail}), context: the proof "
            "rests on the ranks parked in a collective"
        )
    return None


def _mechanism(parked: Sequence[ProcessJudgement]) -> str:
    kinds = {p.parking.kind for p in parked if p.parking}
    frames = sorted({p.parking.named.function for p in parked if p.parking})
    where = ", ".join(f"`{f}`" for f in frames)
    if kinds == {ParkingKind.QUEUE}:
        return f"coordinator deadlocked waiting on its own queue ({where})"
    who = "policy ranks" if any(p.role is not Role.ENGINE for p in parked) else "inference engines"
    return f"{who} {COLLECTIVE_MECHANISM} ({where}) with no progress between dumps"


def rests_on_collective(mechanism: str) -> bool:
    """Whether a `stall_stacks` mechanism rests on processes parked in a collective (the driver
    and coordinator are context there)."""
    return COLLECTIVE_MECHANISM in mechanism


def _describe(judgements: Sequence[ProcessJudgement]) -> str:
    parts = [f"{j.label}: {j.state.value} ({j.detail})" for j in judgements]
    return "; ".join(parts) if parts else "no stacks captured"


def _still_frame(
    judgements: Sequence[ProcessJudgement], holes: Sequence[ProcessJudgement]
) -> str | None:
    """The frame every load-bearing process sits in, when all are still long enough apart."""
    bearing = [j for j in judgements if j.role not in CONTEXT]
    if holes or any(j.state is ProcessState.PARKED for j in bearing):
        return None
    still = [j for j in bearing if j.role in LOAD_BEARING]
    if not still or any(
        j.state is not ProcessState.STILL or j.gap_s < MIN_STILL_GAP_S for j in still
    ):
        return None
    return ", ".join(sorted({j.top for j in still if j.top}))


def judge_stacks(
    dumps: Sequence[StackDump],
    window: DumpWindow | None = None,
    *,
    roles: Roles | None = None,
    failed: Sequence[ProbeFailure] = (),
) -> StackFinding:
    """Whether the dumps prove a stall, with the quotes of the processes the judgement rests on.

    `roles` are the processes' roles (`roles_of` the probes; classified from the dumps when
    absent or unknown); `failed` are the failed py-spy probes (`Facts.failed("stacks")`): each
    one that names a pid makes that process *failed*."""
    processes = _processes(dumps, failed, roles)
    judgements = tuple(_judge_process(p, window or DumpWindow()) for p in processes)
    parked = [j for j in judgements if _proves(j)]
    collective = any(p.parking and p.parking.kind is ParkingKind.COLLECTIVE for p in parked)
    holes = tuple(j for j in judgements if _blocks(j, collective))
    proven = bool(parked) and not holes
    frame = None if proven else _still_frame(judgements, holes)
    notes = tuple(n for j in judgements if not _blocks(j, collective) and (n := _note(j)))
    return StackFinding(
        proven=proven,
        mechanism=_mechanism(parked) if proven else None,
        processes=judgements,
        quotes=tuple(q for j in judgements if _quoted(j, collective) for q in j.quotes),
        summary=_describe(judgements),
        still=frame is not None,
        still_frame=frame,
        notes=notes,
        holes=holes,
    )


def stack_holes(
    failures: Sequence[ProbeFailure], roles: Roles, *, collective: bool
) -> tuple[ProbeFailure, ...]:
    """The failed stack probes a stall judgement cannot do without: every one that names no pid
    (no process found, a listing that failed), and a failed dump of any process but a helper or a
    native one — or, beside ranks parked in a collective, the driver or a coordinator."""
    holes = []
    for failure in failures:
        role = roles.of(failure.target, failure.pid).role if failure.pid is not None else None
        context = role in CONTEXT or (collective and role in {Role.DRIVER, Role.COORDINATOR})
        if role is None or not context:
            holes.append(failure)
    return tuple(holes)
