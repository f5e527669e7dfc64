"""The watcher side: publish a suspect-job event on the alert stream.

An event names its job directory relative to RLHEALTH_BUNDLE_ROOT; `confine` is the one place that
turns a path into that relative name and refuses anything that would leave the root. The worker's
ingest applies the same check to every event it reads.
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared.models import Event, Mode
from shared.settings import Settings
from shared.streams import ALERT_FIELD, StreamNames

__all__ = [
    "OutsideBundleRootError",
    "Refusals",
    "confine",
    "new_event_id",
    "publish_alert",
    "publish_event",
]


class OutsideBundleRootError(ValueError):
    """A job or probe directory that is not inside the bundle root."""


def new_event_id(now: datetime | None = None) -> str:
    """A sortable, unique event id: `evt-<UTC time>-<random hex>`."""
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%S")
    return f"evt-{stamp}Z-{secrets.token_hex(6)}"


def confine(root: Path, path: str | Path) -> str:
    """`path` (absolute, or relative to `root`) as a POSIX path relative to `root`.

    Symlinks are resolved first, so a link that points out of the root is refused like `..` is.
    """
    base = root.resolve()
    target = (base / path).resolve()
    if target == base or not target.is_relative_to(base):
        raise OutsideBundleRootError(f"{path} is not inside the bundle root {root}")
    return target.relative_to(base).as_posix()


def publish_event(redis: Any, event: Event, settings: Settings | None = None) -> str:
    """XADD an already-built event to the alert stream; returns its event id."""
    names = StreamNames((settings or Settings()).stream_prefix)
    redis.xadd(names.alerts, {ALERT_FIELD: event.model_dump_json(exclude_none=True)})
    return event.event_id


def publish_alert(
    redis: Any,
    job_dir: str | Path,
    *,
    reason: str = "",
    mode: Mode | str | None = None,
    probes: str | Path | None = None,
    now: datetime | None = None,
    settings: Settings | None = None,
) -> str:
    """Validate a suspect-job event through `Event`, publish it, and return its event id."""
    settings = settings or Settings()
    root = settings.bundle_root
    event = Event(
        event_id=new_event_id(),
        job_dir=confine(root, job_dir),
        reason=reason,
        published_at=datetime.now(UTC),
        mode=Mode(mode) if mode else None,
        probes=confine(root, probes) if probes else None,
        now=now,
    )
    return publish_event(redis, event, settings)


class Refusals:
    """The dead-letter stream from the moment this is made on: whether ingest refused an event
    (a watcher waiting for a verdict learns at once that none will come). Make it before the
    alert is published, so its refusal cannot come first."""

    def __init__(self, redis: Any, settings: Settings | None = None) -> None:
        self.redis = redis
        self.stream = StreamNames((settings or Settings()).stream_prefix).dead_letter
        newest = redis.xrevrange(self.stream, count=1)
        self.last_id = _text(newest[0][0]) if newest else "0-0"

    def reason(self, event_id: str) -> str | None:
        """Why `event_id` was dead-lettered since, or None (no wait: what is there now)."""
        reply = self.redis.xread({self.stream: self.last_id}, count=100)
        for _stream, items in reply or ():
            for entry_id, fields in items:
                self.last_id = _text(entry_id)
                decoded = {_text(k): _text(v) for k, v in (fields or {}).items()}
                if _refused_event(decoded) == event_id:
                    return decoded.get("reason", "no reason given")
        return None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _refused_event(fields: dict[str, str]) -> str | None:
    """The event id a dead-letter entry is about: its own field, else the refused alert's."""
    if fields.get("event_id"):
        return fields["event_id"]
    try:
        raw = json.loads(fields.get("raw", ""))
        event = json.loads(raw.get(ALERT_FIELD, "")) if isinstance(raw, dict) else None
    except (json.JSONDecodeError, TypeError):
        return None
    found = event.get("event_id") if isinstance(event, dict) else None
    return found if isinstance(found, str) else None
