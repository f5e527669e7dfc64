"""Issue 28, a low item: `python -m worker.evidence.logs` was a second parse command.

It skipped the redactor: a log without metrics had its head printed as it was, and a W&B key in it
with it, while `rl-health parse` hid the key. Now the module runs `rl-health parse` itself: one
command, one redactor, one checked `--out`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.security.corpus import WANDB

ROOT = Path(__file__).resolve().parents[2]


def _module(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "worker.evidence.logs", *map(str, args)]
    return subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_the_module_command_hides_what_the_redactor_hides(tmp_path: Path) -> None:
    """A log without metrics whose head holds a W&B key: the module command prints the head
    with the key redacted, and exits 1 as `rl-health parse` does."""
    log = tmp_path / "job.log"
    log.write_text(f"starting\nexport WANDB_API_KEY={WANDB}\nwandb login {WANDB}\nno metrics\n")
    done = _module(log, "--out", tmp_path / "out")
    printed = done.stdout + done.stderr
    assert done.returncode == 1, printed
    assert WANDB not in printed and WANDB[:12] not in printed and WANDB[-12:] not in printed
    assert "<redacted:" in printed


def test_the_module_command_is_the_parse_command(tmp_path: Path) -> None:
    """The module command takes `rl-health parse`'s options (`--cache`, `--trace-jobs-dir`)."""
    done = _module("--help")
    assert done.returncode == 0
    assert "--cache" in done.stdout and "--trace-jobs-dir" in done.stdout
