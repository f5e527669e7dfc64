"""The HTML page after publish (fakeredis, the in-memory store): the verdict step no longer draws,
the `html` step stores the page beside the JSON report, and a page that cannot be drawn is stored
without plots while the verdict stays as published."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fakeredis
import pytest

from reports import html as html_module
from shared.models import Event, VerdictEntry
from shared.settings import Settings
from testkit.bundles import write_job_bundle
from worker.pipeline import sinks, steps
from worker.pipeline.metrics import HTML_REPORTS
from worker.pipeline.steps import Pipeline
from worker.pipeline.store import MemoryStore
from worker.pipeline.tasks import workflow
from worker.pipeline.watchdog import Watchdog

JOB = "jobs/cw/ops/rl-job"
NOW_ISO = "2026-07-30T21:15:00+00:00"


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    write_job_bundle(tmp_path / "bundles", "rl-job")
    settings = Settings(
        bundle_root=tmp_path / "bundles", stream_prefix="t", cache_dir=tmp_path / "cache"
    )
    return Pipeline(settings, MemoryStore(), fakeredis.FakeRedis())


def _objects(pipeline: Pipeline) -> dict[str, bytes]:
    store = pipeline.store
    assert isinstance(store, MemoryStore)
    return store.objects


def _published(pipeline: Pipeline, lead: str = "e1") -> dict[str, Any]:
    event = Event.model_validate(
        {"event_id": lead, "job_dir": JOB, "published_at": NOW_ISO, "now": NOW_ISO}
    )
    pipeline.events.archive(event)
    pipeline.coalescer.admit(lead, JOB, event_json=event.model_dump_json())
    pipeline.capture(lead, lead, claim="t1")
    results = [pipeline.gate(lead, name) for name in steps.GATE_NAMES]
    entry = pipeline.verdict(results, lead, lead)
    return pipeline.publisher.publish(entry, JOB)


def _keys(entry: dict[str, Any]) -> tuple[str, str]:
    json_key = VerdictEntry.model_validate(entry).report_uri.removeprefix("memory://rlhealth/")
    return json_key, json_key.removesuffix(".json") + ".html"


def _count(outcome: str) -> float:
    return HTML_REPORTS.labels(outcome=outcome)._value.get()


def test_the_verdict_step_does_not_draw(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verdict is decided and its text and JSON stored without rendering the HTML page."""

    def no_drawing(*_args: Any, **_kwargs: Any) -> str:
        raise AssertionError("the verdict step drew the HTML page")

    monkeypatch.setattr(sinks, "render_html", no_drawing)
    entry = _published(pipeline)
    json_key, page = _keys(entry)
    assert json_key in _objects(pipeline)
    assert json_key.removesuffix(".json") + ".txt" in _objects(pipeline)
    assert page not in _objects(pipeline)


def test_the_html_step_stores_the_page_beside_the_json_report(pipeline: Pipeline) -> None:
    """After publish, `html` stores the page with its plots at the JSON key with `.html`, once,
    and lets go of the report it kept in Redis."""
    entry = _published(pipeline)
    _, page = _keys(entry)
    drawn = _count("drawn")
    assert pipeline.shelf.html(entry, "e1") == page
    body = _objects(pipeline)[page].decode()
    assert body.startswith("<!DOCTYPE html>")
    assert "data:image/png;base64," in body
    assert entry["verdict"] in body
    assert _count("drawn") == drawn + 1
    assert not pipeline.redis.keys("t:report:*")
    gone = _count("report_gone")
    assert pipeline.shelf.html(entry, "e1") == page  # run again: drawn already, not drawn again
    assert _count("drawn") == drawn + 1 and _count("report_gone") == gone


def test_a_page_that_cannot_be_drawn_is_stored_without_plots(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plots that raise give the page without them (counted); the published verdict is the
    same entry on the stream, before and after."""
    entry = _published(pipeline)
    stream_before = pipeline.redis.xrange(pipeline.names.verdicts)

    def broken(*_args: Any) -> Any:
        raise ValueError("a plot broke")

    monkeypatch.setattr(html_module, "render_plots", broken)
    without = _count("without_plots")
    _, page = _keys(entry)
    assert pipeline.shelf.html(entry, "e1") == page
    body = _objects(pipeline)[page].decode()
    assert body.startswith("<!DOCTYPE html>") and "data:image/png" not in body
    assert _count("without_plots") == without + 1
    assert pipeline.redis.xrange(pipeline.names.verdicts) == stream_before
    assert pipeline.publisher.decided("e1") == VerdictEntry.model_validate(entry).model_copy(
        update={"event_ids": pipeline.publisher.decided("e1").event_ids}  # type: ignore[union-attr]
    )


def test_lost_evidence_gives_the_page_without_plots(pipeline: Pipeline) -> None:
    """The frozen evidence gone by the time the page is drawn: the page, without plots."""
    entry = _published(pipeline)
    for key in [k for k in _objects(pipeline) if k.startswith("evidence/e1/")]:
        del _objects(pipeline)[key]
    pipeline.frozen._thawed.clear()
    shutil_cache = pipeline.frozen.cache_root / "e1"
    assert not shutil_cache.exists() or _remove(shutil_cache)
    _, page = _keys(entry)
    assert pipeline.shelf.html(entry, "e1") == page
    assert "data:image/png" not in _objects(pipeline)[page].decode()


def _remove(path: Path) -> bool:
    import shutil

    shutil.rmtree(path)
    return True


def test_an_error_answer_gets_its_page_after_publish(pipeline: Pipeline) -> None:
    """`fail` answers ERROR with text and JSON only; `html` then draws its page (no evidence:
    no plots), and a report no longer kept is counted, not drawn."""
    event = Event.model_validate({"event_id": "e2", "job_dir": JOB, "published_at": NOW_ISO})
    pipeline.events.archive(event)
    pipeline.coalescer.admit("e2", JOB, event_json=event.model_dump_json())
    answered = pipeline.publisher.fail("e2", JOB, "capture failed: boom")
    assert answered is not None and answered.verdict.value == "ERROR"
    entry = answered.model_dump(mode="json")
    _, page = _keys(entry)
    assert page not in _objects(pipeline)
    assert pipeline.shelf.html(entry, None) == page
    assert "boom" in _objects(pipeline)[page].decode()
    del _objects(pipeline)[page]
    gone = _count("report_gone")
    assert pipeline.shelf.html(entry, None) is None
    assert _count("report_gone") == gone + 1


def test_the_watchdogs_error_answer_sends_the_page(pipeline: Pipeline) -> None:
    """The watchdog's ERROR answer (a lease that ran out after the last re-send) sends the page
    task for the lead's evidence; the re-sends before it send none."""
    event = Event.model_validate({"event_id": "e3", "job_dir": JOB, "published_at": NOW_ISO})
    pipeline.events.archive(event)
    pipeline.coalescer.admit("e3", JOB, event_json=event.model_dump_json())
    sent: list[tuple[str, str | None]] = []
    dog = Watchdog(pipeline, lambda *_: None, draw=lambda e, i: sent.append((e["event_id"], i)))
    for _ in range(pipeline.settings.redispatch_max + 1):
        pipeline.redis.zadd(pipeline.names.leases, {"e3": 0})
        dog.tick()
    assert sent == [("e3", "e3")]


def test_the_page_follows_publish_outside_the_error_callback() -> None:
    """`html` is linked to publish, not chained: it carries no error callback and no lead (the
    heartbeat does not renew an answered lease for it)."""
    flow = workflow("e1", "e1", "jobs/a", deadline=123.0)
    publish = flow.tasks[1].body.tasks[-1]
    links = publish.options["link"]
    assert [link["task"] for link in links] == ["rlhealth.html"]
    assert links[0]["args"] == ["e1"] or tuple(links[0]["args"]) == ("e1",)
    assert "link_error" not in links[0]["options"]
    assert "lead" not in links[0]["kwargs"]


def test_the_error_callback_sends_the_page_of_its_answer(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rlhealth.fail` (run eagerly) answers ERROR and then sends the page task for that answer,
    with the lead's evidence; nothing is sent when the lead was answered already."""
    from types import SimpleNamespace

    from worker.pipeline import tasks

    event = Event.model_validate({"event_id": "e4", "job_dir": JOB, "published_at": NOW_ISO})
    pipeline.events.archive(event)
    pipeline.coalescer.admit("e4", JOB, event_json=event.model_dump_json())
    failed = SimpleNamespace(
        ready=lambda: True, result=RuntimeError("boom"), name="rlhealth.capture", args=["e4"]
    )
    sent: list[tuple[str, str | None]] = []
    monkeypatch.setattr(tasks, "pipeline", lambda: pipeline)
    monkeypatch.setattr(tasks.app, "AsyncResult", lambda _id: failed)
    monkeypatch.setattr(tasks, "draw_later", lambda e, i: sent.append((e["verdict"], i)))
    kwargs = {"lead": "e4", "job": JOB, "deadline": 4e9}
    tasks.fail.apply(args=("t-failed",), kwargs=kwargs).get()
    assert sent == [("ERROR", "e4")]
    tasks.fail.apply(args=("t-failed",), kwargs=kwargs).get()
    assert sent == [("ERROR", "e4")]
