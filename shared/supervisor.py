"""The supervisor side: read verdicts from the stream (alone or in a consumer group) or the channel.

A verdict may be announced more than once: when alerts reach a job whose verdict is younger than
RLHEALTH_COALESCE_S, the same verdict (same `event_id` and `report_uri`) is announced again with the
longer `event_ids`. Readers that track alerts should key on every id of `event_ids`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from shared.models import VerdictEntry
from shared.settings import Settings
from shared.streams import StreamNames, entry_from_fields

__all__ = ["VerdictReader", "follow_channel"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class VerdictReader:
    """Reads `<prefix>:verdicts`; with `group`, each entry is delivered once per group and acked."""

    def __init__(
        self,
        redis: Any,
        settings: Settings | None = None,
        *,
        group: str | None = None,
        consumer: str = "supervisor-1",
    ) -> None:
        self.redis = redis
        self.stream = StreamNames((settings or Settings()).stream_prefix).verdicts
        self.group = group
        self.consumer = consumer
        self.last_id = "$"

    def recent(self, count: int) -> list[VerdictEntry]:
        """The newest `count` entries, oldest first."""
        items = self.redis.xrevrange(self.stream, count=count)
        self.last_id = _text(items[0][0]) if items else "0-0"
        return [entry_from_fields(fields) for _id, fields in reversed(items)]

    def _read(self, count: int, block_ms: int) -> list[tuple[str, VerdictEntry]]:
        if self.group is None:
            reply = self.redis.xread({self.stream: self.last_id}, count=count, block=block_ms)
        else:
            reply = self.redis.xreadgroup(
                self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms
            )
        found = [(_text(i), entry_from_fields(f)) for _s, items in reply or () for i, f in items]
        if found and self.group is None:
            self.last_id = found[-1][0]
        return found

    def ensure_group(self, start: str = "0") -> None:
        """Create the group (from the stream's start by default); fine if it exists."""
        if self.group is None:
            return
        try:
            self.redis.xgroup_create(self.stream, self.group, id=start, mkstream=True)
        except Exception as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def follow(
        self, *, count: int | None = None, timeout_s: float | None = None, block_ms: int = 1000
    ) -> Iterator[VerdictEntry]:
        """New entries as they come (acked when in a group), until `count` or `timeout_s`."""
        self.ensure_group()
        if self.group is None and self.last_id == "$":
            self.recent(1)  # anchor at the newest entry, so nothing slips between two reads
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        seen = 0
        while (count is None or seen < count) and (deadline is None or time.monotonic() < deadline):
            wait = block_ms if deadline is None else max(1, min(block_ms, _ms_left(deadline)))
            for entry_id, entry in self._read(min(count - seen, 100) if count else 100, wait):
                if self.group is not None:
                    self.redis.xack(self.stream, self.group, entry_id)
                seen += 1
                yield entry


def _ms_left(deadline: float) -> int:
    return int((deadline - time.monotonic()) * 1000)


def follow_channel(
    redis: Any, settings: Settings | None = None, *, timeout_s: float | None = None
) -> Iterator[VerdictEntry]:
    """Verdict entries from the pub/sub channel (live only: nothing from before subscribing)."""
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(StreamNames((settings or Settings()).stream_prefix).verdict_channel)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while deadline is None or time.monotonic() < deadline:
            message = pubsub.get_message(timeout=1.0)
            if message and message.get("type") == "message":
                yield VerdictEntry.model_validate(json.loads(message["data"]))
    finally:
        pubsub.close()
