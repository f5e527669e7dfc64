"""kombu's reconnect race on a real redis-server, step by step: a channel whose BRPOP is in flight
when Redis dies outlives `Connection.collect`, and closing it afterwards must not kill the worker
(worker/pipeline/broker.py)."""

# kombu is untyped: its calls are checked by these tests, not by mypy
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import logging
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu.common import ignore_errors
from kombu.connection import Connection
from kombu.entity import Exchange, Queue

from testkit.services import start_redis, stop

pytestmark = pytest.mark.integration

OURS = "worker.pipeline.broker:Transport"


@pytest.fixture()
def redis_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A redis-server of its own: the test kills it."""
    process, url = start_redis(tmp_path)
    yield process, url
    stop(process)


def _collected_with_tasks_unacked(
    url: str, process: Any, transport: str | None
) -> tuple[Connection, Any]:
    """A worker's consumer connection at the moment Redis dies: its default channel holds an
    unacknowledged task and has a BRPOP in flight (as the event loop leaves it), a second channel
    listens on a fanout queue (the pidbox); the loss is noticed elsewhere first, and Celery
    collects the connection (`on_connection_error_after_connected`). The fanout channel's close
    fails and stops the sweep, so the default channel stays open on a detached transport."""
    conn = Connection(url, transport=transport)
    tasks = Queue("race", Exchange("race", type="direct"), routing_key="race")
    with conn.Producer() as producer:
        producer.publish({"n": 1}, exchange=tasks.exchange, routing_key="race", declare=[tasks])
    default: Any = conn.default_channel
    conn.Consumer(tasks, callbacks=[lambda body, message: None], channel=default).consume()
    conn.drain_events(timeout=5)
    assert len(default.qos._delivered) == 1  # delivered, not acknowledged
    pidbox = Queue("race.pidbox", Exchange("race.pidbox", type="fanout"), auto_delete=True)
    conn.Consumer(pidbox, callbacks=[lambda body, message: None], no_ack=True).consume()
    default._brpop_start()
    process.send_signal(signal.SIGKILL)
    process.wait()
    conn.collect(socket_timeout=0.5)
    assert not default.closed and default.connection.client is None
    return conn, default


def test_kombus_own_transport_dies_closing_the_connection(redis_server: Any) -> None:
    """With kombu's transport, Celery's next step — `ignore_errors(connection,
    connection.close)`, outside any broad except — raises AttributeError ('hostname'): the
    worker's main process dies ("Unrecoverable error"). (If this fails, kombu fixed the race and
    worker/pipeline/broker.py can go.)"""
    process, url = redis_server
    conn, channel = _collected_with_tasks_unacked(url, process, transport=None)
    with pytest.raises(AttributeError, match="hostname"):
        ignore_errors(conn, conn.close)
    channel.qos._on_collect.cancel()  # its restore at exit would only print the same error


def test_the_guarded_transport_makes_it_a_connection_error_the_consumer_ignores(
    redis_server: Any,
) -> None:
    """With the guarded transport the same close is a connection error, ignored like any other:
    the worker reconnects (the message stays in Redis's unacked index, restored after the
    visibility timeout; the diagnosis's lease answers sooner)."""
    process, url = redis_server
    conn, _ = _collected_with_tasks_unacked(url, process, transport=OURS)
    ignore_errors(conn, conn.close)  # raises nothing


def test_the_guarded_transport_leaves_the_tasks_to_the_visibility_timeout_with_a_warning(
    redis_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The detached channel's restore (at its close, or when it is collected) cannot reach
    Redis: it says so in one warning, not a traceback."""
    process, url = redis_server
    conn, channel = _collected_with_tasks_unacked(url, process, transport=OURS)
    ignore_errors(conn, conn.close)
    with caplog.at_level(logging.WARNING, logger="worker.pipeline.broker"):
        channel.qos.restore_unacked_once()
    assert "1 unacknowledged task(s) stay in Redis's unacked index" in caplog.text
