"""A real marin-iris LocalCluster for tests, and watcher-style job directories built from it.

`start_cluster` starts the in-process LocalCluster (client revision date patched, the venv's
`bin` on PATH so tasks find `python` and `py-spy`) and returns an `IrisTestCluster`; the CLI is
run through `testkit.iris_cli_shim` via the project's own read-only spawn module.
`build_job_dir` writes `manifest.json` and `finelog.log` the way the watcher would, from
`iris job summary --json`, `iris query` (job times) and `iris job logs`.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from testkit.iris_cli_shim import patch_revision_date
from worker.backends import allowlist_for
from worker.backends.spawn import ProbeResult, run_probe

__all__ = ["SHIM_COMMAND", "TOYS", "IrisTestCluster", "build_job_dir", "start_cluster", "toy_argv"]

SHIM_COMMAND: tuple[str, ...] = (sys.executable, "-m", "testkit.iris_cli_shim")
TOYS = Path(__file__).parent / "toys"

# The LocalCluster maps container paths into each task's sandbox: any argv element that starts
# with `/tmp` is rewritten to the task's own TMPDIR. A checkout (and its venv) under /tmp would
# then vanish from the command, so toys run as `bash -c 'exec "$IRIS_PYTHON" -c "$0" "$@"'
# SOURCE ARGS...`: the source travels as text (its first line `# toy: NAME` keeps the toy
# findable in `ps`), the interpreter through IRIS_PYTHON (the LocalCluster sets it to this
# interpreter), and the toy reads ARGS as sys.argv[1:].
_TOY_LAUNCH = 'exec "$IRIS_PYTHON" -c "$0" "$@"'


def toy_argv(name: str, *args: str) -> list[str]:
    """The argv that runs `toys/<name>.py` with ARGS inside a LocalCluster task."""
    source = (TOYS / f"{name}.py").read_text(encoding="utf-8")
    return ["bash", "-c", _TOY_LAUNCH, f"# toy: {name}\n{source}", *args]


REPO = Path(__file__).resolve().parents[1]
TERMINAL_STATES = ("succeeded", "failed", "killed", "worker_failed")


@dataclass
class IrisTestCluster:
    """A started LocalCluster: its URL, its client, and the CLI command that reaches it."""

    url: str
    cluster: Any
    client: Any
    user: str = "ops"

    def cli(self, *args: str, timeout_s: float = 60) -> ProbeResult:
        """Run a read-only `iris` command against this cluster (through the allowlist)."""
        argv = (*SHIM_COMMAND, f"--controller-url={self.url}", *args)
        return run_probe(argv, timeout_s, allowlist=allowlist_for(SHIM_COMMAND), env=cli_env())

    def submit(self, name: str, argv: Sequence[str], *, max_retries_failure: int = 0) -> str:
        """Submit a command as job `/ops/<name>`; its job id."""
        from iris.cluster.types import Entrypoint, ResourceSpec

        job = self.client.submit(
            Entrypoint.from_command(*argv),
            name=name,
            resources=ResourceSpec(cpu=1, memory="256m"),
            max_retries_failure=max_retries_failure,
            user=self.user,
        )
        return str(job.job_id)

    def summary(self, job_id: str) -> dict[str, Any]:
        """`iris job summary --json` of a job, parsed."""
        result = self.cli("job", "summary", job_id, "--json")
        assert result.ok, result.why()
        data: dict[str, Any] = json.loads(result.stdout)
        return data

    def wait_for(self, job_id: str, states: Sequence[str], timeout_s: float = 60) -> str:
        """Poll the controller until the job's state is one of `states`; that state."""
        from iris.cluster.types import JobName

        from worker.evidence.probes import iris_state_name

        deadline = time.monotonic() + timeout_s
        state = "unknown"
        while time.monotonic() < deadline:
            state = iris_state_name(int(self.client.job_state(JobName.from_wire(job_id))))
            if state in states:
                return state
            time.sleep(0.5)
        raise AssertionError(f"{job_id} still {state} after {timeout_s} s (wanted {states})")

    def close(self) -> None:
        self.cluster.close()


def cli_env() -> dict[str, str]:
    """The environment for the CLI subprocess: the repo importable, warnings quiet."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env["PYTHONWARNINGS"] = "ignore"
    return env


def start_cluster(workers: int = 2) -> IrisTestCluster:
    """Start a LocalCluster; raises with the reason when it cannot start on this machine."""
    patch_revision_date()
    venv_bin = str(Path(sys.executable).parent)
    if venv_bin not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = venv_bin + os.pathsep + os.environ.get("PATH", "")
    from iris.client.client import IrisClient
    from iris.cluster.backends.local.cluster import LocalCluster, make_local_cluster_config
    from iris.cluster.client import RemoteClusterClient

    cluster = LocalCluster(make_local_cluster_config(workers))
    address = cluster.start()
    url = address if address.startswith("http") else f"http://{address}"
    client = IrisClient(RemoteClusterClient(controller_address=url, timeout_ms=30000))
    return IrisTestCluster(url=url, cluster=cluster, client=client)


def _job_times(cluster: IrisTestCluster, job_id: str) -> dict[str, int | None]:
    sql = f"SELECT submitted_at_ms, finished_at_ms FROM jobs WHERE job_id = '{job_id}'"
    result = cluster.cli("query", sql, "-f", "csv")
    rows = list(csv.DictReader(io.StringIO(result.stdout))) if result.ok else []
    row = rows[0] if rows else {}
    return {key: int(value) if value else None for key, value in row.items()}


def build_job_dir(
    cluster: IrisTestCluster,
    job_id: str,
    root: Path,
    *,
    entrypoint: Sequence[str],
    cluster_name: str = "iris-local",
    synced_at: datetime | None = None,
) -> Path:
    """A watcher-style job directory `<root>/jobs/<cluster>/<user>/<job>` for `job_id`."""
    summary = cluster.summary(job_id)
    logs = cluster.cli("job", "logs", job_id)
    assert logs.ok, logs.why()
    times = _job_times(cluster, job_id)
    user, name = job_id.strip("/").split("/", 1)
    job_dir = root / "jobs" / cluster_name / user / name
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "finelog.log").write_text(logs.stdout, encoding="utf-8")
    lines = len(logs.stdout.splitlines())
    stamp = (synced_at or datetime.now(UTC)).astimezone(UTC)
    manifest = {
        "bundle_format": 1,
        "kind": "rl",
        "cluster": cluster_name,
        "job_id": job_id,
        "bundle_directory": str(job_dir),
        "synced_at": stamp.isoformat().replace("+00:00", "Z"),
        "job": {
            "cluster": {"name": cluster_name},
            "job_id": job_id,
            "state": summary["state"],
            "submitted_at_ms": times.get("submitted_at_ms"),
            "finished_at_ms": times.get("finished_at_ms"),
            "entrypoint": json.dumps({"argv": list(entrypoint)}),
        },
        "artifacts": {"finelog": f"{lines:,} lines" if lines else "unavailable", "errors": []},
        "errors": [],
    }
    (job_dir / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return job_dir
