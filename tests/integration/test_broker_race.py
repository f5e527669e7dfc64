"""kombu's reconnect race on a real redis-server, step by step: a channel whose BRPOP is in flight
when Redis dies outlives `Connection.collect`, and closing it afterwards must not kill the worker
(worker/pipeline/broker.py)."""

# kombu is untyped: its calls are checked by these tests, not by mypy
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

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


def _channel_left_open(url: str, process: Any, transport: str | None) -> tuple[Connection, Any]:
    """A consumer holding one unacknowledged message, its BRPOP in flight (as the worker's event
    loop leaves it), Redis killed, and the connection collected as Celery's consumer does on a
    connection error: the channel stays open on a detached transport."""
    conn = Connection(url, transport=transport)
    queue = Queue("race", Exchange("race", type="direct"), routing_key="race")
    with conn.Producer() as producer:
        producer.publish({"n": 1}, exchange=queue.exchange, routing_key="race", declare=[queue])
    channel = conn.channel()
    conn.Consumer(queue, callbacks=[lambda body, message: None], channel=channel).consume()
    conn.drain_events(timeout=5)
    assert len(channel.qos._delivered) == 1  # delivered, not acknowledged
    channel._brpop_start()
    process.send_signal(signal.SIGKILL)
    process.wait()
    conn.collect(socket_timeout=0.5)
    assert not channel.closed and channel.connection.client is None
    return conn, channel


def test_kombus_own_transport_dies_closing_the_channel(redis_server: Any) -> None:
    """With kombu's transport the close raises AttributeError ('hostname'), which Celery's
    `ignore_errors` lets through: the worker's main process dies. (If this fails, kombu fixed
    the race and worker/pipeline/broker.py can go.)"""
    process, url = redis_server
    conn, channel = _channel_left_open(url, process, transport=None)
    with pytest.raises(AttributeError, match="hostname"):
        ignore_errors(conn, channel.close)


def test_the_guarded_transport_makes_it_a_connection_error_the_consumer_ignores(
    redis_server: Any,
) -> None:
    """With the guarded transport the same close is a connection error, ignored like any other:
    the worker reconnects (the message stays in Redis's unacked index, restored after the
    visibility timeout; the diagnosis's lease answers sooner)."""
    process, url = redis_server
    conn, channel = _channel_left_open(url, process, transport=OURS)
    ignore_errors(conn, channel.close)  # raises nothing
    assert channel.closed
