"""Readers of untrusted JSON values (manifests, trial results): a wrong type is unknown, never a
crash and never a guess."""

from __future__ import annotations

__all__ = ["integer", "number", "text"]


def text(value: object) -> str | None:
    """A non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def number(value: object) -> float | None:
    """An int or float (not a bool) as float, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def integer(value: object) -> int | None:
    """An int, or a float with no fractional part, else None (bools are not numbers here)."""
    value_f = number(value)
    return int(value_f) if value_f is not None and value_f.is_integer() else None
