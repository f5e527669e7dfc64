"""The one rule for times: naive datetimes are UTC, aware ones are converted to UTC; and the one
way durations and ages are written for people (`duration_text`, `age_text`).

A module of its own (no pydantic), so a parse can use it without loading the contract models.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["age_text", "as_utc", "duration_text"]


def as_utc(value: datetime) -> datetime:
    """Naive datetimes are taken as UTC; aware ones are converted to UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def duration_text(seconds: float) -> str:
    """A duration in the unit a person reads at a glance, never negative (the size of the span
    whatever its direction): `0.4 s`, `45 s`, `3 min 20 s`, `12 min`, `2 h 40 min`, `3.5 days`."""
    s = abs(float(seconds))
    if s < 10:
        return f"{_trimmed(s, 1 if s >= 1 else 2)} s"
    if s < 60:
        return f"{s:.0f} s"
    if s < 600:
        minutes, rest = divmod(round(s), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    if s < 5400:
        return f"{round(s / 60)} min"
    if s < 48 * 3600:
        hours, minutes = divmod(round(s / 60), 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{_trimmed(s / 86400, 1)} days"


def age_text(seconds: float, *, ahead: str = "after the time judged") -> str:
    """How long ago something happened (`seconds` since it): `2 h 40 min ago`; a time ahead of
    the reference (a negative age) is said to be so, `5 min after the time judged`, never a
    negative age."""
    return f"{duration_text(seconds)} ago" if seconds >= 0 else f"{duration_text(seconds)} {ahead}"


def _trimmed(value: float, places: int) -> str:
    text = f"{value:.{places}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
