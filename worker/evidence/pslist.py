"""A process table as `ps -ww -eo pid,ppid,args` prints it inside a task or pod.

The live backends run that listing to find the processes worth a stack dump and record it as
`raw/ps-<target>.txt` in the probe directory; the probe reader reads it back so a recorded
capture knows each process's command line (`worker.evidence.roles`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Final

__all__ = ["PsRow", "parse_ps"]

_ROW: Final = re.compile(r"^\s*(\d+)\s+(\d+)\s+(.*)$")
_PYTHON: Final = re.compile(r"^python[\d.]*$")
_RENAMED_PYTHON: Final = re.compile(r"^(ray|VLLM)::")


@dataclass(frozen=True)
class PsRow:
    pid: int
    ppid: int
    args: str

    @property
    def is_python(self) -> bool:
        first = self.args.split(None, 1)[0] if self.args.strip() else ""
        return bool(_PYTHON.match(PurePath(first).name) or _RENAMED_PYTHON.match(first))


def parse_ps(text: str) -> tuple[PsRow, ...]:
    """Rows of `ps -eo pid,ppid,args` (the header and odd lines skipped)."""
    rows = (_ROW.match(line) for line in text.splitlines())
    return tuple(PsRow(int(m[1]), int(m[2]), m[3]) for m in rows if m)
