"""Ingest and coalescing on fakeredis with the in-memory store: what happens to each alert."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

from shared.alerts import publish_alert
from shared.models import Confidence, Verdict, VerdictEntry
from shared.settings import Settings
from shared.streams import ALERT_FIELD, INGEST_GROUP, StreamNames, read_entry, read_message
from testkit.keys import TEST_KEYS
from worker.pipeline.coalesce import Coalescer
from worker.pipeline.ingest import Ingest, StreamEntry
from worker.pipeline.steps import Pipeline
from worker.pipeline.store import MemoryStore

JOB = "jobs/cw/ops/rl-job"


class Recorder:
    """A dispatch that only records what it was asked to start."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []

    def __call__(self, lead: str, job: str) -> None:
        self.started.append((lead, job))


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    (tmp_path / JOB).mkdir(parents=True)
    (tmp_path / "jobs/cw/ops/other").mkdir(parents=True)
    return Settings(bundle_root=tmp_path, stream_prefix="t", coalesce_s=60)


@pytest.fixture
def client() -> Any:
    return fakeredis.FakeRedis()


@pytest.fixture
def pipeline(settings: Settings, client: Any) -> Pipeline:
    return Pipeline(settings, MemoryStore(), client)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def ingest(pipeline: Pipeline, recorder: Recorder) -> Ingest:
    consumer = Ingest(pipeline, recorder, consumer="c1", block_ms=1)
    consumer.ensure_group()
    return consumer


def _entry(verdict: Verdict = Verdict.NO_KILL, lead: str = "e1") -> VerdictEntry:
    return VerdictEntry(
        event_id=lead,
        event_ids=(lead,),
        job_id="/ops/rl-job",
        verdict=verdict,
        confidence=Confidence.HIGH,
        report_uri=f"memory://rlhealth/reports/x-{lead}.json",
        captured_at=datetime(2026, 7, 30, 21, 15, tzinfo=UTC),
    )


def _verdicts(client: Any, names: StreamNames) -> list[VerdictEntry]:
    return [read_entry(fields, TEST_KEYS) for _id, fields in client.xrange(names.verdicts)]


def _alert(client: Any, settings: Settings, job: str = JOB) -> str:
    return publish_alert(client, job, reason="test", settings=settings)


def _event(**fields: str) -> str:
    return json.dumps({"event_id": "e1", "published_at": "2026-07-30T21:00:00Z", **fields})


def _raw(client: Any, names: StreamNames, payload: str) -> None:
    client.xadd(names.alerts, {ALERT_FIELD: payload})


# --- the coalescing scripts --------------------------------------------------------------------


def test_first_alert_starts_and_later_ones_attach(pipeline: Pipeline) -> None:
    """The first alert of a job leads a diagnosis; the next ones attach to it."""
    c = pipeline.coalescer
    assert (c.admit("e1", JOB).outcome, c.admit("e2", JOB).outcome) == ("started", "attached")
    assert c.admit("e2", JOB).outcome == "duplicate"
    assert c.in_flight(JOB) == "e1"
    assert c.answers("e1") == ["e1", "e2"]


def test_publish_lists_every_attached_id_once(pipeline: Pipeline, client: Any) -> None:
    """The verdict entry lists the lead and every attached id; a second publish adds nothing."""
    c = pipeline.coalescer
    c.admit("e1", JOB)
    c.admit("e2", JOB)
    assert c.publish(_entry(), JOB) is True
    assert c.publish(_entry(), JOB) is False
    (entry,) = _verdicts(client, pipeline.names)
    assert entry.event_ids == ("e1", "e2")
    assert c.in_flight(JOB) is None


def test_alert_after_the_verdict_is_answered_by_it(pipeline: Pipeline, client: Any) -> None:
    """An alert that loses the race with the publish re-announces the verdict, listing it."""
    c = pipeline.coalescer
    pipeline.store.put_once("reports/x-e1.json", b"{}")  # in S3, as every announced report is
    c.admit("e1", JOB)
    c.publish(_entry(), JOB)
    admission = c.admit("e3", JOB)
    assert (admission.outcome, admission.lead) == ("reannounced", "e1")
    first, again = _verdicts(client, pipeline.names)
    assert again.event_ids == ("e1", "e3")
    assert again.report_uri == first.report_uri


def test_cooldown_expiry_starts_a_new_diagnosis(settings: Settings, client: Any) -> None:
    """With no cooldown, an alert after the verdict leads a new diagnosis."""
    c = Coalescer(client, StreamNames("t"), keys=TEST_KEYS, coalesce_s=0)
    c.admit("e1", JOB)
    c.publish(_entry(), JOB)
    assert c.admit("e2", JOB).outcome == "started"


def test_jobs_coalesce_independently(pipeline: Pipeline) -> None:
    """Two jobs each get their own diagnosis."""
    c = pipeline.coalescer
    assert c.admit("e1", JOB).outcome == "started"
    assert c.admit("e2", "jobs/cw/ops/other").outcome == "started"


def test_late_publish_does_not_release_a_newer_diagnosis(pipeline: Pipeline) -> None:
    """A publish whose lead is no longer in flight leaves the job's current diagnosis alone."""
    c = pipeline.coalescer
    c.admit("e1", JOB)
    pipeline.redis.delete(pipeline.names.inflight(JOB))  # e1's mark expired
    c.admit("e2", JOB)
    c.publish(_entry(lead="e1"), JOB)
    assert c.in_flight(JOB) == "e2"


def test_channel_carries_the_entry(pipeline: Pipeline, client: Any) -> None:
    """The pub/sub channel gets the same verdict entry as JSON, signed."""
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(pipeline.names.verdict_channel)
    pipeline.coalescer.admit("e1", JOB)
    pipeline.coalescer.publish(_entry(), JOB)
    messages = (pubsub.get_message(timeout=0.2) for _ in range(5))
    message = next(m for m in messages if m)
    assert read_message(message["data"], TEST_KEYS) == _entry().signed(TEST_KEYS)


# --- ingest ------------------------------------------------------------------------------------


def test_alerts_for_one_job_start_one_diagnosis(
    ingest: Ingest, client: Any, settings: Settings, recorder: Recorder
) -> None:
    """Three alerts for one job and one for another start two diagnoses."""
    ids = [_alert(client, settings) for _ in range(3)]
    other = _alert(client, settings, "jobs/cw/ops/other")
    assert ingest.run(until_idle=True) == 4
    assert recorder.started == [(ids[0], JOB), (other, "jobs/cw/ops/other")]
    assert ingest.pipeline.coalescer.answers(ids[0]) == ids


def test_every_event_is_archived(ingest: Ingest, client: Any, settings: Settings) -> None:
    """Each admitted event is stored at events/<event_id>.json."""
    event_id = _alert(client, settings)
    ingest.run(until_idle=True)
    stored = json.loads(ingest.pipeline.store.get(f"events/{event_id}.json"))
    assert (stored["event_id"], stored["job_dir"]) == (event_id, JOB)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ("{not json", "malformed JSON"),
        ('["a list"]', "not an object"),
        (
            _event(job_dir="jobs/cw/ops/rl-job", colour="red"),
            "colour: Extra inputs are not permitted",
        ),
        (
            '{"event_id": "e1", "job_dir": "../../etc", "published_at": "2026-07-30T21:00:00Z"}',
            "escapes the bundle root",
        ),
        (
            _event(job_dir="jobs/cw/ops/gone"),
            "does not exist",
        ),
        (
            '{"job_dir": "jobs/cw/ops/rl-job", "published_at": "2026-07-30T21:00:00Z"}',
            "event_id: Field required",
        ),
        (_event(event_id=".", job_dir="jobs/cw/ops/rl-job"), "needs a letter or digit"),
        (_event(event_id="..", job_dir="jobs/cw/ops/rl-job"), "needs a letter or digit"),
        (_event(job_dir="jobs/cw/ops/rl-job", replay_of=".."), "needs a letter or digit"),
        (_event(job_dir="jobs/cw/ops/rl\r\njob"), "control characters"),
        (_event(job_dir="jobs/cw/ops/rl-job", probes="p\nq"), "control characters"),
    ],
)
def test_bad_events_are_dead_lettered_and_acked(
    ingest: Ingest, client: Any, payload: str, reason: str, recorder: Recorder
) -> None:
    """A bad alert lands on the dead-letter stream with its reason and raw payload, and is acked."""
    names = ingest.names
    _raw(client, names, payload)
    ingest.run(until_idle=True)
    ((_id, fields),) = client.xrange(names.dead_letter)
    assert reason in fields[b"reason"].decode()
    assert json.loads(fields[b"raw"])[ALERT_FIELD] == payload
    assert client.xpending(names.alerts, INGEST_GROUP)["pending"] == 0
    assert recorder.started == []


def test_symlink_out_of_the_root_is_refused(
    ingest: Ingest, client: Any, settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A job directory that is a symlink leaving the bundle root is dead-lettered."""
    outside = tmp_path_factory.mktemp("outside")
    (settings.bundle_root / "jobs/cw/ops/link").symlink_to(outside, target_is_directory=True)
    event = {"event_id": "e9", "job_dir": "jobs/cw/ops/link", "published_at": "2026-07-30T21:00Z"}
    _raw(client, ingest.names, json.dumps(event))
    ingest.run(until_idle=True)
    ((_id, fields),) = client.xrange(ingest.names.dead_letter)
    assert b"escapes the bundle root" in fields[b"reason"]


def test_redelivered_alert_starts_nothing_new(
    ingest: Ingest, client: Any, settings: Settings, recorder: Recorder
) -> None:
    """The same event id delivered twice is handled once."""
    event_id = _alert(client, settings)
    ((_s, ((_id, fields),)),) = client.xread({ingest.names.alerts: "0"})
    client.xadd(ingest.names.alerts, fields)  # the watcher published it twice
    ingest.run(until_idle=True)
    assert recorder.started == [(event_id, JOB)]
    assert ingest.outcomes == {"started": 1, "duplicate": 1}


def test_crash_before_dispatch_is_recovered_on_redelivery(
    pipeline: Pipeline, client: Any, settings: Settings, recorder: Recorder
) -> None:
    """An alert admitted by a consumer that died before starting the workflow is started once
    when the pending entry is read again."""
    event_id = _alert(client, settings)
    names = pipeline.names
    client.xgroup_create(names.alerts, INGEST_GROUP, id="0")
    client.xreadgroup(INGEST_GROUP, "c1", {names.alerts: ">"})  # delivered, never acked
    pipeline.coalescer.admit(event_id, JOB)  # ... and admitted before the crash
    Ingest(pipeline, recorder, consumer="c1", block_ms=1).run(until_idle=True)
    Ingest(pipeline, recorder, consumer="c1", block_ms=1).run(until_idle=True)
    assert recorder.started == [(event_id, JOB)]


class FlakyStore(MemoryStore):
    """A store that is unreachable for the first `failures` writes."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def put_once(self, key: str, body: bytes, content_type: str = "") -> bool:
        if self.failures:
            self.failures -= 1
            raise redis.exceptions.ConnectionError("S3 away")
        return super().put_once(key, body, content_type)


def test_infrastructure_fault_leaves_the_alert_pending(
    settings: Settings, client: Any, recorder: Recorder
) -> None:
    """An alert whose archive fails stays unacknowledged and is handled once S3 is back."""
    pipeline = Pipeline(settings, FlakyStore(failures=1), client)
    consumer = Ingest(pipeline, recorder, consumer="c1", block_ms=1)
    consumer.ensure_group()
    event_id = _alert(client, settings)
    assert consumer.step() == -1
    assert client.xpending(pipeline.names.alerts, INGEST_GROUP)["pending"] == 1
    consumer.run(until_idle=True)
    assert recorder.started == [(event_id, JOB)]
    assert client.xpending(pipeline.names.alerts, INGEST_GROUP)["pending"] == 0


def test_handle_reports_the_outcome(ingest: Ingest, client: Any, settings: Settings) -> None:
    """`handle` returns what happened to the alert."""
    event_id = _alert(client, settings)
    ((_s, ((entry_id, fields),)),) = client.xreadgroup(
        INGEST_GROUP, "c1", {ingest.names.alerts: ">"}
    )
    decoded = {k.decode(): v.decode() for k, v in fields.items()}
    assert ingest.handle(StreamEntry(entry_id.decode(), decoded, False)) == "started"
    assert ingest.pipeline.coalescer.in_flight(JOB) == event_id


def test_ids_just_short_of_refused_are_admitted(
    ingest: Ingest, client: Any, recorder: Recorder
) -> None:
    """Event ids with dots beside a letter or digit (`..a`, `v1.2`) are ordinary ids."""
    for event_id in ("..a", "v1.2"):
        _raw(client, ingest.names, _event(event_id=event_id, job_dir=JOB))
    ingest.run(until_idle=True)
    assert [lead for lead, _job in recorder.started] == ["..a"]
    assert client.xlen(ingest.names.dead_letter) == 0


def test_a_started_lead_keeps_its_event_for_a_recapture(
    ingest: Ingest, client: Any, settings: Settings
) -> None:
    """Admission stores the lead's event beside its lease, so S3 losing it is not final."""
    event_id = _alert(client, settings)
    ingest.run(until_idle=True)
    kept = ingest.pipeline.leases.record(event_id).event
    assert kept is not None and (kept["event_id"], kept["job_dir"]) == (event_id, JOB)


def test_the_loop_ticks_the_watchdog(
    pipeline: Pipeline, client: Any, settings: Settings, recorder: Recorder
) -> None:
    """A lead whose lease ran out is sent again by the watchdog ticking in the ingest loop."""
    from worker.pipeline.watchdog import Watchdog

    sent: list[tuple[str, str, str]] = []
    watchdog = Watchdog(pipeline, lambda *args: sent.append(args))
    consumer = Ingest(pipeline, recorder, consumer="c1", block_ms=1, watchdog=watchdog)
    consumer.ensure_group()
    event_id = _alert(client, settings)
    consumer.run(max_events=1)
    client.zadd(pipeline.names.leases, {event_id: 0})
    watchdog._next = 0.0
    consumer.run(until_idle=True)
    assert sent == [(event_id, JOB, event_id)]


def test_dead_letter_keeps_the_payload_but_not_its_credentials(
    ingest: Ingest, client: Any, recorder: Recorder
) -> None:
    """A refused alert quoting a bearer token and an HF token is dead-lettered whole, minus them."""
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlLXNlY3JldA"
    hf = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123"
    payload = _event(job_dir="jobs/cw/ops/gone", reason=f"Authorization: Bearer {jwt} {hf}")
    _raw(client, ingest.names, payload)
    ingest.run(until_idle=True)
    ((_id, fields),) = client.xrange(ingest.names.dead_letter)
    raw = json.loads(fields[b"raw"])[ALERT_FIELD]  # still JSON, with the credentials gone
    assert jwt[:12] not in raw and hf[3:] not in raw and "eyJ" not in fields[b"raw"].decode()
    assert json.loads(raw)["job_dir"] == "jobs/cw/ops/gone"
    assert "<redacted:" in json.loads(raw)["reason"]


def test_failed_diagnosis_dead_letter_is_redacted(pipeline: Pipeline, client: Any) -> None:
    """A diagnosis failure whose reason quotes a credential dead-letters it redacted."""
    from shared.models import Event

    secret = "hf_" + "ZyXwVuTsRqPoNmLkJiHgFeDcBa9876"
    event = Event(
        event_id="e1", job_dir=JOB, reason=f"token {secret}", published_at=datetime.now(UTC)
    )
    pipeline.publisher.dead_letter(event, f"probe printed {secret}")
    ((_id, fields),) = client.xrange(pipeline.names.dead_letter)
    text = b" ".join(fields.values()).decode()
    assert secret[3:] not in text and "<redacted:hf-token>" in text
    assert json.loads(fields[b"raw"])["event_id"] == "e1"


def test_once_with_stop_on_fault_raises_the_outage_instead_of_waiting(
    settings: Settings, client: Any, recorder: Recorder
) -> None:
    """`ingest --once` runs with `stop_on_fault`: Redis failing under it raises the fault (the
    command turns it into one line and exit 2); without it the loop backs off and tries again."""
    pipeline = Pipeline(settings, MemoryStore(), client)
    consumer = Ingest(pipeline, recorder, consumer="c1", block_ms=1)
    consumer.ensure_group()
    _alert(client, settings)
    calls = []

    def away(*_args: Any, **_kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > 3:
            raise AssertionError("asked again: it did not stop on the fault")
        raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379.")

    client.xreadgroup = away
    with pytest.raises(redis.exceptions.ConnectionError):
        consumer.run(until_idle=True, stop_on_fault=True)
    assert len(calls) == 1
    assert recorder.started == []
