"""Stream names, the verdict entry's stream encoding, and publishing an alert."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import fakeredis
import pytest

from shared.alerts import OutsideBundleRootError, confine, publish_alert
from shared.models import Confidence, Event, Verdict, VerdictEntry
from shared.settings import Settings
from shared.streams import ALERT_FIELD, StreamNames, entry_fields, read_entry
from shared.supervisor import VerdictReader
from testkit.keys import TEST_KEYS, signed_fields


def test_contract_names_follow_the_prefix() -> None:
    """Streams and channel are the contract's names under any prefix."""
    names = StreamNames("rlhealth")
    assert (names.alerts, names.verdicts, names.dead_letter, names.verdict_channel) == (
        "rlhealth:alerts",
        "rlhealth:verdicts",
        "rlhealth:dead-letter",
        "rlhealth:verdicts",
    )
    assert StreamNames("staging").inflight("jobs/a") == "staging:inflight:jobs/a"


def test_verdict_entry_survives_the_stream_encoding() -> None:
    """A signed verdict entry written as stream fields reads back equal."""
    entry = VerdictEntry(
        event_id="e1",
        event_ids=("e1", "e2"),
        job_id="/ops/rl-job",
        verdict=Verdict.KILL,
        confidence=Confidence.MEDIUM,
        report_uri="s3://b/reports/cw/ops/rl-job/2026-07-30T21:15:00Z-e1.json",
        captured_at=datetime(2026, 7, 30, 21, 15, tzinfo=UTC),
    ).signed(TEST_KEYS)
    fields = entry_fields(entry)
    assert json.loads(fields["event_ids"]) == ["e1", "e2"]
    encoded = {k.encode(): v.encode() for k, v in fields.items()}
    assert read_entry(encoded, TEST_KEYS) == entry


def test_confine_keeps_paths_inside_the_root(tmp_path: Path) -> None:
    """Relative and absolute paths inside the root become root-relative; others are refused."""
    (tmp_path / "jobs/a").mkdir(parents=True)
    assert confine(tmp_path, "jobs/a") == "jobs/a"
    assert confine(tmp_path, tmp_path / "jobs/a/../a") == "jobs/a"
    for outside in ("../x", "/etc", ".", "jobs/../.."):
        with pytest.raises(OutsideBundleRootError):
            confine(tmp_path, outside)


def test_publish_alert_puts_a_valid_event_on_the_stream(tmp_path: Path) -> None:
    """publish_alert XADDs one Event (unknown fields impossible) and returns its id."""
    client = fakeredis.FakeRedis()
    settings = Settings(bundle_root=tmp_path, stream_prefix="t")
    now = datetime(2026, 7, 30, 21, 15, tzinfo=UTC)
    event_id = publish_alert(
        client, tmp_path / "jobs/a", reason="stalled", mode="agentic", now=now, settings=settings
    )
    ((_id, fields),) = client.xrange("t:alerts")
    event = Event.model_validate_json(fields[ALERT_FIELD.encode()])
    assert (event.event_id, event.job_dir, event.mode, event.now) == (
        event_id,
        "jobs/a",
        "agentic",
        now,
    )


def test_publish_alert_refuses_a_job_outside_the_root(tmp_path: Path) -> None:
    """A job directory outside the bundle root is refused before anything is published."""
    client = fakeredis.FakeRedis()
    with pytest.raises(OutsideBundleRootError):
        publish_alert(client, "/etc", settings=Settings(bundle_root=tmp_path, stream_prefix="t"))
    assert client.xlen("t:alerts") == 0


def test_reader_group_delivers_each_verdict_once() -> None:
    """Two reads by one consumer group never return the same verdict twice."""
    client = fakeredis.FakeRedis()
    settings = Settings(stream_prefix="t")
    entry = {
        "event_id": "e1",
        "event_ids": ["e1"],
        "job_id": "/u/j",
        "verdict": "KILL",
        "confidence": "high",
        "report_uri": "s3://b/r.json",
        "captured_at": "2026-07-30T21:15:00Z",
    }
    client.xadd("t:verdicts", signed_fields(entry))
    reader = VerdictReader(client, settings, group="sup")
    assert [e.event_id for e in reader.follow(timeout_s=0.2)] == ["e1"]
    assert list(reader.follow(timeout_s=0.2)) == []
    assert [e.event_id for e in VerdictReader(client, settings).recent(5)] == ["e1"]


def test_follow_channel_yields_published_entries_until_count() -> None:
    """`follow_channel` yields the entries published on the channel after it subscribed."""
    import threading
    from itertools import islice

    from shared.supervisor import follow_channel

    client = fakeredis.FakeRedis()
    settings = Settings(stream_prefix="t")
    entry = VerdictEntry(
        event_id="e1",
        event_ids=("e1",),
        job_id="/u/j",
        verdict=Verdict.NO_KILL,
        confidence=Confidence.HIGH,
        report_uri="s3://b/r.json",
        captured_at=datetime(2026, 7, 30, 21, 15, tzinfo=UTC),
    ).signed(TEST_KEYS)
    stop = threading.Event()

    def publish() -> None:  # until the listener has subscribed and read one
        while not stop.wait(0.05):
            client.publish("t:verdicts", entry.model_dump_json())

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:
        got = list(islice(follow_channel(client, settings, timeout_s=10), 2))
    finally:
        stop.set()
        thread.join()
    assert got == [entry, entry]
    assert list(follow_channel(fakeredis.FakeRedis(), settings, timeout_s=0.3)) == []
