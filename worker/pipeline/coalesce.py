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

Every entry announced is signed (`shared.signing`) over the answer list it announces, and the key
never goes to Redis: Python signs for the answer list it read, and the script announces only if
the list is still that one (else it answers `sign` and Python signs again for the new list). A
re-announcement first verifies the job's cooldown entry, so Redis alone cannot make the pipeline
sign a verdict it never reached; a cooldown entry that does not verify, or whose report is no
longer in S3 (`report_there`: an S3 restarted empty), is dropped and the alert starts a diagnosis
of its own — an entry never points at a report that is not there.

Alerts coalesce under a key (`coalescing_key`): the job directory for a live alert, and the job
with a digest of the question for an alert that asks its own (`now`, `probes`, `mode`,
`backend`). An alert judged as of another time, on other probes or in another mode is another
question, never answered by this one's verdict.

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

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from shared.models import Event, VerdictEntry
from shared.signing import KeyRing
from shared.streams import RefusedEntryError, StreamNames, entry_fields, read_entry
from worker.pipeline.metrics import verdict_announced
from worker.pipeline.report_keys import cluster_of

__all__ = [
    "Admission",
    "Coalescer",
    "CoalescingContentionError",
    "Outcome",
    "coalescing_key",
    "job_dir_of",
    "kept_entry",
    "question",
]

log = logging.getLogger(__name__)


def kept_entry(raw: Any, keys: KeyRing, what: str) -> VerdictEntry | None:
    """The verdict entry kept in Redis as `raw` (None: none kept), once it verifies; one that
    does not (written by another hand) is None, with a warning naming `what`."""
    if raw is None:
        return None
    try:
        entry = VerdictEntry.model_validate_json(raw)
        entry.verify(keys)
    except ValueError as exc:  # not an entry (ValidationError), or UnverifiedError
        log.warning("%s is refused: %s", what, exc)
        return None
    return entry


Outcome = Literal["started", "attached", "reannounced", "duplicate"]
QUESTION_MARK: Final = "#q-"  # between the job directory and a question's digest in a key
_SIGN_TRIES: Final = 10  # the answer list changed under us this often: give up (it never does)
_DROP: Final = "drop"  # tells the admit script the cooldown entry did not verify

_ANNOUNCE: Final = """
local function expected(lead, ids)
  return lead .. '\\n' .. table.concat(ids, '\\n')
end
local function announce(stream, channel, maxlen, first, message)
  local fields = {}
  for i = first, #ARGV do fields[#fields + 1] = ARGV[i] end
  redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', unpack(fields))
  redis.call('PUBLISH', channel, message)
end
"""

# KEYS: event marker, inflight(job), cooldown(job), verdict stream, diagnoses stream, leases,
#       lastlead(job), lead record(event_id)
# ARGV: event_id, answers prefix, inflight ttl, retention, channel, maxlen, job, key prefix,
#       lease ms, event JSON, evidence id, the cooldown answer ('' first, 'drop', or the
#       lead and answer list signed for), the signed entry's JSON, then its stream fields
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
if ARGV[12] == 'drop' then redis.call('DEL', KEYS[3]) end
local flat = redis.call('HGETALL', KEYS[3])
if #flat > 0 then
  local fields = {}
  for i = 1, #flat, 2 do fields[flat[i]] = flat[i + 1] end
  local known = fields.event_id or ''
  local ids = redis.call('LRANGE', prefix .. known, 0, -1)
  if ARGV[12] ~= expected(known, ids) then return {'sign', known, flat, ids} end
  redis.call('RPUSH', prefix .. known, event_id)
  redis.call('SET', KEYS[1], known, 'EX', retention)
  announce(KEYS[4], ARGV[5], ARGV[6], 14, ARGV[13])
  return {'reannounced', known}
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
# ARGV: channel, maxlen, coalesce_s, retention, job, cooldown (1/0), the lead and answer list the
#       entry was signed for, the signed entry's JSON, then its stream fields
# Returns 1 (announced), 0 (announced before, or taken over), -1 (the answer list changed: sign
# again).
_PUBLISH: Final = (
    _ANNOUNCE
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local fields = {}
for i = 9, #ARGV, 2 do fields[ARGV[i]] = ARGV[i + 1] end
if redis.call('EXISTS', KEYS[8]) == 1 then
  -- a newer lead took over this one's alerts: it answers them, this one stays silent
  redis.call('ZREM', KEYS[7], fields.event_id)
  return 0
end
local ids = redis.call('LRANGE', KEYS[4], 0, -1)
if #ids == 0 then ids = {fields.event_id} end
if ARGV[7] ~= expected(fields.event_id, ids) then return -1 end
if redis.call('LLEN', KEYS[4]) == 0 then redis.call('RPUSH', KEYS[4], fields.event_id) end
redis.call('EXPIRE', KEYS[4], ARGV[4])
announce(KEYS[5], ARGV[1], ARGV[2], 9, ARGV[8])
if redis.call('GET', KEYS[2]) == fields.event_id then
  redis.call('DEL', KEYS[2])
  if tonumber(ARGV[3]) > 0 and ARGV[6] == '1' then
    redis.call('DEL', KEYS[3])
    for i = 9, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
    redis.call('PEXPIRE', KEYS[3], math.floor(tonumber(ARGV[3]) * 1000))
  end
end
redis.call('SET', KEYS[1], ARGV[8], 'EX', ARGV[4])
redis.call('ZREM', KEYS[7], fields.event_id)
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[2], '*',
  'phase', 'published', 'event_id', fields.event_id, 'job', ARGV[5])
return 1
"""
)


class CoalescingContentionError(RuntimeError):
    """The answer list of a verdict kept changing while it was signed (never seen in practice)."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def question(event: Event) -> dict[str, str | None]:
    """What an alert asks beyond its job: judged as of `now`, on `probes`, in `mode`, through
    `backend` (all None: the live job, now, as the operator's settings say)."""
    return {
        "now": event.model_dump(mode="json")["now"],
        "probes": event.probes,
        "mode": event.mode.value if event.mode else None,
        "backend": event.backend,
    }


def coalescing_key(job: str, event: Event) -> str:
    """The key alerts of `job` (its directory under the bundle root) coalesce under: the job for
    a live alert; for one that asks its own question (its `now`, `probes`, `mode` or `backend`),
    the job and that question's digest. Hypothesis: alerts share a verdict only when the same
    judgement answers both; an early `now` or missing probes would answer another question."""
    asked = question(event)
    if not any(asked.values()):
        return job
    text = json.dumps(asked, sort_keys=True, separators=(",", ":"))
    return f"{job}{QUESTION_MARK}{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def job_dir_of(key: str) -> str:
    """The job directory of a coalescing key."""
    job, mark, digest = key.rpartition(QUESTION_MARK)
    return job if mark and len(digest) == 16 else key


def _listed(lead: str, ids: list[str]) -> str:
    """A lead and its answer list as the scripts compare them (event ids hold no line break)."""
    return "\n".join([lead, *ids])


def _announcement(entry: VerdictEntry, ids: list[str], ring: KeyRing) -> list[Any]:
    """The script arguments that announce `entry` for the answer list `ids`, signed: its JSON
    (for the channel), then its stream fields as name, value pairs."""
    signed = entry.model_copy(update={"event_ids": tuple(ids)}).signed(ring)
    args: list[Any] = [signed.model_dump_json()]
    for name, value in entry_fields(signed).items():
        args += [name, value]
    return args


@dataclass(frozen=True)
class Admission:
    outcome: Outcome
    lead: str  # the event id of the diagnosis that answers this event


class Coalescer:
    """The coalescing state of one pipeline instance; `keys` signs every entry it announces."""

    def __init__(
        self,
        redis: Any,
        names: StreamNames,
        *,
        keys: KeyRing,
        coalesce_s: float,
        lease_s: float = 120,
        inflight_ttl_s: int = 1800,
        retention_s: int = 7 * 24 * 3600,
        maxlen: int = 100_000,
        report_there: Callable[[str], bool] | None = None,
    ) -> None:
        self.redis = redis
        self.report_there = report_there  # report URI -> in S3? (None: not checked)
        self.names = names
        self.keys = keys
        self.coalesce_s = coalesce_s
        self.lease_ms = int(lease_s * 1000)
        self.inflight_ttl_s = inflight_ttl_s
        self.retention_s = max(retention_s, int(coalesce_s) + 1)
        self.maxlen = maxlen
        self._admit = redis.register_script(_ADMIT)
        self._publish = redis.register_script(_PUBLISH)

    def admit(self, event_id: str, job: str, *, event_json: str = "") -> Admission:
        """Admit one alert under `job` (its coalescing key, `coalescing_key`).

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
        base = [
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
        cooldown: list[Any] = [""]
        for _ in range(_SIGN_TRIES):
            reply = self._admit(keys=keys, args=base + cooldown)
            if _text(reply[0]) != "sign":
                return Admission(cast(Outcome, _text(reply[0])), _text(reply[1]))
            cooldown = self._reannouncement(event_id, job, reply)
        raise CoalescingContentionError(f"the answer list of {job}'s verdict kept changing")

    def _reannouncement(self, event_id: str, job: str, reply: list[Any]) -> list[Any]:
        """The admit script's arguments to announce the job's cooldown verdict again, listing
        `event_id` too: the stored entry verified, then signed for the longer answer list; or
        `drop` when the stored entry does not verify."""
        lead, flat, ids = _text(reply[1]), reply[2], [_text(item) for item in reply[3]]
        fields = {_text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}
        try:
            stored = read_entry(fields, self.keys)
            if stored.event_id != lead:
                raise RefusedEntryError("names another lead", "malformed")
        except RefusedEntryError as exc:
            log.warning("the cooldown verdict of %s is refused (%s): dropped", job, exc.reason)
            return [_DROP]
        if self.report_there is not None and not self.report_there(stored.report_uri):
            log.warning("the cooldown verdict of %s points at a report gone from S3: dropped", job)
            return [_DROP]
        # the script checks the list as read here, before it adds this alert's id
        return [_listed(lead, ids), *_announcement(stored, [*ids, event_id], self.keys)]

    def publish(self, entry: VerdictEntry, job: str, *, cooldown: bool = True) -> bool:
        """Announce a diagnosis's verdict, signed, with every id it answers; False if already
        announced (or taken over by a newer lead). `cooldown=False` (a failed diagnosis)
        releases the job without re-announcing this verdict to later alerts: the next alert
        starts afresh."""
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
        base: list[Any] = [
            n.verdict_channel,
            self.maxlen,
            self.coalesce_s,
            self.retention_s,
            job,
            "1" if cooldown else "0",
        ]
        for _ in range(_SIGN_TRIES):
            ids = self.answers(lead) or [lead]
            args = [*base, _listed(lead, ids), *_announcement(entry, ids, self.keys)]
            result = int(self._publish(keys=keys, args=args))
            if result == 1:
                self._count(entry)
            if result >= 0:
                return result == 1
        raise CoalescingContentionError(f"the answer list of {lead} kept changing")

    def _count(self, entry: VerdictEntry) -> None:
        """Count the verdict just announced, by the job's cluster (its latency is counted by the
        pipeline that published it: `verdict_published`)."""
        verdict_announced(entry.verdict.value, cluster_of(entry.report_uri))

    def answers(self, lead: str) -> list[str]:
        """Every event id the diagnosis led by `lead` answers so far."""
        return [_text(item) for item in self.redis.lrange(self.names.answers(lead), 0, -1)]

    def in_flight(self, job: str) -> str | None:
        """The lead event id of the job's diagnosis in flight, if any."""
        lead = self.redis.get(self.names.inflight(job))
        return None if lead is None else _text(lead)

    def published(self, lead: str) -> VerdictEntry | None:
        """The verdict entry a lead published (as signed), None while it has not; one that
        does not verify (written by another hand) is None, with a warning."""
        raw = self.redis.get(self.names.published(lead))
        if raw in (b"1", "1"):  # "1": the mark of an older version
            return None
        return kept_entry(raw, self.keys, f"the published entry of {lead}")
