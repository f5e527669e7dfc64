"""Slurm through `squeue` and `sacct` (read-only): the job's state and its requeued attempts.

`sacct --duplicates` lists every run of a requeued job; each becomes an attempt. Slurm offers no
read-only way into a running step's processes, so this backend takes no stacks or GPU state (the
probe plan records that as a probe that could not be made). The job number (the bundle's job leaf
name) must be digits (`812`, `812_3`) before it joins an argv.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from worker.backends.base import JobRef, Recorder
from worker.backends.identifiers import PATTERNS
from worker.backends.processes import TaskProcess
from worker.evidence.model import AttemptRecord, ControllerView

__all__ = ["SACCT_FIELDS", "SlurmBackend", "attempts_from_sacct", "slurm_state"]

SACCT_FIELDS: Final = ("JobID", "State", "ExitCode", "Start", "End", "NodeList", "Reason")
_STATES: Final = {
    "PENDING": "pending",
    "CONFIGURING": "building",
    "RUNNING": "running",
    "COMPLETING": "running",
    "COMPLETED": "succeeded",
    "FAILED": "failed",
    "TIMEOUT": "failed",
    "OUT_OF_MEMORY": "failed",
    "CANCELLED": "killed",
    "NODE_FAIL": "worker_failed",
    "PREEMPTED": "preempted",
    "REQUEUED": "preempted",
    "BOOT_FAIL": "worker_failed",
}


def slurm_state(text: str) -> str:
    """A Slurm state (`CANCELLED by 0`, `FAILED`) as a lower-case Iris-style name."""
    word = text.strip().split(" ", 1)[0].rstrip("+")
    return _STATES.get(word, word.lower() or "unknown")


def _ms(text: str) -> int | None:
    try:
        return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)
    except ValueError:
        return None  # "Unknown", "None"


def _exit(text: str) -> int | None:
    code = text.split(":", 1)[0]
    return int(code) if code.isdigit() else None


def attempts_from_sacct(text: str) -> tuple[AttemptRecord, ...]:
    """Rows of `sacct -P -n --duplicates -X --format=<SACCT_FIELDS>` as attempts, oldest first."""
    rows = [line.split("|") for line in text.splitlines() if line.count("|") >= 6]
    return tuple(
        AttemptRecord(
            task_id=row[0],
            attempt_id=i,
            state=slurm_state(row[1]),
            exit_code=_exit(row[2]),
            started_at_ms=_ms(row[3]),
            finished_at_ms=_ms(row[4]),
            node_name=row[5] or None,
            terminal_reason=row[6] if row[6] not in {"", "None"} else None,
            error=row[1] if slurm_state(row[1]) not in {"running", "succeeded"} else None,
        )
        for i, row in enumerate(sorted(rows, key=lambda r: r[3]))
    )


@dataclass
class SlurmBackend:
    """Read-only probes of one Slurm job (its numeric id is the bundle's job leaf name)."""

    job: JobRef
    sacct: str = "sacct"
    squeue: str = "squeue"
    name: str = "slurm"
    _attempts: tuple[AttemptRecord, ...] | None = field(default=None, repr=False)

    @property
    def job_number(self) -> str:
        return self.job.name

    def controller(self, rec: Recorder) -> ControllerView | None:
        fields = ",".join(SACCT_FIELDS)
        number = self.job_number
        if not PATTERNS["slurm job"].fullmatch(number):
            rec.note(f"slurm: job id {self.job.job_id!r} does not end in a Slurm job number")
            return None
        argv = (self.sacct, "-j", number, "-P", "-n", "-X", "--duplicates", f"--format={fields}")
        result = rec.run(argv, "raw/sacct.txt")
        self._attempts = attempts_from_sacct(result.stdout) if result.ok else None
        queue = rec.run((self.squeue, "-j", number, "-h", "-o", "%i|%T|%N|%r"), "raw/squeue.txt")
        return self._view(queue.stdout if queue.ok else "")

    def _view(self, squeue: str) -> ControllerView | None:
        line = next((ln for ln in squeue.splitlines() if ln.count("|") >= 3), None)
        newest = self._attempts[-1] if self._attempts else None
        if line is None and newest is None:
            return None
        state = slurm_state(line.split("|")[1]) if line else str(newest.state if newest else "")
        failures = sum(1 for a in self._attempts or () if a.state not in {"running", "succeeded"})
        return ControllerView(
            job_id=self.job.job_id,
            state=state,
            exit_code=newest.exit_code if newest else None,
            failure_count=failures,
            task_count=1,
            tasks=({"task_id": self.job_number, "state": state},),
        )

    def attempts(
        self, rec: Recorder, controller: ControllerView | None
    ) -> tuple[AttemptRecord, ...] | None:
        return self._attempts

    def logs_tail(self, rec: Recorder, controller: ControllerView | None) -> None:
        rec.note("slurm: the log tail comes from the bundle's slurm_logs; no live log probe")

    def targets(self, controller: ControllerView | None) -> tuple[str, ...]:
        return ()

    def processes(self, rec: Recorder, target: str) -> tuple[TaskProcess, ...]:
        return ()

    def stack(self, rec: Recorder, target: str, pid: int, n: int) -> None:
        return None

    def gpus(self, rec: Recorder, target: str) -> None:
        return None
