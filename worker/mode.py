"""The diagnostic mode, declared from the launched configuration (docs/interface.md#evidence-read).

An explicit mode (on the event, or `--mode`) wins. Otherwise the job's entrypoint decides: settings
of an agentic harness (Harbor, Daytona, terminal-bench, a trials directory) make it `agentic`; an
entrypoint without them makes it `standard`. No entrypoint and no explicit mode: `undeclared`.
The presence of `trace_jobs/` never decides it.
"""

from __future__ import annotations

import json
import re
from typing import Final

from shared.models import Mode
from worker.evidence.model import ModeDecision

__all__ = ["AGENTIC_MARKERS", "declare_mode", "entrypoint_argv"]

AGENTIC_MARKERS: Final = re.compile(
    r"harbor|daytona|terminal[_-]?bench|trials?_dir|trials_uri|trace_jobs_dir", re.IGNORECASE
)


def entrypoint_argv(entrypoint: str | None) -> tuple[str, ...]:
    """The launched command as argv: `{"argv": [...]}` JSON, a JSON list, or a command line."""
    if not entrypoint or not entrypoint.strip():
        return ()
    try:
        parsed: object = json.loads(entrypoint)
    except json.JSONDecodeError:
        return tuple(entrypoint.split())
    if isinstance(parsed, dict):
        parsed = parsed.get("argv") or parsed.get("command") or parsed.get("args")
    if isinstance(parsed, str):
        return tuple(parsed.split())
    if isinstance(parsed, list):
        return tuple(str(part) for part in parsed)
    return ()


def declare_mode(explicit: Mode | None, entrypoint: str | None) -> ModeDecision:
    """Decide the mode, with the reason quoted for the report."""
    if explicit is not None:
        return ModeDecision(mode=explicit, reason=f"explicit mode {explicit.value}")
    argv = entrypoint_argv(entrypoint)
    if not argv:
        return ModeDecision(
            mode=Mode.UNDECLARED,
            reason="no explicit mode and no entrypoint in manifest.json job.entrypoint",
        )
    for part in argv:
        match = AGENTIC_MARKERS.search(part)
        if match:
            return ModeDecision(
                mode=Mode.AGENTIC,
                reason=f"entrypoint names an agentic harness ({match.group(0)!r} in {part!r})",
            )
    return ModeDecision(
        mode=Mode.STANDARD, reason="entrypoint names no agentic harness (Harbor, Daytona, trials)"
    )
