"""One diagnosis per job at a time: admitting alerts and publishing verdicts, atomically.

Two Lua scripts own every coalescing key (names in `shared.streams`); Redis runs a script as one
step, so between them there is no window:

- `admit(event_id, job)` marks the event as seen (idempotence) and then either
  `started` it (no diagnosis in flight, no fresh verdict: it becomes the *lead* of a new diagnosis),
  `attached` it to the diagnosis in flight (its id joins that diagnosis's answer list),
  `reannounced` the job's verdict younger than RLHEALTH_COALESCE_S (the id joins that verdict's
  answer list and the verdict entry goes out again, now listing it), or found it a `duplicate`.
- `publish(lead, job, entry)` puts the verdict on the stream and the channel with every id in the
  answer list, releases the job's in-flight mark and opens its cooldown, once per lead.

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

# KEYS: event marker, inflight(job), cooldown(job), verdict stream, diagnoses stream
# ARGV: event_id, answers prefix, inflight ttl, retention, channel, maxlen, job
_ADMIT: Final = (
    _ANNOUNCE
    + """
local event_id, prefix, retention = ARGV[1], ARGV[2], ARGV[4]
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
redis.call('SET', KEYS[2], event_id, 'EX', ARGV[3])
redis.call('DEL', prefix .. event_id)
redis.call('RPUSH', prefix .. event_id, event_id)
redis.call('EXPIRE', prefix .. event_id, retention)
redis.call('SET', KEYS[1], event_id, 'EX', retention)
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[6], '*',
  'phase', 'started', 'event_id', event_id, 'job', ARGV[7])
return {'started', event_id}
"""
)

# KEYS: published(lead), inflight(job), cooldown(job), answers(lead), verdict stream, diagnoses
# ARGV: channel, maxlen, coalesce_s, retention, job, then the entry's field/value pairs
_PUBLISH: Final = (
    _ANNOUNCE
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local fields = {}
for i = 6, #ARGV, 2 do fields[ARGV[i]] = ARGV[i + 1] end
if redis.call('LLEN', KEYS[4]) == 0 then redis.call('RPUSH', KEYS[4], fields.event_id) end
redis.call('EXPIRE', KEYS[4], ARGV[4])
announce(fields, KEYS[4], KEYS[5], ARGV[1], ARGV[2])
if redis.call('GET', KEYS[2]) == fields.event_id then
  redis.call('DEL', KEYS[2])
  if tonumber(ARGV[3]) > 0 then
    redis.call('DEL', KEYS[3])
    for i = 6, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
    redis.call('PEXPIRE', KEYS[3], math.floor(tonumber(ARGV[3]) * 1000))
  end
end
redis.call('SET', KEYS[1], '1', 'EX', ARGV[4])
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
        inflight_ttl_s: int = 1800,
        retention_s: int = 7 * 24 * 3600,
        maxlen: int = 100_000,
    ) -> None:
        self.redis = redis
        self.names = names
        self.coalesce_s = coalesce_s
        self.inflight_ttl_s = inflight_ttl_s
        self.retention_s = max(retention_s, int(coalesce_s) + 1)
        self.maxlen = maxlen
        self._admit = redis.register_script(_ADMIT)
        self._publish = redis.register_script(_PUBLISH)

    def admit(self, event_id: str, job: str) -> Admission:
        """Admit one alert for `job` (its directory relative to the bundle root)."""
        n = self.names
        keys = [n.event(event_id), n.inflight(job), n.cooldown(job), n.verdicts, n.diagnoses]
        args = [
            event_id,
            n.answers(""),
            self.inflight_ttl_s,
            self.retention_s,
            n.verdict_channel,
            self.maxlen,
            job,
        ]
        outcome, lead = (_text(part) for part in self._admit(keys=keys, args=args))
        return Admission(cast(Outcome, outcome), lead)

    def publish(self, entry: VerdictEntry, job: str) -> bool:
        """Announce a diagnosis's verdict with every id it answers; False if already announced."""
        n, lead = self.names, entry.event_id
        keys = [
            n.published(lead),
            n.inflight(job),
            n.cooldown(job),
            n.answers(lead),
            n.verdicts,
            n.diagnoses,
        ]
        args: list[Any] = [n.verdict_channel, self.maxlen, self.coalesce_s, self.retention_s, job]
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
