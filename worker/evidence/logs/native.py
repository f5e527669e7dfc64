"""The native fast path of a scan: one C pass (`_fastscan.c`) over a read.

The pass reads the strict vLLM stat lines itself (the fields `engines.engine_fields` reads, with
the same values) and hands every other line, byte for byte, to the polars path. A line it cannot
prove strict (any other shape, non-ASCII, a control byte, a CR, a number of more than 20 digits,
a traceback literal) is a rest line: the polars path reads it as before, so the tables are the
same with or without the extension. Without the extension (`AVAILABLE` false) every line takes
the polars path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Final

import polars as pl

__all__ = ["AVAILABLE", "Native", "native_scan"]

try:
    from worker.evidence.logs import _fastscan  # type: ignore[attr-defined]
except ImportError:  # not built: the polars path reads every line
    _fastscan = None

# RLHEALTH_PARSE_NATIVE=0 turns the fast path off (to compare both paths).
AVAILABLE: Final = _fastscan is not None and os.environ.get("RLHEALTH_PARSE_NATIVE", "1") != "0"
_FIELDS: Final = ("prompt", "generation", "running", "waiting", "kv", "hit")


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
        lines = self.stats.get_column("idx")
        out = []
        for index in indices:
            row = lines.search_sorted(index)
            out.append(self._data[self._starts[row] : self._stops[row]].decode("ascii"))
        return out


def _pa() -> Any:
    import pyarrow as pa  # a declared dependency; imported only when the extension runs

    return pa


def _strings(pa: Any, n: int, chars: bytes, offsets: bytes, valid: bytes) -> Any:
    bitmap = pa.py_buffer(valid) if n else None
    return pa.Array.from_buffers(
        pa.string(), n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(chars)]
    )


def _primitive(pa: Any, kind: Any, n: int, data: bytes, valid: bytes | None = None) -> Any:
    bitmap = pa.py_buffer(valid) if valid is not None and n else None
    return pa.Array.from_buffers(kind, n, [bitmap, pa.py_buffer(data)])


def native_scan(data: bytes, end: int) -> Native | None:
    """The native pass over `data[:end]`, or None when the extension is not available."""
    if not AVAILABLE or _fastscan is None:
        return None
    n_lines, rows, rest, where, idx, starts, stops, *tail = _fastscan.scan(data, end)
    pa = _pa()
    numbers, (tod, tod_valid), strings = tail[:6], tail[6:8], tail[8:]
    columns = {
        "idx": _primitive(pa, pa.uint32(), rows, idx),
        **{
            name: _strings(pa, rows, *strings[3 * i : 3 * i + 3])
            for i, name in enumerate(("index", "pid", "ip", "vts"))
        },
        "tod": _primitive(pa, pa.int64(), rows, tod, tod_valid),
        **{
            name: _primitive(pa, pa.float64(), rows, values)
            for name, values in zip(_FIELDS, numbers, strict=True)
        },
    }
    stats = pl.from_arrow(pa.table(columns))
    assert isinstance(stats, pl.DataFrame)
    n_rest = len(where) // 4
    return Native(
        n_lines=n_lines,
        rest=rest,
        where=pl.Series("idx", _primitive(pa, pa.uint32(), n_rest, where)),
        stats=stats,
        _data=data,
        _starts=memoryview(starts).cast("q"),
        _stops=memoryview(stops).cast("q"),
    )

