"""The Celery tasks: thin wrappers over `worker.pipeline.steps`, and the workflow that joins them.

    capture ─┬─ gate restarts ──┐
             ├─ gate liveness ──┤
             ├─ ...             ├─ verdict ────────────────────────────── publish ┈┈▶ html
             └─ gate duty_cycle ┘     └─ (a KILL on stacks) second look ──┘
                                         REOBSERVE_S later, a countdown
    (any of them failing) ──────────────────────────────────────────────────▶ fail ┈┈▶ html

`html` draws the HTML page (matplotlib plots) after the verdict is published: a callback linked to
publish (or sent by `fail`, and by ingest's watchdog, once they answered ERROR), outside the
workflow's error handling. The verdict entry and the text and JSON reports are the contract and
never wait for the page; a page that cannot be drawn is stored without plots, and an `html` task
that fails for good is only logged and counted (it never answers the diagnosis).

Each task takes references (event id, evidence id, job key) and the diagnosis's `lead` and retry
`deadline` as keywords, and calls one pipeline step through `_run`, which

- renews the lead's lease, and drops the task (`Ignore`) when the lead is already answered — a
  task the broker restored late, or one of a workflow sent again;
- counts the starts of this delivery: a task killed twice fails instead of running again;
- stops the process when the task passes its memory budget (the next delivery fails with why);
- turns a soft time limit that fired before or in the step, or a step that ran past it, into
  `StageTimeoutError` (`worker.pipeline.softlimit`): never evidence;
- retries infrastructure faults with backoff until the wall-clock `deadline`.

Every failure lands in `fail`, linked as the error callback of the capture and of the chord's
callback (verdict, then publish; Celery calls it when a gate fails). It reads what failed from the
result backend and answers the diagnosis ERROR through the normal publish — or sends it again when
a new run can get past the failure (`_recoverable`: lost evidence, a fault that escaped the
retries, a first time limit).
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import cache, partial
from typing import Any, Final, TypeVar, cast

import redis
from celery import Task, chain, chord, group
from celery.canvas import Signature
from celery.exceptions import Ignore, Reject

from shared.settings import Settings
from worker.pipeline import softlimit
from worker.pipeline.app import app, limits
from worker.pipeline.failures import (
    CaptureBusyError,
    EvidenceLostError,
    InfrastructureError,
    classified,
    explain,
    is_infrastructure,
    is_time_limit,
)
from worker.pipeline.guard import DeliveryGuard, MemoryCeiling
from worker.pipeline.steps import GATE_NAMES, Pipeline
from worker.pipeline.store import store_from_settings

__all__ = [
    "capture",
    "dispatch",
    "draw_later",
    "fail",
    "gate",
    "html",
    "pipeline",
    "publish",
    "redispatch",
    "resend",
    "second_look",
    "verdict",
    "workflow",
]

log = logging.getLogger(__name__)
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
_BACKOFF_MAX_S: Final = 30.0
_BUSY_RETRY_S: Final = 2
_RESULT_WAIT_TRIES: Final = 10  # the failed task's result may be stored just after its errback
_DEPENDENCY: Final = re.compile(r"Dependency ([0-9a-f-]{36}) raised")


@cache
def settings() -> Settings:
    return Settings()


@cache
def pipeline() -> Pipeline:
    """This worker process's adapters, made on first use (after the fork)."""
    client = redis.Redis.from_url(
        settings().redis_url, health_check_interval=30, socket_timeout=10, socket_connect_timeout=5
    )
    return Pipeline(settings(), store_from_settings(settings()), client)


def _task(name: str) -> Callable[[F], Any]:
    """`app.task` (bound, so a task can retry itself), typed for mypy."""
    decorator: Callable[[F], Any] = app.task(name=name, bind=True)
    return decorator


def _backoff(retries: int) -> float:
    return min(_BACKOFF_MAX_S, 2.0 ** min(retries, 6)) * random.uniform(0.5, 1.0)


def _timed(what: str, soft_s: float) -> AbstractContextManager[None]:
    """A soft time limit before or in the step, or a step that ran past it (a gate may swallow
    the signal), fails the stage (`worker.pipeline.softlimit.body`)."""
    return softlimit.body(what, soft_s)


def _budget(task_id: str, what: str) -> MemoryCeiling:
    budget_mb = settings().worker_memory_mb

    def record(used: int) -> None:
        reason = (
            f"{what} exhausted its memory budget: {used / 2**20:.0f} MB resident > "
            f"RLHEALTH_WORKER_MEMORY_MB={budget_mb}"
        )
        DeliveryGuard(pipeline().redis, pipeline().names).stopped(task_id, reason)

    return MemoryCeiling(budget_mb, record)


def _delivery(task: Task) -> str:
    """The id the delivery guard counts starts under: a task that replaced another (the second
    look replaces the verdict, keeping its id) counts its own."""
    nesting = int(task.request.get("replaced_task_nesting") or 0)
    return f"{task.request.id}" if not nesting else f"{task.request.id}:replaced-{nesting}"


def _guarded(task: Task, lead: str, what: str, step: Callable[[], T]) -> T:
    request, p, delivery = task.request, pipeline(), _delivery(task)
    soft_s = limits(settings())[task.name][0]
    with _timed(what, soft_s), classified():
        if not p.leases.renew(lead):
            raise Ignore()  # the diagnosis is answered: this task is a late copy
        DeliveryGuard(p.redis, p.names).started(delivery, int(request.retries or 0), what)
        with _budget(delivery, what).watching():
            return step()


def _run(task: Task, lead: str, deadline: float, what: str, step: Callable[[], T]) -> T:
    """Run one step for the diagnosis `lead` (see the module docstring)."""
    try:
        return _guarded(task, lead, what, step)
    except InfrastructureError as exc:
        if time.time() >= deadline:
            raise
        countdown = _backoff(int(task.request.retries or 0))
        # with the broker away too, Celery rejects the task instead: the error callback (or
        # else the lease) sends the diagnosis again
        raise task.retry(exc=exc, countdown=countdown, max_retries=None) from exc


@_task("rlhealth.capture")
def capture(self: Task, event_id: str, evidence_id: str, *, lead: str, deadline: float) -> str:
    """Freeze the event's evidence to S3; returns the evidence id. The only task that probes a
    cluster (with a live backend, within RLHEALTH_CAPTURE_BUDGET_S, which must end before this
    task's soft time limit: `worker.pipeline.capture.budget_misfit`)."""
    step = partial(pipeline().capture, event_id, evidence_id, claim=str(self.request.id))
    try:
        return _run(self, lead, deadline, "capture", step)
    except CaptureBusyError as exc:
        if time.time() >= deadline:
            raise
        raise self.retry(exc=exc, countdown=_BUSY_RETRY_S, max_retries=None) from exc


@_task("rlhealth.gate")
def gate(self: Task, evidence_id: str, name: str, *, lead: str, deadline: float) -> dict[str, Any]:
    """One gate on the frozen evidence; ERROR rather than an exception for broken evidence."""
    return _run(self, lead, deadline, f"gate {name}", partial(pipeline().gate, evidence_id, name))


@_task("rlhealth.verdict")
def verdict(
    self: Task,
    results: list[dict[str, Any]],
    event_id: str,
    evidence_id: str,
    *,
    lead: str,
    deadline: float,
) -> dict[str, Any]:
    """Join the gates into the report, store it once; returns the verdict entry — or, for a KILL
    that rests on stacks, hands the chain over to its second look (`_look_later`)."""
    step = partial(pipeline().plan_verdict, results, event_id, evidence_id)
    plan = _run(self, lead, deadline, "verdict", step)
    wait = plan.get("look_in_s")
    if wait is None:
        return dict(plan["entry"])
    # `replace` raises Ignore: the second look answers in this task's place (eager: its result)
    return cast(
        "dict[str, Any]",
        _look_later(self, results, event_id, evidence_id, float(wait), lead, deadline),
    )


def _look_later(
    task: Task,
    results: list[dict[str, Any]],
    event_id: str,
    evidence_id: str,
    wait_s: float,
    lead: str,
    deadline: float,
) -> Any:
    """Replace the verdict task by the second look, `wait_s` from now: a countdown, so no pool
    slot waits (the worker's main process holds the message until it is due), and the lease is
    extended past the wait first, so the watchdog does not send it again (the heartbeat alone
    does not keep it: tests/integration/test_second_look.py fails without the extension). The
    rest of the chain (publish) and its error callback follow the replacement."""
    with classified():
        pipeline().leases.extend(lead, wait_s)
    look = second_look.si(
        results, event_id, evidence_id,
        scheduled_at=time.time(), lead=lead, deadline=deadline + wait_s,
    )  # fmt: skip
    return task.replace(look.set(countdown=wait_s))


@_task("rlhealth.second_look")
def second_look(
    self: Task,
    results: list[dict[str, Any]],
    event_id: str,
    evidence_id: str,
    *,
    scheduled_at: float,
    lead: str,
    deadline: float,
) -> dict[str, Any]:
    """Look at the job again, settle the verdict with what moved, store it once; the entry."""
    claim = str(self.request.id)
    step = partial(pipeline().second_look, results, event_id, evidence_id, scheduled_at, claim)
    try:
        return _run(self, lead, deadline, "second look", step)
    except CaptureBusyError as exc:  # another delivery is taking it: wait for its freeze
        if time.time() >= deadline:
            raise
        raise self.retry(exc=exc, countdown=_BUSY_RETRY_S, max_retries=None) from exc


@_task("rlhealth.publish")
def publish(
    self: Task, entry: dict[str, Any], job: str, *, lead: str, deadline: float
) -> dict[str, Any]:
    """Put the verdict on the stream and the channel, once."""
    return _run(self, lead, deadline, "publish", partial(pipeline().publisher.publish, entry, job))


@_task("rlhealth.html")
def html(
    self: Task, entry: dict[str, Any], evidence_id: str | None, *, deadline: float
) -> str | None:
    """After publish: the verdict's HTML page beside its JSON report (`ReportShelf.html`); its key.

    The diagnosis is answered already, so no lease is renewed and nothing answers it again: a
    task killed twice fails (the delivery guard), the memory budget applies as to any task,
    infrastructure faults are retried until `deadline`; no error callback is linked."""
    p, delivery, retries = pipeline(), _delivery(self), int(self.request.retries or 0)
    try:
        with softlimit.interruptible(), classified():
            DeliveryGuard(p.redis, p.names).started(delivery, retries, "html")
            with _budget(delivery, "html").watching():
                return p.shelf.html(entry, evidence_id)
    except InfrastructureError as exc:
        if time.time() >= deadline:
            raise
        raise self.retry(exc=exc, countdown=_backoff(retries), max_retries=None) from exc


def draw_later(entry: dict[str, Any], evidence_id: str | None) -> None:
    """Send the `html` task for a verdict answered outside the workflow (an ERROR answer); a
    send that fails is logged: the verdict is out already."""
    try:
        deadline = time.time() + settings().retry_deadline_s
        html.si(entry, evidence_id, deadline=deadline).apply_async()
    except Exception as exc:
        log.warning("the HTML page of %s was not sent: %s", entry.get("event_id"), exc)


# --- the error callback -------------------------------------------------------------------------


def _stage(result: Any) -> str:
    """`capture`, `gate liveness`, `verdict` or `publish`, from a task's stored result."""
    name = str(getattr(result, "name", None) or "a stage").removeprefix("rlhealth.")
    args = list(getattr(result, "args", None) or ())
    return f"gate {args[1]}" if name == "gate" and len(args) > 1 else name


def _cause(result: Any) -> tuple[str, str, BaseException | None]:
    """(the stage that failed, why, the exception), following a chord's failed dependency."""
    exc = result.result if isinstance(result.result, BaseException) else None
    found = _DEPENDENCY.search(str(exc)) if exc is not None else None
    if found:
        inner = app.AsyncResult(found.group(1))
        if isinstance(inner.result, BaseException):
            result, exc = inner, inner.result
    return _stage(result), explain(_stage(result), exc), exc


@_task("rlhealth.fail")
def fail(self: Task, failed_task_id: str, *, lead: str, job: str, deadline: float) -> None:
    """The error callback: answer the diagnosis `lead` ERROR, naming the stage and the cause —
    or send it again when only its frozen evidence was lost."""
    result = app.AsyncResult(failed_task_id)
    if not result.ready() and self.request.retries < _RESULT_WAIT_TRIES:
        raise self.retry(countdown=1, max_retries=None)
    stage, why, exc = _cause(result)
    try:
        with softlimit.interruptible(), classified():
            p = pipeline()
            first = DeliveryGuard(p.redis, p.names).count(str(self.request.id), 0) == 1
            answered = _answer(lead, job, stage, why, exc, read_frozen=first)
    except InfrastructureError as infra:
        if time.time() >= deadline:
            raise
        countdown = _backoff(int(self.request.retries or 0))
        raise self.retry(exc=infra, countdown=countdown, max_retries=None) from infra
    if answered is not None:
        draw_later(answered, _judged_on(lead) if first else None)


def _judged_on(lead: str) -> str:
    """The evidence id the diagnosis `lead` judged (a replay's is the original's); the lead
    itself when its record cannot be read (the answer is out: its page must not fail it)."""
    try:
        return str(pipeline().leases.record(lead).get("evidence") or lead)
    except Exception as exc:
        log.warning("the record of %s could not be read for its HTML page: %s", lead, exc)
        return lead


def _answer(
    lead: str, job: str, stage: str, why: str, exc: BaseException | None, *, read_frozen: bool
) -> dict[str, Any] | None:
    """The entry published for `lead`; None when it was sent again or answered already."""
    first = not int(pipeline().leases.record(lead).get("redispatches") or 0)
    if _recoverable(stage, exc, first=first) and redispatch(lead, why):
        return None
    # a callback whose process died (reading a huge frozen evidence?) answers from the event
    entry = pipeline().publisher.fail(lead, job, why, read_frozen=read_frozen)
    return None if entry is None else entry.model_dump(mode="json")


def _recoverable(stage: str, exc: BaseException | None, *, first: bool = True) -> bool:
    """A failure a new workflow can get past: evidence lost after its capture (captured again),
    a service fault that escaped the retries (Redis away while a result was stored or a message
    sent, a retry the broker could not take), or — on the diagnosis's first run only — a time
    limit (a stage slowed by a loaded machine, or timed from before an outage that kept the
    worker from collecting its result) or a capture that could not wait for another one's
    claim (its retry lost in an outage: seen in the Redis restart drill), on the first run only.
    Faults still there at the deadline are final; a stage past its time limit a second time is
    answered ERROR."""
    if exc is not None and is_time_limit(exc):
        return first
    if isinstance(exc, EvidenceLostError):
        return stage != "capture"  # a capture that lost its event cannot capture again
    if isinstance(exc, Reject):  # its retry could not be sent: the broker was away
        return True
    if isinstance(exc, CaptureBusyError):  # its wait for another capture could not be sent
        return first
    return exc is not None and is_infrastructure(exc) and not isinstance(exc, InfrastructureError)


def redispatch(lead: str, why: str = "") -> bool:
    """Send the diagnosis `lead` again (its lease restarted); False once it has been sent
    again RLHEALTH_REDISPATCH_MAX times, when it should be answered ERROR instead."""
    p = pipeline()
    times = p.leases.take(lead, only_expired=False)
    if times > settings().redispatch_max:
        return False
    if times > 0:  # -1: answered meanwhile, nothing to send
        record = p.leases.record(lead)
        log.warning("diagnosis %s: %s: sending it again (%d)", lead, why, times)
        resend(lead, record.get("job") or "", record.get("evidence") or lead)
    return True


def resend(lead: str, job: str, evidence_id: str) -> None:
    """Send a registered diagnosis again, as a new workflow with a new retry deadline."""
    dispatch(lead, job, evidence_id=evidence_id, register=False)


# --- the workflow -------------------------------------------------------------------------------


def workflow(event_id: str, evidence_id: str, job: str, *, deadline: float) -> Signature:
    """capture → every gate in parallel → verdict → publish, each failing into `fail`; then the
    HTML page, linked to publish outside the chain (a chain's error callback is linked to each
    of its tasks: the page must never answer the diagnosis)."""
    lead = {"lead": event_id, "deadline": deadline}
    on_error = fail.s(lead=event_id, job=job, deadline=deadline + settings().retry_deadline_s)
    gates = group(gate.si(evidence_id, name, **lead) for name in GATE_NAMES)
    announce = publish.s(job, **lead)
    announce.link(html.s(evidence_id, deadline=deadline + settings().retry_deadline_s))
    # the chord's callback is this chain: Celery calls its error callback when a gate fails
    then = chain(verdict.s(event_id, evidence_id, **lead), announce)
    return chain(
        capture.si(event_id, evidence_id, **lead).on_error(on_error.clone()),
        chord(gates, then.on_error(on_error.clone())),
    )


def dispatch(
    event_id: str, job: str, *, evidence_id: str | None = None, register: bool = True
) -> None:
    """Start the workflow of a diagnosis led by `event_id` (on a frozen evidence for a replay).

    `register` records the lead's lease and what a re-send needs; ingest's admission has
    already done so for a coalesced lead, and a re-send keeps the record it has.
    """
    evidence = evidence_id or event_id
    deadline = time.time() + settings().retry_deadline_s
    with classified():
        if register:
            pipeline().leases.register(event_id, job, evidence, _event_json(event_id))
        workflow(event_id, evidence, job, deadline=deadline).apply_async()


def _event_json(event_id: str) -> str:
    try:
        return pipeline().events.load(event_id).model_dump_json(exclude_none=True)
    except EvidenceLostError:
        return ""
