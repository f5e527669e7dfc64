"""The secrets corpus through the real pipeline: every object it stores in (moto's) S3, read back,
holds no credential of the corpus (issue 9)."""

from __future__ import annotations

import io

import polars as pl
import pytest

from shared.alerts import publish_alert
from testkit.services import wait_for
from tests.integration.conftest import Services
from tests.integration.test_pipeline import _key, _verdicts_for
from tests.security.bundles import NOW
from tests.security.corpus import leaks
from tests.security.test_leaks import secret_bundle, secret_probes
from worker.evidence.frozen import MARKER, referenced_parts

pytestmark = pytest.mark.integration


def _readable(key: str, body: bytes) -> str:
    if key.endswith(".parquet"):
        return str(pl.read_parquet(io.BytesIO(body)).rows())
    return body.decode("utf-8", errors="replace")


def test_no_secret_in_any_object_the_pipeline_stores(pipeline_services: Services) -> None:
    """Alert → capture → gates → report on a bundle carrying the corpus: every S3 object (event,
    frozen evidence, probe files, the Parquet parts of its tables, the reports and the HTML page
    drawn after publish) read back has zero leaks."""
    services = pipeline_services
    job_dir = secret_bundle(services.bundle_root, "rl-secrets")
    probes = secret_probes(services.bundle_root / "probes-secrets")
    event_id = publish_alert(
        services.redis,
        job_dir.relative_to(services.bundle_root).as_posix(),
        now=NOW,
        probes=probes.relative_to(services.bundle_root).as_posix(),
    )
    (entry,) = _verdicts_for(services, {event_id}, timeout=120)
    page = _key(services, entry.report_uri).removesuffix(".json") + ".html"
    wait_for(lambda: services.store.exists(page), 60, "the HTML report")  # drawn after publish
    keys = [k for k in services.store.keys("") if event_id in k]
    assert page in keys
    frozen = services.store.get(f"evidence/{event_id}/{MARKER}")
    keys += sorted(referenced_parts(frozen))  # the tables' parts, kept per job
    assert any(k.startswith("reports/") for k in keys) and any(k.endswith(".parquet") for k in keys)
    texts = {key: _readable(key, services.store.get(key)) for key in keys}
    assert {key: leaks(text) for key, text in texts.items() if leaks(text)} == {}
    assert any("<redacted:" in text for key, text in texts.items() if key.startswith("reports/"))
