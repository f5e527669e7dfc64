"""What the cluster deployment watches (deploy/k8s, deploy/prometheus): verdicts answered by
cluster with their alert → verdict latency, the queue depths ingest reads from Redis at scrape
time, bounded series at zero from a process's start, and the health endpoint of each loop."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from shared.models import Confidence, Event, Verdict, VerdictEntry
from shared.settings import Settings
from shared.streams import INGEST_GROUP, StreamNames
from testkit.services import free_port
from worker.pipeline import metrics
from worker.pipeline.depth import QueueDepth
from worker.pipeline.health import LIVENESS, Liveness, serve_health
from worker.pipeline.ingest import Ingest
from worker.pipeline.report_keys import cluster_of
from worker.pipeline.steps import Pipeline
from worker.pipeline.store import MemoryStore

JOB = "jobs/cw-rno2a/ops/rl-job"
ALERTED = datetime(2026, 7, 30, 21, 0, tzinfo=UTC)


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    (tmp_path / JOB).mkdir(parents=True)
    settings = Settings(bundle_root=tmp_path, stream_prefix="f", coalesce_s=60)
    return Pipeline(settings, MemoryStore(), fakeredis.FakeRedis())


def _entry(lead: str, verdict: Verdict = Verdict.KILL, cluster: str = "cw-rno2a") -> VerdictEntry:
    return VerdictEntry(
        event_id=lead,
        event_ids=(lead,),
        job_id="/ops/rl-job",
        verdict=verdict,
        confidence=Confidence.HIGH,
        report_uri=f"s3://b/ci/reports/{cluster}/ops/rl-job/2026-07-30T21:05:00Z-{lead}.json",
        captured_at=ALERTED + timedelta(minutes=5),
    )


def _lead(pipeline: Pipeline, lead: str, published_at: datetime = ALERTED) -> None:
    event = Event(event_id=lead, job_dir=JOB, published_at=published_at)
    admission = pipeline.coalescer.admit(lead, JOB, event_json=event.model_dump_json())
    assert admission.outcome == "started"


# --- verdicts by cluster, alert -> verdict ------------------------------------------------------


def test_a_verdict_counts_once_by_cluster(pipeline: Pipeline) -> None:
    """The first announcement of a lead's verdict counts one verdict for the report's cluster;
    announcing it again counts nothing. (Its latency from the alert is the publishing pipeline's:
    tests/integration/test_observability.py.)"""
    _lead(pipeline, "e1", published_at=datetime.now(UTC) - timedelta(seconds=42))
    kills = _value("rlhealth_verdicts_published_total", verdict="KILL", cluster="cw-rno2a")
    assert pipeline.coalescer.publish(_entry("e1"), JOB)
    assert not pipeline.coalescer.publish(_entry("e1"), JOB)
    assert _value("rlhealth_verdicts_published_total", verdict="KILL", cluster="cw-rno2a") == (
        kills + 1
    )


def test_an_error_answer_of_a_failed_diagnosis_counts_as_a_verdict(pipeline: Pipeline) -> None:
    """A diagnosis answered ERROR through `Pipeline.fail` counts as an ERROR verdict: a silent
    pipeline and a failing one must not look the same to the alert rules."""
    _lead(pipeline, "e2")
    before = {
        s.labels["cluster"]: s.value
        for family in REGISTRY.collect()
        if family.name == "rlhealth_verdicts_published"
        for s in family.samples
        if s.name.endswith("_total") and s.labels["verdict"] == "ERROR"
    }
    entry = pipeline.publisher.fail("e2", JOB, "capture past its time limit")
    assert entry is not None and entry.verdict is Verdict.ERROR
    cluster = cluster_of(entry.report_uri) or ""
    after = _value("rlhealth_verdicts_published_total", verdict="ERROR", cluster=cluster)
    assert after == before.get(cluster, 0) + 1


def test_a_lead_without_its_event_counts_the_verdict_without_a_latency(
    pipeline: Pipeline,
) -> None:
    """No event kept for the lead: the verdict is counted, no latency is made up."""
    pipeline.coalescer.admit("e3", JOB)  # no event_json
    count = _value("rlhealth_alert_to_verdict_seconds_count")
    kills = _value("rlhealth_verdicts_published_total", verdict="KILL", cluster="cw-rno2a")
    assert pipeline.coalescer.publish(_entry("e3"), JOB)
    assert _value("rlhealth_alert_to_verdict_seconds_count") == count
    assert _value("rlhealth_verdicts_published_total", verdict="KILL", cluster="cw-rno2a") == (
        kills + 1
    )


@pytest.mark.parametrize(
    ("uri", "cluster"),
    [
        ("s3://b/reports/cw-rno2a/ops/job/2026-07-30T21:05:00Z-e1.json", "cw-rno2a"),
        ("s3://b/prefix/reports/cw-x/u/j/f.json", "cw-x"),
        ("s3://b/reports/u/j/f.json", None),  # one segment short of a report key
        ("s3://b/other/cw-x/u/j/f.json", None),
    ],
)
def test_the_cluster_is_read_from_the_report_key(uri: str, cluster: str | None) -> None:
    """`reports/<cluster>/<user>/<job>/<file>` gives its cluster; any other shape gives None."""
    assert cluster_of(uri) == cluster


def test_cluster_labels_are_bounded_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process keeps its first 32 cluster names as labels: the 32nd keeps its name, the 33rd
    is counted as `other`, so a watcher naming clusters cannot grow the series without end."""
    monkeypatch.setattr(metrics, "_clusters", set())
    names = [metrics._cluster_label(f"c{i}") for i in range(33)]
    assert names[31] == "c31"
    assert names[32] == "other"
    assert metrics._cluster_label("c0") == "c0"  # a name already kept stays itself


# --- series at zero from the start --------------------------------------------------------------


def test_bounded_series_exist_at_zero_from_a_process_start() -> None:
    """After `initialise_worker` and `initialise_ingest` the bounded series are exported (zero
    until counted), so the first event shows in `increase()`."""
    metrics.initialise_worker()
    metrics.initialise_ingest()
    for name, labels in (
        ("rlhealth_task_failures_total", {"task": "second_look"}),
        ("rlhealth_probes_failed_total", {"backend": "slurm"}),
        ("rlhealth_alerts_total", {"outcome": "duplicate"}),
        ("rlhealth_dead_letters_total", {"reason": "other"}),
        ("rlhealth_dead_letters_total", {"reason": "id_archived_already"}),
    ):
        assert REGISTRY.get_sample_value(name, labels) is not None, (name, labels)


# --- queue depth ----------------------------------------------------------------------------------


def _depth(client: Any, names: StreamNames) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(QueueDepth(client, names))
    return {sample.name: sample.value for family in registry.collect() for sample in family.samples}


def test_queue_depths_are_read_from_redis_at_scrape_time() -> None:
    """Three alerts, one read and not acked; two tasks queued; one lease; one dead letter: the
    gauges say so."""
    client, names = fakeredis.FakeRedis(), StreamNames("q")
    for i in range(3):
        client.xadd(names.alerts, {"event": str(i)})
    client.xgroup_create(names.alerts, INGEST_GROUP, id="0")
    client.xreadgroup(INGEST_GROUP, "c1", {names.alerts: ">"}, count=1)
    client.lpush(names.task_queue, "t1", "t2")
    client.zadd(names.leases, {"lead": 1})
    client.xadd(names.dead_letter, {"reason": "x"})
    assert _depth(client, names) == {
        "rlhealth_alerts_pending": 1,
        "rlhealth_alerts_lag": 2,
        "rlhealth_task_queue_length": 2,
        "rlhealth_diagnoses_in_flight": 1,
        "rlhealth_dead_letter_entries": 1,
    }


def test_queue_depths_without_an_ingest_group_leave_the_alert_gauges_out() -> None:
    """Before ingest made its group there is no pending or lag to tell: those gauges are absent,
    the others are read."""
    client, names = fakeredis.FakeRedis(), StreamNames("q")
    assert set(_depth(client, names)) == {
        "rlhealth_task_queue_length",
        "rlhealth_diagnoses_in_flight",
        "rlhealth_dead_letter_entries",
    }


def test_a_scrape_with_redis_away_answers_without_the_gauges() -> None:
    """Redis unreachable: the collector yields nothing and the scrape still answers."""

    class Away:
        def pipeline(self, transaction: bool = False) -> Any:
            raise ConnectionError("Connection refused")

    assert _depth(Away(), StreamNames("q")) == {}


# --- health ----------------------------------------------------------------------------------


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def health() -> Iterator[tuple[Liveness, str]]:
    liveness = Liveness(stale_after_s=10)
    port = free_port()
    server = serve_health(port, liveness=liveness)
    yield liveness, f"http://127.0.0.1:{port}"
    server.shutdown()
    server.server_close()


def test_healthz_is_200_just_inside_the_stale_limit_and_503_just_past_it(
    health: tuple[Liveness, str],
) -> None:
    """A beat 9.5 s ago with a 10 s limit is alive; 10.5 s ago is not."""
    liveness, url = health
    liveness._last = time.monotonic() - 9.5
    assert _status(f"{url}/healthz") == 200
    liveness._last = time.monotonic() - 10.5
    assert _status(f"{url}/healthz") == 503


def test_a_stale_loop_waiting_for_redis_is_alive_but_not_ready(
    health: tuple[Liveness, str],
) -> None:
    """Stale with Redis away: alive (a restart cures nothing) and not ready; the same stale loop
    with Redis answering is dead."""
    liveness, url = health
    liveness.begun()
    liveness._last = time.monotonic() - 10.5
    liveness.excuse = lambda: "Redis does not answer (ConnectionError)"
    assert (_status(f"{url}/healthz"), _status(f"{url}/readyz")) == (200, 503)
    liveness.excuse = lambda: None
    assert (_status(f"{url}/healthz"), _status(f"{url}/readyz")) == (503, 503)


@pytest.mark.slow
def test_redis_away_excuses_only_while_redis_does_not_answer() -> None:
    """The excuse names Redis when nothing listens at its address, and is None when it answers."""
    import redis

    from worker.pipeline.health import redis_away

    closed = redis.Redis(port=free_port(), socket_timeout=1, socket_connect_timeout=1)
    assert "Redis does not answer" in (redis_away(closed)() or "")
    assert redis_away(fakeredis.FakeRedis())() is None


def test_readyz_waits_for_the_loop_to_begin(health: tuple[Liveness, str]) -> None:
    """Alive but not begun is not ready; begun is; an unknown path is 404."""
    liveness, url = health
    assert (_status(f"{url}/healthz"), _status(f"{url}/readyz")) == (200, 503)
    liveness.begun()
    assert _status(f"{url}/readyz") == 200
    assert _status(f"{url}/metrics") == 404


def test_the_ingest_loop_beats_and_begins(pipeline: Pipeline) -> None:
    """One turn of ingest's loop (its group made) marks the process begun and beats."""
    LIVENESS._ready, LIVENESS._last = False, time.monotonic() - 1000
    Ingest(pipeline, lambda *_: None, block_ms=1).run(until_idle=True)
    assert LIVENESS.state() == ("ok", True, True)


def test_the_worker_heartbeat_beats_even_holding_no_task() -> None:
    """The worker's lease heartbeat beats for /healthz on every tick, tasks held or not."""
    from worker.pipeline.heartbeat import LeaseHeartbeat

    LIVENESS._last = time.monotonic() - 1000
    LeaseHeartbeat.beat(object.__new__(LeaseHeartbeat))
    assert LIVENESS.age_s() < 60


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("diagnosis failed: capture past its time limit", "diagnosis_failed"),
        ("a diagnosis failed elsewhere", "other"),  # only the worker's own prefix
    ],
)
def test_a_failed_diagnosis_has_its_own_dead_letter_reason(reason: str, kind: str) -> None:
    """The worker's dead letters (`diagnosis failed: ...`) are told from a watcher's bad events."""
    assert metrics.dead_letter_kind(reason) == kind
