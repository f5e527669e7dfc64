"""Read-only live probes of a job: one backend per kind of cluster, one module that spawns.

`resolve_tools` (start-up) turns the operator's settings into a `Toolbox`: every tool's absolute
path, the iris command, the refresh template, the kubeconfig files allowed. `job_ref` names the job
from the bundle (its id and cluster checked against strict patterns) with a connection from the
settings only; `make_backend` builds the backend named on the command line (`iris`, `kubernetes`,
`slurm`, `local`) on that toolbox; `Toolbox.runner()` is `spawn.run_probe` behind its allowlist.
`run_refresh` runs the watcher refresh template for a stale bundle. See docs/security.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from shared.redact import clean
from shared.settings import Settings
from worker.backends.allowlist import Allowlist, RefusedCommandError
from worker.backends.base import Backend, JobRef, Recorder, Runner, probe_job
from worker.backends.connections import (
    ClusterConnection,
    UnconfiguredClusterError,
    configured_clusters,
    connection_for,
)
from worker.backends.identifiers import RefusedValueError, UnsafeValueError, checked
from worker.backends.iris import IrisBackend
from worker.backends.kubernetes import KubernetesBackend
from worker.backends.local import LocalBackend
from worker.backends.slurm import SlurmBackend
from worker.backends.spawn import ProbeResult, run_probe
from worker.backends.tools import Toolbox, ToolSettingsError, resolve_tools
from worker.evidence.model import BundleInfo

__all__ = [
    "BACKENDS",
    "Backend",
    "ClusterConnection",
    "JobRef",
    "ProbeResult",
    "Recorder",
    "RefusedCommandError",
    "RefusedValueError",
    "Runner",
    "ToolSettingsError",
    "Toolbox",
    "UnconfiguredClusterError",
    "UnknownBackendError",
    "UnsafeValueError",
    "allowlist_for",
    "default_runner",
    "job_ref",
    "make_backend",
    "probe_job",
    "refresh_argv",
    "resolve_tools",
    "run_probe",
    "run_refresh",
]

BACKENDS = ("iris", "kubernetes", "slurm", "local")


class UnknownBackendError(ValueError):
    """A backend name that is not one of BACKENDS."""


def _job_id_from_dir(job_dir: Path) -> str:
    """`/<user>/<job>` from a bundle path `.../jobs/<cluster>/<user>/<job>`."""
    parts = job_dir.parts
    return "/" + "/".join(parts[-2:]) if len(parts) >= 2 else "/" + job_dir.name


def job_ref(bundle: BundleInfo, settings: Settings, process_match: str | None = None) -> JobRef:
    """The job to probe: the bundle's id and cluster (checked), the settings' connection.

    `RefusedValueError` when the id or cluster does not fit its pattern, or the cluster is not
    one the operator configured. The manifest's `kubeconfig` and `context` are never read.
    """
    job_id = bundle.job_id or _job_id_from_dir(bundle.job_dir)
    cluster = checked("cluster", bundle.cluster) if bundle.cluster is not None else None
    return JobRef(
        job_id=checked("job id", job_id),
        cluster=cluster,
        connection=connection_for(settings, cluster),
        process_match=process_match or settings.probe_process_match,
    )


def allowlist_for(iris_command: Sequence[str], settings: Settings | None = None) -> Allowlist:
    """The allowlist of the tools resolved from `settings`, with `iris_command` as the iris CLI."""
    return resolve_tools(settings or Settings(), iris_command=iris_command).allowlist()


def default_runner(
    iris_command: Sequence[str] | None = None, settings: Settings | None = None
) -> Runner:
    """`run_probe` behind the allowlist of the tools resolved now from the settings."""
    return resolve_tools(settings or Settings(), iris_command=iris_command).runner()


def make_backend(name: str, job: JobRef, settings: Settings, tools: Toolbox) -> Backend:
    """The backend called `name` for `job` on `tools`; `UnknownBackendError` for any other name."""
    if name == "iris":
        timeout = max(1, int(settings.probe_timeout_s))
        return IrisBackend.connect(job, command=tools.iris, exec_timeout_s=timeout)
    if name == "kubernetes":
        return KubernetesBackend(job, kubectl=tools.argv0("kubectl"))
    if name == "slurm":
        return SlurmBackend(job, sacct=tools.argv0("sacct"), squeue=tools.argv0("squeue"))
    if name == "local":
        return LocalBackend(job, tools=dict(tools.paths))
    raise UnknownBackendError(f"unknown backend {name!r}; use one of {', '.join(BACKENDS)}")


def refresh_argv(
    template: Sequence[str], settings: Settings, job_id: str, cluster: str | None
) -> tuple[str, ...]:
    """The refresh template filled word by word with the checked job id and cluster (a cluster
    must be one the operator configured when RLHEALTH_CLUSTERS is set); RefusedValueError else."""
    clusters = configured_clusters(settings)
    if clusters and cluster not in clusters:
        raise UnconfiguredClusterError(
            f"cluster {cluster!r} is not configured in RLHEALTH_CLUSTERS"
        )
    values = {"job_id": checked("job id", job_id), "cluster": cluster or ""}
    if any("{cluster}" in word for word in template):
        values["cluster"] = checked("cluster", cluster)
    return tuple(word.format(**values) for word in template)


def run_refresh(
    tools: Toolbox,
    settings: Settings,
    job_id: str,
    cluster: str | None,
    clock: Callable[[], datetime] | None = None,
) -> str:
    """Run the watcher refresh for a stale bundle; a note saying what happened."""
    if not tools.refresh:
        return "evidence stale and no RLHEALTH_REFRESH_COMMAND configured: it stays stale"
    try:
        argv = refresh_argv(tools.refresh, settings, job_id, cluster)
        result = tools.runner(clock)(argv, settings.probe_timeout_s)
    except (RefusedValueError, RefusedCommandError) as exc:
        return f"watcher refresh refused: {clean(str(exc))}"
    shown = clean(" ".join(argv))
    if result.ok:
        return f"watcher refresh ran: `{shown}`"
    return f"watcher refresh failed: `{shown}` {result.why()}"
