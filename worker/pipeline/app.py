"""The Celery application: broker and result backend from RLHEALTH_REDIS_URL.

Late acknowledgement with a prefetch of one: a task leaves the queue only once it has run, so a
worker that dies mid-diagnosis hands its task to another (every task is safe to run twice). The
broker's visibility timeout is longer than any task's hard time limit, so a slow task is not
delivered twice while it still runs.
"""

from __future__ import annotations

from typing import Final

from celery import Celery

from shared.settings import Settings
from shared.streams import StreamNames

__all__ = ["CAPTURE_LIMITS_S", "GATE_LIMITS_S", "app", "make_app"]

CAPTURE_LIMITS_S: Final = (240, 300)  # soft, hard: reading a large bundle is the slow step
GATE_LIMITS_S: Final = (60, 90)
_VISIBILITY_TIMEOUT_S: Final = 900


def make_app(settings: Settings | None = None) -> Celery:
    """A Celery app configured from settings."""
    settings = settings or Settings()
    queue = StreamNames(settings.stream_prefix).task_queue
    celery = Celery("rlhealth", broker=settings.redis_url, backend=settings.redis_url)
    celery.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_default_queue=queue,
        task_soft_time_limit=GATE_LIMITS_S[0],
        task_time_limit=GATE_LIMITS_S[1],
        result_expires=24 * 3600,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": _VISIBILITY_TIMEOUT_S},
        result_backend_transport_options={"retry_policy": {"timeout": 5.0}},
        worker_send_task_events=True,
        task_send_sent_event=True,
        worker_hijack_root_logger=False,
        include=["worker.pipeline.tasks"],
    )
    return celery


app = make_app()
