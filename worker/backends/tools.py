"""The executables probes may run, resolved once at start-up from the operator's settings.

`resolve_tools(settings)` looks every cluster tool up on `RLHEALTH_TOOL_PATH` (default: the PATH
of the process at start-up) and keeps its absolute path. The iris command (`RLHEALTH_IRIS_COMMAND`,
shell words) and the watcher refresh template (`RLHEALTH_REFRESH_COMMAND`) are split into words,
their executable resolved the same way, and their shape checked by the allowlist (no shell, no
inline code, no mutating verb). The allowlist then knows each tool by that path alone. A setting
that fails is a `ToolSettingsError` naming it, raised at start-up, before anything runs.

A tool that is not found keeps its bare name: the allowlist still checks its argv, and the spawn
module answers exit 127 without starting anything.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path, PurePath
from typing import Final

from shared.settings import Settings
from worker.backends.allowlist import LOCAL_TOOLS, Allowlist, RefusedCommandError
from worker.backends.base import Runner
from worker.backends.connections import (
    ConnectionSettingsError,
    configured_clusters,
    operator_connection,
)
from worker.backends.spawn import run_probe

__all__ = ["CLUSTER_TOOLS", "ToolSettingsError", "Toolbox", "resolve_tools"]

CLUSTER_TOOLS: Final = ("kubectl", "squeue", "sacct", "sinfo", *LOCAL_TOOLS)


class ToolSettingsError(ValueError):
    """A tool or connection setting refused at start-up; the message names the setting."""


@dataclass(frozen=True)
class Toolbox:
    """Tools by name with the argv[0] each runs as, the iris command, the refresh template."""

    paths: Mapping[str, str] = field(default_factory=dict)  # name -> absolute path, when found
    iris: tuple[str, ...] = ("iris",)
    refresh: tuple[str, ...] = ()
    kubeconfigs: frozenset[str] = frozenset()

    def argv0(self, tool: str) -> str:
        """The path `tool` was resolved to, or its bare name when it was not found."""
        return self.paths.get(tool, tool)

    def allowlist(self) -> Allowlist:
        """The allowlist that knows these tools by their paths."""
        tools = {self.argv0(name): name for name in CLUSTER_TOOLS}
        return Allowlist(
            tools=tools, iris_prefixes=(self.iris,), refresh=self.refresh,
            kubeconfigs=self.kubeconfigs,
        )  # fmt: skip

    def runner(self, clock: Callable[[], datetime] | None = None) -> Runner:
        """`spawn.run_probe` behind this toolbox's allowlist."""
        if clock is None:
            return partial(run_probe, allowlist=self.allowlist())
        return partial(run_probe, allowlist=self.allowlist(), clock=clock)


def _which(word: str, search_path: str) -> str | None:
    """The absolute path of an executable: an absolute `word` as is, else looked up."""
    if "/" in word:
        if not PurePath(word).is_absolute():
            raise ToolSettingsError(f"{word!r}: a tool path must be absolute")
        return word if Path(word).is_file() and os.access(word, os.X_OK) else None
    found = shutil.which(word, path=search_path)
    return str(Path(found).absolute()) if found else None  # not resolve(): keep symlinks' names


def _command(setting: str, text: str, search_path: str) -> tuple[str, ...]:
    """A command setting's words with its executable resolved (kept as written when missing)."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ToolSettingsError(f"{setting}: {exc}") from exc
    if not words:
        return ()
    return (_which(words[0], search_path) or words[0], *words[1:])


def _kubeconfigs(settings: Settings) -> frozenset[str]:
    try:
        entries = [operator_connection(settings), *configured_clusters(settings).values()]
    except ConnectionSettingsError as exc:
        raise ToolSettingsError(str(exc)) from exc
    return frozenset(e.kubeconfig for e in entries if e.kubeconfig)


def resolve_tools(
    settings: Settings, *, iris_command: Sequence[str] | None = None, search_path: str | None = None
) -> Toolbox:
    """Resolve every tool, the iris command and the refresh template from the settings, once."""
    where = search_path or settings.tool_path or os.environ.get("PATH", os.defpath)
    paths = {name: path for name in CLUSTER_TOOLS if (path := _which(name, where))}
    if iris_command:
        iris = (_which(iris_command[0], where) or iris_command[0], *iris_command[1:])
    else:
        iris = _command("RLHEALTH_IRIS_COMMAND", settings.iris_command, where) or ("iris",)
    refresh = _command("RLHEALTH_REFRESH_COMMAND", settings.refresh_command or "", where)
    try:
        toolbox = Toolbox(paths, tuple(iris), refresh, _kubeconfigs(settings))
        toolbox.allowlist()  # the allowlist checks the iris command and the refresh template
    except RefusedCommandError as exc:
        setting = "RLHEALTH_REFRESH_COMMAND" if exc.tool == "refresh" else "RLHEALTH_IRIS_COMMAND"
        raise ToolSettingsError(f"{setting} refused: {exc}") from exc
    return toolbox
