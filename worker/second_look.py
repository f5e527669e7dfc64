"""The second look before a stall KILL: two observations of a job compared, the report settled.

A KILL that rests on stacks (its proof quotes `py-spy` dumps: the liveness gate's `stall_stacks`
or `stall_still`) is published only after a second look, `RLHEALTH_REOBSERVE_S` later: the log,
the controller and one more pair of dumps (docs/verdict.md, "The second look"). This module is the
pure part: `observe` reads what matters from an `Evidence`, `compare` says what the second
observation saw against the first, and `settle` turns the first report into the final one.

The second look is, in this order:

1. **terminal** — the controller says the job ended (succeeded, failed, killed...): NO-KILL,
   nothing to kill;
2. **blind** — it could not see: the trainer log missing or empty, no controller state, a probe
   of the controller, the attempts or the stacks failed, no stacks, the job gone without a
   terminal state: ERROR (blind is not healthy; a confident KILL or NO-KILL needs eyes);
3. **moved** — the log advanced past the first observation's newest step or progress time, the
   controller state or the attempt changed, or a load-bearing process's stack differs from the
   first observation's (or between the two new dumps, or such a process came or went): NO-KILL,
   saying what moved; a re-alert re-judges the job;
4. **confirmed** — nothing moved: the KILL stands, quoting both observations.

Stacks are judged by role (`worker.evidence.roles`, docs/domain.md#processes-and-roles): a rank, the
driver or a coordinator that leaves its frame, comes or goes is movement, and so is an engine or an
unknown process unless it only moved between an event loop's idle waits. A helper's or a native
process's frames, comings and goings are never movement, and its failed or unreadable dump does not
blind the look (nor does the driver's beside ranks parked in a collective): the summary says what
was ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from pydantic import BaseModel, ConfigDict

from shared.models import (
    Confidence,
    Quote,
    Report,
    SecondLook,
    SecondLookOutcome,
    UtcDatetime,
    Verdict,
    iso_utc,
)
from worker.evidence.case import Evidence
from worker.evidence.jobstate import JobState
from worker.evidence.model import StackDump
from worker.evidence.pyspy import ParkingKind, idle_wait, parking, parse_dump, primary_thread
from worker.evidence.quotes import quote
from worker.evidence.roles import (
    CONTEXT,
    LOAD_BEARING,
    Classification,
    Role,
    Roles,
    classify,
    roles_of,
)
from worker.gates.stacks import stack_holes

__all__ = [
    "Observation",
    "ProcessStack",
    "compare",
    "first_look_at",
    "observe",
    "rests_on_stacks",
    "settle",
]

SEEN_PROBES: Final = ("controller", "attempts", "stacks")
"""Probe kinds the second look needs: a failure of one of them leaves it blind (GPU state and
log tails are not part of it)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProcessStack(_Frozen):
    """One process's primary-thread stack in each dump of one observation, and its role."""

    target: str
    pid: int
    frames: tuple[tuple[str, ...], ...]  # per dump, oldest first: the frames, innermost first
    quotes: tuple[Quote, ...]  # the top frame of each dump
    role: Role = Role.UNKNOWN
    why: str = ""  # why it has that role
    idle: tuple[bool, ...] = ()  # per dump: only an event loop's idle wait on top
    collective: bool = False  # a dump of it sits in a collective

    @property
    def key(self) -> str:
        return f"{self.target} pid {self.pid}"

    @property
    def newest(self) -> tuple[str, ...]:
        return self.frames[-1]


class Observation(_Frozen):
    """What one look saw: the log's newest progress and step, the controller, the stacks, and
    what it could not see (`blind`)."""

    at: UtcDatetime
    progress_at: UtcDatetime | None = None
    progress: Quote | None = None
    step: int | None = None
    state: str | None = None
    state_source: str = "none"
    attempt: str | None = None  # the controller's newest attempt, when its history was probed
    log_attempt: int | None = None  # the newest attempt marked in the log
    stacks: tuple[ProcessStack, ...] = ()
    blind: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()  # helpers' failed or unreadable dumps: noted, not blind
    failed: tuple[str, ...] = ()  # keys of processes whose dump failed (not gone)

    @property
    def terminal(self) -> bool:
        parsed = JobState.parse(self.state)
        return parsed is not None and parsed.terminal


# --- when a second look is due -------------------------------------------------------------------


def _is_stack(source: str) -> bool:
    return "stacks/" in source


def rests_on_stacks(report: Report) -> bool:
    """A KILL whose proof quotes stacks (a stall proven by live dumps): the second look is due."""
    proof = report.kill_proof
    return (
        report.verdict is Verdict.KILL
        and proof is not None
        and any(_is_stack(q.source) for q in proof.evidence)
    )


def first_look_at(report: Report) -> datetime | None:
    """When the first look's newest dump that the proof quotes was taken (the second look is
    due RLHEALTH_REOBSERVE_S after it)."""
    proof = report.kill_proof
    stamps = [q.timestamp for q in proof.evidence if _is_stack(q.source)] if proof else []
    return max((s for s in stamps if s is not None), default=None)


# --- one observation -----------------------------------------------------------------------------


def _newest_step(evidence: Evidence) -> int | None:
    logs = evidence.logs
    if logs is None:
        return None
    steps = [
        frame["step"].max()
        for frame in (logs.metrics, logs.timers)
        if not frame.is_empty() and "step" in frame.columns
    ]
    found = [int(s) for s in steps if isinstance(s, int)]
    return max(found, default=None)


def _attempt(evidence: Evidence) -> str | None:
    """The controller's newest attempt (`task:attempt`), when the attempt history was probed."""
    probes = evidence.probes
    if probes is None or not probes.attempts:
        return None
    newest = max(probes.attempts, key=lambda a: (a.attempt_id, a.task_id))
    return f"{newest.task_id}:{newest.attempt_id}"


def _frames(dump: StackDump) -> tuple[tuple[str, ...], int | None, bool, bool] | None:
    """The primary thread's frames (innermost first), the dump line of the top one, whether it
    only waits idly, and whether it sits in a collective."""
    thread = primary_thread(parse_dump(dump.text))
    if thread is None:
        return None
    top = thread.frames[0].dump_line if thread.frames else thread.header_line
    park = parking(thread)
    collective = park is not None and park.kind is ParkingKind.COLLECTIVE
    return tuple(frame.text for frame in thread.frames), top, idle_wait(thread), collective


def _dump_quote(dump: StackDump, frames: tuple[str, ...], line: int | None, prefix: str) -> Quote:
    top = frames[0] if frames else "no frames"
    text = f"pid {dump.pid}: {top}"
    return quote(f"{prefix}{dump.source}", text, line=line, timestamp=dump.captured_at)


def _process(dumps: Sequence[StackDump], prefix: str, role: Classification) -> ProcessStack | str:
    """The process's stacks, or why they cannot be read."""
    ordered = sorted(dumps, key=lambda d: (d.captured_at is None, d.captured_at, d.n))
    read = [(_frames(d), d) for d in ordered]
    unreadable = next((d for found, d in read if found is None), None)
    if unreadable is not None:
        return f"{unreadable.source}: no thread could be read"
    parsed = [(found, d) for found, d in read if found is not None]
    first = ordered[0]
    return ProcessStack(
        target=first.target,
        pid=first.pid,
        frames=tuple(found[0] for found, _ in parsed),
        quotes=tuple(_dump_quote(d, found[0], found[1], prefix) for found, d in parsed),
        role=role.role,
        why=role.why,
        idle=tuple(found[2] for found, _ in parsed),
        collective=any(found[3] for found, _ in parsed),
    )


def _role(roles: Roles, key: tuple[str, int], dumps: Sequence[StackDump]) -> Classification:
    return roles.get(*key) or classify(None, [d.text for d in dumps], pid=key[1])


@dataclass(frozen=True)
class _Stacks:
    found: tuple[ProcessStack, ...]
    unreadable: tuple[tuple[Classification, str], ...]  # role, why it could not be read


def _stacks(evidence: Evidence, prefix: str, roles: Roles) -> _Stacks:
    groups: dict[tuple[str, int], list[StackDump]] = {}
    for dump in evidence.probes.stacks if evidence.probes else ():
        groups.setdefault((dump.target, dump.pid), []).append(dump)
    found, unreadable = [], []
    for key, dumps in sorted(groups.items()):
        role = _role(roles, key, dumps)
        process = _process(dumps, prefix, role)
        if isinstance(process, str):
            unreadable.append((role, process))
        else:
            found.append(process)
    return _Stacks(tuple(found), tuple(unreadable))


def _rests_on_collective(stacks: Sequence[ProcessStack]) -> bool:
    """Ranks parked in a collective: the driver and a coordinator are context beside them."""
    return any(p.collective and p.role in LOAD_BEARING for p in stacks)


def _context(role: Role, collective: bool) -> bool:
    return role in CONTEXT or (collective and role in {Role.DRIVER, Role.COORDINATOR})


def _probe_blind(evidence: Evidence, roles: Roles, collective: bool) -> tuple[list[str], list[str]]:
    """What the probes could not see, and the failed dumps that do not matter (noted)."""
    probes = evidence.probes
    if probes is None:
        notes = [d for d in evidence.discrepancies if "probe" in d or "backend" in d]
        return [f"no live probe was taken{': ' + notes[0] if notes else ''}"], []
    facts = evidence.facts
    dumps = facts.failed("stacks")
    holes = stack_holes(dumps, roles, collective=collective)
    failed = [*facts.failed(*(k for k in SEEN_PROBES if k != "stacks")), *holes]
    blind = [f"probe failed: {f.text}" for f in failed]
    ignored = [
        f"{roles.of(f.target, f.pid).role.value} pid {f.pid}: {f.text}"
        for f in dumps
        if f not in holes and f.pid is not None
    ]
    if probes.controller is None:
        blind.append("the controller's state could not be read")
    return blind, ignored


def _failed_keys(evidence: Evidence, stacks: Sequence[ProcessStack]) -> tuple[str, ...]:
    """The processes whose dump failed (keyed like `ProcessStack.key`): they are not gone."""
    known = {p.pid: p.key for p in stacks}
    keys = [
        f"{f.target} pid {f.pid}" if f.target else known.get(f.pid, f"pid {f.pid}")
        for f in evidence.facts.failed("stacks")
        if f.pid is not None
    ]
    return tuple(dict.fromkeys(keys))


def _log_blind(evidence: Evidence) -> list[str]:
    if evidence.logs is None or evidence.logs.summary.lines == 0:
        return ["the trainer log is missing or empty"]
    return []


def observe(evidence: Evidence, *, prefix: str = "") -> Observation:
    """What `evidence` shows the second look; `prefix` is put before its quoted sources (the
    second observation is frozen under `second_look/`)."""
    facts = evidence.facts
    newest = facts.newest()
    roles = roles_of(evidence.probes)
    read = _stacks(evidence, prefix, roles)
    collective = _rests_on_collective(read.found)
    probe_blind, ignored = _probe_blind(evidence, roles, collective)
    unreadable = [
        (role, why) for role, why in read.unreadable if not _context(role.role, collective)
    ]
    ignored += [
        f"{role.role.value}: {why}"
        for role, why in read.unreadable
        if _context(role.role, collective)
    ]
    blind = [*_log_blind(evidence), *probe_blind, *(why for _, why in unreadable)]
    state = facts.state.value if facts.state is not None else None
    progress = newest.quote if newest is not None else None
    if progress is not None and prefix:
        progress = progress.model_copy(update={"source": prefix + progress.source})
    return Observation(
        at=evidence.now,
        progress_at=newest.at if newest is not None else None,
        progress=progress,
        step=_newest_step(evidence),
        state=state,
        state_source=facts.state_source,
        attempt=_attempt(evidence),
        log_attempt=facts.newest_attempt if evidence.logs is not None else None,
        stacks=read.found,
        blind=tuple(dict.fromkeys(blind)),
        ignored=tuple(dict.fromkeys(ignored)),
        failed=_failed_keys(evidence, read.found),
    )


# --- two observations ----------------------------------------------------------------------------


def _log_moved(first: Observation, second: Observation) -> list[str]:
    moved = []
    if second.step is not None and (first.step is None or second.step > first.step):
        moved.append(f"the log advanced from step {first.step} to step {second.step}")
    if second.progress_at is not None and (
        first.progress_at is None or second.progress_at > first.progress_at
    ):
        text = second.progress.text if second.progress else "progress"
        moved.append(
            f"the log advanced past {iso_utc(first.progress_at) or 'nothing'}: "
            f"`{text}` at {iso_utc(second.progress_at)}"
        )
    return moved


def _controller_moved(first: Observation, second: Observation) -> list[str]:
    moved = []
    if first.state != second.state:
        moved.append(f"the controller state changed from {first.state} to {second.state}")
    if first.attempt is not None and second.attempt is not None and first.attempt != second.attempt:
        moved.append(f"a new attempt: attempt {first.attempt} then {second.attempt}")
    if first.log_attempt != second.log_attempt:
        moved.append(f"a new attempt in the log: {first.log_attempt} then {second.log_attempt}")
    return moved


def _counts(process: ProcessStack) -> bool:
    """Whether the process's frames can be movement (not a helper's, not a native one's)."""
    return process.role not in CONTEXT


def _idle_only(then: ProcessStack, now: ProcessStack) -> bool:
    """An engine or an unknown process that moved only between an event loop's idle waits."""
    return (
        now.role in {Role.ENGINE, Role.UNKNOWN}
        and all(then.idle[-1:])
        and bool(now.idle)
        and all(now.idle)
    )


def _change(key: str, then: ProcessStack | None, now: ProcessStack | None) -> str | None:
    """How the process changed between the observations, or None when it did not."""
    if then is None:
        return f"{key} is new"
    if now is None:
        return f"{key} is gone"
    changed = next((f for f in now.frames if f != then.newest), None)
    if changed is None:
        return None
    was, became = then.newest[:1] or ("no frame",), changed[:1] or ("no frame",)
    return f"{key}: stack changed from `{was[0]}` to `{became[0]}`"


def _stacks_moved(first: Observation, second: Observation) -> tuple[list[str], list[str]]:
    """What moved among the processes that count, and what was ignored (helpers, idle waits)."""
    before = {p.key: p for p in first.stacks}
    after = {p.key: p for p in second.stacks}
    moved: list[str] = []
    ignored: list[str] = []
    for key in [*before, *(k for k in after if k not in before)]:
        then, now = before.get(key), after.get(key)
        if now is None and key in second.failed:
            continue  # its dump failed: not gone (the look's blindness is judged apart)
        change = _change(key, then, now)
        if change is None:
            continue
        seen = [p for p in (then, now) if p is not None]
        if not any(_counts(p) for p in seen):
            ignored.append(f"{change} ({seen[-1].role.value}: {seen[-1].why})")
        elif then is not None and now is not None and _idle_only(then, now):
            ignored.append(f"{change} (only idle waits)")
        else:
            moved.append(change)
    return moved, ignored


def _blind(first: Observation, second: Observation) -> list[str]:
    found = list(second.blind)
    if first.attempt is not None and second.attempt is None:
        found.append("the controller's attempt history could not be read")
    if not second.stacks and not found:
        found.append("no stacks were taken")
    if second.state is None:
        found.append("no controller state")
    elif JobState.parse(second.state) is JobState.MISSING:
        found.append("the job is gone without a terminal state")
    return list(dict.fromkeys(found))


def _quotes(second: Observation) -> tuple[Quote, ...]:
    stacks = tuple(q for p in second.stacks if _counts(p) for q in p.quotes)
    return stacks + ((second.progress,) if second.progress else ())


def _look(
    outcome: SecondLookOutcome,
    first: Observation,
    second: Observation,
    waited_s: float,
    summary: str,
    moved: Iterable[str] = (),
) -> SecondLook:
    return SecondLook(
        outcome=outcome,
        waited_s=round(max(0.0, waited_s), 1),
        first_at=first.at,
        taken_at=second.at,
        summary=summary,
        moved=tuple(moved),
        evidence=_quotes(second),
    )


def _still(first: Observation, second: Observation) -> str:
    counted = [p for p in second.stacks if _counts(p)]
    frames = sorted({p.newest[0] for p in counted if p.newest})
    where = ", ".join(f"`{f}`" for f in frames) or "the same frames"
    log = iso_utc(first.progress_at) or "none"
    return (
        f"still wedged: the log has not advanced past {log} (step {first.step}), the "
        f"controller still says {second.state}, and {len(counted)} process(es) show the "
        f"same stacks in {where}"
    )


IGNORED_SHOWN: Final = 4
"""How many ignored observations the look's summary lists (the rest are counted)."""


def _ignored(notes: Sequence[str]) -> str:
    if not notes:
        return ""
    shown = "; ".join(notes[:IGNORED_SHOWN])
    more = f"; and {len(notes) - IGNORED_SHOWN} more" if len(notes) > IGNORED_SHOWN else ""
    return f" (ignored, not progress: {shown}{more})"


def compare(first: Observation, second: Observation, waited_s: float) -> SecondLook:
    """What the second look saw against the first observation (module docstring: the order)."""
    if second.terminal:
        summary = f"the job went {second.state} meanwhile ({second.state_source}): nothing to kill"
        moved = [f"the controller state changed from {first.state} to {second.state}"]
        return _look(SecondLookOutcome.TERMINAL, first, second, waited_s, summary, moved)
    blind = _blind(first, second)
    if blind:
        summary = "it could not see: " + "; ".join(blind)
        return _look(SecondLookOutcome.BLIND, first, second, waited_s, summary)
    stacks, ignored = _stacks_moved(first, second)
    note = _ignored([*ignored, *second.ignored])
    moved = [*_log_moved(first, second), *_controller_moved(first, second), *stacks]
    if moved:
        summary = "the job moved: " + "; ".join(moved) + note
        return _look(SecondLookOutcome.MOVED, first, second, waited_s, summary, moved)
    summary = _still(first, second) + note
    return _look(SecondLookOutcome.CONFIRMED, first, second, waited_s, summary)


# --- the final report ----------------------------------------------------------------------------


def _after(look: SecondLook) -> str:
    return f"a second look {look.waited_s:g} s later (taken {iso_utc(look.taken_at)})"


def _confirmed(report: Report, look: SecondLook) -> Report:
    proof = report.kill_proof
    assert proof is not None
    quotes = tuple(q for q in look.evidence if q not in proof.evidence)
    both = proof.model_copy(update={"evidence": proof.evidence + quotes})
    reasoning = (
        f"{report.reasoning} Confirmed by {_after(look)}: {look.summary}; the proof quotes both "
        f"observations ({len(both.evidence)} quotes)."
    )
    return report.model_copy(update={"kill_proof": both, "reasoning": reasoning})


def _moved(report: Report, look: SecondLook) -> Report:
    trusted = any(m.startswith(("the log", "the controller", "a new attempt")) for m in look.moved)
    reasoning = (
        f"The first observation looked like a stall ({_proof_line(report)}), but {_after(look)} "
        f"saw it move: {'; '.join(look.moved)}. Not killed: a job that moves is not wedged."
    )
    return report.model_copy(
        update={
            "verdict": Verdict.NO_KILL,
            "confidence": Confidence.MEDIUM if trusted else Confidence.LOW,
            "reasoning": reasoning,
            "next_action": "Supervisor: no action; keep the job running. A new alert for this "
            "job re-judges it.",
            "flip_signal": f"a re-alert that finds it quiet past the stall limit with stacks "
            f"that no longer move (it moved on the second look: {'; '.join(look.moved)})",
            "kill_proof": None,
            "handoff": None,
        }
    )


def _terminal(report: Report, look: SecondLook) -> Report:
    reasoning = (
        f"The first observation looked like a stall ({_proof_line(report)}), but {_after(look)} "
        f"found {look.summary}."
    )
    return report.model_copy(
        update={
            "verdict": Verdict.NO_KILL,
            "confidence": Confidence.HIGH,
            "reasoning": reasoning,
            "next_action": "Supervisor: nothing to kill; the job has ended. Look at how it ended "
            "before relaunching it.",
            "flip_signal": "a new attempt of the job that stalls again (a re-alert re-judges it)",
            "kill_proof": None,
            "handoff": None,
        }
    )


def _blind_report(report: Report, look: SecondLook) -> Report:
    reasoning = (
        f"The first observation looked like a stall ({_proof_line(report)}), but {_after(look)} "
        f"could not confirm it — {look.summary}. A stall KILL needs the second look to see the "
        "job still wedged; blind is not healthy either."
    )
    return report.model_copy(
        update={
            "verdict": Verdict.ERROR,
            "confidence": Confidence.LOW,
            "reasoning": reasoning,
            "next_action": "Check the live probes (backend, permissions to ptrace, the job's "
            "pods), then re-diagnose: a re-alert takes both looks again.",
            "flip_signal": "a second look that sees the job: still wedged (KILL) or moving "
            "(NO-KILL)",
            "kill_proof": None,
            "handoff": None,
        }
    )


def _proof_line(report: Report) -> str:
    proof = report.kill_proof
    return f"`{proof.rule}`: {proof.mechanism}" if proof else "no proof"


_SETTLE: Final = {
    SecondLookOutcome.CONFIRMED: _confirmed,
    SecondLookOutcome.MOVED: _moved,
    SecondLookOutcome.TERMINAL: _terminal,
    SecondLookOutcome.BLIND: _blind_report,
}


def settle(report: Report, look: SecondLook) -> Report:
    """The final report: the first one's verdict confirmed or overturned by the second look, with
    the look recorded in `second_look`."""
    settled = _SETTLE[look.outcome](report, look)
    return Report.model_validate({**settled.model_dump(), "second_look": look.model_dump()})
