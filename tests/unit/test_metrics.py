"""Fleet metrics: Celery signals count stages, diagnoses and verdicts; ingest counts alerts,
coalescing and dead letters by a bounded reason."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fakeredis
import pytest
from celery import signals
from prometheus_client import REGISTRY, generate_latest

from shared.alerts import publish_alert
from shared.settings import Settings
from shared.streams import ALERT_FIELD
from worker.pipeline import metrics
from worker.pipeline.ingest import Ingest
from worker.pipeline.steps import Pipeline
from worker.pipeline.store import MemoryStore

JOB = "jobs/cw/ops/rl-job"


@pytest.fixture(autouse=True)
def _counting() -> None:
    """The task signals counted, as the Celery app's factory connects them."""
    metrics.connect_signals()


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Delta:
    """Sample values of one metric before and after a block."""

    def __init__(self, name: str, **labels: str) -> None:
        self.name, self.labels = name, labels
        self.before = _value(name, **labels)

    @property
    def change(self) -> float:
        return _value(self.name, **self.labels) - self.before


class FakeTask:
    """What the signal handlers read of a Celery task: its name and its request's retries."""

    def __init__(self, name: str, retries: int = 0) -> None:
        self.name = name
        self.request = SimpleNamespace(retries=retries)


def _run(
    name: str,
    args: tuple[Any, ...],
    retval: Any = None,
    *,
    retries: int = 0,
    state: str = "SUCCESS",
    task_id: str = "t-1",
) -> None:
    """Send the prerun and postrun signals Celery sends around one task run."""
    task = FakeTask(name, retries)
    signals.task_prerun.send(sender=task, task_id=task_id, task=task, args=args, kwargs={})
    signals.task_postrun.send(
        sender=task, task_id=task_id, task=task, args=args, kwargs={}, retval=retval, state=state
    )


def test_the_test_process_keeps_metrics_in_memory() -> None:
    """No multiprocess directory here, so REGISTRY holds this process's own values."""
    assert metrics.MULTIPROC_ENV not in os.environ


def test_a_publish_task_times_its_stage_and_leaves_the_verdict_to_the_pipeline() -> None:
    """The publish task's run is timed as stage `publish`; the verdict itself is counted by the
    pipeline step that announced it (`test_pipeline_steps`), so a task signal counts none."""
    kills = Delta("rlhealth_verdicts_total", verdict="KILL", confidence="high")
    seconds = Delta("rlhealth_stage_seconds_count", stage="publish")
    _run("rlhealth.publish", ({},), {"verdict": "KILL", "confidence": "high"})
    assert (kills.change, seconds.change) == (0, 1)


def test_verdict_published_counts_the_kind_and_the_latency_from_the_alert() -> None:
    """One verdict published 42 s after its alert: one finished diagnosis, one verdict of its
    kind and confidence, one latency observation of 42 s under its kind."""
    finished = Delta("rlhealth_diagnoses_finished_total")
    kills = Delta("rlhealth_verdicts_total", verdict="KILL", confidence="high")
    count = Delta("rlhealth_alert_to_verdict_seconds_count", verdict="KILL")
    total = Delta("rlhealth_alert_to_verdict_seconds_sum", verdict="KILL")
    metrics.verdict_published("KILL", "high", 42.0)
    assert (finished.change, kills.change, count.change, total.change) == (1, 1, 1, 42.0)


def test_a_latency_from_a_clock_ahead_is_not_observed() -> None:
    """A verdict 'before' its alert (the watcher's clock ahead) is counted, its latency not:
    -0.5 s is left out, 0 s is kept."""
    count = Delta("rlhealth_alert_to_verdict_seconds_count", verdict="ERROR")
    metrics.verdict_published("ERROR", "low", -0.5)
    assert count.change == 0
    metrics.verdict_published("ERROR", "low", 0.0)
    assert count.change == 1


def _served(role: metrics.Role) -> set[str]:
    text = generate_latest(metrics.registry_for(role)).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def test_each_process_serves_only_what_it_counts() -> None:
    """Ingest's endpoint has no worker counter (diagnoses started, stages) and the worker's no
    ingest counter (alerts), though both live in this one process's registry."""
    metrics.alert_handled("started")
    metrics.verdict_published("NO-KILL", "high", 1.0)
    ingest, worker = _served("ingest"), _served("worker")
    assert "rlhealth_alerts_total" in ingest and "rlhealth_alerts_total" not in worker
    assert "rlhealth_verdicts_total" in worker and "rlhealth_verdicts_total" not in ingest
    assert "rlhealth_diagnoses_started_total" in worker
    assert not {n for n in ingest if n.startswith("rlhealth_diagnoses")}
    assert "rlhealth_watchdog_actions_total" in ingest
    assert "rlhealth_alert_to_verdict_seconds_count" in worker


def test_gates_are_timed_under_their_own_names() -> None:
    """`rlhealth.gate(evidence_id, "liveness")` is observed as stage `liveness`."""
    liveness = Delta("rlhealth_stage_seconds_count", stage="liveness")
    _run("rlhealth.gate", ("e1", "liveness"), {"name": "liveness", "result": {}})
    assert liveness.change == 1
    assert metrics.stage_of("rlhealth.gate", (), {"evidence_id": "e", "name": "dynamics"}) == (
        "dynamics"
    )
    assert metrics.stage_of("rlhealth.verdict", ([], "e", "e"), {}) == "verdict"
    assert metrics.stage_of("celery.chord_unlock", (), {}) is None


def test_only_the_first_try_of_a_capture_starts_a_diagnosis() -> None:
    """A capture retried (busy or after a fault) does not count a second diagnosis."""
    started = Delta("rlhealth_diagnoses_started_total")
    _run("rlhealth.capture", ("e1", "e1"), "e1", retries=0, task_id="c-1")
    _run("rlhealth.capture", ("e1", "e1"), "e1", retries=1, task_id="c-2")
    assert started.change == 1


def test_retries_and_failures_are_counted_per_task() -> None:
    """task_retry and task_failure signals count under the task's short name."""
    retries = Delta("rlhealth_task_retries_total", task="capture")
    failures = Delta("rlhealth_task_failures_total", task="verdict")
    signals.task_retry.send(sender=FakeTask("rlhealth.capture"), request=None)
    signals.task_failure.send(sender=FakeTask("rlhealth.verdict"), task_id="x")
    signals.task_failure.send(sender=FakeTask("celery.chord_unlock"), task_id="y")
    assert (retries.change, failures.change) == (1, 1)


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("malformed JSON: Expecting value: line 1 column 1 (char 0)", "malformed_json"),
        ("no 'event' field in the alert entry", "no_event_field"),
        ("the event is a JSON list, not an object", "not_an_object"),
        ("job_dir '../../etc' escapes the bundle root", "outside_bundle_root"),
        ("job_dir 'jobs/x' does not exist under the bundle root", "missing_directory"),
        ("invalid event: colour: Extra inputs are not permitted", "invalid_event"),
        ("ingest failed: ValueError: boom", "ingest_failed"),
        ("something new", "other"),
    ],
)
def test_dead_letter_reasons_map_to_a_bounded_label(reason: str, kind: str) -> None:
    """Each reason ingest writes has its own label; anything else is `other`, never free text."""
    assert metrics.dead_letter_kind(reason) == kind


@pytest.fixture
def ingest(tmp_path: Path) -> Iterator[tuple[Ingest, Any]]:
    (tmp_path / JOB).mkdir(parents=True)
    settings = Settings(bundle_root=tmp_path, stream_prefix="m", coalesce_s=60)
    client = fakeredis.FakeRedis()
    consumer = Ingest(Pipeline(settings, MemoryStore(), client), lambda *_: None, block_ms=1)
    consumer.ensure_group()
    yield consumer, client


def test_ingest_counts_outcomes_coalescing_and_dead_letters(ingest: tuple[Ingest, Any]) -> None:
    """Three alerts for one job: one started, two coalesced; a malformed one is dead-lettered."""
    consumer, client = ingest
    started = Delta("rlhealth_alerts_total", outcome="started")
    coalesced = Delta("rlhealth_alerts_coalesced_total")
    dead = Delta("rlhealth_dead_letters_total", reason="malformed_json")
    for _ in range(3):
        publish_alert(client, JOB, settings=consumer.pipeline.settings)
    client.xadd(consumer.names.alerts, {ALERT_FIELD: "{oops"})
    consumer.run(until_idle=True)
    assert (started.change, coalesced.change, dead.change) == (1, 2, 1)
    refused = [json.loads(f[b"raw"]) for _i, f in client.xrange(consumer.names.dead_letter)]
    assert refused == [{ALERT_FIELD: "{oops"}]


def test_probes_ran_counts_commands_and_failures_per_backend() -> None:
    """Five probes, one exiting 1 and one timed out: five run, two failed, under the backend."""
    run = Delta("rlhealth_probes_run_total", backend="iris")
    failed = Delta("rlhealth_probes_failed_total", backend="iris")
    metrics.probes_ran("iris", [0, 0, 1, None, 0])
    assert (run.change, failed.change) == (5, 2)


def test_serve_refuses_a_multiprocess_directory_set_too_late(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Setting PROMETHEUS_MULTIPROC_DIR after prometheus-client loaded would lose the children's
    counts, so serving refuses instead of showing zeros."""
    monkeypatch.setenv(metrics.MULTIPROC_ENV, str(tmp_path))
    with pytest.raises(RuntimeError, match="set after prometheus-client was imported"):
        metrics.serve(0)
