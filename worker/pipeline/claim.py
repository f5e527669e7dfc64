"""The capture claim: one task at a time writes an evidence prefix, and a dead one lets go.

The claim is a Redis key holding the task id, with an expiry its holder keeps renewing from a
background thread while it captures. A holder that dies (killed child, killed worker, lost host)
stops renewing, the claim expires, and the next capture of the event takes it over, removes the
dead attempt's partial objects (a freeze without its `evidence.json` marker is not evidence) and
captures again. The same task delivered again (its child was killed) holds the same token, so it
resumes at once. Before writing each object the holder checks it still holds the claim, so a
holder that was frozen past its expiry stops instead of mixing its files with its successor's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

__all__ = ["CLAIM_TTL_S", "CaptureClaim"]

log = logging.getLogger(__name__)

CLAIM_TTL_S: Final = 60
"""The seconds a capture claim lives unless its holder renews it."""

# KEYS: claim; ARGV: token, ttl ms. Take the claim if free or already ours.
_ACQUIRE: Final = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
# KEYS: claim; ARGV: token, ttl ms (0: release). Renew or release the claim if still ours.
_KEEP: Final = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) == 0 then redis.call('DEL', KEYS[1]) return 1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class CaptureClaim:
    """The claim on one evidence prefix, for one task (`token`)."""

    def __init__(self, redis: Any, key: str, token: str, ttl_s: float = 60) -> None:
        self.redis = redis
        self.key = key
        self.token = token
        self.ttl_ms = int(ttl_s * 1000)
        self._acquire = redis.register_script(_ACQUIRE)
        self._keep = redis.register_script(_KEEP)

    def acquire(self) -> bool:
        """Take the claim; False while another live task holds it."""
        return bool(self._acquire(keys=[self.key], args=[self.token, self.ttl_ms]))

    def held(self) -> bool:
        """Whether this task still holds the claim."""
        holder = self.redis.get(self.key)
        return holder is not None and _text(holder) == self.token

    def renew(self) -> bool:
        return bool(self._keep(keys=[self.key], args=[self.token, self.ttl_ms]))

    def release(self) -> None:
        self._keep(keys=[self.key], args=[self.token, 0])

    @contextmanager
    def kept(self) -> Iterator[None]:
        """Renew the claim every third of its expiry while the block runs."""
        stop = threading.Event()
        thread = threading.Thread(target=self._renew_until, args=(stop,), daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)

    def _renew_until(self, stop: threading.Event) -> None:
        while not stop.wait(self.ttl_ms / 3000):
            try:
                self.renew()
            except Exception as exc:  # Redis away: the next beat tries again
                log.warning("could not renew the capture claim %s: %s", self.key, exc)
