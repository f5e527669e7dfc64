"""The worker's heartbeat: its main process renews the lease of every diagnosis it holds a task of.

A Celery worker step, so it runs in the main process, which holds every task the worker took from
the broker: running in a child, waiting for a free child, or waiting out a retry countdown. While
that process lives, the diagnoses of those tasks keep their leases, however long a capture takes;
when it dies, nothing renews them, and ingest's watchdog sends them again once the lease runs out.
A pool child killed alone is the broker's business: its task is re-queued at once.

Each beat is also the main process's sign of life for `/healthz` (`worker.pipeline.health`).
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any, Final

from celery import bootsteps
from celery.worker import state

from shared.settings import Settings
from shared.streams import StreamNames
from worker.pipeline.health import LIVENESS
from worker.pipeline.lease import Leases

__all__ = ["LeaseHeartbeat", "held_leads"]

log = logging.getLogger(__name__)

_BEATS_PER_LEASE: Final = 4


def _held_requests() -> list[Any]:
    """Every request the main process holds: reserved, running, and waiting out a countdown or
    an ETA (a retry's countdown, the second look's wait). Celery files the last ones in
    `scheduled_requests`; some versions also list them in `requests`, others not."""
    held = {id(r): r for r in list(state.requests.values())}
    held.update((id(r), r) for r in list(getattr(state, "scheduled_requests", ())))
    return list(held.values())


def held_leads(requests: Any = None) -> set[str]:
    """The leads of every task this worker holds (each task carries its lead as a keyword)."""
    found: set[str] = set()
    for request in list(requests.values()) if requests is not None else _held_requests():
        try:
            lead = (request.kwargs or {}).get("lead")
        except Exception:  # a message we cannot decode is not ours to renew
            continue
        if isinstance(lead, str) and lead:
            found.add(lead)
    return found


@cache
def _leases() -> Leases:
    import redis

    settings = Settings()
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=2)
    return Leases(client, StreamNames(settings.stream_prefix), lease_s=settings.lease_s)


class LeaseHeartbeat(bootsteps.StartStopStep):  # type: ignore[misc]  # celery is untyped
    """Renews the leases of the worker's tasks every quarter of the lease."""

    requires = ("celery.worker.components:Timer",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.timer_ref: Any = None

    def start(self, parent: Any) -> None:
        interval = max(1.0, Settings().lease_s / _BEATS_PER_LEASE)
        self.timer_ref = parent.timer.call_repeatedly(interval, self.beat, priority=10)
        LIVENESS.begun()  # /readyz: the consumer is starting, its timer runs

    def stop(self, parent: Any) -> None:
        if self.timer_ref is not None:
            self.timer_ref.cancel()
            self.timer_ref = None

    def beat(self) -> None:
        LIVENESS.beat()  # the main process's event loop went round: /healthz
        leads = held_leads()
        if not leads:
            return
        try:
            _leases().renew_many(leads)
        except Exception as exc:  # Redis away: the next beat tries again
            log.warning("could not renew %d lease(s): %s", len(leads), exc)
