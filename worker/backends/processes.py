"""Pick the Python processes of a task or pod from `ps -eo pid,ppid,args` run inside it.

Inside a container every process belongs to the task. A local Iris worker runs tasks as children
of its own process, so the listing holds the whole machine: the task's processes are then the
descendants of the probe's parent (the worker), minus the probe and the CLI that carries it; an
optional regex on the command line narrows them to the trainer.

A Python process is one whose program is `python*`, or one that renamed itself the way Ray's
workers and actors (`ray::PolicyWorker.ppo_train`, `ray::IDLE`) and vLLM's engine processes
(`VLLM::EngineCore_0`) do: those hold the ranks and engines a stall proof rests on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from worker.evidence.pslist import PsRow, parse_ps

__all__ = ["PS_ARGV", "PsRow", "TaskProcess", "parse_ps", "task_processes"]

PS_ARGV: Final = ("ps", "-ww", "-eo", "pid,ppid,args")  # -ww: never cut the command line
_PROBE_TEXT: Final = " ".join(PS_ARGV)


@dataclass(frozen=True)
class TaskProcess:
    """A Python process of the task, with its parent's command line (torchrun's ranks are known
    by their parent)."""

    pid: int
    ppid: int | None
    args: str
    parent_args: str | None = None


def _descendants(rows: Iterable[PsRow], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for row in rows:
        children.setdefault(row.ppid, []).append(row.pid)
    found: set[int] = set()
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid not in found and pid != root:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def task_processes(text: str, match: str | None = None) -> tuple[TaskProcess, ...]:
    """The Python processes of the task the listing was taken in, optionally matching `match`,
    in pid order."""
    rows = parse_ps(text)
    probe = next((r for r in rows if r.args.strip() == _PROBE_TEXT), None)
    scope = _descendants(rows, probe.ppid) if probe else {r.pid for r in rows}
    pattern = re.compile(match) if match else None
    args = {r.pid: r.args for r in rows}
    return tuple(
        TaskProcess(r.pid, r.ppid, r.args, args.get(r.ppid))
        for r in sorted(rows, key=lambda row: row.pid)
        if r.pid in scope
        and r.is_python
        and _PROBE_TEXT not in r.args
        and (pattern is None or pattern.search(r.args))
    )
