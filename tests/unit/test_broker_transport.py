"""The worker's Celery app uses kombu's Redis transport with its reconnect race closed for a
`redis://` broker, and the URL's own transport for any other (worker/pipeline/broker.py)."""

from __future__ import annotations

import pytest
import redis.exceptions

from shared.settings import Settings
from worker.pipeline import broker
from worker.pipeline.app import make_app


def test_a_redis_broker_gets_the_guarded_transport() -> None:
    """redis://: the app's connections use `worker.pipeline.broker.Transport`."""
    app = make_app(Settings(redis_url="redis://127.0.0.1:6390/0"))
    assert app.connection_for_read().transport_cls == "worker.pipeline.broker:Transport"
    assert app.connection_for_read().get_transport_cls() is broker.Transport


def test_a_tls_broker_keeps_kombus_transport() -> None:
    """rediss://: kombu's own transport, whose TLS defaults hang on the scheme."""
    app = make_app(Settings(redis_url="rediss://127.0.0.1:6390/0"))
    assert app.conf.broker_transport is None
    assert app.connection_for_read().transport_cls == "rediss"


def test_a_channel_without_its_transport_is_a_lost_connection() -> None:
    """A channel kombu already detached (`connection` None, e.g. an ack of a task from before a
    reconnect) raises the connection error every caller handles, not AttributeError."""
    channel = object.__new__(broker.Channel)
    channel.connection = None
    with pytest.raises(redis.exceptions.ConnectionError, match="closed under this channel"):
        channel._connparams()
