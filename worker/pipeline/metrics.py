"""Fleet metrics for Prometheus: what the workers and ingest did, served by prometheus-client.

Each process serves only what it counts (`serve(port, addr, role)`): a worker's endpoint never
shows ingest's counters as zeros, nor ingest's the worker's.

- the worker: diagnoses started and finished, verdicts by kind and confidence, the alert →
  verdict latency, stage durations, task retries and failures, probes, the log cache, HTML
  pages, dead letters of failed diagnoses;
- ingest: alerts by outcome, coalesced alerts, dead letters of refused alerts, what its
  watchdog did with diagnoses whose lease ran out (sent again, answered ERROR).

Worker metrics come from Celery signals, so the tasks stay thin:
- `task_prerun` / `task_postrun`: diagnoses started (a capture's first try), stage durations
  (capture, each gate by name, verdict, publish; successful runs);
- `task_retry`: retries per task; `task_failure`: tasks that failed for good;
- `worker_process_shutdown`: a prefork child's live values are released.
Where no signal can see, the adapters call a function here in one line: the pipeline for every
verdict it publishes or answers (`verdict_published`: kind, confidence, and the time since the
alert that started the diagnosis was published), ingest for every alert's outcome (started,
attached, reannounced, duplicate, dead-letter; attached and reannounced are the coalesced ones) and
every dead letter by reason, the capture policy for the probes it ran, the log cache for the log
bytes a capture parsed and reused and what became of its S3 copy, the HTML task for every page it
stored (with plots, without them, or none when the report was gone), the coalescer for every
diagnosis it answers on the verdict stream for the first time (`verdict_announced`: by verdict and
the job's cluster).

Bounded label sets are set to zero when a process starts (`initialise_worker`,
`initialise_ingest`): a series that exists before its first event lets `increase()` and `rate()`
count that event, and tells "nothing happened" from "not exported". Ingest also serves the queue
depths read from Redis at scrape time (`worker.pipeline.depth`).

Prefork workers: every pool child is its own process, so values are kept in prometheus-client's
multiprocess mode — one memory-mapped file per process in `PROMETHEUS_MULTIPROC_DIR`, which must be
set (and emptied) before prometheus-client is imported, i.e. before this module is: `rl-health
worker --metrics-port` does that. The main process serves the sum of every
child's files (`serve`), and the counts of a child that died stay counted. A process without that
variable (ingest, `rl-health diagnose`) keeps its values in memory and serves them directly.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final, Literal

from celery import signals
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    multiprocess,
    start_http_server,
    values,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

__all__ = [
    "ALERTS",
    "ALERTS_COALESCED",
    "ALERT_TO_VERDICT",
    "DEAD_LETTERS",
    "DIAGNOSES_FINISHED",
    "DIAGNOSES_STARTED",
    "HTML_REPORTS",
    "LOG_CACHE_BYTES",
    "LOG_CACHE_FILES",
    "LOG_CACHE_SHARED",
    "MULTIPROC_ENV",
    "OWN",
    "PROBES_FAILED",
    "PROBES_RUN",
    "STAGE_SECONDS",
    "TASK_FAILURES",
    "TASK_RETRIES",
    "VERDICTS",
    "VERDICTS_PUBLISHED",
    "WATCHDOG",
    "alert_handled",
    "dead_letter_kind",
    "dead_lettered",
    "html_drawn",
    "initialise_ingest",
    "initialise_worker",
    "log_cache_used",
    "probes_ran",
    "registry_for",
    "serve",
    "served_names",
    "stage_of",
    "verdict_announced",
    "verdict_published",
    "watchdog_acted",
]

MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
_TASK_PREFIX: Final = "rlhealth."
_STAGE_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# alert published → verdict on the stream: a second for a small bundle, minutes with live probes
# and a second look, the retry deadline (30 min) at worst
_LATENCY_BUCKETS: Final = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)
_VERDICT_KINDS: Final = ("KILL", "NO-KILL", "ERROR")
Role = Literal["worker", "ingest"]
# A cluster name comes from the job's bundle (sanitised like its report key): data, not a setting.
# Each process keeps this many names as labels and counts any later one as "other", so a watcher
# that names many clusters cannot grow the series without bound.
_MAX_CLUSTER_LABELS: Final = 32
_OTHER_CLUSTER: Final = "other"

DIAGNOSES_STARTED = Counter(
    "rlhealth_diagnoses_started", "Diagnoses whose capture began (first try of the capture task)."
)
DIAGNOSES_FINISHED = Counter(
    "rlhealth_diagnoses_finished",
    "Diagnoses whose verdict was published to the stream (an ERROR answer included).",
)
VERDICTS = Counter(
    "rlhealth_verdicts",
    "Verdicts published by this process, by kind and confidence.",
    ["verdict", "confidence"],
)
ALERT_TO_VERDICT = Histogram(
    "rlhealth_alert_to_verdict_seconds",
    "From the publication of the alert that started a diagnosis to its verdict on the stream, "
    "by verdict (the watcher's clock against this process's: a skew shows here).",
    ["verdict"],
    buckets=_LATENCY_BUCKETS,
)
STAGE_SECONDS = Histogram(
    "rlhealth_stage_seconds",
    "Wall time of a pipeline stage that succeeded: capture, each gate by name, verdict, publish, "
    "html (the page drawn after publish).",
    ["stage"],
    buckets=_STAGE_BUCKETS,
)
TASK_RETRIES = Counter("rlhealth_task_retries", "Task retries (infrastructure faults).", ["task"])
TASK_FAILURES = Counter("rlhealth_task_failures", "Tasks that failed for good.", ["task"])
ALERTS = Counter(
    "rlhealth_alerts",
    "Alerts handled by ingest, by outcome (started, attached, reannounced, duplicate, "
    "dead-letter).",
    ["outcome"],
)
ALERTS_COALESCED = Counter(
    "rlhealth_alerts_coalesced",
    "Alerts answered by a diagnosis they did not start (attached or reannounced).",
)
DEAD_LETTERS = Counter(
    "rlhealth_dead_letters", "Alerts refused to the dead-letter stream, by reason.", ["reason"]
)
VERDICTS_PUBLISHED = Counter(
    "rlhealth_verdicts_published",
    "Diagnoses answered on the verdict stream (the first announcement of each), by verdict and "
    "the job's cluster: the worker's verdicts and the ERROR answers of failed diagnoses; a "
    "cooldown verdict announced again is not counted.",
    ["verdict", "cluster"],
)
WATCHDOG = Counter(
    "rlhealth_watchdog_actions",
    "Diagnoses whose lease ran out, by what ingest's watchdog did: resent (sent again), "
    "answered_error (sent again too often: answered ERROR by ingest itself).",
    ["action"],
)
PROBES_RUN = Counter("rlhealth_probes_run", "Live probe commands run, by backend.", ["backend"])
PROBES_FAILED = Counter(
    "rlhealth_probes_failed", "Live probes that failed or timed out, by backend.", ["backend"]
)

LOG_CACHE_FILES = Counter(
    "rlhealth_log_cache_files",
    "Log files a capture read, by how: resumed (from a cache entry) or whole.",
    ["how"],
)
LOG_CACHE_BYTES = Counter(
    "rlhealth_log_cache_bytes",
    "Log bytes of the files a capture read, by kind: parsed, or reused from the cache.",
    ["kind"],
)
LOG_CACHE_SHARED = Counter(
    "rlhealth_log_cache_shared",
    "The S3 copy of job log caches, by outcome: downloaded, uploaded, ignored (failed its "
    "checks), withheld (an entry held text the redactor hides).",
    ["outcome"],
)
HTML_REPORTS = Counter(
    "rlhealth_html_reports",
    "HTML pages of published verdicts, by outcome: drawn (with plots), without_plots (the plots "
    "or the evidence failed: the page says so), report_gone (no longer kept: no page).",
    ["outcome"],
)

_COALESCED: Final = frozenset({"attached", "reannounced"})
_DEAD_LETTER_KINDS: Final = (
    # first match wins: a bounded label set, never the free-text reason
    ("malformed_json", re.compile(r"malformed JSON")),
    ("no_event_field", re.compile(r"^no '.*' field")),
    ("not_an_object", re.compile(r"not an object")),
    ("outside_bundle_root", re.compile(r"escapes the bundle root")),
    ("missing_directory", re.compile(r"does not exist under the bundle root")),
    ("invalid_event", re.compile(r"^invalid event")),
    ("id_archived_already", re.compile(r"is archived already")),
    ("ingest_failed", re.compile(r"^ingest failed")),
    ("diagnosis_failed", re.compile(r"^diagnosis failed")),  # the worker's, after a failed stage
)
_started: dict[str, float] = {}  # task id -> monotonic start, in the process that runs it
_clusters: set[str] = set()  # the cluster labels this process has used
# the label values a process counts, set to zero at its start
_WORKER_TASKS: Final = ("capture", "gate", "verdict", "second_look", "publish", "html", "fail")
_BACKENDS: Final = ("iris", "kubernetes", "slurm", "local")
_OUTCOMES: Final = ("started", "attached", "reannounced", "duplicate", "dead-letter")


OWN: Final[dict[Role, tuple[MetricWrapperBase, ...]]] = {
    "worker": (
        DIAGNOSES_STARTED,
        DIAGNOSES_FINISHED,
        VERDICTS,
        ALERT_TO_VERDICT,
        VERDICTS_PUBLISHED,
        STAGE_SECONDS,
        TASK_RETRIES,
        TASK_FAILURES,
        DEAD_LETTERS,
        PROBES_RUN,
        PROBES_FAILED,
        LOG_CACHE_FILES,
        LOG_CACHE_BYTES,
        LOG_CACHE_SHARED,
        HTML_REPORTS,
    ),
    # the watchdog's ERROR answers are announced verdicts too
    "ingest": (ALERTS, ALERTS_COALESCED, DEAD_LETTERS, WATCHDOG, VERDICTS_PUBLISHED),
}
"""The metrics each process counts, and so serves."""


# --- hooks the adapters call ----------------------------------------------------------------------


def verdict_published(verdict: str, confidence: str, latency_s: float | None) -> None:
    """This process published a verdict (or answered a diagnosis ERROR); `latency_s` since the
    alert that started it was published (None: unknown; a negative one, a skewed clock, is not
    observed)."""
    DIAGNOSES_FINISHED.inc()
    VERDICTS.labels(verdict=verdict, confidence=confidence).inc()
    if latency_s is not None and latency_s >= 0:
        ALERT_TO_VERDICT.labels(verdict=verdict).observe(latency_s)


def _cluster_label(cluster: str | None) -> str:
    """`cluster` as a label, or "other" once this process has used its share of names."""
    name = cluster or "unknown-cluster"
    if name in _clusters:
        return name
    if len(_clusters) >= _MAX_CLUSTER_LABELS:
        return _OTHER_CLUSTER
    _clusters.add(name)
    return name


def verdict_announced(verdict: str, cluster: str | None) -> None:
    """A diagnosis was answered on the verdict stream for the first time (its latency is
    `verdict_published`'s)."""
    VERDICTS_PUBLISHED.labels(verdict=verdict, cluster=_cluster_label(cluster)).inc()


def _zero(counter: Counter, label: str, values: Iterable[str]) -> None:
    for value in values:
        counter.labels(**{label: value})


def initialise_worker() -> None:
    """The worker's bounded series at zero: retries and failures by task, probes by backend."""
    for counter in (TASK_RETRIES, TASK_FAILURES):
        _zero(counter, "task", _WORKER_TASKS)
    for counter in (PROBES_RUN, PROBES_FAILED):
        _zero(counter, "backend", _BACKENDS)


def initialise_ingest() -> None:
    """Ingest's bounded series at zero: alerts by outcome, dead letters by reason."""
    _zero(ALERTS, "outcome", _OUTCOMES)
    _zero(DEAD_LETTERS, "reason", [kind for kind, _ in _DEAD_LETTER_KINDS] + ["other"])


def alert_handled(outcome: str) -> None:
    """Ingest handled one alert with this outcome."""
    ALERTS.labels(outcome=outcome).inc()
    if outcome in _COALESCED:
        ALERTS_COALESCED.inc()


def dead_letter_kind(reason: str) -> str:
    """The bounded label of a dead-letter reason."""
    return next((kind for kind, pattern in _DEAD_LETTER_KINDS if pattern.search(reason)), "other")


def dead_lettered(reason: str) -> None:
    """Ingest refused one alert to the dead-letter stream."""
    DEAD_LETTERS.labels(reason=dead_letter_kind(reason)).inc()


def probes_ran(backend: str, exit_codes: Sequence[int | None]) -> None:
    """The capture policy ran probe commands through `backend` with these exit codes (None: timed
    out); every non-zero or missing code is a failed probe."""
    PROBES_RUN.labels(backend=backend).inc(len(exit_codes))
    PROBES_FAILED.labels(backend=backend).inc(sum(1 for code in exit_codes if code != 0))


def log_cache_used(
    resumed: int, whole: int, parsed: int, reused: int, shared: Sequence[str] = ()
) -> None:
    """A capture read `resumed` log files from a cache entry and `whole` files from their start,
    parsing `parsed` bytes and reusing `reused`; `shared` names what happened to the S3 copy."""
    LOG_CACHE_FILES.labels(how="resumed").inc(resumed)
    LOG_CACHE_FILES.labels(how="whole").inc(whole)
    LOG_CACHE_BYTES.labels(kind="parsed").inc(parsed)
    LOG_CACHE_BYTES.labels(kind="reused").inc(reused)
    for outcome in shared:
        LOG_CACHE_SHARED.labels(outcome=outcome).inc()


def watchdog_acted(action: str) -> None:
    """Ingest's watchdog sent a diagnosis again (`resent`) or answered it ERROR
    (`answered_error`)."""
    WATCHDOG.labels(action=action).inc()


def html_drawn(outcome: str) -> None:
    """The HTML task stored a page (`drawn`, `without_plots`) or could not (`report_gone`)."""
    HTML_REPORTS.labels(outcome=outcome).inc()


# --- Celery signals -------------------------------------------------------------------------------


def stage_of(
    task_name: str, args: Sequence[Any] | None, kwargs: dict[str, Any] | None
) -> str | None:
    """The stage label of a task run: the gate's name for `rlhealth.gate`, else the task's."""
    if not task_name.startswith(_TASK_PREFIX):
        return None
    stage = task_name.removeprefix(_TASK_PREFIX)
    if stage != "gate":
        return stage
    name = (kwargs or {}).get("name") or (args[1] if args and len(args) > 1 else None)
    return str(name) if name else "gate"


def _task_started(task_id: str, task: Any, **_: Any) -> None:
    _started[task_id] = time.monotonic()
    if task.name == f"{_TASK_PREFIX}capture" and not getattr(task.request, "retries", 0):
        DIAGNOSES_STARTED.inc()


def _task_finished(
    task_id: str,
    task: Any,
    args: Sequence[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    state: str | None = None,
    **_: Any,
) -> None:
    began = _started.pop(task_id, None)
    stage = stage_of(task.name, args, kwargs)
    if stage is None or state != "SUCCESS":
        return
    if began is not None:
        STAGE_SECONDS.labels(stage=stage).observe(time.monotonic() - began)


def _task_retried(sender: Any = None, **_: Any) -> None:
    name = getattr(sender, "name", None)
    if name and name.startswith(_TASK_PREFIX):
        TASK_RETRIES.labels(task=name.removeprefix(_TASK_PREFIX)).inc()


def _task_failed(sender: Any = None, **_: Any) -> None:
    name = getattr(sender, "name", None)
    if name and name.startswith(_TASK_PREFIX):
        TASK_FAILURES.labels(task=name.removeprefix(_TASK_PREFIX)).inc()


def _child_gone(pid: int | None = None, **_: Any) -> None:
    if os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(pid or os.getpid())  # type: ignore[no-untyped-call]


def connect_signals() -> None:
    """Count tasks from now on (the Celery app's factory calls this: `make_app`). Connecting
    again adds nothing: Celery keys a receiver by its identity. Strong references: these handlers
    are module functions, but nothing else needs to hold them."""
    signals.task_prerun.connect(_task_started, weak=False)
    signals.task_postrun.connect(_task_finished, weak=False)
    signals.task_retry.connect(_task_retried, weak=False)
    signals.task_failure.connect(_task_failed, weak=False)
    signals.worker_process_shutdown.connect(_child_gone, weak=False)


# --- serving --------------------------------------------------------------------------------------


def _multiprocess_values() -> bool:
    return values.ValueClass is not values.MutexValue


def served_names(role: Role) -> frozenset[str]:
    """The metric family names a process of `role` serves."""
    return frozenset(family.name for metric in OWN[role] for family in metric.describe())


class _Own(Collector):
    """The families of `source` this process counts: every `rlhealth_*` family of another role
    is left out (prometheus-client's own process and runtime families stay)."""

    def __init__(self, source: Any, names: frozenset[str]) -> None:
        self.source = source
        self.names = names

    def collect(self) -> Iterator[Any]:
        for family in self.source.collect():
            if family.name in self.names or not family.name.startswith("rlhealth_"):
                yield family


def _zeros(role: Role) -> None:
    """The labels a rate is taken over show from the start, at zero: each verdict kind's
    latency and `initialise_worker` (the worker), each watchdog action and `initialise_ingest`
    (ingest)."""
    if role == "worker":
        for kind in _VERDICT_KINDS:
            ALERT_TO_VERDICT.labels(verdict=kind)
        initialise_worker()
    else:
        for action in ("resent", "answered_error"):
            WATCHDOG.labels(action=action)
        initialise_ingest()


def registry_for(role: Role, extra: Sequence[Collector] = ()) -> CollectorRegistry:
    """What a process of `role` serves: the metrics it counts (`OWN`), summed over every process
    sharing the multiprocess directory when there is one, else this process's own values; and
    the `extra` collectors read at scrape time (ingest's queue depths)."""
    names = served_names(role)
    registry = CollectorRegistry()
    if os.environ.get(MULTIPROC_ENV):
        if not _multiprocess_values():
            raise RuntimeError(
                f"{MULTIPROC_ENV} was set after prometheus-client was imported: "
                "child processes' metrics would be lost"
            )
        every = CollectorRegistry()
        multiprocess.MultiProcessCollector(every)  # type: ignore[no-untyped-call]
        registry.register(_Own(every, names))
    else:
        registry.register(_Own(REGISTRY, names))
    for collector in extra:
        registry.register(collector)
    _zeros(role)
    return registry


def serve(
    port: int, addr: str = "127.0.0.1", role: Role = "worker", extra: Sequence[Collector] = ()
) -> None:
    """Serve /metrics of `role` (`registry_for`) on `addr:port` in a background thread
    (RLHEALTH_METRICS_ADDR; loopback unless the operator opens it to a scraper elsewhere)."""
    start_http_server(port, addr, registry=registry_for(role, extra))
