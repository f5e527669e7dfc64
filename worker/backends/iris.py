"""Iris through its `iris` CLI: job summary or describe, attempts from `iris query`, a log tail,
and `iris task exec` for ps, py-spy and nvidia-smi inside a running task.

The command set is detected from `iris job --help`: releases up to 0.2.20 have `job summary
--json`; newer ones replace it with `job describe` (asked with `--json` as well). Attempts come
from the controller database: `iris query "SELECT ... FROM task_attempts WHERE task_id LIKE
'<job>/%'" -f csv`.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from pydantic import ValidationError

from shared.settings import Settings
from worker.backends.base import JobRef, Recorder, safe_name
from worker.backends.processes import PS_ARGV, python_pids
from worker.evidence.model import AttemptRecord, ControllerView
from worker.evidence.probes import attempts_from_iris_query_csv, controller_from_iris_summary

__all__ = ["ATTEMPTS_SQL", "GPU_QUERY", "IrisBackend", "iris_command_from_env"]

GPU_QUERY: Final = (
    "nvidia-smi",
    "--query-gpu=index,utilization.gpu,memory.used,memory.total,power.draw,power.limit",
    "--format=csv",
)
ATTEMPTS_SQL: Final = (
    "SELECT task_id, attempt_id, state, exit_code, error, started_at_ms, finished_at_ms "
    "FROM task_attempts WHERE task_id LIKE '{pattern}' ORDER BY task_id, attempt_id"
)
_TOOL: Final = "iris"


def iris_command_from_env() -> tuple[str, ...]:
    """The iris CLI argv prefix: the `RLHEALTH_IRIS_COMMAND` setting (shell words), else `iris`."""
    configured = Settings().iris_command.strip()
    return tuple(shlex.split(configured)) if configured else ("iris",)


def _sql_text(value: str) -> str:
    return value.replace("'", "''")


@dataclass
class IrisBackend:
    """Read-only probes of one Iris job; `command` is the CLI prefix, `connection` its options."""

    job: JobRef
    command: tuple[str, ...] = ("iris",)
    connection: tuple[str, ...] = ()
    log_lines: int = 2000
    exec_timeout_s: int = 60
    name: str = "iris"
    _describe: bool | None = field(default=None, repr=False)

    @classmethod
    def connect(
        cls,
        job: JobRef,
        *,
        controller_url: str | None,
        cluster: str | None,
        command: Sequence[str] = ("iris",),
        exec_timeout_s: int = 60,
    ) -> IrisBackend:
        """A backend on `--controller-url` when given, else `--cluster` (settings, then bundle)."""
        if controller_url:
            connection: tuple[str, ...] = (f"--controller-url={controller_url}",)
        elif cluster or job.cluster:
            connection = (f"--cluster={cluster or job.cluster}",)
        else:
            connection = ()
        return cls(job, tuple(command), connection, exec_timeout_s=exec_timeout_s)

    def _argv(self, *args: str) -> tuple[str, ...]:
        return (*self.command, *self.connection, *args)

    def _run(self, rec: Recorder, output: str, *args: str) -> str | None:
        result = rec.run(self._argv(*args), output, tool=_TOOL)
        return result.stdout if result.ok else None

    def _uses_describe(self, rec: Recorder) -> bool:
        """Feature detection: `job describe` (newer releases) or `job summary` (up to 0.2.20)."""
        if self._describe is None:
            text = self._run(rec, "raw/iris-job-help.txt", "job", "--help") or ""
            commands = text.split("Commands:", 1)[-1]
            self._describe = "describe" in commands and "summary" not in commands
        return self._describe

    def controller(self, rec: Recorder) -> ControllerView | None:
        verb = "describe" if self._uses_describe(rec) else "summary"
        text = self._run(rec, f"raw/job-{verb}.json", "job", verb, self.job.job_id, "--json")
        if text is None:
            return None
        try:
            return controller_from_iris_summary(text)
        except (ValueError, ValidationError) as exc:
            rec.note(f"`iris job {verb} --json` output does not parse: {exc}")
            return None

    def attempts(
        self, rec: Recorder, controller: ControllerView | None
    ) -> tuple[AttemptRecord, ...] | None:
        pattern = _sql_text(self.job.job_id.rstrip("/")) + "/%"
        sql = ATTEMPTS_SQL.format(pattern=pattern)
        text = self._run(rec, "raw/task-attempts.csv", "query", sql, "-f", "csv")
        if text is None:
            return None
        try:
            return attempts_from_iris_query_csv(text)
        except (ValueError, ValidationError) as exc:
            rec.note(f"`iris query` attempts do not parse: {exc}")
            return None

    def logs_tail(self, rec: Recorder, controller: ControllerView | None) -> None:
        bound = ("--tail", "--max-lines", str(self.log_lines))
        self._run(rec, "logs/tail.log", "job", "logs", self.job.job_id, *bound)

    def targets(self, controller: ControllerView | None) -> tuple[str, ...]:
        if controller is None:
            return ()
        running = (t for t in controller.tasks if str(t.get("state")) == "running")
        return tuple(str(t["task_id"]) for t in running if t.get("task_id"))

    def _exec(self, rec: Recorder, output: str, target: str, *probe: str) -> str | None:
        timeout = str(self.exec_timeout_s)
        return self._run(rec, output, "task", "exec", target, "--timeout", timeout, "--", *probe)

    def pids(self, rec: Recorder, target: str) -> tuple[int, ...]:
        text = self._exec(rec, f"raw/ps-{safe_name(target)}.txt", target, *PS_ARGV)
        return python_pids(text, self.job.process_match) if text is not None else ()

    def stack(self, rec: Recorder, target: str, pid: int, n: int) -> None:
        output = f"stacks/{safe_name(target)}-pid{pid}-{n}.txt"
        self._exec(rec, output, target, "py-spy", "dump", "--pid", str(pid))

    def gpus(self, rec: Recorder, target: str) -> None:
        self._exec(rec, f"gpus/{safe_name(target)}.csv", target, *GPU_QUERY)
