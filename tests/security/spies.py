"""Spies in place of every cluster tool: each logs its argv and answers from a replies file.

`make_spybin(folder)` writes an executable for every tool the backends may run (and for decoys a
crafted setting might name: `sh`, `scancel`, `pkill`, ...). Each is the fake CLI of
`tests/fixtures/fakebin/_replay.py`: it appends its argv (tool name first) as one JSON line to
`$FAKEBIN_LOG` and prints the reply recorded for that argv in `$FAKEBIN_REPLIES` (exit 1 without
one). `Spies.calls()` reads back every command that actually ran.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shared.settings import Settings
from worker.backends.tools import CLUSTER_TOOLS, Toolbox, resolve_tools

__all__ = ["DECOYS", "Spies", "make_spybin", "spies_on_path"]

REPLAY = Path(__file__).resolve().parents[1] / "fixtures" / "fakebin" / "_replay.py"
DECOYS = ("sh", "bash", "env", "scancel", "scontrol", "pkill", "kill", "rm", "watcher")


@dataclass
class Spies:
    """The spy folder, its call log and replies file."""

    bin: Path
    log: Path
    replies: Path

    def calls(self) -> list[list[str]]:
        """Every argv a spy received, tool name first, in order."""
        if not self.log.is_file():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def reply(self, argv: str, stdout: str = "", exit_code: int = 0) -> None:
        """Answer `argv` (tool name and arguments joined by spaces) with `stdout`."""
        data: dict[str, Any] = json.loads(self.replies.read_text())
        data[argv] = {"stdout": stdout, "exit": exit_code}
        self.replies.write_text(json.dumps(data))

    def toolbox(self, settings: Settings | None = None) -> Toolbox:
        """The tools resolved from this folder, as a start-up would."""
        return resolve_tools(settings or Settings(), search_path=str(self.bin))


def make_spybin(folder: Path) -> Spies:
    """A folder with a spy for every cluster tool, `iris` and the decoys."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (*CLUSTER_TOOLS, "iris", *DECOYS):
        spy = folder / name
        spy.write_text(f'#!/bin/sh\nexec python3 "{REPLAY}" "$0" "$@"\n')
        spy.chmod(0o755)
    replies = folder.parent / "replies.json"
    replies.write_text("{}")
    return Spies(folder, folder.parent / "calls.log", replies)


def spies_on_path(monkeypatch: pytest.MonkeyPatch, folder: Path) -> Spies:
    """Spies first on PATH and on RLHEALTH_TOOL_PATH, their log and replies in the environment."""
    spies = make_spybin(folder)
    monkeypatch.setenv("PATH", f"{spies.bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("RLHEALTH_TOOL_PATH", str(spies.bin))
    monkeypatch.setenv("RLHEALTH_IRIS_COMMAND", str(spies.bin / "iris"))
    monkeypatch.setenv("FAKEBIN_LOG", str(spies.log))
    monkeypatch.setenv("FAKEBIN_REPLIES", str(spies.replies))
    return spies
