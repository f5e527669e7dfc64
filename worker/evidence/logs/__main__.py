"""`python -m worker.evidence.logs PATH [--out DIR] [--format csv|parquet]`: parse and write tables.

PATH is a job directory or a single log file. Prints a one-line summary; exits 1 when no metrics
were found (the other tables are still written), 2 when the logs cannot be read within the memory
budget (one line saying why).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from worker.evidence.logs import LogBudgetError, parse_job_logs, parse_log_file, write_tables
from worker.evidence.parsed import LogTables


def _parse(path: Path) -> LogTables | None:
    if path.is_dir():
        return parse_job_logs(path)
    return parse_log_file(path, path.name)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; the exit code."""
    parser = argparse.ArgumentParser(prog="python -m worker.evidence.logs")
    parser.add_argument("path", type=Path)
    parser.add_argument("--out", type=Path, default=Path())
    parser.add_argument("--format", choices=["csv", "parquet"], default="csv")
    args = parser.parse_args(argv)
    try:
        tables = _parse(args.path)
    except LogBudgetError as exc:
        print(exc, file=sys.stderr)
        return 2
    if tables is None:
        print(f"no log file under {args.path}", file=sys.stderr)
        return 1
    written = write_tables(tables, args.out, args.format)
    summary = tables.summary
    print(
        f"lines={summary.lines} records={summary.records} malformed={summary.malformed} "
        f"tables={[p.name for p in written]}"
    )
    if tables.metrics.is_empty():
        print("no usable metrics; the log starts with:", *summary.head, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
