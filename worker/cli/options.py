"""Option types shared by the commands."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

__all__ = ["ISO_DATETIME"]


class IsoDatetime(click.ParamType[datetime]):
    """An ISO-8601 timestamp; a trailing Z or no zone means UTC."""

    name = "ISO-8601"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            self.fail(
                f"{value!r} is not an ISO-8601 timestamp (e.g. 2026-07-30T21:15:00Z)", param, ctx
            )
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


ISO_DATETIME = IsoDatetime()
