"""The pipeline's logs, written for the people on call.

- One line per record on stderr: `time level [event id] logger: message` by default, or one JSON
  object per line with `RLHEALTH_LOG_FORMAT=json` (`time`, `level`, `logger`, `event_id`,
  `message`, and `traceback` when there is one). The event id is on every line: the diagnosis a
  Celery task works for (its `lead`), the alert ingest is handling; `-` (null in JSON) outside
  of one.
- Celery's own lines for each task received and each result (a gate's result is a page of JSON,
  and its `"status": "ERROR"` matched `grep ERROR` on healthy runs) are logged at DEBUG; the
  pipeline says what happened in its own words: `verdict event=... job=... verdict=...` once per
  diagnosis (`worker.pipeline.publish`), ingest's start and each alert it takes or dead-letters
  (`worker.pipeline.ingest`).
- Every record has passed the redactor first (`shared.redact.install_log_redaction`).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Final, Literal

from shared.redact import install_log_redaction

__all__ = [
    "BrokerNamed",
    "EventIdFilter",
    "JsonFormatter",
    "TaskLinesAtDebug",
    "about_event",
    "configure_logging",
    "current_event",
    "set_event",
]

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s [%(event_id)s] %(name)s: %(message)s"
# the Celery lines about each task's delivery and result, as the redactor leaves them (formatted)
_TASK_LINE: Final = re.compile(r"^Task \S+\[[^\]]*\] (?:received|succeeded in )")
_TASK_LOGGERS: Final = ("celery.app.trace", "celery.worker.strategy")
_BROKER_LOGGER: Final = "celery.worker.consumer.connection"

_event: ContextVar[str | None] = ContextVar("rlhealth_event_id", default=None)
# the task this process runs (a pool child runs one at a time): the threads a task starts (S3
# uploads in a pool) do not inherit the context, yet work for the same diagnosis
_task_event: list[str | None] = [None]


def current_event() -> str | None:
    """The event id this thread of work is about, if any."""
    return _event.get() or _task_event[0]


def set_event(event_id: str | None) -> None:
    """Every record logged from now on in this process carries `event_id` (a Celery task's
    lead, set when it starts and cleared when it ends: `worker.pipeline.tasks`)."""
    _event.set(event_id)
    _task_event[0] = event_id


@contextmanager
def about_event(event_id: str | None) -> Iterator[None]:
    """Every record logged inside carries `event_id`."""
    token = _event.set(event_id)
    try:
        yield
    finally:
        _event.reset(token)


class EventIdFilter(logging.Filter):
    """Puts the current event id on every record (`-` outside of one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "event_id", None) is None:
            record.event_id = current_event() or "-"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record; every record has its `event_id` (null outside of one)."""

    def format(self, record: logging.LogRecord) -> str:
        event_id = getattr(record, "event_id", None)
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "event_id": None if event_id in (None, "-") else event_id,
            "message": record.getMessage(),
        }
        trace = record.exc_text or (
            self.formatException(record.exc_info) if record.exc_info else ""
        )
        if trace:
            data["traceback"] = trace
        return json.dumps(data, ensure_ascii=True, separators=(",", ":"))


class TaskLinesAtDebug(logging.Filter):
    """Celery's per-task `received` and `succeeded` lines, demoted to DEBUG (shown only when the
    logger would show DEBUG); every other line of those loggers passes as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not _TASK_LINE.match(record.getMessage()):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


class BrokerNamed(logging.Filter):
    """Celery's `Connected to <URL>` line names the broker by its address instead: kombu masks a
    Redis URL's password as `**` whether one is set or not, which the redactor then reports as
    a redacted password, on a deployment that has none."""

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Connected to "):
            record.msg, record.args = f"Connected to the broker: Redis at {self.address}", None
        return True


def configure_logging(
    level: str | int = "INFO",
    *,
    broker: str | None = None,
    fmt: Literal["text", "json"] = "text",
) -> None:
    """The root logger to stderr in `fmt` (`Settings.log_format`, RLHEALTH_LOG_FORMAT), at
    `level`, for this process and the ones it forks (Celery's pool children inherit it); `broker`
    is the Redis address Celery's connection line names."""
    install_log_redaction()
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(EventIdFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level if isinstance(level, int) else level.upper())
    for name in _TASK_LOGGERS:
        task_logger = logging.getLogger(name)
        if not any(isinstance(f, TaskLinesAtDebug) for f in task_logger.filters):
            task_logger.addFilter(TaskLinesAtDebug())
    if broker is not None:
        connection = logging.getLogger(_BROKER_LOGGER)
        connection.filters = [f for f in connection.filters if not isinstance(f, BrokerNamed)]
        connection.addFilter(BrokerNamed(broker))


def _lead_of(args: Any, kwargs: Any) -> str | None:
    """The diagnosis a task run works for: its `lead`, else the entry's (html), else its first
    argument when that is an event id (capture)."""
    found = (kwargs or {}).get("lead")
    if found is None and args:
        first = args[0]
        found = first.get("event_id") if isinstance(first, dict) else first
    return found if isinstance(found, str) else None


def task_started(args: Any = None, kwargs: Any = None, **_: Any) -> None:
    """Celery's `task_prerun`: the task's lines carry its diagnosis (connected by `make_app`)."""
    set_event(_lead_of(args, kwargs))


def task_over(**_: Any) -> None:
    """Celery's `task_postrun`: lines after the task carry no event."""
    set_event(None)
