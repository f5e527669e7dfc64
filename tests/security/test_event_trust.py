"""Issue 28, events as an attacker who can publish alerts would send them: an old event id that
Redis has forgotten, re-used for another job or question (finding 9), and an alert that asks
another question (its own `now`, no probes) racing the genuine one (finding 10). Ingest runs on
fakeredis and the in-memory store; each test fails on the code before the fix.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from shared.alerts import publish_event
from shared.models import Confidence, Event, Verdict, VerdictEntry
from shared.settings import Settings
from shared.streams import INGEST_GROUP
from worker.pipeline.ingest import Ingest
from worker.pipeline.steps import Pipeline
from worker.pipeline.store import MemoryStore

KILLED = "jobs/cw/ops/killed"
VICTIM = "jobs/cw/ops/healthy-victim"
PROBES = "probes/healthy-victim"
EARLY = datetime(2026, 7, 30, 18, 0, tzinfo=UTC)


class Started:
    """The dispatch: which leads were started, under which key."""

    def __init__(self) -> None:
        self.leads: list[tuple[str, str]] = []

    def __call__(self, lead: str, job: str) -> None:
        self.leads.append((lead, job))


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    for folder in (KILLED, VICTIM, PROBES):
        (tmp_path / folder).mkdir(parents=True)
    settings = Settings(bundle_root=tmp_path, stream_prefix="t", coalesce_s=300)
    return Pipeline(settings, MemoryStore(), fakeredis.FakeRedis())


@pytest.fixture
def started() -> Started:
    return Started()


@pytest.fixture
def ingest(pipeline: Pipeline, started: Started) -> Ingest:
    consumer = Ingest(pipeline, started, consumer="c1", block_ms=1)
    consumer.ensure_group()
    return consumer


def _send(ingest: Ingest, event_id: str, job_dir: str, **fields: Any) -> str:
    """Publish one alert and let ingest handle it; the outcome."""
    event = Event(event_id=event_id, job_dir=job_dir, published_at=datetime.now(UTC), **fields)
    publish_event(ingest.redis, event, ingest.pipeline.settings)
    before = dict(ingest.outcomes)
    ingest.run(until_idle=True)
    (outcome,) = [k for k, n in ingest.outcomes.items() if n != before.get(k, 0)]
    return outcome


def _forget(client: Any) -> None:
    """What the retention does after seven days: every key but the alert stream is gone."""
    for key in client.keys("t:*"):
        if key not in (b"t:alerts", b"t:dead-letter"):
            client.delete(key)


def _dead_letters(client: Any) -> list[str]:
    return [fields[b"reason"].decode() for _id, fields in client.xrange("t:dead-letter")]


# --- finding 9: an event id Redis has forgotten ---------------------------------------------------


def test_an_old_event_id_for_another_job_is_dead_lettered(ingest: Ingest, started: Started) -> None:
    """An event id already archived for a killed job, sent again for a healthy one after Redis
    forgot it, is dead-lettered: the old job's frozen evidence never answers another job."""
    assert _send(ingest, "evt-old", KILLED) == "started"
    _forget(ingest.redis)
    assert _send(ingest, "evt-old", VICTIM) == "dead-letter"
    assert started.leads == [("evt-old", KILLED)]
    (reason,) = _dead_letters(ingest.redis)
    assert "evt-old" in reason and "another job" in reason
    assert ingest.redis.xpending("t:alerts", INGEST_GROUP)["pending"] == 0


def test_an_old_event_id_with_another_question_is_dead_lettered(
    ingest: Ingest, started: Started
) -> None:
    """The same job asked as of another time under an old id is dead-lettered too; the same
    event sent again (a watcher's retry) is still answered."""
    assert _send(ingest, "evt-old", KILLED) == "started"
    _forget(ingest.redis)
    assert _send(ingest, "evt-old", KILLED, now=EARLY) == "dead-letter"
    assert _send(ingest, "evt-old", KILLED) == "started"  # the same question: a retry
    assert [lead for lead, _job in started.leads] == ["evt-old", "evt-old"]


@pytest.mark.parametrize(("days", "outcome"), [(7.05, "dead-letter"), (6.95, "started")])
def test_an_event_id_older_than_the_retention_is_not_started_again(
    ingest: Ingest, pipeline: Pipeline, days: float, outcome: str
) -> None:
    """The same event, archived longer ago than Redis remembers ids (7 days), is dead-lettered
    instead of announcing its old verdict again as new; archived just less long ago, answered."""
    assert _send(ingest, "evt-old", KILLED) == "started"
    store = pipeline.store
    assert isinstance(store, MemoryStore)
    store.written_at["events/evt-old.json"] = time.time() - days * 86400
    _forget(ingest.redis)
    assert _send(ingest, "evt-old", KILLED) == outcome


# --- finding 10: coalescing by question -----------------------------------------------------------


def test_an_alert_with_its_own_now_does_not_answer_the_genuine_alert(
    ingest: Ingest, started: Started
) -> None:
    """An early-`now` alert without probes, first in, does not absorb the genuine alert with
    probes: each leads its own diagnosis. An alert asking the same question as a lead in
    flight still attaches to it (the boundary)."""
    assert _send(ingest, "evt-early", VICTIM, now=EARLY) == "started"
    assert _send(ingest, "evt-genuine", VICTIM, probes=PROBES) == "started"
    assert _send(ingest, "evt-early-2", VICTIM, now=EARLY) == "attached"
    assert _send(ingest, "evt-genuine-2", VICTIM, probes=PROBES) == "attached"
    assert _send(ingest, "evt-agentic", VICTIM, probes=PROBES, mode="agentic") == "started"
    leads = [lead for lead, _key in started.leads]
    assert leads == ["evt-early", "evt-genuine", "evt-agentic"]
    assert len({key for _lead, key in started.leads}) == 3


def test_a_verdict_for_another_question_is_not_reannounced(
    ingest: Ingest, started: Started, pipeline: Pipeline
) -> None:
    """After the early-`now` diagnosis answers ERROR, a genuine alert within the coalescing
    window is not answered with that ERROR: it starts its own diagnosis."""
    assert _send(ingest, "evt-early", VICTIM, now=EARLY) == "started"
    ((lead, key),) = started.leads
    error = VerdictEntry(
        event_id=lead,
        event_ids=(lead,),
        job_id="/ops/healthy-victim",
        verdict=Verdict.ERROR,
        confidence=Confidence.LOW,
        report_uri="memory://rlhealth/reports/x.json",
        captured_at=EARLY,
    )
    pipeline.store.put_once("reports/x.json", b"{}")  # in S3, as every announced report is
    assert pipeline.coalescer.publish(error, key) is True
    assert _send(ingest, "evt-early-2", VICTIM, now=EARLY) == "reannounced"  # same question
    assert _send(ingest, "evt-genuine", VICTIM, probes=PROBES) == "started"
