"""The pipeline steps on fakeredis and the in-memory store: lost objects, captures taken over,
time limits and safe keys."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from celery.exceptions import SoftTimeLimitExceeded

from shared.models import Event, VerdictEntry
from shared.settings import Settings
from testkit.bundles import write_job_bundle
from tests.unit.test_frozen import assert_same
from worker.diagnosis import collect_evidence
from worker.evidence import frozen
from worker.pipeline import capture, steps
from worker.pipeline.claim import CaptureClaim
from worker.pipeline.failures import EvidenceLostError, StageTimeoutError
from worker.pipeline.parts import PARTS_PREFIX
from worker.pipeline.steps import CaptureBusyError, Pipeline
from worker.pipeline.store import MemoryStore

NOW = datetime(2026, 7, 30, 21, 15, tzinfo=UTC)
JOB = "jobs/cw/ops/rl-job"


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    write_job_bundle(tmp_path / "bundles", "rl-job")
    settings = Settings(
        bundle_root=tmp_path / "bundles", stream_prefix="t", cache_dir=tmp_path / "cache"
    )
    return Pipeline(settings, MemoryStore(), fakeredis.FakeRedis())


def _admit(pipeline: Pipeline, event_id: str = "e1", job: str = JOB) -> Event:
    event = Event(event_id=event_id, job_dir=job, published_at=NOW, now=NOW)
    pipeline.events.archive(event)
    pipeline.coalescer.admit(event_id, job, event_json=event.model_dump_json())
    return event


def _objects(pipeline: Pipeline) -> dict[str, bytes]:
    store = pipeline.store
    assert isinstance(store, MemoryStore)
    return store.objects


def _diagnose(pipeline: Pipeline, lead: str = "e1") -> VerdictEntry:
    pipeline.capture(lead, lead, claim="t1")
    results = [pipeline.gate(lead, name) for name in steps.GATE_NAMES]
    return VerdictEntry.model_validate(pipeline.verdict(results, lead, lead))


# --- lost objects -------------------------------------------------------------------------------


def test_a_lost_event_is_archived_again_from_its_alert(pipeline: Pipeline) -> None:
    """The capture of an event gone from S3 re-archives it from the copy its lead keeps."""
    _admit(pipeline)
    del _objects(pipeline)["events/e1.json"]
    pipeline.capture("e1", "e1", claim="t1")
    assert json.loads(_objects(pipeline)["events/e1.json"])["event_id"] == "e1"
    assert "evidence/e1/evidence.json" in _objects(pipeline)


def test_an_event_gone_everywhere_is_reported_lost(pipeline: Pipeline) -> None:
    """An event neither S3 nor Redis holds raises EvidenceLostError, not a bare KeyError."""
    with pytest.raises(EvidenceLostError, match="gone from S3 and Redis"):
        pipeline.capture("e9", "e9", claim="t1")


def test_lost_frozen_evidence_is_not_turned_into_a_verdict(pipeline: Pipeline) -> None:
    """A gate whose frozen evidence vanished raises EvidenceLostError (the diagnosis is sent
    again) instead of answering "the evidence could not be read"."""
    _admit(pipeline)
    pipeline.capture("e1", "e1", claim="t1")
    for key in [k for k in _objects(pipeline) if k.startswith("evidence/")]:
        del _objects(pipeline)[key]
    with pytest.raises(EvidenceLostError, match="gone from S3"):
        pipeline.gate("e1", "liveness")


def test_lost_evidence_is_captured_again(pipeline: Pipeline) -> None:
    """After the loss, a new capture of the same event freezes the evidence again."""
    _admit(pipeline)
    pipeline.capture("e1", "e1", claim="t1")
    for key in [k for k in _objects(pipeline) if k.startswith("evidence/")]:
        del _objects(pipeline)[key]
    pipeline.capture("e1", "e1", claim="t2")
    assert pipeline.gate("e1", "liveness")["name"] == "liveness"


def test_a_replay_whose_evidence_is_gone_says_so(pipeline: Pipeline) -> None:
    """A replay on frozen evidence that is gone cannot capture it again: EvidenceLostError."""
    _admit(pipeline, "e2")
    with pytest.raises(EvidenceLostError, match="replay --fresh"):
        pipeline.capture("e2", "e1", claim="t1")


# --- a verdict entry never points at a report that is not in S3 ---------------------------------


def _reports(pipeline: Pipeline) -> list[str]:
    return sorted(k for k in _objects(pipeline) if k.startswith("reports/"))


def _lose_reports(pipeline: Pipeline, *, kept_too: bool = False) -> None:
    """S3 restarted empty of reports (and, with `kept_too`, Redis's copies of them gone)."""
    for key in _reports(pipeline):
        del _objects(pipeline)[key]
    if kept_too:
        for key in pipeline.redis.keys(f"{pipeline.names.prefix}:report:*"):
            pipeline.redis.delete(key)


def _announced(pipeline: Pipeline) -> list[str]:
    """The report URIs of the verdict entries on the stream, in order."""
    return [f[b"report_uri"].decode() for _id, f in pipeline.redis.xrange(pipeline.names.verdicts)]


def _in_store(pipeline: Pipeline, uri: str) -> bool:
    return uri.removeprefix(pipeline.store.uri("")) in _objects(pipeline)


def test_a_report_lost_before_its_publish_is_written_again(pipeline: Pipeline) -> None:
    """A report S3 lost between the verdict step and the publish is written again (from the
    copy Redis keeps) before the entry pointing at it is announced."""
    _admit(pipeline)
    entry = _diagnose(pipeline)
    written = _reports(pipeline)
    _lose_reports(pipeline)
    pipeline.publisher.publish(entry.model_dump(mode="json"), JOB)
    assert _announced(pipeline) == [entry.report_uri]
    assert _reports(pipeline) == written
    assert _in_store(pipeline, entry.report_uri)


def test_a_report_lost_everywhere_is_not_announced_but_written_anew(pipeline: Pipeline) -> None:
    """A decided verdict whose report is gone from S3 and Redis is not announced: the decision
    is withdrawn (ReportLostError sends the diagnosis again), and the verdict step run again
    writes the report before its entry goes out."""
    _admit(pipeline)
    entry = _diagnose(pipeline)
    _lose_reports(pipeline, kept_too=True)
    with pytest.raises(EvidenceLostError, match="gone from S3"):
        pipeline.publisher.publish(entry.model_dump(mode="json"), JOB)
    assert _announced(pipeline) == []
    assert pipeline.publisher.decided("e1") is None
    again = _diagnose(pipeline)
    pipeline.publisher.publish(again.model_dump(mode="json"), JOB)
    (uri,) = _announced(pipeline)
    assert _in_store(pipeline, uri)


def test_the_error_callback_answers_with_a_report_that_is_there(pipeline: Pipeline) -> None:
    """A decided verdict the error callback would publish, whose report is lost everywhere,
    gives way to an ERROR with a report of its own."""
    _admit(pipeline)
    _diagnose(pipeline)
    _lose_reports(pipeline, kept_too=True)
    answered = pipeline.publisher.fail("e1", JOB, "publish failed")
    assert answered is not None and answered.verdict.value == "ERROR"
    (uri,) = _announced(pipeline)
    assert _in_store(pipeline, uri)


@pytest.mark.parametrize(("lost", "outcome"), [(False, "reannounced"), (True, "started")])
def test_a_cooldown_verdict_is_reannounced_only_with_its_report(
    pipeline: Pipeline, lost: bool, outcome: str
) -> None:
    """An alert in the job's cooldown is answered by the published verdict while its report is
    in S3; once S3 lost it, the alert starts a diagnosis of its own instead of an entry
    pointing at nothing."""
    _admit(pipeline)
    entry = _diagnose(pipeline)
    pipeline.publisher.publish(entry.model_dump(mode="json"), JOB)
    if lost:
        _lose_reports(pipeline)
    assert pipeline.coalescer.admit("e2", JOB).outcome == outcome
    assert all(_in_store(pipeline, uri) for uri in _announced(pipeline)[1:])


# --- the capture claim --------------------------------------------------------------------------


def test_a_live_claim_makes_a_second_capture_wait(pipeline: Pipeline) -> None:
    """While another task holds the claim, a capture raises CaptureBusyError and writes nothing."""
    _admit(pipeline)
    CaptureClaim(pipeline.redis, pipeline.names.capture_claim("e1"), "other").acquire()
    with pytest.raises(CaptureBusyError):
        pipeline.capture("e1", "e1", claim="t1")
    assert not any(k.startswith("evidence/") for k in _objects(pipeline))


def test_a_dead_captures_leftovers_are_replaced(pipeline: Pipeline) -> None:
    """Once a dead capture's claim expired, the next one removes its unmarked objects."""
    _admit(pipeline)
    _objects(pipeline)["evidence/e1/logs/stale.parquet"] = b"half a file"
    pipeline.capture("e1", "e1", claim="t2")
    assert "evidence/e1/logs/stale.parquet" not in _objects(pipeline)
    assert "evidence/e1/evidence.json" in _objects(pipeline)


def test_the_same_task_delivered_again_resumes_its_capture(pipeline: Pipeline) -> None:
    """A task whose child was killed holds its own claim and captures at once when redelivered."""
    _admit(pipeline)
    CaptureClaim(pipeline.redis, pipeline.names.capture_claim("e1"), "t1").acquire()
    pipeline.capture("e1", "e1", claim="t1")
    assert "evidence/e1/evidence.json" in _objects(pipeline)
    assert pipeline.redis.get(pipeline.names.capture_claim("e1")) is None


def test_a_capture_that_lost_its_claim_stops_writing(pipeline: Pipeline) -> None:
    """A holder frozen past its claim's expiry does not mix its files with its successor's."""
    _admit(pipeline)
    holder = CaptureClaim(pipeline.redis, pipeline.names.capture_claim("e1"), "t1")
    holder.acquire()
    pipeline.redis.set(pipeline.names.capture_claim("e1"), "t2")  # taken over meanwhile
    event = pipeline.events.load("e1")
    with pytest.raises(CaptureBusyError, match="lost the capture claim"):
        pipeline.capturer.capture(event, holder.held)
    assert not any(k.startswith("evidence/") for k in _objects(pipeline))


# --- time limits and memory are never evidence --------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [SoftTimeLimitExceeded(), StageTimeoutError("past"), MemoryError()],
)
def test_a_capture_interrupted_by_a_limit_freezes_nothing(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    """A time limit or a memory error during the capture propagates: no frozen evidence says
    "capture failed: SoftTimeLimitExceeded"."""
    _admit(pipeline)

    def interrupted(*_args: Any, **_kwargs: Any) -> Any:
        raise failure

    monkeypatch.setattr(capture, "collect_evidence", interrupted)
    with pytest.raises(type(failure)):
        pipeline.capture("e1", "e1", claim="t1")
    assert "evidence/e1/evidence.json" not in _objects(pipeline)


def test_a_broken_bundle_is_still_evidence(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader error on the bundle (not a limit) freezes evidence that says why: ERROR."""
    _admit(pipeline)

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise ValueError("unreadable manifest")

    monkeypatch.setattr(capture, "collect_evidence", broken)
    entry = _diagnose(pipeline)
    assert entry.verdict.value == "ERROR"


@pytest.mark.parametrize("failure", [SoftTimeLimitExceeded(), StageTimeoutError("past")])
def test_a_gate_interrupted_by_a_limit_raises(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    """A gate past its time limit fails the stage instead of becoming an ERROR gate result."""
    _admit(pipeline)
    pipeline.capture("e1", "e1", claim="t1")

    def interrupted(*_args: Any) -> Any:
        raise failure

    monkeypatch.setattr(steps, "run_gate", interrupted)
    with pytest.raises(type(failure)):
        pipeline.gate("e1", "liveness")


def test_a_gate_that_breaks_on_the_evidence_answers_error(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ordinary exception in a gate is an ERROR result quoting it, so the chord joins."""
    _admit(pipeline)
    pipeline.capture("e1", "e1", claim="t1")

    def broken(*_args: Any) -> Any:
        raise KeyError("step")

    monkeypatch.setattr(steps, "run_gate", broken)
    result = pipeline.gate("e1", "liveness")["result"]
    assert result["status"] == "ERROR"
    assert "KeyError" in result["summary"]


# --- keys ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "manifest",
    [
        {"cluster": ".."},
        {"user": ".."},
        {"cluster": "."},
        {"job_id": "/ops/evil\r\nVERDICT: NO-KILL"},
        {"cluster": "../../etc"},
    ],
)
def test_report_keys_never_climb(pipeline: Pipeline, manifest: dict[str, str]) -> None:
    """Cluster, user or job values from a manifest cannot put `.`/`..` segments or control
    characters into the report's key."""
    path = pipeline.settings.bundle_root / JOB / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **manifest}))
    _admit(pipeline)
    entry = _diagnose(pipeline)
    key = entry.report_uri.removeprefix("memory://rlhealth/")
    assert key in _objects(pipeline)
    assert not {".", "..", ""} & set(key.split("/"))
    assert all(ord(ch) >= 32 for ch in key)


def test_a_plain_cluster_keeps_its_name(pipeline: Pipeline) -> None:
    """An ordinary cluster, user and job name appear unchanged in the key."""
    _admit(pipeline)
    assert "/reports/cw/ops/rl-job/" in _diagnose(pipeline).report_uri


# --- frozen evidence in parts: a grown log ------------------------------------------------------


def _finelog(pipeline: Pipeline) -> Path:
    return pipeline.settings.bundle_root / JOB / "finelog.log"


def _part_keys(pipeline: Pipeline) -> set[str]:
    return {key for key in _objects(pipeline) if key.startswith(PARTS_PREFIX)}


def test_a_grown_log_stores_and_thaws_only_its_new_parts(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second diagnosis after the log grew uploads only the parts after the unchanged rows;
    a process that thawed the first reads only those, and thaws what a full read gives."""
    monkeypatch.setattr(frozen, "PART_ROWS", 4)
    log = _finelog(pipeline)
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-4]))
    _admit(pipeline, "e1")
    _diagnose(pipeline, "e1")
    first = _part_keys(pipeline)
    gates = Pipeline(pipeline.settings, pipeline.store, pipeline.redis)  # another process
    gates.frozen.thaw("e1")
    read_before = gates.frozen.part_cache.misses
    with log.open("ab") as handle:
        handle.write(b"".join(lines[-4:]))
    pipeline.redis.delete(pipeline.names.cooldown(JOB))
    _admit(pipeline, "e2")
    pipeline.capture("e2", "e2", claim="t2")
    new = _part_keys(pipeline) - first
    assert 0 < len(new) < len(first) // 2
    thawed = gates.frozen.thaw("e2")
    assert gates.frozen.part_cache.misses - read_before == len(new)
    full = collect_evidence(pipeline.settings.bundle_root / JOB, now=NOW)
    assert thawed.logs is not None and full.logs is not None
    assert_same(thawed.logs, full.logs)


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_damaged_part_is_lost_evidence_answered_error(pipeline: Pipeline, damage: str) -> None:
    """A part the frozen evidence references that is gone or altered (in S3 and on the worker's
    disk) never thaws into a shorter table: the gate raises EvidenceLostError naming the part,
    and the diagnosis is answered ERROR."""
    _admit(pipeline)
    pipeline.capture("e1", "e1", claim="t1")
    shutil.rmtree(pipeline.settings.cache_dir / "parts")  # type: ignore[operator]
    key = sorted(_part_keys(pipeline))[0]
    if damage == "missing":
        del _objects(pipeline)[key]
    else:
        _objects(pipeline)[key] = _objects(pipeline)[key][:-20] + b"\0" * 20
    with pytest.raises(EvidenceLostError, match="part"):
        pipeline.gate("e1", "liveness")
    entry = pipeline.publisher.fail("e1", JOB, "the frozen evidence of e1 cannot be read")
    assert entry is not None and entry.verdict.value == "ERROR"


def test_a_damaged_disk_copy_of_a_part_is_read_from_s3(pipeline: Pipeline) -> None:
    """A part whose copy on the worker's disk was altered is read from S3 instead."""
    _admit(pipeline)
    pipeline.capture("e1", "e1", claim="t1")
    for path in (pipeline.settings.cache_dir / "parts").iterdir():  # type: ignore[operator]
        path.write_bytes(b"damaged")
    assert pipeline.gate("e1", "liveness")["result"]["status"] != "ERROR"


def test_a_lead_whose_part_is_gone_is_captured_again(pipeline: Pipeline) -> None:
    """The diagnosis sent again after a part went missing captures afresh (as for a freeze gone
    whole), and its gates then judge it; a replay of it says the evidence is gone."""
    _admit(pipeline)
    pipeline.capture("e1", "e1", claim="t1")
    key = sorted(_part_keys(pipeline))[0]
    del _objects(pipeline)[key]
    shutil.rmtree(pipeline.settings.cache_dir / "parts")  # type: ignore[operator]
    with pytest.raises(EvidenceLostError, match="replay --fresh"):
        pipeline.capture("e2", "e1", claim="t2")
    pipeline.capture("e1", "e1", claim="t3")
    assert key in _objects(pipeline)
    assert pipeline.gate("e1", "liveness")["name"] == "liveness"


def test_a_published_verdict_is_counted_and_logged_once(
    pipeline: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    """Publishing a verdict counts it (kind, confidence, latency from its alert) and logs one
    `verdict event=... job=...` line; the same entry published again (a task run twice) counts
    and logs nothing more."""
    from tests.unit.test_metrics import Delta

    _admit(pipeline)
    entry = _diagnose(pipeline)
    kind = {"verdict": entry.verdict.value, "confidence": entry.confidence.value}
    counted = Delta("rlhealth_verdicts_total", **kind)
    latency = Delta("rlhealth_alert_to_verdict_seconds_count", verdict=entry.verdict.value)
    with caplog.at_level("INFO", logger="worker.pipeline.publish"):
        pipeline.publisher.publish(entry.model_dump(mode="json"), JOB)
        pipeline.publisher.publish(entry.model_dump(mode="json"), JOB)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("verdict ")]
    assert (counted.change, latency.change, len(lines)) == (1, 1, 1)
    assert lines[0].startswith(
        f"verdict event=e1 job={entry.job_id} verdict={entry.verdict.value} "
        f"confidence={entry.confidence.value} duration="
    )
    assert f"report={entry.report_uri}" in lines[0]


def test_a_failed_diagnosis_answered_error_is_counted_as_an_error_verdict(
    pipeline: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    """`fail` answers the lead ERROR: one ERROR verdict counted and logged, with its latency."""
    from tests.unit.test_metrics import Delta

    _admit(pipeline)
    errors = Delta("rlhealth_verdicts_total", verdict="ERROR", confidence="low")
    latency = Delta("rlhealth_alert_to_verdict_seconds_count", verdict="ERROR")
    with caplog.at_level("INFO", logger="worker.pipeline.publish"):
        assert pipeline.publisher.fail("e1", JOB, "capture ran past its time limit") is not None
        assert pipeline.publisher.fail("e1", JOB, "again") is None
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("verdict ")]
    assert (errors.change, latency.change, len(lines)) == (1, 1, 1)
    assert "verdict=ERROR confidence=low" in lines[0]
