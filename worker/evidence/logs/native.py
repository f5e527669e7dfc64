"""The native fast path of a scan: one C pass (`_fastscan.c`) over a read.

The pass reads the strict vLLM stat lines itself (the fields `engines.engine_fields` reads, with
the same values) and hands every other line, byte for byte, to the polars path. A line it cannot
prove strict (any other shape, non-ASCII, a control byte, a CR, a number of more than 20 digits,
a traceback literal) is a rest line: the polars path reads it as before, so the tables are the
same with or without the extension. Without the extension (`AVAILABLE` false) every line takes
the polars path. The columns come back through the Arrow C data interface: polars takes them
without a copy (and without numpy or pyarrow).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

import polars as pl

__all__ = ["AVAILABLE", "Native", "native_scan"]

try:
    from worker.evidence.logs import _fastscan  # type: ignore[attr-defined]
except ImportError:  # not built: the polars path reads every line
    _fastscan = None

# RLHEALTH_PARSE_NATIVE=0 turns the fast path off (to compare both paths).
AVAILABLE: Final = _fastscan is not None and os.environ.get("RLHEALTH_PARSE_NATIVE", "1") != "0"


class _Capsules:
    """An (ArrowSchema, ArrowArray) capsule pair, as polars reads one (`__arrow_c_array__`)."""

    def __init__(self, pair: tuple[object, object]) -> None:
        self._pair = pair

    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]:
        return self._pair


@dataclass(frozen=True)
class Native:
    """A read after the native pass: `rest` holds the lines it did not read (`where`: their
    line index in the read), `stats` the stat lines it read (`engines.engine_fields` columns)."""

    n_lines: int
    rest: bytes
    where: pl.Series  # UInt32, sorted
    stats: pl.DataFrame
    _data: bytes
    _starts: memoryview  # byte offset of each stat line in the read
    _stops: memoryview

    def raw(self, indices: list[int]) -> list[str]:
        """The text of the stat lines of `indices` (ASCII, as the polars split reads it)."""
        rows = self.stats.get_column("idx").search_sorted(pl.Series(indices, dtype=pl.UInt32))
        data, starts, stops = self._data, self._starts, self._stops
        return [data[starts[row] : stops[row]].decode("ascii") for row in rows.to_list()]


def native_scan(data: bytes, end: int) -> Native | None:
    """The native pass over `data[:end]`, or None when the extension is not available."""
    if not AVAILABLE or _fastscan is None:
        return None
    n_lines, _, rest, starts, stops, (stats, where) = _fastscan.scan(data, end)
    return Native(
        n_lines=n_lines,
        rest=rest,
        where=pl.Series("idx", _Capsules(where)),
        stats=pl.DataFrame(_Capsules(stats)),
        _data=data,
        _starts=memoryview(starts).cast("q"),
        _stops=memoryview(stops).cast("q"),
    )
