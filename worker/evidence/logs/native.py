"""The native pass of a scan: one C pass (`_fastscan.c`) over a read (docs/parsing.md): it drops
the lines no rule needs, reads the strict lines itself and leaves the others to the polars path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl

__all__ = ["AVAILABLE", "Native", "Rules", "native_scan", "rules"]

try:
    from worker.evidence.logs import _fastscan  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # not built: the polars path reads every line
    _fastscan = None
if _fastscan is not None and getattr(_fastscan, "API", 1) < 2:
    # built from an older _fastscan.c (`make venv` rebuilds it): the polars path, not a crash
    _fastscan = None

AVAILABLE: Final = _fastscan is not None


@dataclass(frozen=True)
class Rules:
    """Which rest lines the polars path can need (`literals`, `blocks`, `window`, `first_lines`,
    `long_line`: docs/parsing.md) and the kinds read natively; the extension's copy: `_capsule`."""

    literals: tuple[str, ...]
    blocks: tuple[str, ...]
    window: int
    first_lines: int
    long_line: int
    classes: tuple[str, ...]
    kinds: tuple[tuple[str, str], ...]
    _capsule: object | None


_MAX_LITERALS, _MAX_LITERAL, _MAX_KINDS = 1024, 1024, 32  # as _fastscan.c takes them


def buckets(count: int) -> bytes:
    """The Teddy bucket (0-7) of each of `count` literals: round robin over the sorted literals.
    A greedy choice by how much text each bucket's masks let through saved 2 % of the scan on the
    noisy benchmark log and nothing on the others (docs/parsing.md): not worth its code."""
    return bytes(i % 8 for i in range(count))


def _shown(literal: str, least: int = 2) -> bool:
    """Whether the raw bytes can show `literal` as such (NUL, CR, newline and U+FFFD are
    rewritten before the polars path searches)."""
    size = len(literal.encode())
    return least <= size <= _MAX_LITERAL and not any(c in literal for c in "\x00\r\n\ufffd")


def rules(
    literals: tuple[str, ...],
    blocks: tuple[str, ...],
    window: int,
    first_lines: int,
    long_line: int,
    *,
    vector: bool = True,
    classes: tuple[str, ...] = (),
    kinds: tuple[tuple[str, str], ...] = (),
) -> Rules:
    """The rules; none (every line kept) without the extension or with a literal the raw bytes
    cannot show as such. `vector`: AVX2 when the CPU has it (off: the scalar search). `kinds` and
    `classes`: the strict lines read natively (`rules.NATIVE_KINDS`, `rules.CLASS_LITERALS`)."""
    usable = (
        _fastscan is not None
        and max(len(literals), len(classes)) <= _MAX_LITERALS
        and len(blocks) <= 2
        and len(kinds) <= _MAX_KINDS
        and all(_shown(lit) for lit in (*literals, *blocks, *classes))
        and all(_shown(lit, 1) and _shown(name, 1) for lit, name in kinds)
    )
    capsule = (
        _fastscan.rules(
            tuple(lit.encode() for lit in literals),
            buckets(len(literals)),
            tuple(lit.encode() for lit in blocks),
            window,
            first_lines,
            long_line,
            vector,
            tuple(lit.encode() for lit in classes),
            buckets(len(classes)),
            tuple((lit.encode(), name.encode()) for lit, name in kinds),
        )
        if usable and _fastscan is not None
        else None
    )
    return Rules(literals, blocks, window, first_lines, long_line, classes, kinds, capsule)


class _Capsules:
    """An (ArrowSchema, ArrowArray) capsule pair, as polars reads one (`__arrow_c_array__`)."""

    def __init__(self, pair: tuple[object, object]) -> None:
        self._pair = pair

    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]:
        return self._pair


@dataclass(frozen=True)
class Native:
    """A read after the native pass: `rest`, the lines it left (`where`: their index in the
    read), `stats` and `picked`, the stat lines and the lines of a native kind it read."""

    n_lines: int
    rest: bytes
    dropped: int  # rest lines no rule keeps: counted, not in `rest`
    where: pl.Series  # UInt32, sorted
    stats: pl.DataFrame
    picked: pl.DataFrame  # idx, text, msg, prefix, task, tod, pid, ip, rank, ldt, kind, actor
    _data: bytes
    _starts: memoryview  # byte offset of each stat line in the read
    _stops: memoryview

    def raw(self, indices: list[int]) -> list[str]:
        """The text of the stat lines of `indices` (ASCII, as the polars split reads it)."""
        rows = self.stats.get_column("idx").search_sorted(pl.Series(indices, dtype=pl.UInt32))
        data, starts, stops = self._data, self._starts, self._stops
        return [data[starts[row] : stops[row]].decode("ascii") for row in rows.to_list()]


def native_scan(data: bytes, end: int, keep: Rules | None = None) -> Native | None:
    """The native pass over `data[:end]` (the GIL released), None without the extension; with
    `keep`, only the rest lines it keeps are in `rest`."""
    if not AVAILABLE or _fastscan is None:
        return None
    capsule = keep._capsule if keep is not None else None
    found = _fastscan.scan(data, end, capsule)
    n_lines, _, rest, starts, stops, columns, dropped = found
    stats, where, picked = columns
    return Native(
        n_lines=n_lines,
        rest=rest,
        dropped=dropped,
        where=pl.Series("idx", _Capsules(where)),
        stats=pl.DataFrame(_Capsules(stats)),
        picked=pl.DataFrame(_Capsules(picked)),
        _data=data,
        _starts=memoryview(starts).cast("q"),
        _stops=memoryview(stops).cast("q"),
    )
