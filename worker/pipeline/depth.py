"""How much work waits, read from Redis when Prometheus scrapes ingest.

Gauges, not counters: what is waiting now. Ingest serves them (`rl-health ingest --metrics-port`),
read at scrape time with short timeouts, so a dashboard shows the queue whatever the loop is doing;
with Redis away the scrape answers without them (the series go absent, `up` stays 1). Several
ingests serve the same values: take `max()` across them, never `sum()`.

- `rlhealth_alerts_pending`: alerts ingest has read and not yet acknowledged (`XPENDING` of the
  `ingest` group): what a crashed ingest leaves for the next one;
- `rlhealth_alerts_lag`: alerts on the stream not yet read by the group (`XINFO GROUPS` `lag`,
  Redis 7 and later; absent where Redis cannot tell) — what KEDA's `redis-streams` trigger reads;
- `rlhealth_task_queue_length`: Celery tasks waiting for a worker (`LLEN` of the task queue) —
  what KEDA's `redis` trigger reads;
- `rlhealth_diagnoses_in_flight`: diagnoses that hold a lease (started, not yet answered);
- `rlhealth_dead_letter_entries`: entries on the dead-letter stream (trimmed by no one: it only
  grows; `rlhealth_dead_letters_total` counts how fast).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Final

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.streams import INGEST_GROUP, StreamNames

__all__ = ["QueueDepth"]

log = logging.getLogger(__name__)

_TIMEOUT_S: Final = 2.0  # a scrape must answer even when Redis does not


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _group(groups: Any, name: str) -> dict[str, Any] | None:
    """The entry of consumer group `name` in an `XINFO GROUPS` reply."""
    if not isinstance(groups, list):
        return None
    for group in groups:
        fields = {_text(key): value for key, value in dict(group).items()}
        if _text(fields.get("name", "")) == name:
            return fields
    return None


class QueueDepth(Collector):
    """The gauges above, read from `redis` (a client with short timeouts) at each scrape."""

    def __init__(self, redis: Any, names: StreamNames) -> None:
        self.redis = redis
        self.names = names

    @classmethod
    def from_url(cls, url: str, names: StreamNames) -> QueueDepth:
        import redis

        client = redis.Redis.from_url(
            url, socket_timeout=_TIMEOUT_S, socket_connect_timeout=_TIMEOUT_S
        )
        return cls(client, names)

    def _read(self) -> list[Any]:
        pipe = self.redis.pipeline(transaction=False)
        pipe.xinfo_groups(self.names.alerts)
        pipe.llen(self.names.task_queue)
        pipe.zcard(self.names.leases)
        pipe.xlen(self.names.dead_letter)
        return list(pipe.execute(raise_on_error=False))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            groups, queued, in_flight, dead = self._read()
        except Exception as exc:  # Redis away: this scrape goes without the gauges
            log.warning("queue depth not read: %s", exc)
            return
        ingest = _group(groups, INGEST_GROUP)
        if ingest is not None:
            pending, lag = int(ingest.get("pending") or 0), ingest.get("lag")
            yield GaugeMetricFamily(
                "rlhealth_alerts_pending", "Alerts read by ingest, not acked.", value=pending
            )
            if lag is not None:  # Redis 7 and later
                yield GaugeMetricFamily(
                    "rlhealth_alerts_lag", "Alerts not yet read by ingest.", value=int(lag)
                )
        for name, text, value in (
            ("rlhealth_task_queue_length", "Celery tasks waiting for a worker.", queued),
            ("rlhealth_diagnoses_in_flight", "Diagnoses started, not answered.", in_flight),
            ("rlhealth_dead_letter_entries", "Entries on the dead-letter stream.", dead),
        ):
            if isinstance(value, int):
                yield GaugeMetricFamily(name, text, value=value)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # read at collect time only: registering must not reach Redis
