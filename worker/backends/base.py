"""The backend protocol and the recorder every probe goes through.

A backend turns questions about one job (controller state, attempts, a log tail, the processes of
a task or pod, their stacks, their GPUs) into read-only commands. It never runs them itself: each
goes through a `Recorder`, which hands it to a `Runner` (`spawn.run_probe`, or a recorded replay),
retries transient failures, and keeps the exact argv, start time, exit status and output for the
probe directory. `probe_job` is the one plan all backends share.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Protocol

from worker.backends.connections import ClusterConnection
from worker.backends.identifiers import checked
from worker.backends.processes import TaskProcess
from worker.backends.retry import with_retries
from worker.backends.spawn import ProbeResult
from worker.evidence.model import (
    AttemptRecord,
    ControllerView,
    ProbeCommand,
    ProbeEvidence,
    ProcessRecord,
)
from worker.evidence.roles import Role, classify

__all__ = [
    "Backend",
    "JobRef",
    "Recorder",
    "Runner",
    "probe_job",
    "safe_name",
]


class Runner(Protocol):
    """Runs one command within a time budget (the real one is `spawn.run_probe`)."""

    def __call__(self, argv: Sequence[str], timeout_s: float) -> ProbeResult: ...


@dataclass(frozen=True)
class JobRef:
    """Which job to probe: its id and cluster from the bundle (checked against their strict
    patterns, so neither can become an option), its connection from the operator's settings."""

    job_id: str
    cluster: str | None = None
    connection: ClusterConnection = field(default_factory=ClusterConnection)
    process_match: str | None = None  # regex on a process's command line, to pick the trainer

    def __post_init__(self) -> None:
        checked("job id", self.job_id)
        if self.cluster is not None:
            checked("cluster", self.cluster)

    @property
    def name(self) -> str:
        """The job's leaf name (`rl-job` for `/ops/rl-job`)."""
        return self.job_id.rstrip("/").rsplit("/", 1)[-1]


def safe_name(target: str) -> str:
    """A task id or pod name as a file-name part: `/ops/job/0` -> `ops_job_0`."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", target.strip("/")) or "target"


@dataclass
class Recorder:
    """Runs probes through `runner` and keeps what the probe directory must hold."""

    runner: Runner
    timeout_s: float
    retry_wait_s: float = 1.0
    commands: list[ProbeCommand] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    processes: list[ProcessRecord] = field(default_factory=list)

    def run(self, argv: Sequence[str], output: str, *, tool: str = "") -> ProbeResult:
        """Run `argv`; its stdout goes to `output` on success, else to `failed/<output>`."""
        result, tries = with_retries(
            tool, lambda: self.runner(argv, self.timeout_s), wait_s=self.retry_wait_s
        )
        path = output if result.ok else f"failed/{output}"
        self.outputs[path] = result.stdout if result.ok else _failure_text(result)
        self.commands.append(
            ProbeCommand(
                argv=result.argv,
                started_at=result.started_at,
                exit_code=result.exit_code,
                output=path,
                why=None if result.ok else result.why(),
            )
        )
        if not result.ok:
            retried = f" after {tries} tries" if tries > 1 else ""
            self.failures.append(f"`{' '.join(result.argv)}` {result.why()}{retried}")
        return result

    def note(self, failure: str) -> None:
        """A probe that could not even be attempted (no running task, no pid found)."""
        self.failures.append(failure)

    def evidence(
        self,
        *,
        backend: str,
        job_id: str,
        captured_at: datetime,
        controller: ControllerView | None,
        attempts: tuple[AttemptRecord, ...] | None,
    ) -> ProbeEvidence:
        """The ProbeEvidence to write; stacks and GPU files travel as raw outputs."""
        return ProbeEvidence(
            directory="probes",
            captured_at=captured_at,
            backend=backend,
            job_id=job_id,
            commands=tuple(self.commands),
            controller=controller,
            attempts=attempts,
            processes=tuple(self.processes),
            failures=tuple(self.failures),
        )


def _failure_text(result: ProbeResult) -> str:
    return f"{result.stdout}\n--- stderr ---\n{result.stderr}\n--- {result.why()}\n"


class Backend(Protocol):
    """Read-only probes of one job on one kind of cluster."""

    name: str

    def controller(self, rec: Recorder) -> ControllerView | None:
        """The controller's view of the job (`controller.json`)."""
        ...

    def attempts(
        self, rec: Recorder, controller: ControllerView | None
    ) -> tuple[AttemptRecord, ...] | None:
        """The attempt history (`attempts.json`)."""
        ...

    def logs_tail(self, rec: Recorder, controller: ControllerView | None) -> None:
        """Record a bounded tail of recent logs under `logs/`."""
        ...

    def targets(self, controller: ControllerView | None) -> tuple[str, ...]:
        """The running tasks or pods whose processes can be probed."""
        ...

    def processes(self, rec: Recorder, target: str) -> tuple[TaskProcess, ...]:
        """The Python processes of `target` worth a stack dump, with their command lines."""
        ...

    def stack(self, rec: Recorder, target: str, pid: int, n: int) -> None:
        """Record dump `n` of process `pid` as `stacks/<target>-pid<pid>-<n>.txt`."""
        ...

    def gpus(self, rec: Recorder, target: str) -> None:
        """Record `gpus/<target>.csv` from an nvidia-smi query."""
        ...


@dataclass(frozen=True)
class ProbePlan:
    """What to ask: stacks (two dumps `interval_s` apart) only when a stall must be judged; the
    log tail and GPU state unless `context` is off (the second look compares the stacks, the log
    and the controller, and needs neither). The dumps of one round run `parallel` at a time, so
    they show the task at nearly one instant and a round costs about one probe's time."""

    stacks: bool = False
    interval_s: float = 5.0
    dumps: int = 2
    max_pids: int = 8
    context: bool = True
    parallel: int = 8


_DUMP_FIRST: Final = (
    Role.RANK, Role.DRIVER, Role.COORDINATOR, Role.ENGINE, Role.UNKNOWN, Role.HELPER, Role.NATIVE,
)  # fmt: skip
"""The order in which processes are chosen when a task holds more than `max_pids`."""
ARGS_MAX_CHARS: Final = 4096
"""A recorded command line is cut here (a launcher's may carry a whole environment)."""


def _worth_dumping(found: Sequence[TaskProcess], limit: int) -> tuple[TaskProcess, ...]:
    """At most `limit` processes, the load-bearing ones first as their command lines name them
    (a Ray node's helpers never crowd its ranks out), in pid order."""

    def order(process: TaskProcess) -> tuple[int, int]:
        role = classify(process.args, pid=process.pid, parent_args=process.parent_args).role
        return _DUMP_FIRST.index(role), process.pid

    return tuple(sorted(sorted(found, key=order)[:limit], key=lambda p: p.pid))


def _record(rec: Recorder, target: str, process: TaskProcess, dumps: int) -> ProcessRecord:
    """The process and its role, decided from its command line and what its dumps returned."""
    name = f"{safe_name(target)}-pid{process.pid}"
    outputs = [f"stacks/{name}-{n}.txt" for n in range(1, dumps + 1)]
    texts = [rec.outputs[path] for path in outputs if path in rec.outputs]
    failures = [
        rec.outputs[f"failed/{path}"] for path in outputs if f"failed/{path}" in rec.outputs
    ]
    found = classify(
        process.args, texts, pid=process.pid, parent_args=process.parent_args, failures=failures
    )
    return ProcessRecord(
        target=safe_name(target),
        pid=process.pid,
        ppid=process.ppid,
        args=process.args[:ARGS_MAX_CHARS],
        role=found.role.value,
        why=found.why,
    )


def _by_file(command: ProbeCommand) -> str:
    return (command.output or "").removeprefix("failed/")


def _dump_round(
    backend: Backend, rec: Recorder, pids: Sequence[tuple[str, int]], n: int, parallel: int
) -> None:
    """Dump `n` of every (target, pid), `parallel` at a time; recorded in (target, pid) order
    whatever order they finish in."""
    start = len(rec.commands)
    if parallel <= 1 or len(pids) <= 1:
        for target, pid in pids:
            backend.stack(rec, target, pid, n)
    else:
        with ThreadPoolExecutor(max_workers=min(parallel, len(pids))) as pool:
            list(pool.map(lambda key: backend.stack(rec, key[0], key[1], n), pids))
    rec.commands[start:] = sorted(rec.commands[start:], key=_by_file)


def _dump_stacks(
    backend: Backend,
    rec: Recorder,
    targets: Sequence[str],
    plan: ProbePlan,
    sleep: Callable[[float], None],
) -> None:
    chosen = {t: _worth_dumping(backend.processes(rec, t), plan.max_pids) for t in targets}
    for target, found in chosen.items():
        if not found:
            rec.note(f"no Python process found in {target}: no stacks")
    pids = [(target, process.pid) for target, found in chosen.items() for process in found]
    for n in range(1, plan.dumps + 1):
        if n > 1:
            sleep(plan.interval_s)
        _dump_round(backend, rec, pids, n, plan.parallel)
    for target, found in chosen.items():
        rec.processes.extend(_record(rec, target, process, plan.dumps) for process in found)


def probe_job(
    backend: Backend,
    rec: Recorder,
    plan: ProbePlan,
    *,
    job_id: str,
    clock: Callable[[], datetime],
    sleep: Callable[[float], None] = time.sleep,
) -> ProbeEvidence:
    """Run the shared plan: controller, attempts, log tail, then stacks and GPUs when asked."""
    captured_at = clock()
    controller = backend.controller(rec)
    attempts = backend.attempts(rec, controller)
    if plan.context:
        backend.logs_tail(rec, controller)
    if plan.stacks:
        targets = backend.targets(controller)
        if not targets:
            rec.note("no running task or pod: stacks and GPU state cannot be captured")
        _dump_stacks(backend, rec, targets, plan, sleep)
        for target in targets if plan.context else ():
            backend.gpus(rec, target)
    return rec.evidence(
        backend=backend.name,
        job_id=job_id,
        captured_at=captured_at,
        controller=controller,
        attempts=attempts,
    )
