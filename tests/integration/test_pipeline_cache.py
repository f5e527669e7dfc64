"""Re-diagnosis reads only what is new, on the real services: two prefork Celery workers, Redis and
the moto S3 server. A repeated alert for a job whose finelog grew parses only the appended bytes
(the worker's Prometheus endpoint says how many), from the worker's disk or, on a cold disk, from
the job's manifest and parts in S3 (a grown log's capture writes only its new parts), and the
frozen evidence says the same as a full read."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from shared.alerts import publish_alert
from shared.models import VerdictEntry
from testkit.bundles import write_job_bundle
from tests.integration.conftest import Services
from tests.integration.test_observability import Samples, _delta, _scrape
from tests.integration.test_pipeline import NOW, _judgement, _key, _verdicts_for
from tests.unit.test_frozen import assert_same
from worker.diagnosis import collect_evidence, judge
from worker.evidence.frozen import PART_ROWS
from worker.pipeline.logcache import PREFIX, job_id
from worker.pipeline.parts import PARTS_PREFIX
from worker.pipeline.steps import Pipeline

pytestmark = pytest.mark.integration

TAIL_SLACK = 64 * 1024  # the open tail after the last committed line is read again
_SUMMARY_FIELDS = ("lines", "bytes", "records", "malformed", "first_timestamp", "last_timestamp")


def _log_bytes(megabytes: float = 2.0) -> bytes:
    from testkit.gen_finelog import generate

    with tempfile.TemporaryDirectory() as tmp:
        return generate(Path(tmp) / "f.log", megabytes).read_bytes()


def _bytes(before: Samples, after: Samples, kind: str) -> float:
    return _delta(before, after, "rlhealth_log_cache_bytes_total", kind=kind)


def _diagnose(services: Services, job: str) -> tuple[str, Samples]:
    """One alert answered (the job's cooldowns lifted first, as if they had run out: the one of
    its live alerts and those of alerts asking their own question, `now` here); the worker's
    metrics after it."""
    for key in services.redis.scan_iter(match=services.names.cooldown(job) + "*"):
        services.redis.delete(key)
    event_id = publish_alert(services.redis, job, now=NOW)
    _verdicts_for(services, {event_id})
    return event_id, _scrape(services.metrics["worker"])


def _frozen_summary(services: Services, event_id: str) -> dict[str, Any]:
    document = json.loads(services.store.get(f"evidence/{event_id}/evidence.json"))
    summary = document["logs"]["summary"]
    return {name: summary[name] for name in _SUMMARY_FIELDS}


def _full_read_summary(job_dir: Path) -> dict[str, Any]:
    logs = collect_evidence(job_dir, now=NOW).logs
    assert logs is not None
    summary = logs.summary.to_json()
    return {name: summary[name] for name in _SUMMARY_FIELDS}


def test_a_repeated_alert_for_a_grown_log_parses_only_the_new_bytes(
    pipeline_services: Services,
) -> None:
    """Alert 1 parses the whole finelog and writes the job's archive to S3; the log grows; alert 2
    (another diagnosis, either worker process) parses only the appended bytes; the worker's disk is
    wiped and the log grows again; alert 3 resumes from the archive in S3. Every alert is answered
    and each frozen evidence equals a full read of the log as it was."""
    services = pipeline_services
    job_dir = write_job_bundle(services.bundle_root, "grown-log")
    job = job_dir.relative_to(services.bundle_root).as_posix()
    data = _log_bytes()
    first_part, second_part = len(data) // 2, len(data) * 3 // 4
    (job_dir / "finelog.log").write_bytes(data[:first_part])
    before = _scrape(services.metrics["worker"])

    first, after_first = _diagnose(services, job)
    assert _bytes(before, after_first, "parsed") == first_part
    assert _bytes(before, after_first, "reused") == 0
    assert _frozen_summary(services, first) == _full_read_summary(job_dir)
    parts_prefix = f"{PREFIX}{job_id(job)}/parts/"
    first_parts = set(services.store.keys(parts_prefix))
    assert first_parts, "no part of the job's log cache in S3"

    with (job_dir / "finelog.log").open("ab") as handle:
        handle.write(data[first_part:second_part])
    second, after_second = _diagnose(services, job)
    added = set(services.store.keys(parts_prefix)) - first_parts
    assert 0 < len(added) < len(first_parts), "the grown log's capture wrote every part again"
    reused = _bytes(after_first, after_second, "reused")
    parsed = _bytes(after_first, after_second, "parsed")
    assert first_part - TAIL_SLACK < reused <= first_part
    assert reused + parsed == second_part
    assert _delta(after_first, after_second, "rlhealth_log_cache_files_total", how="resumed") == 1
    assert _frozen_summary(services, second) == _full_read_summary(job_dir)

    shutil.rmtree(Path(services.env["RLHEALTH_CACHE_DIR"]) / "logs")  # a cold disk
    with (job_dir / "finelog.log").open("ab") as handle:
        handle.write(data[second_part:])
    third, after_third = _diagnose(services, job)
    shared = _delta(
        after_second, after_third, "rlhealth_log_cache_shared_total", outcome="downloaded"
    )
    assert shared == 1
    reused = _bytes(after_second, after_third, "reused")
    assert second_part - TAIL_SLACK < reused <= second_part
    assert reused + _bytes(after_second, after_third, "parsed") == len(data)
    assert _frozen_summary(services, third) == _full_read_summary(job_dir)


def _parts(services: Services, job: str) -> dict[str, int]:
    """The job's table parts in S3, with their sizes."""
    prefix = f"{PARTS_PREFIX}{job_id(job)}/"
    return {key: services.store.size(key) for key in services.store.keys(prefix)}


def _offline(services: Services, evidence_id: str, cache: Path) -> Pipeline:
    """A pipeline on another machine: its own empty disk, S3 alone (no worker's part cache)."""
    settings = services.settings.model_copy(update={"cache_dir": cache})
    pipeline = Pipeline(settings, services.store, services.redis)
    pipeline.frozen.thaw(evidence_id)
    return pipeline


def test_a_grown_logs_diagnosis_uploads_only_new_parts_and_replays_from_s3(
    pipeline_services: Services, tmp_path: Path
) -> None:
    """A finelog with tables longer than one part (PART_ROWS): the diagnosis after it grew
    uploads only the parts past its unchanged rows (fewer bytes than the parts it re-uses); its
    frozen evidence, thawed from S3 alone on an empty disk, equals a full read of the log and
    is judged the same as the published verdict; `rl-health replay` answers the same."""
    services = pipeline_services
    job_dir = write_job_bundle(services.bundle_root, "grown-parts")
    job = job_dir.relative_to(services.bundle_root).as_posix()
    data = _log_bytes(60.0)
    cut = data.index(b"\n", len(data) * 98 // 100) + 1
    (job_dir / "finelog.log").write_bytes(data[:cut])
    first, _ = _diagnose(services, job)
    before = _parts(services, job)
    document = json.loads(services.store.get(f"evidence/{first}/evidence.json"))
    metrics = document["logs"]["tables"]["metrics"]
    assert len(metrics) >= 2 and metrics[0][2] == PART_ROWS  # a full part, then the rest

    with (job_dir / "finelog.log").open("ab") as handle:
        handle.write(data[cut:])
    second, _ = _diagnose(services, job)
    after = _parts(services, job)
    new = {key: size for key, size in after.items() if key not in before}
    document = json.loads(services.store.get(f"evidence/{second}/evidence.json"))
    referenced = {ref[0] for refs in document["logs"]["tables"].values() for ref in refs}
    reused = {key: size for key, size in before.items() if key.split("/")[-1][:32] in referenced}
    assert new and reused
    assert sum(new.values()) < sum(reused.values())
    assert {key.split("/")[-1][:32] for key in new} <= referenced

    offline = _offline(services, second, tmp_path / "elsewhere")
    thawed = offline.frozen.thaw(second)
    assert thawed.logs is not None
    full = collect_evidence(job_dir, now=NOW).logs
    assert full is not None
    assert_same(thawed.logs.metrics, full.metrics)
    assert_same(thawed.logs.engines, full.engines)
    (published,) = [e for e in _verdicts_for(services, {second}) if second in e.event_ids]
    again = judge(thawed, event_id=second)
    assert (again.verdict, again.confidence) == (published.verdict, published.confidence)

    result = services.run("replay", second, "--json", "--timeout", "120", timeout=180)
    assert result.returncode == 0, result.stderr
    replay = VerdictEntry.model_validate_json(result.stdout)
    stored = json.loads(services.store.get(_key(services, published.report_uri)))
    replayed = json.loads(services.store.get(_key(services, replay.report_uri)))
    assert _judgement(stored) == _judgement(replayed)
