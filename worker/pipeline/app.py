"""The Celery application: broker and result backend from RLHEALTH_REDIS_URL.

Late acknowledgement with a prefetch of one: a task leaves the queue only once it has run, so a
worker whose child dies hands its task to another (every task is safe to run twice).

What no broker setting can promise — a worker's main process killed between taking a message and
recording it as unacknowledged, or holding messages the broker only restores after its visibility
timeout — is answered by the lease of each diagnosis (`worker.pipeline.lease`): the worker's main
process renews the leases of the tasks it holds (`worker.pipeline.heartbeat`), and ingest's
watchdog sends a diagnosis again when its lease runs out. So the visibility timeout stays long
(a restored message of an answered diagnosis is ignored), and a worker's death is answered within
the lease, not the visibility timeout.

Redis may go away for minutes (a failover, a restart): the worker reconnects without limit (on
kombu's Redis transport with its reconnect race closed: `worker.pipeline.broker`);
within a task, messages it sends (its retry, the next step, the error callback) and results it
stores wait for Redis at most `_redis_wait_s` (10 s) — far inside the quickest stage's soft time
limit, so an outage is never mistaken for a stage past its limit, and a soft limit never lands
while a child hands its result over. A workflow that could not go on meanwhile is sent again when
its lease runs out.
"""

from __future__ import annotations

from typing import Any, Final

from celery import Celery, signals

from shared.redact import install_log_redaction
from shared.settings import Settings
from shared.streams import StreamNames

__all__ = ["app", "limits", "make_app"]

_VISIBILITY_TIMEOUT_S: Final = 900
# The longest a send or a result store waits for Redis inside a task. Short on purpose: Celery's
# soft time limit interrupts a pool child wherever it is, and one interrupted while handing its
# result to the worker corrupts the pool's pipe and stops the whole worker; so nothing after the
# task's body may wait long. Outages longer than this are the lease's to answer.
_REDIS_WAIT_MAX_S: Final = 10.0
_SOFT_SHARE: Final = 0.8  # the soft time limit, as a share of the hard one


def limits(settings: Settings) -> dict[str, tuple[float, float]]:
    """(soft, hard) time limits by task name; the capture reads a bundle, the rest are quick."""
    capture, other = settings.capture_time_limit_s, settings.gate_time_limit_s
    quick = (other * _SOFT_SHARE, other)
    return {
        "rlhealth.capture": (capture * _SOFT_SHARE, capture),
        "rlhealth.second_look": (capture * _SOFT_SHARE, capture),  # probes again, like a capture
        "rlhealth.gate": quick,
        "rlhealth.verdict": quick,
        "rlhealth.publish": quick,
        "rlhealth.html": quick,  # the page after publish: plots of every table, bounded in points
        "rlhealth.fail": quick,
    }


def _redis_wait_s(settings: Settings) -> float:
    """How long a task waits for Redis inside one run: well within the quickest stage's soft
    time limit, so an outage never turns into a time limit (longer outages: the lease)."""
    return min(_REDIS_WAIT_MAX_S, settings.gate_time_limit_s * _SOFT_SHARE / 4)


def _resilience(wait_s: float) -> dict[str, Any]:
    """Broker and backend settings that ride out a Redis outage: each wait within a task is
    bounded by `wait_s`; the worker itself reconnects without limit."""
    send_policy = {
        "max_retries": max(1, int(wait_s / 2)),
        "interval_start": 0.5,
        "interval_step": 0.5,
        "interval_max": 2,
    }
    return {
        "broker_connection_retry": True,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,  # a worker never gives up on its broker
        "broker_transport_options": {
            "visibility_timeout": _VISIBILITY_TIMEOUT_S,
            "socket_timeout": 10,
            "socket_connect_timeout": 5,
            "socket_keepalive": True,
            "retry_on_timeout": True,
            "health_check_interval": 10,
        },
        "task_publish_retry": True,
        "task_publish_retry_policy": send_policy,
        "result_backend_transport_options": {
            "retry_policy": {"timeout": wait_s, **send_policy},
        },
        "redis_socket_timeout": 10,
        "redis_socket_connect_timeout": 5,
        "redis_socket_keepalive": True,
        "redis_retry_on_timeout": True,
        "redis_backend_health_check_interval": 10,
    }


def _broker_transport(url: str) -> str | None:
    """kombu's Redis transport with its reconnect race closed (`worker.pipeline.broker`) for a
    `redis://` broker; None (the URL's own transport) for any other."""
    return "worker.pipeline.broker:Transport" if url.startswith("redis://") else None


def make_app(settings: Settings | None = None) -> Celery:
    """A Celery app configured from settings."""
    settings = settings or Settings()
    queue = StreamNames(settings.stream_prefix).task_queue
    celery = Celery("rlhealth", broker=settings.redis_url, backend=settings.redis_url)
    quick_soft, quick_hard = limits(settings)["rlhealth.gate"]
    annotations = {
        name: {"soft_time_limit": soft, "time_limit": hard}
        for name, (soft, hard) in limits(settings).items()
    }
    budget_kb = settings.worker_memory_mb * 1024 // 2
    celery.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_default_queue=queue,
        task_soft_time_limit=quick_soft,
        task_time_limit=quick_hard,
        task_annotations=annotations,
        result_expires=24 * 3600,
        result_extended=True,  # the error callback names the stage that failed from its result
        worker_max_memory_per_child=budget_kb or None,  # a child bloated by a task is replaced
        worker_send_task_events=True,
        task_send_sent_event=True,
        worker_hijack_root_logger=False,
        include=["worker.pipeline.tasks"],
        broker_transport=_broker_transport(settings.redis_url),
        **_resilience(_redis_wait_s(settings)),
    )
    from worker.pipeline.heartbeat import LeaseHeartbeat

    celery.steps["worker"].add(LeaseHeartbeat)
    _connect_signals()
    return celery


def _connect_signals() -> None:
    """The task signals' handlers: task metrics, the soft time limit's guard, the event id on
    every log line of a task. Connected here, where an app is made, never by importing a module;
    a second app connects nothing twice (Celery keys a receiver by its identity)."""
    from worker.pipeline import logsetup, metrics, softlimit

    metrics.connect_signals()
    softlimit.connect_signals()
    signals.task_prerun.connect(logsetup.task_started, weak=False)
    signals.task_postrun.connect(logsetup.task_over, weak=False)


# `celery -A worker.pipeline.app worker` starts without the rl-health CLI: its log records (task
# failures quote exception text, which may quote a bundle) are redacted here as well.
install_log_redaction()
app = make_app()
