"""The parser state carried from one chunk to the next (kept by the incremental cache as JSON)."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field, fields
from datetime import date, datetime
from typing import Any, Final

__all__ = ["MAX_EXAMPLES", "ParserState"]

MAX_EXAMPLES: Final = 5
_DATES: Final = ("anchor_day",)
_DATETIMES: Final = ("first_ts", "last_ts", "newest_own")


@dataclass
class ParserState:
    """State after the last committed line of a file."""

    line: int = 0  # lines committed so far (the next line is line + 1)
    offset: int = 0  # bytes committed so far
    first_content: int | None = None  # 1-based line of the first non-blank line
    attempt: int = 0
    attempt_task: str | None = None  # the Iris task whose boundaries count attempts
    driver_pid: str | None = None  # the pid of the driver's Ray prefix, last seen
    death_pid: str | None = None  # the driver pid when the last death line was logged ("": none)
    death_pending: bool = False  # a death line came after the last attempt start
    completed: int = 0  # completed steps before the next line
    post_finish: bool = False  # the last step marker was `Finished: 'step'`
    anchor_day: date | None = None  # the date for time-of-day-only lines
    rolls: int = 0  # midnights passed since the anchor
    last_tod: int | None = None  # the last Iris time of day, in seconds
    breakdowns: dict[str, str] = field(default_factory=dict)  # actor -> pending breakdown
    head: list[str] = field(default_factory=list)
    head_lines: list[int] = field(default_factory=list)  # 1-based line numbers of `head`
    head_seen: int = 0  # lines looked at for `head`
    records: dict[str, int] = field(default_factory=dict)
    malformed: int = 0
    malformed_examples: list[str] = field(default_factory=list)
    first_ts: datetime | None = None
    last_ts: datetime | None = None
    skew_lines: int = 0  # lines with both an own time and an Iris prefix time
    skew_min_s: float | None = None  # own time minus prefix time, smallest and largest
    skew_max_s: float | None = None
    skew_off_lines: int = 0  # lines whose two times differ beyond PREFIX_SKEW_TOLERANCE_S
    skew_first_line: int | None = None  # the first such line
    lag_sample: list[float] = field(default_factory=list)  # the first skews (replays.LAG_SAMPLE)
    newest_own: datetime | None = None  # the newest own time of a line not replayed
    replayed_lines: int = 0  # lines the log shipper re-sent (`replays`): no progress rows
    replayed_examples: list[str] = field(default_factory=list)  # "source:line: ...", the first few
    cut_lines: int = 0  # lines longer than LINE_MAX_BYTES, cut
    cut_examples: list[str] = field(default_factory=list)  # "source:line: N bytes", the first few

    @classmethod
    def initial(cls, reference_date: date | None) -> ParserState:
        """The state before the first line."""
        return cls(anchor_day=reference_date)

    def copy(self) -> ParserState:
        """A deep copy."""
        return copy.deepcopy(self)

    def count(self, name: str, n: int) -> None:
        """Add `n` records of serialization `name`."""
        if n:
            self.records[name] = self.records.get(name, 0) + n

    def to_json(self) -> str:
        """The state as JSON."""
        data = asdict(self)
        for name in (*_DATES, *_DATETIMES):
            value = data[name]
            data[name] = value.isoformat() if value is not None else None
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> ParserState:
        """The state back from `to_json`."""
        data: dict[str, Any] = json.loads(text)
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        for name in _DATES:
            data[name] = date.fromisoformat(data[name]) if data.get(name) else None
        for name in _DATETIMES:
            data[name] = datetime.fromisoformat(data[name]) if data.get(name) else None
        return cls(**data)
