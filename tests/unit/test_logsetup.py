"""Logs written for operators: text or JSON (RLHEALTH_LOG_FORMAT) with the event id on every line,
Celery's per-task result lines at DEBUG, the broker named by its address, and ingest saying what
it did with each alert."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import fakeredis
import pytest

from shared.alerts import publish_alert
from shared.settings import Settings
from shared.streams import ALERT_FIELD
from worker.pipeline.ingest import Ingest
from worker.pipeline.logsetup import about_event, configure_logging
from worker.pipeline.steps import Pipeline
from worker.pipeline.store import MemoryStore

RESULT = (
    "Task rlhealth.gate[0f6c] succeeded in 0.05s: {'name': 'rollouts', 'result': "
    "{'status': 'ERROR', 'summary': 'mode undeclared'}}"
)


class Stream(io.StringIO):
    """What the handler `configure` sets up writes (made in the test's call phase, after pytest
    has set its own capture of stderr)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__()
        self.monkeypatch = monkeypatch

    def configure(
        self, level: str, broker: str | None = None, fmt: Literal["text", "json"] = "text"
    ) -> None:
        self.monkeypatch.setattr("sys.stderr", self)
        configure_logging(level, broker=broker, fmt=fmt)


@pytest.fixture
def stream(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stream]:
    """The log's output; the root logger and the Celery loggers restored after the test."""
    out = Stream(monkeypatch)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    loggers = [
        logging.getLogger(n) for n in ("celery.app.trace", "celery.worker.consumer.connection")
    ]
    filters = [logger.filters[:] for logger in loggers]
    yield out
    root.handlers, root.level = saved[0], saved[1]
    for logger, kept in zip(loggers, filters, strict=True):
        logger.filters = kept


def _json_lines(out: Stream) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_json_logs_carry_the_event_id_on_every_line(
    stream: Stream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RLHEALTH_LOG_FORMAT=json: one JSON object per line, `event_id` on each (null outside an
    event), the level, the logger and the message."""
    stream.configure("INFO", fmt=Settings(log_format="json").log_format)
    log = logging.getLogger("rlhealth.test")
    log.info("outside")
    with about_event("evt-42"):
        log.warning("inside %s", "it")
    lines = _json_lines(stream)
    assert [(x["event_id"], x["level"], x["message"]) for x in lines] == [
        (None, "INFO", "outside"),
        ("evt-42", "WARNING", "inside it"),
    ]
    assert all(set(x) >= {"time", "level", "logger", "event_id", "message"} for x in lines)


def test_text_logs_show_the_event_id_in_brackets(stream: Stream) -> None:
    """The default text format: `time LEVEL [event id] logger: message`, `-` outside one."""
    stream.configure("INFO")
    log = logging.getLogger("rlhealth.test")
    with about_event("evt-7"):
        log.info("took it")
    log.info("idle")
    first, second = stream.getvalue().splitlines()
    assert " INFO [evt-7] rlhealth.test: took it" in first
    assert " INFO [-] rlhealth.test: idle" in second


def test_celery_task_results_are_logged_at_debug_only(stream: Stream) -> None:
    """A task's result line (JSON with "status": "ERROR" in a healthy run) is not written at
    INFO, is written as DEBUG at DEBUG; a retry line of the same logger stays at INFO."""
    trace = logging.getLogger("celery.app.trace")
    stream.configure("INFO")
    trace.info(RESULT)
    trace.info("Task rlhealth.capture[1a] retry: Retry in 2s: ConnectionError")
    assert "succeeded" not in stream.getvalue() and "ERROR" not in stream.getvalue()
    assert " INFO [-] celery.app.trace: Task rlhealth.capture[1a] retry" in stream.getvalue()
    stream.configure("DEBUG")
    trace.info(RESULT)
    assert " DEBUG [-] celery.app.trace: Task rlhealth.gate[0f6c] succeeded" in stream.getvalue()


def test_the_broker_is_named_by_its_address_not_a_masked_url(stream: Stream) -> None:
    """kombu's `redis://:**@host` (masked even without a password) becomes the address: no
    `<redacted:password>` on a deployment that has no password."""
    stream.configure("INFO", broker="127.0.0.1:6379/0")
    logging.getLogger("celery.worker.consumer.connection").info(
        "Connected to redis://:**@127.0.0.1:6379/0"
    )
    text = stream.getvalue()
    assert "Connected to the broker: Redis at 127.0.0.1:6379/0" in text
    assert "redacted" not in text and "**" not in text


def test_ingest_logs_each_alert_taken_and_each_dead_letter(stream: Stream, tmp_path: Path) -> None:
    """One INFO line per alert taken (what became of it) and one WARNING per alert refused, each
    with the event id the alert claims."""
    job = "jobs/cw/ops/rl-job"
    (tmp_path / job).mkdir(parents=True)
    settings = Settings(bundle_root=tmp_path, stream_prefix="lg", coalesce_s=60)
    client = fakeredis.FakeRedis()
    ingest = Ingest(Pipeline(settings, MemoryStore(), client), lambda *_: None, block_ms=1)
    stream.configure("INFO")
    first = publish_alert(client, job, settings=settings)
    second = publish_alert(client, job, settings=settings)
    bad = json.dumps(
        {"event_id": "evt-bad", "job_dir": "../../etc", "published_at": "2026-07-30T00:00:00Z"}
    )
    client.xadd(ingest.names.alerts, {ALERT_FIELD: bad})
    ingest.run(until_idle=True)
    lines = stream.getvalue().splitlines()
    assert any(f"INFO [{first}]" in x and f"for {job}: started a diagnosis" in x for x in lines)
    assert any(
        f"INFO [{second}]" in x and "attached to the diagnosis in flight" in x for x in lines
    )
    assert any("WARNING [evt-bad]" in x and "dead-lettered alert" in x for x in lines)


def test_an_unknown_log_format_stops_ingest_with_one_line() -> None:
    """RLHEALTH_LOG_FORMAT=xml: exit 2, one line naming the setting."""
    from click.testing import CliRunner

    from worker.cli import main

    result = CliRunner().invoke(main, ["ingest", "--once"], env={"RLHEALTH_LOG_FORMAT": "xml"})
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("rl-health: unusable setting RLHEALTH_LOG_FORMAT: ") and "'json'" in line
