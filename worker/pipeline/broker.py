"""kombu's Redis transport, with its reconnect race closed.

When Redis goes away, Celery's consumer first collects the broken connection
(`Connection.collect`: close each channel, then detach the transport, `transport.client = None`),
then closes it (`ignore_errors(connection, connection.close)`, in
`Consumer.on_connection_error_after_connected`, outside any broad `except`). If the loss was
noticed elsewhere first (an ack, a publish, the pidbox's fanout listener), the task channel's BRPOP
is still in flight: its first close raises reading the BRPOP's answer, and when another channel's
close fails too (a fanout queue's delete, Redis being down), the sweep stops and the task channel
stays open. `connection.close()` closes it again: kombu's Redis channel drops its connection pools
and restores its unacknowledged tasks through a new pool, whose parameters it reads from the
detached transport: `AttributeError: 'NoneType' object has no attribute 'hostname'`
(`_connparams`). Not a connection error, it escapes `ignore_errors` and the worker's main process
dies ("Unrecoverable error"; the race of celery/kombu#582 and #970, still in kombu 5.7.0, the
latest release). Which fd the event loop reads first decides it, so it comes and goes with load:
the Redis crash drill saw it (docs/reliability.md); `tests/integration/test_broker_race.py`
replays the sequence step by step on a real redis-server.

Here a channel of a detached transport raises a connection error instead, which every caller
already handles: the close is ignored and the worker reconnects. Its unacknowledged tasks stay
where kombu recorded them at delivery (Redis's `unacked` index), from which a worker restores them
after the visibility timeout — the diagnosis's lease answers sooner; the channel's restore (at its
close, or when it is collected) says so in one warning instead of a traceback.

Used for `redis://` brokers (`worker.pipeline.app`); `rediss://` keeps kombu's own transport,
whose TLS defaults depend on the URL's scheme.
"""

from __future__ import annotations

import logging
from typing import Any

import redis.exceptions
from kombu.transport import redis as kombu_redis

__all__ = ["DETACHED", "Channel", "QoS", "Transport"]

log = logging.getLogger(__name__)

DETACHED = "the broker connection was closed under this channel (Redis went away)"


def _detached(channel: Any) -> bool:
    transport = channel.connection
    return transport is None or transport.client is None


class QoS(kombu_redis.QoS):
    """kombu's unacked bookkeeping; a detached channel's tasks are left to the visibility
    timeout, with a warning."""

    def restore_unacked(self, client: Any = None) -> None:
        if client is None and _detached(self.channel):
            log.warning(
                "%d unacknowledged task(s) stay in Redis's unacked index: %s; restored after the "
                "visibility timeout",
                len(self._delivered),
                DETACHED,
            )
            self._delivered.clear()
            return
        super().restore_unacked(client)  # type: ignore[no-untyped-call]


class Channel(kombu_redis.Channel):
    """kombu's Redis channel; a new pool for a detached transport is a connection error."""

    QoS = QoS

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if _detached(self):
            raise redis.exceptions.ConnectionError(DETACHED)
        params: dict[str, Any] = super()._connparams(asynchronous)  # type: ignore[no-untyped-call]
        return params


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel`."""

    Channel = Channel
