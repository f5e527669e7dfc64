"""Read-only live probes of a job: one backend per kind of cluster, one module that spawns.

`make_backend` builds the backend named on the command line (`iris`, `kubernetes`, `slurm`,
`local`); `job_ref` names the job from the bundle and the settings; `default_runner` is
`spawn.run_probe` with the allowlist extended by the configured Iris command.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from shared.settings import Settings
from worker.backends.allowlist import DEFAULT_ALLOWLIST, Allowlist, RefusedCommandError
from worker.backends.base import Backend, JobRef, Recorder, Runner, probe_job
from worker.backends.iris import IrisBackend, iris_command_from_env
from worker.backends.kubernetes import KubernetesBackend
from worker.backends.local import LocalBackend
from worker.backends.slurm import SlurmBackend
from worker.backends.spawn import ProbeResult, run_probe
from worker.evidence.model import BundleInfo

__all__ = [
    "BACKENDS",
    "Backend",
    "JobRef",
    "ProbeResult",
    "Recorder",
    "RefusedCommandError",
    "Runner",
    "UnknownBackendError",
    "default_runner",
    "job_ref",
    "make_backend",
    "probe_job",
]

BACKENDS = ("iris", "kubernetes", "slurm", "local")


class UnknownBackendError(ValueError):
    """A backend name that is not one of BACKENDS."""


def _job_id_from_dir(job_dir: Path) -> str:
    """`/<user>/<job>` from a bundle path `.../jobs/<cluster>/<user>/<job>`."""
    parts = job_dir.parts
    return "/" + "/".join(parts[-2:]) if len(parts) >= 2 else "/" + job_dir.name


def _kube(manifest: dict[str, Any] | None) -> dict[str, Any]:
    job = (manifest or {}).get("job")
    cluster = job.get("cluster") if isinstance(job, dict) else None
    return cluster if isinstance(cluster, dict) else {}


def job_ref(bundle: BundleInfo, settings: Settings, process_match: str | None = None) -> JobRef:
    """The job to probe: the manifest's identity, the settings' connection."""
    kube = _kube(bundle.manifest)
    return JobRef(
        job_id=bundle.job_id or _job_id_from_dir(bundle.job_dir),
        cluster=settings.iris_cluster or bundle.cluster,
        kube_context=kube.get("context") or settings.kube_context,
        kubeconfig=kube.get("kubeconfig"),
        process_match=process_match or settings.probe_process_match,
    )


def allowlist_for(iris_command: Sequence[str]) -> Allowlist:
    """The default allowlist, accepting `iris_command` as the iris CLI."""
    return DEFAULT_ALLOWLIST.with_iris_prefix(iris_command)


def default_runner(iris_command: Sequence[str] | None = None) -> Runner:
    """`run_probe` behind the allowlist that accepts the configured iris command."""
    command = tuple(iris_command or iris_command_from_env())
    return partial(run_probe, allowlist=allowlist_for(command))


def make_backend(
    name: str, job: JobRef, settings: Settings, *, iris_command: Sequence[str] | None = None
) -> Backend:
    """The backend called `name` for `job`; `UnknownBackendError` for any other name."""
    if name == "iris":
        return IrisBackend.connect(
            job,
            controller_url=settings.iris_controller_url,
            cluster=settings.iris_cluster,
            command=tuple(iris_command or iris_command_from_env()),
            exec_timeout_s=max(1, int(settings.probe_timeout_s)),
        )
    if name == "kubernetes":
        return KubernetesBackend(job)
    if name == "slurm":
        return SlurmBackend(job)
    if name == "local":
        return LocalBackend(job)
    raise UnknownBackendError(f"unknown backend {name!r}; use one of {', '.join(BACKENDS)}")
