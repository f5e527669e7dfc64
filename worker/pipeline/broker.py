"""kombu's Redis transport, with its reconnect race closed.

When Redis goes away, Celery's consumer closes the broken connection (`Connection.collect`): each
channel is closed, then the transport is detached from the connection (`transport.client = None`).
A channel whose BRPOP is still in flight — the loss was noticed elsewhere first: an ack, a publish,
the fanout listener — fails to close (reading the BRPOP's answer raises the connection error,
which `collect` swallows) and stays open. When the consumer's bootsteps then close it, kombu's Redis
channel drops its connection pools and restores its unacknowledged messages through a new pool,
whose parameters it reads from the detached transport: `'NoneType' object has no attribute
'hostname'` (`_connparams`). That `AttributeError` is not a connection error, so it escapes
`ignore_errors` and kills the worker's main process ("Unrecoverable error"; the race of
celery/kombu#582 and #970, still in kombu 5.7.0, the latest release). The Redis crash drill saw
it (docs/reliability.md); `tests/integration/test_broker_race.py` reproduces it step by step.

Here a channel of a detached transport raises a connection error instead, which every caller
already handles: the close is ignored, the worker reconnects, and the unacknowledged messages stay
where kombu recorded them at delivery (Redis's `unacked` index), from which any worker restores
them after the visibility timeout — and the diagnosis's lease answers sooner.

Used for `redis://` brokers (`worker.pipeline.app`); `rediss://` keeps kombu's own transport,
whose TLS defaults depend on the URL's scheme.
"""

from __future__ import annotations

from typing import Any

import redis.exceptions
from kombu.transport import redis as kombu_redis

__all__ = ["DETACHED", "Channel", "Transport"]

DETACHED = "the broker connection was closed under this channel (Redis went away)"


class Channel(kombu_redis.Channel):
    """kombu's Redis channel; a new pool for a detached transport is a connection error."""

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport is None or transport.client is None:
            raise redis.exceptions.ConnectionError(DETACHED)
        params: dict[str, Any] = super()._connparams(asynchronous)  # type: ignore[no-untyped-call]
        return params


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel`."""

    Channel = Channel
