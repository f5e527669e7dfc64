"""The pipeline end to end on real services: alerts in, verdicts out, nothing lost or doubled."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shared.alerts import publish_alert
from shared.models import Event, VerdictEntry
from shared.streams import ALERT_FIELD
from shared.supervisor import VerdictReader
from testkit.bundles import write_job_bundle
from testkit.services import wait_for
from tests.integration.conftest import Services
from worker.pipeline.coalesce import job_dir_of

pytestmark = pytest.mark.integration

NOW = datetime(2026, 7, 30, 21, 13, tzinfo=UTC)


def _job(services: Services, name: str) -> str:
    job_dir = write_job_bundle(services.bundle_root, name)
    return job_dir.relative_to(services.bundle_root).as_posix()


def _verdicts_for(services: Services, ids: set[str], timeout: float = 60) -> list[VerdictEntry]:
    """Verdict entries from the start of the stream until every id in `ids` is answered."""
    reader = VerdictReader(services.redis, services.settings)
    reader.last_id = "0-0"
    entries: list[VerdictEntry] = []
    for entry in reader.follow(timeout_s=timeout):
        entries.append(entry)
        if ids <= {i for e in entries for i in e.event_ids}:
            return entries
    answered = {i for e in entries for i in e.event_ids}
    logs = (services.logs / "worker.log").read_text()[-3000:]
    raise AssertionError(f"unanswered: {sorted(ids - answered)}\nworker log tail:\n{logs}")


def _key(services: Services, uri: str) -> str:
    prefix = f"s3://{services.settings.s3_bucket}/{services.settings.s3_prefix}/"
    assert uri.startswith(prefix)
    return uri[len(prefix) :]


def _diagnosis_marks(services: Services) -> list[dict[str, str]]:
    entries = services.redis.xrange(services.names.diagnoses)
    return [{k.decode(): v.decode() for k, v in fields.items()} for _id, fields in entries]


def _max_in_flight_per_job(services: Services) -> dict[str, int]:
    """The most diagnoses in flight at once per job directory (a mark names the coalescing key:
    the job, with the digest of the question its alerts ask)."""
    running: dict[str, int] = defaultdict(int)
    peak: dict[str, int] = defaultdict(int)
    for mark in _diagnosis_marks(services):
        job = job_dir_of(mark["job"])
        running[job] += 1 if mark["phase"] == "started" else -1
        peak[job] = max(peak[job], running[job])
    return dict(peak)


def test_alert_gets_a_verdict_with_a_readable_report(pipeline_services: Services) -> None:
    """`rl-health alert` → one verdict entry whose report_uri holds the JSON report in S3."""
    services = pipeline_services
    job = _job(services, "single")
    result = services.run("alert", job, "--reason", "no step for 20 min", "--now", NOW.isoformat())
    assert result.returncode == 0, result.stderr
    event_id = result.stdout.strip()
    (entry,) = _verdicts_for(services, {event_id})
    assert (entry.event_id, entry.event_ids, entry.job_id) == (event_id, (event_id,), "/ops/single")
    assert entry.captured_at == NOW
    report = json.loads(services.store.get(_key(services, entry.report_uri)))
    assert (report["event_id"], report["verdict"]) == (event_id, entry.verdict.value)
    assert report["evidence_dir"].startswith(f"s3://rlhealth-test/ci/evidence/{event_id}/")
    assert entry.report_uri.endswith(f"reports/cw/ops/single/2026-07-30T21:13:00Z-{event_id}.json")
    assert services.store.exists(_key(services, entry.report_uri)[: -len("json")] + "txt")
    assert services.store.exists(f"events/{event_id}.json")
    assert services.store.exists(f"evidence/{event_id}/evidence.json")


def test_verdicts_command_prints_one_json_entry_per_line(pipeline_services: Services) -> None:
    """`rl-health verdicts --json` prints the entries the pipeline published."""
    services = pipeline_services
    event_id = publish_alert(services.redis, _job(services, "cli"), now=NOW)
    _verdicts_for(services, {event_id})
    result = services.run("verdicts", "--json", "--count", "5")
    assert result.returncode == 0, result.stderr
    lines = [VerdictEntry.model_validate_json(line) for line in result.stdout.splitlines()]
    assert [entry.event_id for entry in lines] == [event_id]
    grouped = services.run("verdicts", "--json", "--group", "ops", "--timeout", "2")
    assert [json.loads(line)["event_id"] for line in grouped.stdout.splitlines()] == [event_id]
    again = services.run("verdicts", "--json", "--group", "ops", "--timeout", "1")
    assert again.stdout == ""


def test_bad_events_go_to_the_dead_letter_stream(pipeline_services: Services) -> None:
    """Malformed JSON, an unknown field, an escaping or missing job dir: refused with reasons."""
    services = pipeline_services
    job = _job(services, "dead-letter")
    base = {"event_id": "evt-bad", "published_at": "2026-07-30T21:00:00Z"}
    payloads = {
        "malformed JSON": "{oops",
        "Extra inputs are not permitted": json.dumps({**base, "job_dir": job, "colour": "red"}),
        "escapes the bundle root": json.dumps({**base, "job_dir": "../../etc"}),
        "does not exist": json.dumps({**base, "job_dir": "jobs/cw/ops/nowhere"}),
    }
    for payload in payloads.values():
        services.redis.xadd(services.names.alerts, {ALERT_FIELD: payload})
    stream = services.names.dead_letter
    wait_for(lambda: services.redis.xlen(stream) >= len(payloads), 30, "dead letters")
    refused = [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _id, fields in services.redis.xrange(stream)
    ]
    for (reason, payload), entry in zip(payloads.items(), refused, strict=True):
        assert reason in entry["reason"]
        assert json.loads(entry["raw"]) == {ALERT_FIELD: payload}
    assert services.redis.xlen(services.names.verdicts) == 0


def test_alerts_for_one_job_coalesce_into_one_verdict(pipeline_services: Services) -> None:
    """A burst of alerts for a job gets one diagnosis whose verdict lists every event id."""
    services = pipeline_services
    busy, calm = _job(services, "busy"), _job(services, "calm")
    burst = [publish_alert(services.redis, busy, reason=f"#{i}", now=NOW) for i in range(8)]
    other = publish_alert(services.redis, calm, now=NOW)
    entries = _verdicts_for(services, {*burst, other})
    leads = {entry.job_id: set() for entry in entries}
    for entry in entries:
        leads[entry.job_id].add(entry.event_id)
    assert {job: len(ids) for job, ids in leads.items()} == {"/ops/busy": 1, "/ops/calm": 1}
    newest = [entry for entry in entries if entry.job_id == "/ops/busy"][-1]
    assert sorted(newest.event_ids) == sorted(burst)
    assert len({entry.report_uri for entry in entries if entry.job_id == "/ops/busy"}) == 1
    assert _max_in_flight_per_job(services) == {busy: 1, calm: 1}


def test_redelivered_alert_starts_nothing_new(pipeline_services: Services) -> None:
    """The same event delivered twice is answered once, by one diagnosis."""
    services = pipeline_services
    event = Event(
        event_id="evt-twice", job_dir=_job(services, "twice"), published_at=NOW, now=NOW
    ).model_dump_json(exclude_none=True)
    for _ in range(2):
        services.redis.xadd(services.names.alerts, {ALERT_FIELD: event})
    entries = _verdicts_for(services, {"evt-twice"})
    time_for_a_second = 3.0
    more = list(
        VerdictReader(services.redis, services.settings).follow(timeout_s=time_for_a_second)
    )
    assert [entry.event_ids for entry in entries + more] == [("evt-twice",)]
    assert [m["phase"] for m in _diagnosis_marks(services)] == ["started", "published"]


def test_replay_on_frozen_evidence_gives_the_same_verdict(pipeline_services: Services) -> None:
    """`rl-health replay` judges the frozen evidence as of the original capture time."""
    services = pipeline_services
    event_id = publish_alert(services.redis, _job(services, "replayed"), now=NOW)
    (original,) = _verdicts_for(services, {event_id})
    result = services.run("replay", event_id, "--json", "--timeout", "60")
    assert result.returncode == 0, result.stderr
    replay = VerdictEntry.model_validate_json(result.stdout)
    assert replay.event_id != event_id
    assert (replay.verdict, replay.confidence, replay.captured_at) == (
        original.verdict,
        original.confidence,
        original.captured_at,
    )
    archived = Event.model_validate_json(services.store.get(f"events/{replay.event_id}.json"))
    assert archived.replay_of == event_id
    first = json.loads(services.store.get(_key(services, original.report_uri)))
    second = json.loads(services.store.get(_key(services, replay.report_uri)))
    assert _judgement(first) == _judgement(second)


def _judgement(report: dict[str, Any]) -> dict[str, Any]:
    ignored = {"event_id", "event_ids", "signature"}  # the signature covers the event ids too
    return {key: value for key, value in report.items() if key not in ignored}


def test_fresh_replay_captures_again(pipeline_services: Services, tmp_path: Path) -> None:
    """`rl-health replay --fresh` makes a new capture of the job directory."""
    services = pipeline_services
    event_id = publish_alert(services.redis, _job(services, "fresh"), now=NOW)
    _verdicts_for(services, {event_id})
    result = services.run("replay", event_id, "--fresh", "--json", "--timeout", "60")
    assert result.returncode == 0, result.stderr
    replay = VerdictEntry.model_validate_json(result.stdout)
    assert services.store.exists(f"evidence/{replay.event_id}/evidence.json")
    assert replay.captured_at > NOW


AGREEMENT = ("stall_with_stacks", "healthy_standard", "stall_without_stacks", "crash_loop")


def test_pipeline_verdicts_agree_with_diagnose(pipeline_services: Services) -> None:
    """For scenario bundles (KILL, NO-KILL, ERROR), the pipeline's report gives the verdict,
    confidence and gate statuses that `rl-health diagnose` gives on the same directory."""
    from tests.scenarios.catalog import SCENARIOS

    services = pipeline_services
    expected: dict[str, dict[str, Any]] = {}
    for scenario in (s for s in SCENARIOS if s.name in AGREEMENT):
        built = scenario.build(services.bundle_root / "agreement")
        args = ["--now", built.now.isoformat()]
        if built.probes is not None:
            args += ["--probes", built.probes.relative_to(services.bundle_root).as_posix()]
        job = built.job_dir.relative_to(services.bundle_root).as_posix()
        alert = services.run("alert", job, *args)
        assert alert.returncode == 0, alert.stderr
        probes = ["--probes", str(built.probes)] if built.probes is not None else []
        local = services.run("diagnose", str(built.job_dir), "--now", built.now.isoformat(),
                             "--format", "json", *probes)  # fmt: skip
        expected[alert.stdout.strip()] = json.loads(local.stdout)
    for entry in _verdicts_for(services, set(expected)):
        for event_id in set(entry.event_ids) & set(expected):
            got = json.loads(services.store.get(_key(services, entry.report_uri)))
            want = expected[event_id]
            assert (got["verdict"], got["confidence"], got["restarts"]["count"]) == (
                want["verdict"],
                want["confidence"],
                want["restarts"]["count"],
            ), event_id
            statuses = {name: gate["status"] for name, gate in got["gates"].items()}
            assert statuses == {name: g["status"] for name, g in want["gates"].items()}


def test_verdicts_follow_channel_prints_live_entries(pipeline_services: Services) -> None:
    """`rl-health verdicts --follow --channel --json` prints a verdict published while it listens,
    the same entry the stream holds; `--channel` without `--follow` is a usage error (exit 2)."""
    import subprocess

    from testkit.services import RL_HEALTH

    services = pipeline_services
    channel = services.names.verdict_channel
    listener = subprocess.Popen(
        [RL_HEALTH, "verdicts", "--follow", "--channel", "--json", "--count", "1",
         "--timeout", "120"],
        env=services.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: services.redis.pubsub_numsub(channel)[0][1] >= 1, 60, "a subscriber")
        event_id = publish_alert(services.redis, _job(services, "channel"), now=NOW)
        out, err = listener.communicate(timeout=120)
    finally:
        listener.kill()
    assert listener.returncode == 0, err
    (line,) = out.splitlines()
    (entry,) = _verdicts_for(services, {event_id})
    assert VerdictEntry.model_validate_json(line) == entry
    usage = services.run("verdicts", "--channel")
    assert usage.returncode == 2 and "--channel needs --follow" in usage.stderr
