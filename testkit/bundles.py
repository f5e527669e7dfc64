"""Watcher-style job bundles for the pipeline tests and the benchmark, built in a folder."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

__all__ = ["STEP_SECONDS", "write_job_bundle"]

STEP_SECONDS = 60.0
_START = datetime(2026, 7, 30, 21, 0, tzinfo=UTC)
_ENTRYPOINT = {"argv": ["uv", "run", "python", "-m", "skyrl_train.entrypoints.main_base"]}
_FILLER = (
    "{ts} | INFO | skyrl_train.generators.base:generate:88 - "
    "generation batch in progress, prompts queued for the inference engines\n"
)


def _step_lines(step: int) -> str:
    stamp = (_START + timedelta(seconds=STEP_SECONDS * step)).strftime("%Y-%m-%d %H:%M:%S.000")
    metrics = {"reward/avg_raw_reward": 0.25 + 0.01 * step, "policy/policy_entropy": 1.1}
    return (
        f"{stamp} | INFO | skyrl_train.trainer:train:210 - Finished: 'step', "
        f"time cost: {STEP_SECONDS:.2f}s\n"
        f"WANDB_MIRROR kind=train step={step} metrics={json.dumps(metrics)}\n"
    )


def _finelog(steps: int, size_bytes: int) -> str:
    body = "".join(_step_lines(step) for step in range(1, steps + 1))
    stamp = (_START + timedelta(seconds=STEP_SECONDS * steps)).strftime("%Y-%m-%d %H:%M:%S.000")
    filler = _FILLER.format(ts=stamp)
    missing = max(0, size_bytes - len(body))
    return filler * (missing // len(filler)) + body


def write_job_bundle(
    root: Path,
    name: str = "rl-job",
    *,
    cluster: str = "cw",
    user: str = "ops",
    steps: int = 12,
    size_bytes: int = 0,
) -> Path:
    """`<root>/jobs/<cluster>/<user>/<name>/` with a manifest and a SkyRL finelog; returns it.

    `size_bytes` pads the finelog with ordinary INFO lines before the step lines.
    """
    job_dir = root / "jobs" / cluster / user / name
    job_dir.mkdir(parents=True, exist_ok=True)
    synced = _START + timedelta(seconds=STEP_SECONDS * steps + 30)
    manifest = {
        "bundle_format": 1,
        "cluster": cluster,
        "job_id": f"/{user}/{name}",
        "kind": "rl",
        "synced_at": synced.isoformat(),
        "job": {
            "job_id": f"/{user}/{name}",
            "state": "running",
            "task_state": "running",
            "entrypoint": json.dumps(_ENTRYPOINT),
            "submitted_at_ms": int(_START.timestamp() * 1000),
            "finished_at_ms": None,
        },
        "artifacts": {"finelog": f"{steps * 2} lines", "pod_logs": "not requested"},
    }
    (job_dir / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    (job_dir / "finelog.log").write_text(_finelog(steps, size_bytes), encoding="utf-8")
    return job_dir
