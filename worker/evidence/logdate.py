"""The date that time-only log lines lack, and where it came from (stated in the report).

Iris prefixes every line it collects with the time of day only (`[HH:MM:SS] task=...`). The parser
dates such a line from the last line before it that carries a full date, and before any, from
the *reference date* decided here. The first that applies wins:

1. `--log-date YYYY-MM-DD`, the operator's word;
2. the job's submission in `manifest.json` (`job.submitted_at_ms`);
3. the first full date (`YYYY-MM-DD HH:MM`) among the trainer log's first lines;
4. the trainer log's modification time — unless that is after the time judged (`now`): a log
   judged as of `now` was written before it, so its file was copied or touched since; then the
   date judged, or the day before when the log's first time of day is later than now's.

Hypothesis behind 4: a log file is modified when it is written, so its modification time dates its
newest lines — true for a watcher's sync, false for a copy (`cp` gives it the time of the copy).
The report says which rule gave the date, so a wrong one is seen and corrected with --log-date.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Final

__all__ = ["LogDate", "has_time_only_lines", "reference_date"]

_FULL_DATE: Final = re.compile(rb"\b(20\d\d)-(\d\d)-(\d\d)[ T]\d\d:\d\d")
_TIME_ONLY: Final = re.compile(rb"^\[(\d\d):(\d\d):(\d\d)\] ", re.MULTILINE)


@dataclass(frozen=True)
class LogDate:
    """The reference date (None: none could be found) and, in words, where it came from."""

    day: date | None
    source: str

    def statement(self, trainer: str) -> str:
        """The report's line about it."""
        if self.day is None:
            return f"time-only lines ([HH:MM:SS]) of {trainer} have no date: {self.source}"
        return (
            f"time-only lines ([HH:MM:SS]) of {trainer} dated {self.day.isoformat()}: {self.source}"
        )


def has_time_only_lines(head: bytes) -> bool:
    """Whether the first bytes of a log hold an Iris `[HH:MM:SS] ` line."""
    return _TIME_ONLY.search(head) is not None


def _first_full_date(head: bytes) -> tuple[date, int] | None:
    found = _FULL_DATE.search(head)
    if found is None:
        return None
    try:
        day = date(int(found[1]), int(found[2]), int(found[3]))
    except ValueError:
        return None
    return day, head.count(b"\n", 0, found.start()) + 1


def _first_time_of_day(head: bytes) -> time | None:
    found = _TIME_ONLY.search(head)
    if found is None:
        return None
    try:
        return time(int(found[1]), int(found[2]), int(found[3]))
    except ValueError:
        return None


def _judged_day(now: datetime, head: bytes) -> date:
    """The date judged, or the day before when the log's first time of day is later than now's
    (the log began before midnight)."""
    first = _first_time_of_day(head)
    now = now.astimezone(UTC)
    if first is not None and first > now.time().replace(tzinfo=None):
        return now.date() - timedelta(days=1)
    return now.date()


def reference_date(
    *,
    given: date | None,
    submitted: datetime | None,
    head: bytes,
    trainer: str,
    modified: datetime | None,
    now: datetime,
) -> LogDate:
    """The reference date by the module's rules, with its source."""
    if given is not None:
        return LogDate(given, "set by --log-date")
    if submitted is not None:
        return LogDate(submitted.astimezone(UTC).date(), "the job's submission (manifest.json)")
    dated = _first_full_date(head)
    if dated is not None:
        return LogDate(dated[0], f"the first dated line of {trainer} (line {dated[1]})")
    if modified is None:
        return LogDate(None, "no --log-date, no manifest, no dated line and no file to date")
    if modified <= now:
        return LogDate(
            modified.astimezone(UTC).date(),
            f"the modification time of {trainer} (a copied file carries the copy's date: "
            "give --log-date YYYY-MM-DD)",
        )
    return LogDate(
        _judged_day(now, head),
        f"the time judged ({now.astimezone(UTC).isoformat(timespec='minutes')}), since {trainer} "
        "was modified after it (a copy?); give --log-date YYYY-MM-DD if its lines are from "
        "another day",
    )
