"""A local process: `/proc/<pid>/status` and `cmdline`, `py-spy dump` of it, and `nvidia-smi` on
this host. The job id's leaf name is the pid of the job's main process (ASCII digits only). Each
tool runs as the path resolved at start-up (`worker.backends.tools`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from worker.backends.base import JobRef, Recorder
from worker.backends.identifiers import PATTERNS
from worker.backends.iris import GPU_QUERY
from worker.backends.processes import TaskProcess
from worker.evidence.model import AttemptRecord, ControllerView

__all__ = ["LocalBackend", "proc_state"]

_STATE: Final = re.compile(r"^State:\s*(\S)", re.MULTILINE)
_RUNNING: Final = frozenset("RSDI")


def proc_state(status_text: str) -> str:
    """`running` for a live process (R, S, D, I), `failed` for a zombie or dead one."""
    found = _STATE.search(status_text)
    if found is None:
        return "unknown"
    return "running" if found.group(1) in _RUNNING else "failed"


@dataclass
class LocalBackend:
    """Read-only probes of one local process tree rooted at `pid`."""

    job: JobRef
    tools: Mapping[str, str] = field(default_factory=dict)  # tool name -> resolved path
    name: str = "local"

    def _tool(self, name: str) -> str:
        return self.tools.get(name, name)

    @property
    def pid(self) -> str:
        return self.job.name

    @property
    def target(self) -> str:
        return f"local-{self.pid}"

    def controller(self, rec: Recorder) -> ControllerView | None:
        if not PATTERNS["pid"].fullmatch(self.pid):
            rec.note(f"local: job id {self.job.job_id!r} does not end in a pid")
            return None
        cat = self._tool("cat")
        status = rec.run((cat, f"/proc/{self.pid}/status"), "raw/proc-status.txt")
        rec.run((cat, f"/proc/{self.pid}/cmdline"), "raw/proc-cmdline.txt")
        state = proc_state(status.stdout) if status.ok else "missing"
        task = {"task_id": self.target, "state": state, "pid": int(self.pid)}
        return ControllerView(job_id=self.job.job_id, state=state, task_count=1, tasks=(task,))

    def attempts(
        self, rec: Recorder, controller: ControllerView | None
    ) -> tuple[AttemptRecord, ...] | None:
        return None  # a bare process has no attempt history

    def logs_tail(self, rec: Recorder, controller: ControllerView | None) -> None:
        return None  # its log is the bundle's finelog

    def targets(self, controller: ControllerView | None) -> tuple[str, ...]:
        running = controller is not None and controller.state == "running"
        return (self.target,) if running else ()

    def processes(self, rec: Recorder, target: str) -> tuple[TaskProcess, ...]:
        cmdline = rec.outputs.get("raw/proc-cmdline.txt", "")
        args = " ".join(part for part in cmdline.split("\0") if part)
        return (TaskProcess(int(self.pid), None, args),)

    def stack(self, rec: Recorder, target: str, pid: int, n: int) -> None:
        argv = (self._tool("py-spy"), "dump", "--pid", str(pid))
        rec.run(argv, f"stacks/{target}-pid{pid}-{n}.txt")

    def gpus(self, rec: Recorder, target: str) -> None:
        rec.run((self._tool("nvidia-smi"), *GPU_QUERY[1:]), f"gpus/{target}.csv")
