"""The memory budget of one parse: how much it may hold, how big its reads are, when to stop.

A parse may never add more than the operator's setting `RLHEALTH_PARSE_MEMORY_MB` (default 2048)
to the process: that is the limit, past which it stops. Within it, the parse *aims* at 1.5x the
bytes of the logs it reads (at least FLOOR_MB, 512: a few MB of log still need a few reads' worth
of buffers, polars' thread pool and pattern caches, and their tables; a 17 MB log of 750,000
distinct metric keys keeps ~100 MB of rows): the read size and how many reads are scanned ahead
follow from the aim. The aim is not a limit: a log whose parse needs more than 1.5x of it (a 500
MB busy log peaks at ~1.3x-1.5x, a 200 MB one at ~2.4x, most of it pages the allocator keeps) is
read, not refused (it was refused before 2026-12-03, so every log of ~350-700 MB was an ERROR).
The memory counted is what the parse adds to the process's resident memory (RSS): its reads in
flight, the rows it keeps and what the allocator holds on to.

Bounded by construction: the read size follows from the budget (`chunk_bytes`), a line never
holds more than LINE_MAX_BYTES (`lines.py`), and after every chunk the process's RSS is read
(`/proc/self/statm`; elsewhere the rows' estimated size stands in). When that, with room for the
reads still in flight and for the copies that assembling the final tables makes of the rows kept
(`DataFrame.estimated_size`), would pass the budget, the parse stops with `LogBudgetError`: the
diagnosis says ERROR with that reason instead of growing until the process is killed.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # the budget is reckoned before polars is imported (`prelude`)
    import polars as pl

__all__ = [
    "DEFAULT_MEMORY_MB",
    "FLOOR_MB",
    "LOG_FACTOR",
    "Held",
    "LogBudgetError",
    "MemoryBudget",
    "frames_bytes",
    "rss_bytes",
    "rss_grown",
    "setting_mb",
]

DEFAULT_MEMORY_MB: Final = 2048
FLOOR_MB: Final = 512
LOG_FACTOR: Final = 1.5
_MB: Final = 2**20
# Reads in flight (two scanned in worker threads, one queued, one parsed, their split lines and
# scan frames) come to about this many times the read size: 8-9x for a busy log (the read size
# is chosen for those), 12x for one of nothing but metric records (the check assumes the worst;
# the RSS it reads catches the rest).
_TYPICAL_READS: Final = 9
_WORKING_READS: Final = 12
# One read being scanned: its bytes, its lines, the stat fields (~3x), and its frames (density)
# several times over while they are made.
_SCAN_READS: Final = 3
_DENSITY_COPIES: Final = 4
# What a parse adds whatever the log: polars' thread pool, its pattern caches (measured ~50 MB).
_FIXED: Final = 64 * _MB
_MIN_CHUNK: Final = 4 * _MB
_MAX_CHUNK: Final = 48 * _MB
# After the read: the tables built from the rows kept, and what their readers copy (half again),
# and stitching, which sorts and filters the metric rows (two more copies of them).
_KEPT_COPIES: Final = 1.5
_METRIC_COPIES: Final = 2.0
_ENV: Final = "RLHEALTH_PARSE_MEMORY_MB"
_STATM: Final = Path("/proc/self/statm")


class LogBudgetError(ValueError):
    """A log that cannot be read within the parse memory budget; the message says why."""


def setting_mb() -> int:
    """`RLHEALTH_PARSE_MEMORY_MB` (`shared.settings.Settings.parse_memory_mb`), read when called;
    `ValueError` with one clear line when it is not a whole number of at least 64."""
    if os.environ.get(_ENV) is None:
        return DEFAULT_MEMORY_MB  # the settings (pydantic-settings) are loaded only to read it
    from pydantic import ValidationError

    from shared.settings import Settings

    try:
        return Settings().parse_memory_mb
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        raise ValueError(f"unusable RLHEALTH_* setting: {problems}") from None


def rss_bytes() -> int | None:
    """The process's resident memory now (Linux), else None."""
    try:
        pages = int(_STATM.read_text(encoding="ascii").split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * resource.getpagesize()


def rss_grown(base: int | None) -> int | None:
    """How much the process's RSS grew since `base`, when both are known."""
    now = rss_bytes()
    return now - base if now is not None and base is not None else None


def frames_bytes(parts: Iterable[dict[str, pl.DataFrame]]) -> int:
    """The estimated bytes of every frame in `parts`."""
    return sum(int(frame.estimated_size()) for part in parts for frame in part.values())


@dataclass
class Held:
    """Bytes of rows kept: all of them, and the metric rows among them (stitching copies those)."""

    total: int = 0
    metrics: int = 0

    def add(self, rows: dict[str, pl.DataFrame]) -> None:
        """Count the frames of `rows`."""
        self.total += frames_bytes([rows])
        metrics = rows.get("metrics")
        self.metrics += int(metrics.estimated_size()) if metrics is not None else 0


@dataclass
class MemoryBudget:
    """The budget of one parse (one file, or every log of a job read together)."""

    limit_bytes: int  # the setting: past it the parse stops (`check`)
    chunk_bytes: int
    aim_bytes: int = 0  # 1.5x the logs (at least the floor, at most the limit): reads in flight
    log_bytes: int = 0  # the bytes to read (a small log never has many reads in flight)
    before: Held = field(default_factory=Held)  # rows kept from files read earlier
    base_rss: int | None = field(default_factory=rss_bytes)  # RSS when the parse began

    @classmethod
    def for_logs(cls, log_bytes: int, memory_mb: int | None = None) -> MemoryBudget:
        """The budget for reading `log_bytes` of logs under a setting of `memory_mb`."""
        setting = (memory_mb if memory_mb is not None else setting_mb()) * _MB
        aim = min(setting, max(FLOOR_MB * _MB, int(LOG_FACTOR * log_bytes)))
        # half of what is not fixed for the reads in flight, half for the rows and their assembly
        chunk = min(_MAX_CHUNK, max(_MIN_CHUNK, (aim - _FIXED) // (2 * _TYPICAL_READS)))
        return cls(
            limit_bytes=setting,
            chunk_bytes=chunk - chunk % 4096,
            aim_bytes=aim,
            log_bytes=log_bytes,
        )

    @property
    def limit_mb(self) -> int:
        return self.limit_bytes // _MB

    def check(self, held: Held, source: str, line: int, offset: int) -> None:
        """Raise `LogBudgetError` when the rows `held` (of `source`, read up to `line`) could not
        be made into tables within the budget."""
        working = _WORKING_READS * min(self.chunk_bytes, max(self.log_bytes, _MIN_CHUNK))
        total = self.before.total + held.total
        metrics = self.before.metrics + held.metrics
        # now: at least the steady state (fixed, reads in flight, rows), or what RSS says
        now = max(rss_grown(self.base_rss) or 0, _FIXED + working + total)
        # still to come: the copies that assembling the final tables makes of the rows
        ahead = (_KEPT_COPIES - 1) * total + _METRIC_COPIES * metrics
        if now + ahead <= self.limit_bytes:
            return
        raise LogBudgetError(
            f"{source} could not be read within the parse memory budget of {self.limit_mb:,} MB "
            f"(RLHEALTH_PARSE_MEMORY_MB): by line {line:,} "
            f"(byte {offset:,}) its tables already held {total // _MB:,} MB"
        )

    def room(self, held: Held, reads: int, density: float) -> bool:
        """True when `reads` reads may be scanned at once beside the rows `held`: a read costs
        about `_SCAN_READS` times its size, plus its scan's frames (`density`, bytes of frames
        for each byte read: ~0.2 for a busy log, ~3 for one of nothing but records) many times
        over while they are made. An estimate, not the RSS: the allocator's pages a finished
        read leaves behind are what the next one reuses (`check` reads the RSS)."""
        total = self.before.total + held.total
        metrics = self.before.metrics + held.metrics
        per_read = (_SCAN_READS + _DENSITY_COPIES * density) * self.chunk_bytes
        ahead = (_KEPT_COPIES - 1) * total + _METRIC_COPIES * metrics
        return _FIXED + total + reads * per_read + ahead <= (self.aim_bytes or self.limit_bytes)

    def held_before(self, size: int) -> None:
        """Count `size` bytes the parse already held when its RSS was first read (the reads a
        prelude made, `prelude.py`) as grown since: the base is lowered by them."""
        if self.base_rss is not None:
            self.base_rss -= size

    def keep(self, held: Held) -> None:
        """Count the rows `held` of a file read to the end."""
        self.before.total += held.total
        self.before.metrics += held.metrics
