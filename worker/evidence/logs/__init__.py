"""The vectorised log parser: log files in, evidence tables out.

Public API: `parse_log_file` (one file), `parse_job_logs` (a watcher job directory),
`write_tables`, and `LogCache` for incremental re-parsing of growing logs. See docs/parsing.md.
"""

from __future__ import annotations

from worker.evidence.logs.incremental import LogCache
from worker.evidence.logs.job import parse_job_logs
from worker.evidence.logs.lines import CHUNK_BYTES
from worker.evidence.logs.reader import parse_log_file
from worker.evidence.logs.write import write_tables

__all__ = ["CHUNK_BYTES", "LogCache", "parse_job_logs", "parse_log_file", "write_tables"]
