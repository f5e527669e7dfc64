"""What on-call people look at, on the real services: the HTML report stored beside the JSON, the
Prometheus endpoints of the prefork worker and of ingest counting this test's alerts, the board
served by `rl-health board` and opened in headless Chromium, and the live table of verdicts."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.alerts import publish_alert
from shared.streams import ALERT_FIELD
from testkit.bundles import write_job_bundle
from testkit.services import RL_HEALTH, free_port, spawn, stop, wait_for
from tests.browser.harness import assert_rendered, render
from tests.integration.conftest import Services
from tests.integration.test_pipeline import _key, _verdicts_for
from tests.unit.test_terminal import _plain, _run

pytestmark = pytest.mark.integration

NOW = datetime(2026, 7, 30, 21, 13, tzinfo=UTC)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def _job(services: Services, name: str) -> str:
    return write_job_bundle(services.bundle_root, name).relative_to(services.bundle_root).as_posix()


def test_metrics_endpoints_count_this_tests_alerts(pipeline_services: Services) -> None:
    """Three alerts for one job, one for another and a malformed one: the worker's endpoint
    (summed over its prefork children) shows two diagnoses started and finished, two verdicts
    and two alert → verdict latencies, each stage (the HTML page after publish included) timed
    twice; ingest's shows two started, two coalesced, one dead letter; neither shows the other's
    counters."""
    services = pipeline_services
    before = {name: _scrape(url) for name, url in services.metrics.items()}
    busy, calm = _job(services, "metrics-busy"), _job(services, "metrics-calm")
    ids = [publish_alert(services.redis, busy, reason=f"#{i}", now=NOW) for i in range(3)]
    ids.append(publish_alert(services.redis, calm, now=NOW))
    services.redis.xadd(services.names.alerts, {ALERT_FIELD: "{not json"})
    entries = _verdicts_for(services, set(ids))
    kinds: dict[str, int] = {}
    for lead in {e.event_id: e for e in entries}.values():
        kinds[lead.verdict.value] = kinds.get(lead.verdict.value, 0) + 1

    def worker_done() -> bool:
        now = _scrape(services.metrics["worker"])
        finished = _delta(before["worker"], now, "rlhealth_diagnoses_finished_total")
        drawn = _delta(before["worker"], now, "rlhealth_stage_seconds_count", stage="html")
        return finished >= 2 and drawn >= 2  # the HTML pages come after the verdicts

    wait_for(worker_done, 30, "the worker's finished count")
    worker = _scrape(services.metrics["worker"])
    ingest = _scrape(services.metrics["ingest"])
    w, i = before["worker"], before["ingest"]
    assert _delta(w, worker, "rlhealth_diagnoses_started_total") == 2
    assert _delta(w, worker, "rlhealth_diagnoses_finished_total") == 2
    for verdict, count in kinds.items():
        assert (
            _delta(
                w,
                worker,
                "rlhealth_verdicts_total",
                verdict=verdict,
                confidence=next(e.confidence.value for e in entries if e.verdict.value == verdict),
            )
            == count
        )
    for stage in (
        "capture",
        "restarts",
        "liveness",
        "dynamics",
        "duty_cycle",
        "verdict",
        "publish",
        "html",
    ):
        assert _delta(w, worker, "rlhealth_stage_seconds_count", stage=stage) == 2, stage
    assert _delta(i, ingest, "rlhealth_alerts_total", outcome="started") == 2
    assert _delta(i, ingest, "rlhealth_alerts_coalesced_total") == 2
    assert _delta(i, ingest, "rlhealth_dead_letters_total", reason="malformed_json") == 1
    latency = sum(
        _delta(w, worker, "rlhealth_alert_to_verdict_seconds_count", verdict=v)
        for v in ("KILL", "NO-KILL", "ERROR")
    )
    assert latency == 2  # one alert → verdict latency per diagnosis, under its verdict
    # each process serves only what it counts: no zeros of the other's counters
    # (ingest's gauge of diagnoses holding a lease is its own: read from Redis at scrape time)
    counted = {"rlhealth_diagnoses_started_total", "rlhealth_diagnoses_finished_total"}
    assert not {name for name, _labels in ingest if name in counted}
    assert not {name for name, _labels in worker if name.startswith("rlhealth_alerts")}


def test_the_html_report_is_stored_beside_the_json(pipeline_services: Services) -> None:
    """The verdict's report key with `.html` holds a self-contained page with its plots (drawn
    after the verdict is published)."""
    services = pipeline_services
    event_id = publish_alert(services.redis, _job(services, "html"), now=NOW)
    (entry,) = _verdicts_for(services, {event_id})
    key = _key(services, entry.report_uri).removesuffix(".json") + ".html"
    wait_for(lambda: services.store.exists(key), 60, "the HTML report")
    page = services.store.get(key).decode()
    assert page.startswith("<!DOCTYPE html>") and f"<h1>{entry.verdict.value}</h1>" in page
    assert 'src="data:image/png;base64,' in page and event_id in page
    assert json.loads(services.store.get(_key(services, entry.report_uri)))["event_id"] == event_id


@pytest.fixture
def board(pipeline_services: Services) -> Iterator[str]:
    """`rl-health board` on a free loopback port, against the session's services."""
    port = free_port()
    process = spawn(
        [RL_HEALTH, "board", "--port", str(port), "--refresh", "30"],
        pipeline_services.env,
        pipeline_services.logs / "board.log",
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: urllib.request.urlopen(f"{url}/healthz", timeout=1).status == 200, 30, "board")
    yield url
    stop(process)


def _status(url: str, method: str) -> int:
    request = urllib.request.Request(url, method=method, data=b"" if method != "GET" else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_board_renders_in_chromium_and_opens_the_html_report(
    pipeline_services: Services, board: str, tmp_path: Path
) -> None:
    """Headless Chromium opens the board (the verdict listed, nothing broken), follows the row's
    report link to the HTML report served through the board (every plot loaded), and the board
    refuses anything but GET."""
    services = pipeline_services
    event_id = publish_alert(services.redis, _job(services, "board"), now=NOW)
    (entry,) = _verdicts_for(services, {event_id})
    page = _key(services, entry.report_uri).removesuffix(".json") + ".html"
    wait_for(lambda: services.store.exists(page), 60, "the HTML report")  # drawn after publish
    seen = render(f"{board}/", tmp_path / "board.png")
    assert_rendered(seen, images=0)
    assert "/ops/board" in seen.text and event_id in seen.text and entry.verdict.value in seen.text

    def open_report(page: object) -> None:
        page.click("text=report")  # type: ignore[attr-defined]

    report = render(f"{board}/", tmp_path / "board-report.png", then=open_report)
    stored = services.store.get(page)
    plots = stored.decode().count('src="data:image/png;base64,')
    assert plots >= 2  # this bundle logs reward and entropy
    assert_rendered(report, images=plots)
    assert report.title.startswith(f"{entry.verdict.value} — /ops/board")
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        assert _status(f"{board}/", method) == 405
    assert _status(f"{board}/", "GET") == 200


def _blocked_in_xread(services: Services) -> bool:
    """A client of the test's Redis waits in a blocking XREAD (only the follower reads so)."""
    clients = services.redis.client_list()
    return any(c.get("cmd") == "xread" and "b" in c.get("flags", "") for c in clients)


def test_verdicts_follow_shows_a_live_table_on_a_terminal(pipeline_services: Services) -> None:
    """`rl-health verdicts --follow` on a terminal draws the table with the new verdict in it."""
    services = pipeline_services
    env = {k: v for k, v in services.env.items() if k.startswith(("RLHEALTH_", "AWS_"))}
    argv = [RL_HEALTH, "verdicts", "--follow", "--count", "1", "--timeout", "90"]
    seen: list[str] = []
    follower = threading.Thread(
        target=lambda: seen.append(_run(argv, tty_out=True, tty_err=False, **env)[2])
    )
    follower.start()
    # the follower anchors at the newest entry, then blocks reading: publish only once it reads
    wait_for(lambda: _blocked_in_xread(services), 60, "the follower's first read")
    publish_alert(services.redis, _job(services, "live"), now=NOW)
    follower.join(120)
    plain = _plain(seen[0])
    assert "verdicts (newest first)" in plain and "/ops/live" in plain
    assert any(v in plain for v in ("KILL", "NO-KILL", "ERROR"))
