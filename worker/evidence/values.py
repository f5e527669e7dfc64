"""Readers of untrusted JSON values (manifests, trial results, probe files): a wrong type is
unknown, never a crash and never a guess.

`read_json` and `loads_json` bound what a file may hold: its size, its nesting depth and, where
the values become table columns (trial results, probe files), its integers (64 bits). Anything
past a bound is a `JsonLimitError` (a `ValueError`) whose message names it, so each reader turns
it into the discrepancy it already states for a file that does not parse — never a
`RecursionError` or an `OverflowError` from deep inside a gate.

They read a file already open (`BundleFiles.open`: opened beneath the bundle's root, no symlink
followed), never a path: a path opened here could have changed since it was checked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import BinaryIO, Final

__all__ = [
    "JSON_MAX_BYTES",
    "JSON_MAX_DEPTH",
    "JsonLimitError",
    "integer",
    "loads_json",
    "number",
    "read_json",
    "read_text",
    "text",
]

JSON_MAX_BYTES: Final = 64 * 2**20
# Deeper than any manifest, trial result or probe file nests (they nest a handful of levels); far
# below the interpreter's recursion limit, which the code that walks the data later would hit.
JSON_MAX_DEPTH: Final = 64
_INT64: Final = 2**63


class JsonLimitError(ValueError):
    """JSON past a bound: too large, nested too deep, or an integer beyond 64 bits."""


def text(value: object) -> str | None:
    """A non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def number(value: object) -> float | None:
    """An int or float (not a bool) as float, else None (also for an int too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def integer(value: object) -> int | None:
    """An int, or a float with no fractional part, within 64 bits, else None (bools are not
    numbers here)."""
    value_f = number(value)
    if value_f is None or not value_f.is_integer():
        return None
    found = value if isinstance(value, int) else int(value_f)
    return found if -_INT64 <= found < _INT64 else None


def _children(value: object) -> Iterator[object]:
    if isinstance(value, dict):
        yield from value.values()
    elif isinstance(value, list):
        yield from value


def _check(data: object, max_depth: int, int64: bool) -> None:
    """Raise `JsonLimitError` when `data` nests deeper than `max_depth` or (`int64`) holds an
    integer beyond 64 bits (walked with a stack, never recursively)."""
    stack: list[tuple[object, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if int64 and _huge(value):
            raise JsonLimitError("holds an integer beyond 64 bits")
        if isinstance(value, dict | list):
            if depth >= max_depth:
                raise JsonLimitError(f"nested deeper than {max_depth} levels")
            stack.extend((child, depth + 1) for child in _children(value))


def _huge(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and not -_INT64 <= value < _INT64


def loads_json(raw: str | bytes, max_depth: int = JSON_MAX_DEPTH, *, int64: bool = False) -> object:
    """`json.loads` within the bounds; `JsonLimitError` or another `ValueError` otherwise.
    `int64`: an integer beyond 64 bits is past a bound too."""
    try:
        data: object = json.loads(raw)
    except RecursionError as exc:
        raise JsonLimitError(f"nested deeper than {max_depth} levels") from exc
    _check(data, max_depth, int64)
    return data


def read_text(handle: BinaryIO, max_bytes: int) -> tuple[str, bool]:
    """At most `max_bytes` of the open file as text (invalid UTF-8 replaced), and whether it was
    cut."""
    raw = handle.read(max_bytes + 1)
    return raw[:max_bytes].decode("utf-8", errors="replace"), len(raw) > max_bytes


def read_json(handle: BinaryIO, max_bytes: int = JSON_MAX_BYTES, *, int64: bool = False) -> object:
    """The JSON in the open file, bounded (`loads_json`): `JsonLimitError` past a bound,
    `ValueError` when it does not parse, `OSError` when it cannot be read."""
    content, cut = read_text(handle, max_bytes)
    if cut:
        raise JsonLimitError(f"larger than {max_bytes:,} bytes")
    return loads_json(content, int64=int64)
