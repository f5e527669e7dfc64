"""Every metric the alert rules and the Grafana dashboard query (deploy/k8s) is one the processes
really export: read from the live `/metrics` of the prefork worker, ingest and the board after a
verdict and a dead letter went through, and the health endpoints the kubelet's probes ask."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.alerts import publish_alert
from shared.streams import ALERT_FIELD
from testkit.bundles import write_job_bundle
from testkit.services import RL_HEALTH, free_port, spawn, stop, wait_for
from tests.deploy.tools import PROMETHEUS_OWN, panel_exprs, queried_metrics, rule_exprs
from tests.integration.conftest import Services
from tests.integration.test_pipeline import _verdicts_for

pytestmark = pytest.mark.integration

# the series a family of each type exports
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count"),
}


def _exported(url: str) -> set[str]:
    """The series names an endpoint exports, from its families (labelled ones with no sample yet
    included: they are declared and will be counted)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in _SUFFIXES.get(family.type, ("",))
    }


@pytest.fixture
def board_url(pipeline_services: Services) -> Iterator[str]:
    port = free_port()
    process = spawn(
        [RL_HEALTH, "board", "--port", str(port)],
        pipeline_services.env,
        pipeline_services.logs / "deploy-board.log",
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: urllib.request.urlopen(f"{url}/healthz", timeout=1).status == 200, 30, "board")
    yield url
    stop(process)


def test_every_queried_metric_is_exported_by_a_live_process(
    pipeline_services: Services, board_url: str
) -> None:
    """After one diagnosis and one malformed alert, the union of the worker's, ingest's and the
    board's /metrics holds every `rlhealth_*` series a rule or a panel reads (the rest are
    Prometheus's own, such as `up`)."""
    services = pipeline_services
    root = services.bundle_root
    job = write_job_bundle(root, "deploy-metrics").relative_to(root).as_posix()
    event_id = publish_alert(services.redis, job)
    services.redis.xadd(services.names.alerts, {ALERT_FIELD: "{not json"})
    _verdicts_for(services, {event_id})
    exported: set[str] = set()
    for url in (*services.metrics.values(), f"{board_url}/metrics"):
        exported |= _exported(url)
    queried = queried_metrics(rule_exprs() + panel_exprs())
    assert {"rlhealth_verdicts_published_total", "rlhealth_alert_to_verdict_seconds_bucket"} <= (
        queried
    )
    missing = sorted(queried - exported - PROMETHEUS_OWN)
    assert missing == [], f"queried but exported by no process: {missing}"


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_worker_and_ingest_answer_the_kubelets_probes(pipeline_services: Services) -> None:
    """`rl-health worker --health-port` and `rl-health ingest --health-port`, started as the
    manifests start them, answer /healthz and /readyz with 200 once their loops run."""
    services = pipeline_services
    ports = {"worker": free_port(), "ingest": free_port()}
    processes = [
        spawn(
            [RL_HEALTH, "worker", "--concurrency=1", f"--health-port={ports['worker']}"],
            services.env,
            services.logs / "probe-worker.log",
        ),
        spawn(
            [RL_HEALTH, "ingest", "--consumer=probe-ingest", f"--health-port={ports['ingest']}"],
            services.env,
            services.logs / "probe-ingest.log",
        ),
    ]
    try:
        for name, port in ports.items():
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda url=url: _status(f"{url}/readyz") == 200, 60, f"{name} /readyz")
            assert _status(f"{url}/healthz") == 200
    finally:
        for process in processes:
            stop(process, timeout=20)
