"""The log parser: log files in, evidence tables out (docs/parsing.md). The cache a re-read
resumes from is `worker.evidence.log_cache.LogCache`."""

from worker.evidence.logs.budget import LogBudgetError, ParseBudget
from worker.evidence.logs.job import parse_job_logs
from worker.evidence.logs.reader import parse_log_file
from worker.evidence.logs.rules import LINE_MAX_BYTES

__all__ = [
    "LINE_MAX_BYTES",
    "LogBudgetError",
    "ParseBudget",
    "parse_job_logs",
    "parse_log_file",
]
