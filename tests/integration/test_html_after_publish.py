"""The HTML page after publish, on the real services (redis-server, moto, prefork Celery workers,
ingest): the verdict is published first and the page appears under its key afterwards; plots
that break (slowly) neither delay nor change the verdict, and nothing answers it ERROR."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shared.alerts import publish_alert
from shared.models import VerdictEntry
from shared.settings import Settings
from shared.streams import StreamNames
from shared.supervisor import VerdictReader
from testkit.bundles import write_job_bundle
from testkit.services import RL_HEALTH, free_port, spawn, stop, wait_for
from tests.integration.conftest import Services
from tests.integration.test_observability import Samples, _delta, _scrape
from tests.integration.test_pipeline import _key, _verdicts_for
from worker.pipeline.app import make_app

pytestmark = pytest.mark.integration

NOW = datetime(2026, 7, 30, 21, 13, tzinfo=UTC)
BROKEN_PREFIX = "rlhtest-broken-plots"
SLOW_S = 6.0
# Loaded by every process of the broken stack before anything else (PYTHONPATH): the plots
# wait, then raise, wherever they are drawn.
SHIM = f"""
import time
import reports.plots


def _broken(*_args, **_kwargs):
    time.sleep({SLOW_S})
    raise RuntimeError("plots broken on purpose by the test")


reports.plots.render_plots = _broken
"""


def _job(services: Services, name: str) -> str:
    return write_job_bundle(services.bundle_root, name).relative_to(services.bundle_root).as_posix()


def _page_key(services: Services, entry: VerdictEntry) -> str:
    return _key(services, entry.report_uri).removesuffix(".json") + ".html"


def _pages_settled(metrics: str) -> Samples:
    """The worker's metrics once every diagnosis published so far had its page task counted (an
    earlier test's page may still be drawn when this one starts: its count is not this test's)."""
    outcomes = ("drawn", "without_plots", "report_gone")

    def settled() -> bool:
        now = _scrape(metrics)
        pages = sum(_delta({}, now, "rlhealth_html_reports_total", outcome=o) for o in outcomes)
        return pages >= _delta({}, now, "rlhealth_diagnoses_finished_total")

    wait_for(settled, 30, "the pages of the diagnoses before this test")
    return _scrape(metrics)


def test_the_verdict_is_published_then_its_page_appears(pipeline_services: Services) -> None:
    """The verdict comes on the stream; the `html` task (counted as drawn, its stage timed)
    then stores the page with its plots beside the JSON report."""
    services = pipeline_services
    before = _pages_settled(services.metrics["worker"])
    event_id = publish_alert(services.redis, _job(services, "html-after"), now=NOW)
    (entry,) = _verdicts_for(services, {event_id})
    page = _page_key(services, entry)
    wait_for(lambda: services.store.exists(page), 60, "the HTML page")
    body = services.store.get(page).decode()
    assert f"<h1>{entry.verdict.value}</h1>" in body and 'src="data:image/png;base64,' in body

    def counted() -> bool:
        now = _scrape(services.metrics["worker"])
        return _delta(before, now, "rlhealth_html_reports_total", outcome="drawn") == 1

    wait_for(counted, 30, "the worker's count of HTML pages drawn")
    after = _scrape(services.metrics["worker"])
    assert _delta(before, after, "rlhealth_stage_seconds_count", stage="html") == 1


@dataclass
class Broken:
    settings: Settings
    metrics: str
    logs: Path


@pytest.fixture
def broken(pipeline_services: Services, tmp_path: Path) -> Iterator[Broken]:
    """A worker and an ingest of their own (another stream prefix: another queue), whose plots
    sleep SLOW_S and raise."""
    services = pipeline_services
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM, encoding="utf-8")
    path = os.pathsep.join(p for p in (str(shim), services.env.get("PYTHONPATH", "")) if p)
    env = {**services.env, "RLHEALTH_STREAM_PREFIX": BROKEN_PREFIX, "PYTHONPATH": path}
    settings = services.settings.model_copy(update={"stream_prefix": BROKEN_PREFIX})
    port = free_port()
    worker_argv = [RL_HEALTH, "worker", "--concurrency", "1", "--hostname", "broken-plots@%h"]
    worker_argv += ["--metrics-port", str(port), "--metrics-dir", str(tmp_path / "metrics")]
    worker = spawn(worker_argv, env, tmp_path / "worker.log")
    ingest = spawn([RL_HEALTH, "ingest"], env, tmp_path / "ingest.log")
    app = make_app(settings)
    try:

        def answers() -> bool:
            replies = app.control.ping(timeout=0.5)
            return any(name.startswith("broken-plots@") for r in replies for name in r)

        wait_for(answers, 60, "the broken worker")
        yield Broken(settings, f"http://127.0.0.1:{port}/metrics", tmp_path)
    finally:
        for process in (ingest, worker):
            stop(process, timeout=20)
        for key in services.redis.scan_iter(match=f"{BROKEN_PREFIX}*", count=1000):
            services.redis.delete(key)


def test_broken_plots_neither_delay_nor_change_the_verdict(
    pipeline_services: Services, broken: Broken
) -> None:
    """With plots that take SLOW_S and raise, the verdict is on the stream before the page
    exists, it is the verdict the healthy stack gives the same bundle, nothing is dead-lettered,
    and the page lands afterwards without plots (counted)."""
    services = pipeline_services
    healthy_id = publish_alert(services.redis, _job(services, "plots-healthy"), now=NOW)
    (healthy,) = _verdicts_for(services, {healthy_id})
    before = _scrape(broken.metrics)
    event_id = publish_alert(
        services.redis, _job(services, "plots-broken"), now=NOW, settings=broken.settings
    )
    reader = VerdictReader(services.redis, broken.settings)
    reader.last_id = "0-0"
    entry = next((e for e in reader.follow(timeout_s=90) if event_id in e.event_ids), None)
    assert entry is not None, (broken.logs / "worker.log").read_text()[-3000:]
    page = _page_key(services, entry)
    assert not services.store.exists(page)  # the verdict did not wait for the plots
    assert (entry.verdict, entry.confidence) == (healthy.verdict, healthy.confidence)
    wait_for(lambda: services.store.exists(page), 60, "the page without plots")
    body = services.store.get(page).decode()
    assert f"<h1>{entry.verdict.value}</h1>" in body and "data:image/png" not in body

    def counted() -> bool:
        now = _scrape(broken.metrics)
        return _delta(before, now, "rlhealth_html_reports_total", outcome="without_plots") == 1

    wait_for(counted, 30, "the count of pages stored without plots")
    names = StreamNames(BROKEN_PREFIX)
    assert services.redis.xlen(names.dead_letter) == 0
    assert [e.event_id for e in VerdictReader(services.redis, broken.settings).recent(10)] == [
        event_id
    ]
