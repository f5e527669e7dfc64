"""Iris through its `iris` CLI: job summary or describe, attempts from `iris query`, a log tail,
and `iris task exec` for ps, py-spy and nvidia-smi inside a running task.

The command set is detected from `iris job --help`: releases up to 0.2.20 have `job summary
--json`; newer ones replace it with `job describe` (asked with `--json` as well). Attempts come
from the controller database: `iris query "SELECT ... FROM task_attempts WHERE task_id LIKE
'<job>/%' ESCAPE '\\'" -f csv`, the job id's `%`, `_` and `\\` escaped to match only
themselves.

Every value from data is checked before it joins an argv: the job id and the task ids of the
controller's reply match their strict patterns, and the job id follows `--`. The connection
(`--controller-url` or `--cluster`) comes from the operator's settings (`JobRef.connection`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from pydantic import ValidationError

from worker.backends.base import JobRef, Recorder, safe_name
from worker.backends.identifiers import PATTERNS, like_prefix
from worker.backends.processes import PS_ARGV, TaskProcess, task_processes
from worker.evidence.model import AttemptRecord, ControllerView
from worker.evidence.probes import attempts_from_iris_query_csv, controller_from_iris_summary

__all__ = ["ATTEMPTS_SQL", "GPU_QUERY", "IrisBackend"]

GPU_QUERY: Final = (
    "nvidia-smi",
    "--query-gpu=index,utilization.gpu,memory.used,memory.total,power.draw,power.limit",
    "--format=csv",
)
ATTEMPTS_SQL: Final = (
    "SELECT task_id, attempt_id, state, exit_code, error, started_at_ms, finished_at_ms "
    "FROM task_attempts WHERE task_id LIKE '{pattern}' ESCAPE '\\' ORDER BY task_id, attempt_id"
)
_TOOL: Final = "iris"


@dataclass
class IrisBackend:
    """Read-only probes of one Iris job; `command` is the CLI prefix resolved at start-up."""

    job: JobRef
    command: tuple[str, ...] = ("iris",)
    log_lines: int = 2000
    exec_timeout_s: int = 60
    name: str = "iris"
    _describe: bool | None = field(default=None, repr=False)

    @classmethod
    def connect(
        cls, job: JobRef, *, command: Sequence[str] = ("iris",), exec_timeout_s: int = 60
    ) -> IrisBackend:
        """A backend for `job` through the iris CLI `command`."""
        return cls(job, tuple(command), exec_timeout_s=exec_timeout_s)

    @property
    def connection(self) -> tuple[str, ...]:
        """`--controller-url` when configured, else `--cluster`, else the CLI's own default."""
        settings = self.job.connection
        if settings.iris_controller_url:
            return (f"--controller-url={settings.iris_controller_url}",)
        if settings.iris_cluster:
            return (f"--cluster={settings.iris_cluster}",)
        return ()

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
        text = self._run(rec, f"raw/job-{verb}.json", "job", verb, "--json", "--", self.job.job_id)
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
        pattern = like_prefix(self.job.job_id.rstrip("/") + "/") + "%"
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
        self._run(rec, "logs/tail.log", "job", "logs", *bound, "--", self.job.job_id)

    def targets(self, controller: ControllerView | None) -> tuple[str, ...]:
        if controller is None:
            return ()
        running = (t for t in controller.tasks if str(t.get("state")) == "running")
        return tuple(str(t["task_id"]) for t in running if t.get("task_id"))

    def _exec(self, rec: Recorder, output: str, target: str, *probe: str) -> str | None:
        if not PATTERNS["task id"].fullmatch(target):
            rec.note(f"iris: task id {target!r} is not a valid task id: not probed")
            return None
        timeout = str(self.exec_timeout_s)
        return self._run(rec, output, "task", "exec", target, "--timeout", timeout, "--", *probe)

    def processes(self, rec: Recorder, target: str) -> tuple[TaskProcess, ...]:
        text = self._exec(rec, f"raw/ps-{safe_name(target)}.txt", target, *PS_ARGV)
        return task_processes(text, self.job.process_match) if text is not None else ()

    def stack(self, rec: Recorder, target: str, pid: int, n: int) -> None:
        output = f"stacks/{safe_name(target)}-pid{pid}-{n}.txt"
        self._exec(rec, output, target, "py-spy", "dump", "--pid", str(pid))

    def gpus(self, rec: Recorder, target: str) -> None:
        self._exec(rec, f"gpus/{safe_name(target)}.csv", target, *GPU_QUERY)
