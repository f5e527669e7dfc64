"""The recorded backend: a probe directory read back, and a runner that replays it.

`read_recorded` gives the ProbeEvidence a replay judges (what the original diagnosis saw).
`RecordedRunner` answers each command with the output recorded for the same argv, so a live
backend can run its whole plan against recorded outputs (how preemption and worker loss, which a
local cluster cannot stage, are tested) without spawning anything.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePath

from worker.backends.spawn import MISSING_EXIT_CODE, ProbeResult
from worker.evidence.model import ProbeEvidence
from worker.evidence.paths import BundleFiles, resolve_inside
from worker.evidence.probes import read_probes

__all__ = ["RecordedRunner", "read_recorded"]


def read_recorded(probe_dir: Path, source_prefix: str = "probes") -> ProbeEvidence:
    """The probe directory as the gates see it."""
    return read_probes(probe_dir, source_prefix)


def _now() -> datetime:
    return datetime.now(UTC)


def _portable(argv: Sequence[str]) -> tuple[str, ...]:
    """`argv` with its executable reduced to its file name."""
    return (PurePath(argv[0]).name, *argv[1:]) if argv else ()


@dataclass
class RecordedRunner:
    """Replays the outputs of `probes.json` in `probe_dir`, matching commands by argv."""

    probe_dir: Path
    clock: Callable[[], datetime] = _now
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def _recorded(self) -> dict[tuple[str, ...], dict[str, object]]:
        data = json.loads(self._read("probes.json"))
        return {_portable(c["argv"]): c for c in data.get("commands", [])}

    def _read(self, relative: str) -> str:
        """A file of the probe directory, opened beneath it (`BundleFiles.open`: no symlink
        followed out of it, even one put there after the check); `PathEscapeError` when it
        leaves the directory, "" when it is not a regular file, `OSError` when it is missing."""
        resolve_inside(self.probe_dir, relative)  # a path out of the directory is an error
        handle = BundleFiles(self.probe_dir).open(relative)
        if handle is None:
            return ""
        with handle:
            return handle.read().decode("utf-8")

    def _output(self, relative: str) -> str:
        """A command's recorded output; "" when it is missing."""
        try:
            return self._read(relative)
        except FileNotFoundError:
            return ""

    def __call__(self, argv: Sequence[str], timeout_s: float) -> ProbeResult:
        """The recorded result of `argv`; an unrecorded command fails as if not found.

        Commands match by their words, the executable by its name: a recording made where a tool
        was resolved to another path still answers (nothing is ever run here)."""
        command = tuple(argv)
        self.calls.append(command)
        entry = self._recorded().get(_portable(command))
        if entry is None:
            return ProbeResult(command, self.clock(), MISSING_EXIT_CODE, "", "not recorded")
        output = entry.get("output")
        text = self._output(str(output)) if output else ""
        code = entry.get("exit_code")
        exit_code = code if isinstance(code, int) else None
        stdout, stderr = (text, "") if exit_code == 0 else ("", text)
        return ProbeResult(command, self.clock(), exit_code, stdout, stderr)
