"""The budget of one parse: how much memory it may add, how big its reads are, when it stops
(docs/parsing.md, "Memory budget")."""

from __future__ import annotations

import resource
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import polars as pl

__all__ = ["Held", "LogBudgetError", "ParseBudget", "parse_settings"]

FLOOR_MB: Final = 512
LOG_FACTOR: Final = 1.5
_MB: Final = 2**20
# The aim, past the fixed part, holds this many reads: two in flight (one parsed, the next
# scanned) at ~4x their size each (bytes, lines, stat fields, scan frames), the rest for the rows
# kept. The check assumes more reads' worth (a read of nothing but metric records explodes into
# pairs several times its size).
_READS_IN_AIM: Final = 18
_WORKING_READS: Final = 12
# What a parse adds whatever the log: polars' thread pool, its pattern caches (measured ~50 MB).
_FIXED: Final = 64 * _MB
_MIN_CHUNK: Final = 4 * _MB
_MAX_CHUNK: Final = 48 * _MB
# After the read: the tables built from the rows kept, and what their readers copy (half again),
# and stitching, which sorts and filters the metric rows (two more copies of them).
_KEPT_COPIES: Final = 1.5
_METRIC_COPIES: Final = 2.0
_STATM: Final = Path("/proc/self/statm")


class LogBudgetError(ValueError):
    """A log that cannot be read within the parse memory budget; the message says why."""


def parse_settings() -> tuple[int, bool]:
    """The parse settings (`shared.settings.Settings`): the memory limit in MB and whether the
    native pass reads lines; `ValueError` with one clear line when they are unusable."""
    from pydantic import ValidationError

    from shared.settings import Settings

    try:
        found = Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        raise ValueError(f"unusable RLHEALTH_* setting: {problems}") from None
    return found.parse_memory_mb, found.parse_native


def rss_bytes() -> int | None:
    """The process's resident memory now (Linux), else None."""
    try:
        pages = int(_STATM.read_text(encoding="ascii").split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * resource.getpagesize()


def _frames_bytes(parts: Iterable[dict[str, pl.DataFrame]]) -> int:
    return sum(int(frame.estimated_size()) for part in parts for frame in part.values())


@dataclass
class Held:
    """Bytes of rows kept: all of them, and the metric rows among them (stitching copies those)."""

    total: int = 0
    metrics: int = 0

    def add(self, rows: dict[str, pl.DataFrame]) -> None:
        """Count the frames of `rows`."""
        self.total += _frames_bytes([rows])
        metrics = rows.get("metrics")
        self.metrics += int(metrics.estimated_size()) if metrics is not None else 0


@dataclass
class ParseBudget:
    """The budget of one parse (one file, or every log of a job read together)."""

    limit_bytes: int  # the setting: past it the parse stops (`check`)
    chunk_bytes: int
    native: bool = True  # the native pass reads the lines it can (`Settings.parse_native`)
    log_bytes: int = 0  # the bytes to read (a small log never has many reads in flight)
    before: Held = field(default_factory=Held)  # rows kept from files read earlier
    base_rss: int | None = field(default_factory=rss_bytes)  # RSS when the parse began

    @classmethod
    def for_logs(
        cls, log_bytes: int, memory_mb: int | None = None, *, native: bool | None = None
    ) -> ParseBudget:
        """The budget for reading `log_bytes` of logs under a limit of `memory_mb` (default:
        the settings', as is `native`)."""
        if memory_mb is None or native is None:
            setting_mb, setting_native = parse_settings()
            memory_mb = setting_mb if memory_mb is None else memory_mb
            native = setting_native if native is None else native
        limit = memory_mb * _MB
        aim = min(limit, max(FLOOR_MB * _MB, int(LOG_FACTOR * log_bytes)))
        chunk = min(_MAX_CHUNK, max(_MIN_CHUNK, (aim - _FIXED) // _READS_IN_AIM))
        return cls(limit, chunk - chunk % 4096, native, log_bytes)

    @property
    def limit_mb(self) -> int:
        return self.limit_bytes // _MB

    def check(self, held: Held, source: str, line: int, offset: int) -> None:
        """Raise `LogBudgetError` when the rows `held` (of `source`, read up to `line`) could not
        be made into tables within the limit."""
        working = _WORKING_READS * min(self.chunk_bytes, max(self.log_bytes, _MIN_CHUNK))
        total = self.before.total + held.total
        metrics = self.before.metrics + held.metrics
        grown = rss_bytes()
        grown = grown - self.base_rss if grown is not None and self.base_rss is not None else 0
        # now: at least the steady state (fixed, reads in flight, rows), or what RSS says
        now = max(grown, _FIXED + working + total)
        # still to come: the copies that assembling the final tables makes of the rows
        ahead = (_KEPT_COPIES - 1) * total + _METRIC_COPIES * metrics
        if now + ahead <= self.limit_bytes:
            return
        raise LogBudgetError(
            f"{source} could not be read within the parse memory budget of {self.limit_mb:,} MB "
            f"(RLHEALTH_PARSE_MEMORY_MB): by line {line:,} "
            f"(byte {offset:,}) its tables already held {total // _MB:,} MB"
        )

    def keep(self, held: Held) -> None:
        """Count the rows `held` of a file read to the end."""
        self.before.total += held.total
        self.before.metrics += held.metrics
