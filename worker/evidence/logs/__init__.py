"""The vectorised log parser: log files in, evidence tables out.

Public API: `parse_log_file` (one file), `parse_job_logs` (a watcher job directory),
`read_job_logs` (the same for a diagnosis: tables and the notes to report), `write_tables`,
`LogCache` for incremental re-parsing of growing logs, and the memory budget (`MemoryBudget`,
`LogBudgetError`). See docs/parsing.md.

The names are imported on first use (PEP 562): importing a polars-free submodule (`rules`,
`reads`, `native`, `budget`, `prelude`) does not import polars, so `rl-health parse` can begin
reading a log while polars is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from worker.evidence.logs.budget import LogBudgetError, MemoryBudget
    from worker.evidence.logs.incremental import LogCache
    from worker.evidence.logs.job import parse_job_logs, read_job_logs
    from worker.evidence.logs.lines import CHUNK_BYTES, LINE_MAX_BYTES
    from worker.evidence.logs.reader import parse_log_file
    from worker.evidence.logs.write import write_tables

__all__ = [
    "CHUNK_BYTES",
    "LINE_MAX_BYTES",
    "LogBudgetError",
    "LogCache",
    "MemoryBudget",
    "parse_job_logs",
    "parse_log_file",
    "read_job_logs",
    "write_tables",
]

_WHERE: Final = {
    "CHUNK_BYTES": "lines",
    "LINE_MAX_BYTES": "lines",
    "LogBudgetError": "budget",
    "LogCache": "incremental",
    "MemoryBudget": "budget",
    "parse_job_logs": "job",
    "parse_log_file": "reader",
    "read_job_logs": "job",
    "write_tables": "write",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
