"""Kubernetes (CoreWeave) through `kubectl`: pods of the job, their restarts, a log tail, and
`kubectl exec` for ps, py-spy and nvidia-smi.

Pods are found with a label selector (default `job-name=<job leaf name>`). The pods map onto the
controller view of docs/interface.md: one task per pod, job state from the pod phases; every
container termination kubectl still remembers (`lastState.terminated`) becomes an attempt.

`--kubeconfig`, `--context` and `--namespace` come from the operator's connection settings only
(`JobRef.connection`), never from a bundle: a kubeconfig names credential plugins kubectl runs.
The label value and every pod name of kubectl's reply are checked against their strict patterns
before they join an argv; a pod name follows `--` for `kubectl logs`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from worker.backends.base import JobRef, Recorder, safe_name
from worker.backends.identifiers import PATTERNS
from worker.backends.iris import GPU_QUERY
from worker.backends.processes import PS_ARGV, TaskProcess, task_processes
from worker.evidence.model import AttemptRecord, ControllerView

__all__ = ["KubernetesBackend", "attempts_from_pods", "controller_from_pods"]

_PHASES: Final = {
    "Pending": "pending",
    "Running": "running",
    "Succeeded": "succeeded",
    "Failed": "failed",
    "Unknown": "unknown",
}
_TOOL: Final = "kubectl"


def _pods(data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    items = data.get("items")
    return [p for p in items if isinstance(p, Mapping)] if isinstance(items, list) else []


def _statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found = pod.get("status", {}).get("containerStatuses") or []
    return [s for s in found if isinstance(s, Mapping)]


def _job_state(states: Sequence[str]) -> str:
    for state in ("failed", "running", "pending"):
        if state in states:
            return state
    if states and all(s == "succeeded" for s in states):
        return "succeeded"
    return "unknown" if states else "missing"


def _task(pod: Mapping[str, Any]) -> dict[str, Any]:
    terminated = [s.get("state", {}).get("terminated") for s in _statuses(pod)]
    exit_code = next((t.get("exitCode") for t in terminated if t), None)
    return {
        "task_id": pod.get("metadata", {}).get("name", ""),
        "state": _PHASES.get(str(pod.get("status", {}).get("phase")), "unknown"),
        "exit_code": exit_code,
        "restart_count": sum(int(s.get("restartCount") or 0) for s in _statuses(pod)),
        "worker_id": pod.get("spec", {}).get("nodeName"),
        "error": pod.get("status", {}).get("reason") or "",
    }


def controller_from_pods(job_id: str, data: Mapping[str, Any]) -> ControllerView:
    """`kubectl get pods -o json` mapped onto the keys of `iris job summary --json`."""
    tasks = [_task(pod) for pod in _pods(data)]
    states = [str(t["state"]) for t in tasks]
    counts: dict[str, int] = {}
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    return ControllerView(
        job_id=job_id,
        state=_job_state(states),
        failure_count=sum(int(t["restart_count"]) for t in tasks),
        task_count=len(tasks),
        completed_count=counts.get("succeeded", 0),
        task_state_counts=counts,
        tasks=tuple(tasks),
    )


def _pod_attempts(pod: Mapping[str, Any]) -> list[AttemptRecord]:
    name = str(pod.get("metadata", {}).get("name", ""))
    node = pod.get("spec", {}).get("nodeName")
    records: list[AttemptRecord] = []
    for status in _statuses(pod):
        last = (status.get("lastState") or {}).get("terminated")
        restarts = int(status.get("restartCount") or 0)
        if last:
            records.append(_attempt(name, node, restarts - 1, last, "failed"))
        current = (status.get("state") or {}).get("terminated")
        state = "succeeded" if current and current.get("exitCode") == 0 else "failed"
        records.append(_attempt(name, node, restarts, current or {}, state if current else None))
    return records


def _attempt(
    pod: str, node: object, number: int, term: Mapping[str, Any], state: str | None
) -> AttemptRecord:
    return AttemptRecord(
        task_id=pod,
        attempt_id=max(number, 0),
        state=state or "running",
        exit_code=term.get("exitCode"),
        error=term.get("message") or term.get("reason"),
        pod_name=pod,
        node_name=str(node) if node else None,
        terminal_reason=term.get("reason"),
    )


def attempts_from_pods(data: Mapping[str, Any]) -> tuple[AttemptRecord, ...]:
    """The terminations kubectl remembers (the last one per container) and the current runs."""
    return tuple(record for pod in _pods(data) for record in _pod_attempts(pod))


@dataclass
class KubernetesBackend:
    """Read-only probes of the pods of one job; `kubectl` is the path resolved at start-up."""

    job: JobRef
    kubectl: str = "kubectl"
    selector: str | None = None
    log_since: str = "1h"
    log_lines: int = 2000
    name: str = "kubernetes"
    _pods: dict[str, Any] | None = field(default=None, repr=False)

    def _argv(self, *args: str) -> tuple[str, ...]:
        settings, options = self.job.connection, []
        if settings.kubeconfig:
            options.append(f"--kubeconfig={settings.kubeconfig}")
        if settings.kube_context:
            options.append(f"--context={settings.kube_context}")
        if settings.namespace:
            options.append(f"--namespace={settings.namespace}")
        return (self.kubectl, *options, *args)

    def _run(self, rec: Recorder, output: str, *args: str) -> str | None:
        result = rec.run(self._argv(*args), output, tool=_TOOL)
        return result.stdout if result.ok else None

    def controller(self, rec: Recorder) -> ControllerView | None:
        if self.selector is None and not PATTERNS["label value"].fullmatch(self.job.name):
            rec.note(f"kubernetes: job name {self.job.name!r} is not a valid label value")
            return None
        selector = self.selector or f"job-name={self.job.name}"
        text = self._run(rec, "raw/pods.json", "get", "pods", "-l", selector, "-o", "json")
        try:
            self._pods = json.loads(text) if text is not None else None
        except ValueError as exc:
            rec.note(f"`kubectl get pods -o json` output does not parse: {exc}")
            self._pods = None
        if not isinstance(self._pods, dict):
            return None
        return controller_from_pods(self.job.job_id, self._pods)

    def attempts(
        self, rec: Recorder, controller: ControllerView | None
    ) -> tuple[AttemptRecord, ...] | None:
        return attempts_from_pods(self._pods) if self._pods is not None else None

    def logs_tail(self, rec: Recorder, controller: ControllerView | None) -> None:
        for pod in self._valid(rec, self._all_pods(controller)):
            since, lines = f"--since={self.log_since}", f"--tail={self.log_lines}"
            self._run(rec, f"logs/{safe_name(pod)}.log", "logs", since, lines, "--", pod)

    @staticmethod
    def _valid(rec: Recorder, pods: tuple[str, ...]) -> tuple[str, ...]:
        """The pod names fit to join an argv; the others noted and skipped."""
        for pod in pods:
            if not PATTERNS["pod"].fullmatch(pod):
                rec.note(f"kubernetes: pod name {pod!r} is not a valid pod name: not probed")
        return tuple(pod for pod in pods if PATTERNS["pod"].fullmatch(pod))

    def _all_pods(self, controller: ControllerView | None) -> tuple[str, ...]:
        tasks = controller.tasks if controller else ()
        return tuple(str(t["task_id"]) for t in tasks if t.get("task_id"))

    def targets(self, controller: ControllerView | None) -> tuple[str, ...]:
        tasks = controller.tasks if controller else ()
        return tuple(str(t["task_id"]) for t in tasks if t.get("state") == "running")

    def _exec(self, rec: Recorder, output: str, target: str, *probe: str) -> str | None:
        if not self._valid(rec, (target,)):
            return None
        return self._run(rec, output, "exec", target, "--", *probe)

    def processes(self, rec: Recorder, target: str) -> tuple[TaskProcess, ...]:
        text = self._exec(rec, f"raw/ps-{safe_name(target)}.txt", target, *PS_ARGV)
        return task_processes(text, self.job.process_match) if text is not None else ()

    def stack(self, rec: Recorder, target: str, pid: int, n: int) -> None:
        output = f"stacks/{safe_name(target)}-pid{pid}-{n}.txt"
        self._exec(rec, output, target, "py-spy", "dump", "--pid", str(pid))

    def gpus(self, rec: Recorder, target: str) -> None:
        self._exec(rec, f"gpus/{safe_name(target)}.csv", target, *GPU_QUERY)
