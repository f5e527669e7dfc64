"""The one rule for times: naive datetimes are UTC, aware ones are converted to UTC.

A module of its own (no pydantic), so a parse can use it without loading the contract models.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["as_utc"]


def as_utc(value: datetime) -> datetime:
    """Naive datetimes are taken as UTC; aware ones are converted to UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
