"""The watchdog: a diagnosis whose lease ran out is sent again, or answered ERROR.

It runs inside every ingest (the process that admits alerts runs whenever alerts can arrive), a
tick every quarter of the lease. A lead's lease runs out when nothing renewed it for
RLHEALTH_LEASE_S: no task of it started, no worker holds one, none waits in the broker queue. Its
workflow is lost — a worker's main process killed with its tasks, a message dropped between the
broker's BRPOP and its bookkeeping, a step that could not be sent during a Redis outage. The
watchdog then sends it again (capture and every later step are safe to run twice) up to
RLHEALTH_REDISPATCH_MAX times, and after that answers it ERROR through the normal publish.

Several ingests may run: taking a lead bumps its lease atomically, so one watchdog acts on it.
After Redis comes back from an outage, the watchdog waits half a lease before acting, so workers
can renew what they hold first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from worker.pipeline.failures import describe, is_infrastructure
from worker.pipeline.metrics import watchdog_acted
from worker.pipeline.steps import Pipeline

__all__ = ["Draw", "Resend", "Watchdog"]

log = logging.getLogger(__name__)

Resend = Callable[[str, str, str], None]  # (lead, job, evidence id)
Draw = Callable[[dict[str, Any], str | None], None]  # (published entry, evidence id)
_SCAN_CHUNK: Final = 500
_TICKS_PER_LEASE: Final = 4


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Watchdog:
    """Watches the leases of one pipeline instance."""

    def __init__(
        self,
        pipeline: Pipeline,
        resend: Resend,
        *,
        draw: Draw | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pipeline = pipeline
        self.resend = resend
        self.draw = draw  # sends the HTML page of an ERROR answer (worker.pipeline.tasks)
        self.clock = clock
        lease_s = pipeline.settings.lease_s
        self.every_s = max(1.0, lease_s / _TICKS_PER_LEASE)
        self.settle_s = lease_s / 2
        self._next = 0.0
        self._acting_from = 0.0

    def maybe_tick(self) -> int:
        """Tick when one is due; the number of leads sent again or answered."""
        now = self.clock()
        if now < self._next:
            return 0
        self._next = now + self.every_s
        try:
            return self.tick() if now >= self._acting_from else 0
        except Exception as exc:
            if not is_infrastructure(exc):
                raise
            log.warning("watchdog: Redis or S3 unavailable: %s", describe(exc))
            self._acting_from = self.clock() + self.settle_s
            return 0

    def tick(self) -> int:
        """Handle every lead whose lease ran out; how many were sent again or answered."""
        leases = self.pipeline.leases
        expired = leases.expired()
        if not expired:
            return 0
        queued = self.queued(expired)
        leases.renew_many(queued)
        return sum(self._handle(lead) for lead in expired if lead not in queued)

    def queued(self, leads: Iterable[str]) -> set[str]:
        """The leads with a task still waiting in the broker queue (not lost, only waiting)."""
        wanted = {lead: lead.encode() for lead in leads}
        found: set[str] = set()
        queue, client = self.pipeline.names.task_queue, self.pipeline.redis
        for start in range(0, int(client.llen(queue)), _SCAN_CHUNK):
            for message in client.lrange(queue, start, start + _SCAN_CHUNK - 1):
                raw = message if isinstance(message, bytes) else str(message).encode()
                found.update(lead for lead, needle in wanted.items() if needle in raw)
        return found

    def _handle(self, lead: str) -> int:
        leases = self.pipeline.leases
        times = leases.take(lead)
        if times < 0:
            return 0  # renewed or answered meanwhile
        record = leases.record(lead)
        job = record.get("job") or ""
        limit = self.pipeline.settings.redispatch_max
        if times <= limit:
            log.warning("watchdog: the lease of %s ran out: sending it again (%d)", lead, times)
            self.resend(lead, job, record.get("evidence") or lead)
            watchdog_acted("resent")
        else:
            lease_s = self.pipeline.settings.lease_s
            reason = (
                f"no worker made progress on it: its lease of {lease_s:g} s ran out "
                f"{times} times (sent again {limit} times)"
            )
            entry = self.pipeline.publisher.fail(lead, job, reason)
            watchdog_acted("answered_error")
            if entry is not None and self.draw is not None:
                self.draw(entry.model_dump(mode="json"), record.get("evidence") or lead)
        return 1
