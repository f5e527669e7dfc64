"""The single place that starts processes: check the allowlist, run with a time budget, record.

`run_probe` refuses a command the allowlist does not hold before anything is spawned; there is no
default allowlist, so every caller names the one built from the operator's settings
(`worker.backends.tools`). argv[0] is the absolute path the tool was resolved to at start-up; a tool
that was not found (its bare name) gives exit code 127 without a lookup on PATH, as does a path
that has gone. A timeout gives exit code None (the process group it started is killed), so both
become probe failures instead of exceptions.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePath
from typing import Final

from worker.backends.allowlist import Allowlist

__all__ = ["MISSING_EXIT_CODE", "ProbeResult", "run_probe"]

MISSING_EXIT_CODE: Final = 127
_KILL_GRACE_S: Final = 5.0


@dataclass(frozen=True)
class ProbeResult:
    """What one command returned; `exit_code` None means it was stopped at its time budget."""

    argv: tuple[str, ...]
    started_at: datetime
    exit_code: int | None
    stdout: str
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def why(self) -> str:
        """One line saying why the command failed (empty when it did not)."""
        if self.exit_code is None:
            return "timed out"
        if self.ok:
            return ""
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return f"exited {self.exit_code}" + (f": {text[-1][:300]}" if text else "")


def _now() -> datetime:
    return datetime.now(UTC)


def _kill_group(process: subprocess.Popen[str]) -> None:
    """Stop the process group this module started (never anything else)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        return


def run_probe(
    argv: Sequence[str],
    timeout_s: float,
    *,
    allowlist: Allowlist,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], datetime] = _now,
) -> ProbeResult:
    """Run one allowed read-only command; `RefusedCommandError` before spawning anything else."""
    command = tuple(argv)
    tool = allowlist.check(command)
    started = clock()
    if not PurePath(command[0]).is_absolute():  # never looked up on PATH: not found at start-up
        why = f"command not found: {tool} was not found on the tool path at start-up"
        return ProbeResult(command, started, MISSING_EXIT_CODE, "", why)
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        return ProbeResult(command, started, MISSING_EXIT_CODE, "", f"command not found: {exc}")
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        stdout, stderr = process.communicate(timeout=_KILL_GRACE_S)
        note = f"\ntimed out after {timeout_s:g} s; process group killed"
        return ProbeResult(command, started, None, stdout or "", (stderr or "") + note)
    return ProbeResult(command, started, process.returncode, stdout, stderr)
