"""The supervisor side: read verdicts from the stream (alone or in a consumer group) or the channel.

A verdict is returned only when its signature verifies (`shared.signing`, with the keys of
RLHEALTH_VERDICT_KEY or RLHEALTH_VERDICT_KEY_FILE). Any other entry — unsigned, signed with a key
this reader does not hold, tampered with, or malformed — is never returned: it is reported as a
`Refusal` (`REFUSED <entry id>: <reason>`) to the `on_refused` callback, counted in
`rlhealth_verdicts_refused`, and, in a consumer group, acknowledged at once. A refused entry never
stops a reader or holds back the entries read with it.

A verdict may be announced more than once: when alerts reach a job whose verdict is younger than
RLHEALTH_COALESCE_S, the same verdict (same `event_id` and `report_uri`) is announced again with the
longer `event_ids`. Readers that track alerts should key on every id of `event_ids`, and act only
on a verdict whose `job_id` is the job they asked about (see docs/security.md, "What a supervisor
must check").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import Counter

from shared.models import VerdictEntry
from shared.redact import escape_controls
from shared.settings import Settings
from shared.signing import KeyRing
from shared.streams import RefusedEntryError, StreamNames, read_entry, read_message

__all__ = ["VERDICTS_REFUSED", "Refusal", "VerdictReader", "follow_channel"]

CHANNEL_ENTRY: Final = "(channel message)"  # what a refused channel message is named by

VERDICTS_REFUSED = Counter(
    "rlhealth_verdicts_refused",
    "Verdict entries a reader refused (never shown as verdicts), by reader and kind: malformed, "
    "unsigned, unknown_key, bad_signature.",
    ["reader", "kind"],
)


@dataclass(frozen=True)
class Refusal:
    """An entry that was not shown as a verdict, and why."""

    entry_id: str
    reason: str
    kind: str

    def __str__(self) -> str:
        return f"REFUSED {escape_controls(self.entry_id)}: {escape_controls(self.reason)}"


OnRefused = Callable[[Refusal], None]


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _ignore(_refusal: Refusal) -> None:
    return None


class VerdictReader:
    """Reads `<prefix>:verdicts`; with `group`, each entry is delivered once per group and acked.

    `keys` verify (default: the settings' verdict keys, `VerdictKeyError` when none is set);
    `reader` labels the refusal metric.
    """

    def __init__(
        self,
        redis: Any,
        settings: Settings | None = None,
        *,
        keys: KeyRing | None = None,
        group: str | None = None,
        consumer: str = "supervisor-1",
        on_refused: OnRefused = _ignore,
        reader: str = "supervisor",
    ) -> None:
        settings = settings or Settings()
        self.redis = redis
        self.keys = keys or settings.verdict_keys()
        self.stream = StreamNames(settings.stream_prefix).verdicts
        self.group = group
        self.consumer = consumer
        self.on_refused = on_refused
        self.reader = reader
        self.refused = 0
        self.last_id = "$"

    def _verdicts(self, items: Any) -> list[tuple[str, VerdictEntry]]:
        """The verified entries of `items` (id, fields), in order; every other one refused (and
        acked, in a group)."""
        found: list[tuple[str, VerdictEntry]] = []
        for raw_id, fields in items:
            entry_id = _text(raw_id)
            try:
                if fields is None:  # deleted from the stream while pending in the group
                    raise RefusedEntryError("malformed: deleted from the stream", "malformed")
                found.append((entry_id, read_entry(fields, self.keys)))
            except RefusedEntryError as exc:
                self._refuse(Refusal(entry_id, exc.reason, exc.kind))
                if self.group is not None:
                    self.redis.xack(self.stream, self.group, entry_id)
        return found

    def _refuse(self, refusal: Refusal) -> None:
        self.refused += 1
        VERDICTS_REFUSED.labels(reader=self.reader, kind=refusal.kind).inc()
        self.on_refused(refusal)

    def find(self, event_id: str, *, page: int = 500) -> VerdictEntry | None:
        """The newest verified entry answering `event_id` (one of its `event_ids`: a verdict
        re-announced for a coalesced alert is found by every id it answers), or None. Only the
        entries that mention the id are verified; one of them that does not verify is refused,
        never returned."""
        end = "+"
        while True:
            items = self.redis.xrevrange(self.stream, max=end, min="-", count=page)
            mentioning = [(i, f) for i, f in items or () if _mentions(f, event_id)]
            for _id, entry in self._verdicts(mentioning):
                if event_id in entry.event_ids:
                    return entry
            if not items or len(items) < page:
                return None
            end = f"({_text(items[-1][0])}"

    def recent(self, count: int) -> list[VerdictEntry]:
        """The verified entries among the newest `count`, oldest first."""
        items = self.redis.xrevrange(self.stream, count=count)
        self.last_id = _text(items[0][0]) if items else "0-0"
        return [entry for _id, entry in self._verdicts(reversed(items))]

    def _read(self, count: int, block_ms: int) -> list[tuple[str, VerdictEntry]]:
        if self.group is None:
            reply = self.redis.xread({self.stream: self.last_id}, count=count, block=block_ms)
        else:
            reply = self.redis.xreadgroup(
                self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms
            )
        items = [item for _stream, batch in reply or () for item in batch]
        if items and self.group is None:
            self.last_id = _text(items[-1][0])  # past the refused ones too
        return self._verdicts(items)

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
        """New verified entries as they come (acked when in a group), until `count` verdicts or
        `timeout_s`."""
        self.ensure_group()
        if self.group is None and self.last_id == "$":
            self.anchor()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        seen = 0
        while (count is None or seen < count) and (deadline is None or time.monotonic() < deadline):
            wait = block_ms if deadline is None else max(1, min(block_ms, _ms_left(deadline)))
            for entry_id, entry in self._read(min(count - seen, 100) if count else 100, wait):
                if self.group is not None:
                    self.redis.xack(self.stream, self.group, entry_id)
                seen += 1
                yield entry

    def anchor(self) -> None:
        """Start after the newest entry, so nothing slips between two reads (and nothing
        before it is read, or refused)."""
        items = self.redis.xrevrange(self.stream, count=1)
        self.last_id = _text(items[0][0]) if items else "0-0"


def _mentions(fields: Any, event_id: str) -> bool:
    """Whether a raw stream entry's fields mention `event_id` anywhere (a cheap test before the
    signature is checked)."""
    return fields is not None and any(event_id in _text(value) for value in fields.values())


def _ms_left(deadline: float) -> int:
    return int((deadline - time.monotonic()) * 1000)


def follow_channel(
    redis: Any,
    settings: Settings | None = None,
    *,
    keys: KeyRing | None = None,
    timeout_s: float | None = None,
    on_refused: OnRefused = _ignore,
    reader: str = "supervisor",
) -> Iterator[VerdictEntry]:
    """Verified verdict entries from the pub/sub channel (live only: nothing from before
    subscribing); every other message refused, as `VerdictReader` does."""
    settings = settings or Settings()
    ring = keys or settings.verdict_keys()
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(StreamNames(settings.stream_prefix).verdict_channel)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while deadline is None or time.monotonic() < deadline:
            message = pubsub.get_message(timeout=1.0)
            if not message or message.get("type") != "message":
                continue
            try:
                yield read_message(message["data"], ring)
            except RefusedEntryError as exc:
                VERDICTS_REFUSED.labels(reader=reader, kind=exc.kind).inc()
                on_refused(Refusal(CHANNEL_ENTRY, exc.reason, exc.kind))
    finally:
        pubsub.close()
