"""Leases, the watchdog and a failed diagnosis's answer, on fakeredis with the in-memory store."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

from shared.models import Confidence, Event, Verdict, VerdictEntry
from shared.settings import Settings
from shared.streams import read_entry
from testkit.bundles import write_job_bundle
from worker.pipeline.steps import Pipeline
from worker.pipeline.store import MemoryStore
from worker.pipeline.watchdog import Watchdog

NOW = datetime(2026, 7, 30, 21, 15, tzinfo=UTC)


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    root = tmp_path / "bundles"
    write_job_bundle(root, "rl-job")
    settings = Settings(
        bundle_root=root, stream_prefix="t", coalesce_s=60, lease_s=30, redispatch_max=2,
        cache_dir=tmp_path / "cache",
    )  # fmt: skip
    return Pipeline(settings, MemoryStore(), fakeredis.FakeRedis())


JOB = "jobs/cw/ops/rl-job"


def _start(pipeline: Pipeline, event_id: str = "e1") -> str:
    event = Event(event_id=event_id, job_dir=JOB, published_at=NOW, now=NOW)
    pipeline.events.archive(event)
    admission = pipeline.coalescer.admit(event_id, JOB, event_json=event.model_dump_json())
    return admission.lead


def _expire(pipeline: Pipeline, lead: str) -> None:
    pipeline.redis.zadd(pipeline.names.leases, {lead: 0})


def _entry(lead: str = "e1", verdict: Verdict = Verdict.NO_KILL) -> VerdictEntry:
    return VerdictEntry(
        event_id=lead, event_ids=(lead,), job_id="/ops/rl-job", verdict=verdict,
        confidence=Confidence.HIGH, report_uri=f"memory://rlhealth/reports/x-{lead}.json",
        captured_at=NOW,
    )  # fmt: skip


def _verdicts(pipeline: Pipeline) -> list[VerdictEntry]:
    verdicts = pipeline.redis.xrange(pipeline.names.verdicts)
    return [read_entry(fields, pipeline.keys) for _id, fields in verdicts]


class Resends:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []

    def __call__(self, lead: str, job: str, evidence_id: str) -> None:
        self.sent.append((lead, job, evidence_id))


# --- leases -------------------------------------------------------------------------------------


def test_a_started_lead_holds_a_lease_and_its_event(pipeline: Pipeline) -> None:
    """The admission of a new lead registers its lease, job, evidence and event."""
    _start(pipeline)
    record = pipeline.leases.record("e1")
    assert (record["job"], record["evidence"]) == (JOB, "e1")
    assert record.event is not None and record.event["event_id"] == "e1"
    assert pipeline.leases.deadline_ms("e1") is not None
    assert pipeline.leases.expired() == []


def test_publishing_ends_the_lease_and_renewal_says_answered(pipeline: Pipeline) -> None:
    """After its publish a lead leaves the lease set and `renew` reports it answered."""
    _start(pipeline)
    assert pipeline.leases.renew("e1") is True
    pipeline.coalescer.publish(_entry(), JOB)
    assert pipeline.leases.deadline_ms("e1") is None
    assert pipeline.leases.renew("e1") is False


def test_renew_many_never_adds_an_unknown_lead(pipeline: Pipeline) -> None:
    """The heartbeat renews registered leads only: an answered lead does not come back."""
    _start(pipeline)
    _expire(pipeline, "e1")
    pipeline.leases.renew_many({"e1", "stranger"})
    assert pipeline.leases.deadline_ms("stranger") is None
    assert pipeline.leases.expired() == []


def test_an_expired_lead_is_taken_once(pipeline: Pipeline) -> None:
    """Two watchdogs racing for one expired lead: the first takes it, the second gets -1."""
    _start(pipeline)
    assert pipeline.leases.take("e1") == -1  # alive
    _expire(pipeline, "e1")
    assert (pipeline.leases.take("e1"), pipeline.leases.take("e1")) == (1, -1)


def test_a_new_lead_takes_over_the_answers_of_one_that_never_published(
    pipeline: Pipeline,
) -> None:
    """When a lead's in-flight mark expired unpublished, the next alert's lead answers its
    alerts too, and the old lead, should it come back, stays silent."""
    _start(pipeline, "e1")
    pipeline.coalescer.admit("e2", JOB)
    pipeline.redis.delete(pipeline.names.inflight(JOB))  # every worker gone for 30 min
    assert pipeline.coalescer.admit("e3", JOB).outcome == "started"
    assert pipeline.coalescer.answers("e3") == ["e1", "e2", "e3"]
    assert pipeline.coalescer.publish(_entry("e1"), JOB) is False
    assert pipeline.leases.deadline_ms("e1") is None
    assert pipeline.coalescer.publish(_entry("e3"), JOB) is True
    assert [e.event_ids for e in _verdicts(pipeline)] == [("e1", "e2", "e3")]


def test_a_published_lead_is_not_taken_over(pipeline: Pipeline) -> None:
    """A lead that published keeps its answers: the next lead starts with its own id only."""
    coalescer = pipeline.coalescer
    _start(pipeline, "e1")
    coalescer.publish(_entry("e1"), JOB, cooldown=False)
    assert coalescer.admit("e2", JOB).outcome == "started"
    assert coalescer.answers("e2") == ["e2"]


def test_a_failure_releases_the_job_without_a_cooldown(pipeline: Pipeline) -> None:
    """`publish(cooldown=False)`: the next alert starts a new diagnosis instead of being given
    the failed one's ERROR again."""
    _start(pipeline, "e1")
    pipeline.coalescer.publish(_entry("e1", Verdict.ERROR), JOB, cooldown=False)
    assert pipeline.coalescer.admit("e2", JOB).outcome == "started"


# --- the watchdog -------------------------------------------------------------------------------


def test_watchdog_sends_a_lost_diagnosis_again(pipeline: Pipeline) -> None:
    """An expired lead with nothing queued is sent again with its job and evidence."""
    _start(pipeline)
    _expire(pipeline, "e1")
    resends = Resends()
    assert Watchdog(pipeline, resends).tick() == 1
    assert resends.sent == [("e1", JOB, "e1")]
    assert pipeline.leases.expired() == []


def test_watchdog_leaves_a_queued_diagnosis_alone(pipeline: Pipeline) -> None:
    """An expired lead whose task still waits in the broker queue is renewed, not sent again."""
    _start(pipeline)
    _expire(pipeline, "e1")
    message = json.dumps({"headers": {"kwargsrepr": "{'lead': 'e1', 'deadline': 1.0}"}})
    pipeline.redis.rpush(pipeline.names.task_queue, message)
    resends = Resends()
    assert Watchdog(pipeline, resends).tick() == 0
    assert resends.sent == []
    assert pipeline.leases.expired() == []


def test_watchdog_answers_error_after_the_last_resend(pipeline: Pipeline) -> None:
    """After RLHEALTH_REDISPATCH_MAX re-sends, the next expiry is answered ERROR with every
    attached id, the job is released and the event dead-lettered."""
    _start(pipeline)
    pipeline.coalescer.admit("e2", JOB)
    resends, dog = Resends(), Watchdog(pipeline, Resends())
    dog.resend = resends
    for _ in range(3):
        _expire(pipeline, "e1")
        dog.tick()
    assert len(resends.sent) == 2
    (entry,) = _verdicts(pipeline)
    assert (entry.verdict, entry.event_ids) == (Verdict.ERROR, ("e1", "e2"))
    assert pipeline.coalescer.in_flight(JOB) is None
    ((_id, letter),) = pipeline.redis.xrange(pipeline.names.dead_letter)
    assert b"lease of 30 s ran out 3 times" in letter[b"reason"]
    assert json.loads(letter[b"raw"])["event_id"] == "e1"


def test_watchdog_waits_after_redis_comes_back(pipeline: Pipeline) -> None:
    """A tick that finds Redis away makes the watchdog hold off half a lease, so workers can
    renew what they hold before anything is sent again."""
    clock = [0.0]

    class Away:
        def expired(self) -> list[str]:
            raise redis.exceptions.ConnectionError("away")

    dog = Watchdog(pipeline, Resends(), clock=lambda: clock[0])
    real = pipeline.leases
    pipeline.__dict__["leases"] = Away()
    assert dog.maybe_tick() == 0
    pipeline.__dict__["leases"] = real
    _start(pipeline)
    _expire(pipeline, "e1")
    clock[0] = 10.0  # a tick is due, but within the settling time (15 s)
    assert dog.maybe_tick() == 0
    clock[0] = 20.0
    assert dog.maybe_tick() == 1


# --- a failed diagnosis ---------------------------------------------------------------------------


def _report(pipeline: Pipeline, entry: VerdictEntry) -> dict[str, Any]:
    store = pipeline.store
    assert isinstance(store, MemoryStore)
    key = entry.report_uri.removeprefix("memory://rlhealth/")
    parsed: dict[str, Any] = json.loads(store.get(key))
    return parsed


def test_fail_answers_error_once_naming_the_stage(pipeline: Pipeline) -> None:
    """`fail` writes an ERROR report whose gates are not judged, publishes it once listing every
    attached id, and dead-letters the lead's event."""
    _start(pipeline)
    pipeline.coalescer.admit("e2", JOB)
    entry = pipeline.publisher.fail("e1", JOB, "gate liveness failed: StageTimeoutError: past 72 s")
    assert entry is not None and entry.verdict is Verdict.ERROR
    assert pipeline.publisher.fail("e1", JOB, "again") is None
    (published,) = _verdicts(pipeline)
    assert published.event_ids == ("e1", "e2")
    report = _report(pipeline, published)
    assert report["verdict"] == "ERROR"
    assert all("not judged" in gate["summary"] for gate in report["gates"].values())
    assert any("gate liveness failed" in d for d in report["discrepancies"])
    assert pipeline.redis.xlen(pipeline.names.dead_letter) == 1


def test_fail_publishes_a_verdict_already_decided(pipeline: Pipeline) -> None:
    """A diagnosis whose verdict was decided but not published is answered with that verdict,
    not with an ERROR, and nothing is dead-lettered."""
    _start(pipeline)
    decided = _entry().signed(pipeline.keys)  # the verdict step keeps it signed
    pipeline.store.put_once("reports/x-e1.json", b"{}")  # and has written its report
    pipeline.redis.set(pipeline.names.entry("e1"), decided.model_dump_json())
    entry = pipeline.publisher.fail("e1", JOB, "publish failed: ConnectionError")
    assert entry is not None and entry.verdict is Verdict.NO_KILL
    assert [e.verdict for e in _verdicts(pipeline)] == [Verdict.NO_KILL]
    assert pipeline.redis.xlen(pipeline.names.dead_letter) == 0


def test_verdict_after_a_failure_returns_the_published_entry(pipeline: Pipeline) -> None:
    """A verdict task that runs after the diagnosis was answered writes no second report and
    returns what was published."""
    _start(pipeline)
    failed = pipeline.publisher.fail("e1", JOB, "capture failed: boom")
    assert failed is not None
    store = pipeline.store
    assert isinstance(store, MemoryStore)
    reports = [k for k in store.objects if k.startswith("reports/")]
    again = pipeline.verdict([], "e1", "e1")
    assert VerdictEntry.model_validate(again).verdict is Verdict.ERROR
    assert [k for k in store.objects if k.startswith("reports/")] == reports


def test_fail_survives_a_bundle_whose_report_cannot_render(pipeline: Pipeline) -> None:
    """Even when the frozen evidence cannot be rendered (a lone surrogate in the manifest), the
    ERROR report is written from the event's job directory."""
    _start(pipeline)
    manifest = pipeline.settings.bundle_root / JOB / "manifest.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "job_id": "/ops/\udcff"}))
    pipeline.capture("e1", "e1", claim="t1")
    entry = pipeline.publisher.fail("e1", JOB, "verdict failed: UnicodeEncodeError")
    assert entry is not None and entry.verdict is Verdict.ERROR
    assert entry.job_id == "/ops/rl-job"  # from the job directory, not the manifest
    assert "/cw/ops/rl-job/" in entry.report_uri


@pytest.mark.parametrize(
    ("read_frozen", "job_id"), [(True, "/ops/from-manifest"), (False, "/ops/rl-job")]
)
def test_a_callback_killed_once_answers_from_the_event(
    pipeline: Pipeline, read_frozen: bool, job_id: str
) -> None:
    """The error callback takes the job's identity from the frozen evidence, unless its process
    died once already (reading a huge evidence?): then from the event's job directory."""
    manifest = pipeline.settings.bundle_root / JOB / "manifest.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "job_id": "/ops/from-manifest"}))
    _start(pipeline)
    pipeline.capture("e1", "e1", claim="t1")
    entry = pipeline.publisher.fail(
        "e1", JOB, "gate liveness was killed twice", read_frozen=read_frozen
    )
    assert entry is not None and entry.job_id == job_id
