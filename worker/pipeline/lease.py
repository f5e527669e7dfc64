"""The lease of a diagnosis in flight: renewed by every sign of life, watched for running out.

A lead (the event that leads a diagnosis) is registered when it starts (by the admit script of
`worker.pipeline.coalesce`, or by `register` for a replay or a re-send) and leaves the lease set
when its verdict is published. In between, its lease runs out `RLHEALTH_LEASE_S` after the last
sign of life:

- every task renews it when it starts;
- the worker's main process renews it every few seconds for each task it holds (running, waiting
  for a free child, or waiting out a retry countdown) — so a long capture keeps its lease while
  its process lives, and loses it when the worker dies;
- the watchdog renews it while a task of the lead still waits in the broker queue;
- a planned wait (the countdown of a second look before a stall KILL) extends it past the wait.

Times are Redis's own clock (`TIME` inside the scripts), so every process agrees on them.
"""

from __future__ import annotations

import json
from typing import Any, Final

from shared.streams import StreamNames

__all__ = ["LeadRecord", "Leases"]

_NOW_MS: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: leases, published(lead); ARGV: lease_ms, prefix, inflight ttl, lead
# Renew one lead; 0 when it is already answered (published or taken over), 1 when alive.
_RENEW: Final = (
    _NOW_MS
    + """
local lead, prefix = ARGV[4], ARGV[2]
if redis.call('EXISTS', KEYS[2]) == 1 or redis.call('EXISTS', prefix .. 'superseded:' .. lead) == 1
then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), lead)
local job = redis.call('HGET', prefix .. 'lead:' .. lead, 'job')
if job and redis.call('GET', prefix .. 'inflight:' .. job) == lead then
  redis.call('EXPIRE', prefix .. 'inflight:' .. job, ARGV[3])
end
return 1
"""
)

# KEYS: leases; ARGV: lease_ms, leads...
_RENEW_MANY: Final = (
    _NOW_MS
    + """
local n = 0
for i = 2, #ARGV do
  n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[i])
end
return n
"""
)

# KEYS: leases; ARGV: ms beyond now, lead
# Push one registered lead's lease out to at least now + ms (never shortened); 1 when moved.
_EXTEND: Final = (
    _NOW_MS
    + """
return redis.call('ZADD', KEYS[1], 'XX', 'GT', 'CH', now + tonumber(ARGV[1]), ARGV[2])
"""
)

# KEYS: leases; ARGV: limit
_EXPIRED: Final = (
    _NOW_MS
    + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
"""
)

# KEYS: leases, lead record, published(lead); ARGV: lead, lease_ms, only expired (1/0)
# Take a lead for a re-send (bumping its lease so no other watchdog takes it): returns how often
# it has now been taken, or -1 when it is answered (or, for a watchdog, still alive).
_TAKE: Final = (
    _NOW_MS
    + """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return -1 end
if ARGV[3] == '1' and tonumber(score) > now then return -1 end
if redis.call('EXISTS', KEYS[3]) == 1 then redis.call('ZREM', KEYS[1], ARGV[1]) return -1 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return redis.call('HINCRBY', KEYS[2], 'redispatches', 1)
"""
)

# KEYS: leases, lead record; ARGV: lead, lease_ms, job, evidence, event, retention
_REGISTER: Final = (
    _NOW_MS
    + """
redis.call('HSET', KEYS[2], 'job', ARGV[3], 'evidence', ARGV[4], 'event', ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[6])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class LeadRecord(dict[str, str]):
    """The lead's hash: `job`, `evidence` (the evidence id it judges), `event` (its event as
    JSON), `redispatches`."""

    @property
    def event(self) -> dict[str, Any] | None:
        raw = self.get("event")
        return json.loads(raw) if raw else None


class Leases:
    """The leases of one pipeline instance."""

    def __init__(
        self,
        redis: Any,
        names: StreamNames,
        *,
        lease_s: float,
        inflight_ttl_s: int = 1800,
        retention_s: int = 7 * 24 * 3600,
    ) -> None:
        self.redis = redis
        self.names = names
        self.lease_ms = int(lease_s * 1000)
        self.inflight_ttl_s = inflight_ttl_s
        self.retention_s = retention_s
        self._renew = redis.register_script(_RENEW)
        self._renew_many = redis.register_script(_RENEW_MANY)
        self._expired = redis.register_script(_EXPIRED)
        self._extend = redis.register_script(_EXTEND)
        self._take = redis.register_script(_TAKE)
        self._register = redis.register_script(_REGISTER)

    def register(self, lead: str, job: str, evidence_id: str, event_json: str) -> None:
        """Start (or restart) the lease of `lead`, recording what a re-send needs."""
        n = self.names
        args = [lead, self.lease_ms, job, evidence_id, event_json, self.retention_s]
        self._register(keys=[n.leases, n.lead(lead)], args=args)

    def renew(self, lead: str) -> bool:
        """Renew one lead's lease; False when the lead is already answered (nothing to do)."""
        n = self.names
        args = [self.lease_ms, f"{n.prefix}:", self.inflight_ttl_s, lead]
        return bool(self._renew(keys=[n.leases, n.published(lead)], args=args))

    def renew_many(self, leads: set[str]) -> int:
        """Renew every registered lead of `leads` (unknown ones are left out); how many."""
        if not leads:
            return 0
        return int(self._renew_many(keys=[self.names.leases], args=[self.lease_ms, *leads]))

    def extend(self, lead: str, wait_s: float) -> bool:
        """Keep `lead` alive through a planned wait (the countdown of its second look): its lease
        runs out no sooner than `wait_s` plus one lease from now. False for an unknown lead."""
        ms = int(wait_s * 1000) + self.lease_ms
        return bool(self._extend(keys=[self.names.leases], args=[ms, lead]))

    def expired(self, limit: int = 100) -> list[str]:
        """Leads whose lease has run out, oldest first."""
        return [_text(lead) for lead in self._expired(keys=[self.names.leases], args=[limit])]

    def take(self, lead: str, *, only_expired: bool = True) -> int:
        """Claim a lead for a re-send, restarting its lease: how often it has been taken, or -1
        when it is answered (or, with `only_expired`, when its lease has not run out)."""
        n = self.names
        keys = [n.leases, n.lead(lead), n.published(lead)]
        args = [lead, self.lease_ms, "1" if only_expired else "0"]
        return int(self._take(keys=keys, args=args))

    def record(self, lead: str) -> LeadRecord:
        raw = self.redis.hgetall(self.names.lead(lead))
        return LeadRecord({_text(k): _text(v) for k, v in raw.items()})

    def deadline_ms(self, lead: str) -> float | None:
        """When the lead's lease runs out (Redis ms), None when it holds none."""
        score = self.redis.zscore(self.names.leases, lead)
        return None if score is None else float(score)
