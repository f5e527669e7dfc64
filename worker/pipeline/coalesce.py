"""One diagnosis per job at a time: admitting alerts and publishing verdicts, atomically.

Two Lua scripts own every coalescing key (names in `shared.streams`); Redis runs a script as one
step, so between them there is no window:

- `admit(event_id, job)` marks the event as seen (idempotence) and then either
  `started` it (no diagnosis in flight, no fresh verdict: it becomes the *lead* of a new diagnosis),
  `attached` it to the diagnosis in flight (its id joins that diagnosis's answer list),
  `reannounced` the job's verdict younger than RLHEALTH_COALESCE_S (the id joins that verdict's
  answer list and the verdict entry goes out again, now listing it), or found it a `duplicate`.
- `publish(lead, job, entry)` puts the verdict on the stream and the channel with every id in the
  answer list, releases the job's in-flight mark and opens its cooldown (not for a failed
  diagnosis), once per lead, and ends the lead's lease.

A started lead is registered with a lease (`worker.pipeline.lease`). If the job's in-flight mark
ever expires without a publish (every worker gone for half an hour), the next alert's lead takes
over the old lead's answer list, and the old lead, should it come back, stays silent.

The race "an alert attaches just as the verdict publishes" resolves either way without loss:
admitted before the publish, the id is in the list the publish reads; admitted after, the job is
in cooldown and the verdict is announced again with the id.

The answer list of a lead is found from the in-flight or cooldown value inside `admit`, so those key
names are built in the script from a prefix: this needs a single Redis node, not Redis Cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from shared.models import VerdictEntry
from shared.streams import StreamNames, entry_fields

__all__ = ["Admission", "Coalescer", "Outcome"]

Outcome = Literal["started", "attached", "reannounced", "duplicate"]

_ANNOUNCE: Final = """
local function announce(fields, answers, stream, channel, maxlen)
  local ids = redis.call('LRANGE', answers, 0, -1)
  local ids_json = cjson.encode(ids)
  redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
    'event_id', fields.event_id, 'event_ids', ids_json, 'job_id', fields.job_id,
    'verdict', fields.verdict, 'confidence', fields.confidence,
    'report_uri', fields.report_uri, 'captured_at', fields.captured_at)
  local entry = {event_id = fields.event_id, event_ids = ids, job_id = fields.job_id,
    verdict = fields.verdict, confidence = fields.confidence,
    report_uri = fields.report_uri, captured_at = fields.captured_at}
  redis.call('PUBLISH', channel, cjson.encode(entry))
end
"""

# KEYS: event marker, inflight(job), cooldown(job), verdict stream, diagnoses stream, leases,
#       lastlead(job), lead record(event_id)
# ARGV: event_id, answers prefix, inflight ttl, retention, channel, maxlen, job, key prefix,
#       lease ms, event JSON, evidence id
_ADMIT: Final = (
    _ANNOUNCE
    + """
local event_id, prefix, retention, base = ARGV[1], ARGV[2], ARGV[4], ARGV[8]
local seen = redis.call('GET', KEYS[1])
if seen then return {'duplicate', seen} end
local lead = redis.call('GET', KEYS[2])
if lead then
  redis.call('RPUSH', prefix .. lead, event_id)
  redis.call('SET', KEYS[1], lead, 'EX', retention)
  return {'attached', lead}
end
local flat = redis.call('HGETALL', KEYS[3])
if #flat > 0 then
  local fields = {}
  for i = 1, #flat, 2 do fields[flat[i]] = flat[i + 1] end
  redis.call('RPUSH', prefix .. fields.event_id, event_id)
  redis.call('SET', KEYS[1], fields.event_id, 'EX', retention)
  announce(fields, prefix .. fields.event_id, KEYS[4], ARGV[5], ARGV[6])
  return {'reannounced', fields.event_id}
end
local answers = prefix .. event_id
redis.call('SET', KEYS[2], event_id, 'EX', ARGV[3])
redis.call('DEL', answers)
local prev = redis.call('GET', KEYS[7])
if prev and prev ~= event_id and redis.call('EXISTS', base .. 'published:' .. prev) == 0
    and redis.call('EXISTS', base .. 'superseded:' .. prev) == 0 then
  -- the job's previous lead lost its in-flight mark without publishing: its alerts move here
  for _, id in ipairs(redis.call('LRANGE', prefix .. prev, 0, -1)) do
    redis.call('RPUSH', answers, id)
    redis.call('SET', base .. 'event:' .. id, event_id, 'EX', retention)
  end
  redis.call('SET', base .. 'superseded:' .. prev, event_id, 'EX', retention)
  redis.call('ZREM', KEYS[6], prev)
end
redis.call('RPUSH', answers, event_id)
redis.call('EXPIRE', answers, retention)
redis.call('SET', KEYS[1], event_id, 'EX', retention)
redis.call('SET', KEYS[7], event_id, 'EX', retention)
redis.call('HSET', KEYS[8], 'job', ARGV[7], 'evidence', ARGV[11], 'event', ARGV[10])
redis.call('EXPIRE', KEYS[8], retention)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[6], now + tonumber(ARGV[9]), event_id)
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[6], '*',
  'phase', 'started', 'event_id', event_id, 'job', ARGV[7])
return {'started', event_id}
"""
)

# KEYS: published(lead), inflight(job), cooldown(job), answers(lead), verdict stream, diagnoses,
#       leases, superseded(lead)
# ARGV: channel, maxlen, coalesce_s, retention, job, cooldown (1/0), entry JSON, then the entry's
#       field/value pairs
_PUBLISH: Final = (
    _ANNOUNCE
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local fields = {}
for i = 8, #ARGV, 2 do fields[ARGV[i]] = ARGV[i + 1] end
if redis.call('EXISTS', KEYS[8]) == 1 then
  -- a newer lead took over this one's alerts: it answers them, this one stays silent
  redis.call('ZREM', KEYS[7], fields.event_id)
  return 0
end
if redis.call('LLEN', KEYS[4]) == 0 then redis.call('RPUSH', KEYS[4], fields.event_id) end
redis.call('EXPIRE', KEYS[4], ARGV[4])
announce(fields, KEYS[4], KEYS[5], ARGV[1], ARGV[2])
if redis.call('GET', KEYS[2]) == fields.event_id then
  redis.call('DEL', KEYS[2])
  if tonumber(ARGV[3]) > 0 and ARGV[6] == '1' then
    redis.call('DEL', KEYS[3])
    for i = 8, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
    redis.call('PEXPIRE', KEYS[3], math.floor(tonumber(ARGV[3]) * 1000))
  end
end
redis.call('SET', KEYS[1], ARGV[7], 'EX', ARGV[4])
redis.call('ZREM', KEYS[7], fields.event_id)
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[2], '*',
  'phase', 'published', 'event_id', fields.event_id, 'job', ARGV[5])
return 1
"""
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Admission:
    outcome: Outcome
    lead: str  # the event id of the diagnosis that answers this event


class Coalescer:
    """The coalescing state of one pipeline instance."""

    def __init__(
        self,
        redis: Any,
        names: StreamNames,
        *,
        coalesce_s: float,
        lease_s: float = 120,
        inflight_ttl_s: int = 1800,
        retention_s: int = 7 * 24 * 3600,
        maxlen: int = 100_000,
    ) -> None:
        self.redis = redis
        self.names = names
        self.coalesce_s = coalesce_s
        self.lease_ms = int(lease_s * 1000)
        self.inflight_ttl_s = inflight_ttl_s
        self.retention_s = max(retention_s, int(coalesce_s) + 1)
        self.maxlen = maxlen
        self._admit = redis.register_script(_ADMIT)
        self._publish = redis.register_script(_PUBLISH)

    def admit(self, event_id: str, job: str, *, event_json: str = "") -> Admission:
        """Admit one alert for `job` (its directory relative to the bundle root).

        A `started` lead is registered with its lease and its event (`event_json`), so the
        watchdog can send it again, and capture can archive the event again if S3 lost it.
        """
        n = self.names
        keys = [
            n.event(event_id),
            n.inflight(job),
            n.cooldown(job),
            n.verdicts,
            n.diagnoses,
            n.leases,
            n.last_lead(job),
            n.lead(event_id),
        ]
        args = [
            event_id,
            n.answers(""),
            self.inflight_ttl_s,
            self.retention_s,
            n.verdict_channel,
            self.maxlen,
            job,
            f"{n.prefix}:",
            self.lease_ms,
            event_json,
            event_id,
        ]
        outcome, lead = (_text(part) for part in self._admit(keys=keys, args=args))
        return Admission(cast(Outcome, outcome), lead)

    def publish(self, entry: VerdictEntry, job: str, *, cooldown: bool = True) -> bool:
        """Announce a diagnosis's verdict with every id it answers; False if already announced
        (or taken over by a newer lead). `cooldown=False` (a failed diagnosis) releases the job
        without re-announcing this verdict to later alerts: the next alert starts afresh."""
        n, lead = self.names, entry.event_id
        keys = [
            n.published(lead),
            n.inflight(job),
            n.cooldown(job),
            n.answers(lead),
            n.verdicts,
            n.diagnoses,
            n.leases,
            n.superseded(lead),
        ]
        args: list[Any] = [
            n.verdict_channel,
            self.maxlen,
            self.coalesce_s,
            self.retention_s,
            job,
            "1" if cooldown else "0",
            entry.model_dump_json(),
        ]
        for name, value in entry_fields(entry).items():
            args += [name, value]
        return bool(self._publish(keys=keys, args=args))

    def answers(self, lead: str) -> list[str]:
        """Every event id the diagnosis led by `lead` answers so far."""
        return [_text(item) for item in self.redis.lrange(self.names.answers(lead), 0, -1)]

    def in_flight(self, job: str) -> str | None:
        """The lead event id of the job's diagnosis in flight, if any."""
        lead = self.redis.get(self.names.inflight(job))
        return None if lead is None else _text(lead)

    def published(self, lead: str) -> VerdictEntry | None:
        """The verdict entry a lead published, None while it has not."""
        raw = self.redis.get(self.names.published(lead))
        if raw is None or raw in (b"1", "1"):  # "1": the mark of an older version
            return None
        return VerdictEntry.model_validate_json(raw)
