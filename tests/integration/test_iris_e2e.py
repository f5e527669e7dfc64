"""End to end on a real LocalCluster: bundle from Iris, live probes, verdict, and replay."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shared.models import iso_utc
from testkit.iris_cluster import SHIM_COMMAND, IrisTestCluster, build_job_dir, toy_argv
from tests.integration.test_iris_backend import iris_cluster  # noqa: F401  (module fixture)

pytestmark = pytest.mark.integration

PY = sys.executable
RL_HEALTH = str(Path(sys.executable).with_name("rl-health"))


def _diagnose(job_dir: Path, now: datetime, *args: str, env: dict[str, str]) -> dict[str, Any]:
    """`rl-health diagnose JOB_DIR --now NOW --format json ARGS...` as a user runs it."""
    result = subprocess.run(
        [RL_HEALTH, "diagnose", str(job_dir), "--now", iso_utc(now) or "", "--format", "json",
         *args],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    body: dict[str, Any] = json.loads(result.stdout)
    return body


def _env(cluster: IrisTestCluster, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "RLHEALTH_IRIS_COMMAND": shlex.join(SHIM_COMMAND),
        "RLHEALTH_IRIS_CONTROLLER_URL": cluster.url,
        **extra,
    }


def test_crash_loop_is_killed_and_replay_agrees(
    iris_cluster: IrisTestCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`diagnose --backend iris` on a crash loop is KILL with same_failure; `--probes` agrees."""
    job_id = iris_cluster.submit("e2e-crash", toy_argv("crash_loop"), max_retries_failure=2)
    iris_cluster.wait_for(job_id, ["failed", "succeeded"])
    job_dir = build_job_dir(iris_cluster, job_id, tmp_path, entrypoint=[PY, "crash_loop.py"])
    now, out = datetime.now(UTC), tmp_path / "out"
    env = _env(iris_cluster)
    live = _diagnose(job_dir, now, "--backend", "iris", "--out", str(out), env=env)
    assert live["verdict"] == "KILL", json.dumps(live, indent=1)
    assert live["restarts"]["same_failure"] is True
    assert live["restarts"]["count"] == 3
    assert (out / "probes" / "probes.json").is_file()
    replay = _diagnose(job_dir, now, "--probes", str(out / "probes"), env=env)
    assert (replay["verdict"], replay["restarts"]) == (live["verdict"], live["restarts"])


def test_hung_trainer_is_killed_on_live_stacks_and_replay_agrees(
    iris_cluster: IrisTestCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`diagnose --backend iris` on a trainer hung in all_reduce (STALL_FLOOR_S lowered to suit
    its seconds-long steps) is KILL quoting two live stacks; replaying them with --probes agrees."""
    job_id = iris_cluster.submit("e2e-hung", toy_argv("hung_trainer"))
    iris_cluster.wait_for(job_id, ["running"])
    deadline = datetime.now(UTC) + timedelta(seconds=90)
    while "Finished: 'step'" not in iris_cluster.cli("job", "logs", job_id).stdout:
        assert datetime.now(UTC) < deadline, "the hung toy never started its step"
        time.sleep(1)
    job_dir = build_job_dir(iris_cluster, job_id, tmp_path / "bundle", entrypoint=[PY])
    now, out = datetime.now(UTC) + timedelta(seconds=5), tmp_path / "out"
    env = _env(
        iris_cluster,
        RLHEALTH_STALL_FLOOR_S="2",
        RLHEALTH_PROBE_PROCESS_MATCH="hung_trainer",
        RLHEALTH_PROBE_INTERVAL_S="2",
    )
    live = _diagnose(job_dir, now, "--backend", "iris", "--out", str(out), env=env)
    assert live["verdict"] == "KILL", json.dumps(live, indent=1)
    liveness = live["gates"]["liveness"]
    assert liveness["status"] == "FAIL"
    stacks = [q for q in liveness["evidence"] if q["source"].startswith("probes/stacks/")]
    parked = [q for q in stacks if "all_reduce" in q["text"]]
    assert len({q["timestamp"] for q in parked}) >= 2, liveness  # two dumps, apart in time
    replay = _diagnose(job_dir, now, "--probes", str(out / "probes"), env=env)
    assert replay["verdict"] == live["verdict"]
    assert replay["gates"]["liveness"] == liveness
