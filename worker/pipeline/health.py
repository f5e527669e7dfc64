"""Health for the kubelet: a process is alive while its own loop goes round.

`rl-health worker` and `rl-health ingest` take `--health-port`: a small HTTP server in a thread
answers `GET /healthz` (liveness) and `GET /readyz` (readiness). A thread that answers proves
nothing about the loop doing the work, so the answer is the age of the loop's last beat:

- ingest beats once per turn of its read loop (a turn ends at least every second, or after a
  back-off of at most 30 s while Redis is away: an outage is not a death, a restart would not
  cure it);
- the worker's main process beats from the lease heartbeat (`worker.pipeline.heartbeat`), a timer
  of Celery's own event loop every quarter of the lease: when that loop is stuck, nothing renews
  the leases of the tasks it holds and nothing beats either.

`/healthz` is 200 while the last beat is younger than `stale_after_s` (default: the lease, 120 s,
four of the worker's beats) and 503 after — unless the loop is excused: while Redis is away the
worker's event loop does not turn (Celery's consumer waits in its reconnection; seen: no beat from
the moment redis-server stopped until it was back), and restarting it would cure nothing, only
lose the captures its children are still running and, repeated, leave it in a crash-loop back-off
long after Redis returned. So a stale loop whose Redis does not answer a PING is reported alive
(`200 waiting: ...`) and not ready. `/readyz` is 200 once the loop has begun (ingest: its
consumer group is there; the worker: its consumer started) and it is alive and not waiting. The
process start counts as a beat, so a slow start is judged by the probe's own start-up allowance.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

__all__ = ["LIVENESS", "Excuse", "Liveness", "redis_away", "serve_health"]

Excuse = Callable[[], str | None]  # why a stale loop is waiting, not dead; None: no excuse

_PLAIN: Final = "text/plain; charset=utf-8"


class Liveness:
    """The age of a loop's last beat, and whether the loop has begun."""

    def __init__(self, stale_after_s: float = 120.0, excuse: Excuse | None = None) -> None:
        self.stale_after_s = stale_after_s
        self.excuse = excuse
        self._last = time.monotonic()
        self._ready = False

    def beat(self) -> None:
        """The loop went round once."""
        self._last = time.monotonic()

    def begun(self) -> None:
        """The loop is doing its work (ready for readiness)."""
        self._ready = True
        self.beat()

    def age_s(self) -> float:
        return time.monotonic() - self._last

    def fresh(self) -> bool:
        return self.age_s() <= self.stale_after_s

    def state(self) -> tuple[str, bool, bool]:
        """(what to say, alive, ready): fresh; stale but waiting on its excuse; or stale."""
        if self.fresh():
            return ("ok" if self._ready else "starting"), True, self._ready
        waiting = self.excuse() if self.excuse is not None else None
        if waiting:
            return f"waiting: {waiting}", True, False
        return "stale", False, False


LIVENESS = Liveness()  # the one loop of this process


def redis_away(client: Any) -> Excuse:
    """An excuse that holds while Redis (`client`, with short timeouts) does not answer a PING."""

    def away() -> str | None:
        try:
            client.ping()
        except Exception as exc:  # any failure to reach it: the loop is waiting for Redis
            return f"Redis does not answer ({type(exc).__name__})"
        return None

    return away


def _handler(liveness: Liveness) -> type[BaseHTTPRequestHandler]:
    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path not in ("/healthz", "/readyz"):
                self._answer(404, "not found\n")
                return
            said, alive, ready = liveness.state()
            ok = alive if self.path == "/healthz" else ready
            self._answer(200 if ok else 503, f"{said}; last beat {liveness.age_s():.0f}s ago\n")

        def _answer(self, status: int, text: str) -> None:
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", _PLAIN)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Probes come every few seconds: not worth a log line each."""

    return Health


def serve_health(
    port: int, addr: str = "127.0.0.1", liveness: Liveness = LIVENESS
) -> ThreadingHTTPServer:
    """Answer `/healthz` and `/readyz` on `addr:port` from a daemon thread; returns the server."""
    server = ThreadingHTTPServer((addr, port), _handler(liveness))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
