"""Crafted job bundles: a SkyRL job whose manifest, log and trials carry what an attacker controls.

`crafted_bundle` writes a running job (three steps, then a log quiet for an hour, so every live
probe is called for) and lets a test override any manifest value — the job id, the cluster, the
kubeconfig and context, the watcher's `artifacts.errors` — and add log lines and trials.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.scenarios.builder import JobBuilder

__all__ = ["NOW", "crafted_bundle", "rewrite_manifest"]

NOW = datetime(2026, 7, 30, 21, 0, tzinfo=UTC)
METRICS = {"reward/avg_raw_reward": 0.3, "policy/policy_entropy": 1.1, "policy/policy_loss": 0.2}


def rewrite_manifest(job_dir: Path, **top: Any) -> dict[str, Any]:
    """Set top-level manifest keys (and `job.<key>` for `job_id`, `state`, `cluster`)."""
    path = job_dir / "manifest.json"
    manifest: dict[str, Any] = json.loads(path.read_text())
    for key, value in top.items():
        if key == "cluster_block":
            manifest["job"]["cluster"] = value
            continue
        manifest[key] = value
        if key in {"job_id", "state"}:
            manifest["job"][key] = value
        if key == "cluster":
            manifest["job"]["cluster"]["name"] = value
    path.write_text(json.dumps(manifest, indent=2))
    return manifest


def crafted_bundle(
    root: Path,
    name: str = "rl-job",
    *,
    stale: bool = False,
    state: str = "running",
    lines: Sequence[str] = (),
    head: Sequence[str] = (),
    steps: int = 3,
    trials: Sequence[tuple[str, str, str]] = (),
    manifest: Mapping[str, Any] | None = None,
    argv: Sequence[str] = ("python", "-m", "skyrl_train.entrypoints.main_base"),
) -> Path:
    """Write the bundle under `root/jobs/cw/ops/<name>`; `manifest` overrides manifest keys.

    `head` lines open the finelog (a config dump is what a log starts with), `lines` follow the
    steps; `trials` are `(name, exception_type, message)` of failed Harbor trials.
    """
    start = NOW - timedelta(hours=1)
    job = JobBuilder(root, name, start=start, cluster="cw", iris_prefix=False)
    job.lines.extend(head)
    moment = start
    for step in range(1, steps + 1):
        moment = job.step(step, moment, 60.0, METRICS)
    job.lines.extend(lines)
    for i, (trial, exception, message) in enumerate(trials):
        job.trial(
            trial, start + timedelta(minutes=i), reward=None, exception=exception, message=message
        )
    synced = NOW - (timedelta(hours=2) if stale else timedelta(minutes=1))
    job.manifest(state=state, argv=list(argv), synced_at=synced)
    job_dir = job.write()
    if manifest:
        rewrite_manifest(job_dir, **manifest)
    return job_dir
