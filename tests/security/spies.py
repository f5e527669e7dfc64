"""Spies in place of every cluster tool: each logs its argv and answers from a replies file.

`make_spybin(folder)` writes an executable for every tool the backends may run, for `iris`, and for
decoys a crafted setting might name (`sh`, `scancel`, `pkill`, ...). Each runs `spy.py`: it appends
its argv (tool name first) as one JSON line to `$SPY_LOG` and prints the first reply whose regex
matches its command line. `Spies.calls()` reads back every command that actually ran. This module
imports nothing from the code under test, so the same spies serve a run of older code.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = ["DECOYS", "TOOLS", "Spies", "make_spybin", "spies_on_path"]

SPY = Path(__file__).resolve().with_name("spy.py")
TOOLS = (
    "kubectl",
    "squeue",
    "sacct",
    "sinfo",
    "py-spy",
    "nvidia-smi",
    "cat",
    "ps",
    "pgrep",
    "iris",
)
DECOYS = ("sh", "bash", "env", "scancel", "scontrol", "pkill", "kill", "rm", "watcher")


@dataclass
class Spies:
    """The spy folder, its call log and its replies file."""

    bin: Path
    log: Path
    replies: Path

    def calls(self) -> list[list[str]]:
        """Every argv a spy received, tool name first, in order."""
        if not self.log.is_file():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def reply(self, pattern: str, stdout: str = "", exit_code: int = 0) -> None:
        """Answer command lines matching the regex `pattern` with `stdout` (first match wins)."""
        data: list[Any] = json.loads(self.replies.read_text())
        data.append([pattern, {"stdout": stdout, "exit": exit_code}])
        self.replies.write_text(json.dumps(data))

    def env(self) -> dict[str, str]:
        """The environment variables the spies read."""
        return {"SPY_LOG": str(self.log), "SPY_REPLIES": str(self.replies)}

    def toolbox(self, settings: Any = None) -> Any:
        """The tools resolved from this folder, as a start-up would."""
        from shared.settings import Settings
        from worker.backends.tools import resolve_tools

        return resolve_tools(settings or Settings(), search_path=str(self.bin))


def make_spybin(folder: Path) -> Spies:
    """A folder with a spy for every cluster tool, `iris` and the decoys."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (*TOOLS, *DECOYS):
        spy = folder / name
        # the interpreter by absolute path: `python3` on PATH may be a shim that runs `env` or
        # `cat`, which are spies here too
        spy.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "{SPY}" "$0" "$@"\n')
        spy.chmod(0o755)
    replies = folder.parent / "spy-replies.json"
    replies.write_text("[]")
    return Spies(folder, folder.parent / "spy-calls.log", replies)


def spies_on_path(monkeypatch: pytest.MonkeyPatch, folder: Path) -> Spies:
    """Spies first on PATH and on RLHEALTH_TOOL_PATH, the iris command pointing at the iris spy."""
    spies = make_spybin(folder)
    monkeypatch.setenv("PATH", f"{spies.bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("RLHEALTH_TOOL_PATH", str(spies.bin))
    monkeypatch.setenv("RLHEALTH_IRIS_COMMAND", str(spies.bin / "iris"))
    for name, value in spies.env().items():
        monkeypatch.setenv(name, value)
    return spies
