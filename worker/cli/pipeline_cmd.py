"""`rl-health alert | ingest | worker | verdicts | replay`: the pipeline's commands
(docs/interface.md).

Connections come from settings: RLHEALTH_REDIS_URL, RLHEALTH_S3_ENDPOINT_URL, RLHEALTH_S3_BUCKET,
RLHEALTH_S3_PREFIX, RLHEALTH_BUNDLE_ROOT, RLHEALTH_STREAM_PREFIX, RLHEALTH_COALESCE_S. Every role
that signs or reads verdicts (ingest, worker, verdicts, replay) needs the verdict key
(RLHEALTH_VERDICT_KEY or RLHEALTH_VERDICT_KEY_FILE) and exits 2 naming it when it is missing;
`alert` only publishes an event and needs none (with `--wait` it verifies the verdict it prints,
so it needs the key too). Metrics are served on RLHEALTH_METRICS_ADDR.

Every command reaches Redis (and S3, where it uses it) before anything else
(`worker.cli.dependencies`): one that is down, refuses the credentials or is named by a
malformed setting stops the command within seconds with one line and exit 2.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar

import click

from shared.models import Event, Mode, VerdictEntry
from shared.redact import escape_controls
from shared.settings import Settings
from worker.cli.dependencies import reach_redis, reach_s3, redis_address, s3_address
from worker.cli.options import ISO_DATETIME, load_settings, load_verdict_keys

if TYPE_CHECKING:
    from shared.alerts import Refusals
    from shared.signing import KeyRing
    from shared.supervisor import VerdictReader
    from worker.pipeline.steps import Pipeline

__all__ = [
    "alert_command",
    "ingest_command",
    "replay_command",
    "verdicts_command",
    "worker_command",
]

MODES = [m.value for m in Mode if m is not Mode.UNDECLARED]
WAIT_S = 120.0  # `alert --wait` without a value: a diagnosis with live probes and a second look
log = logging.getLogger("rlhealth.cli")
FC = TypeVar("FC", bound=Callable[..., Any] | click.Command)
# the names prometheus-client's multiprocess mode gives its files: `<type>_<pid>.db`
_METRIC_FILE = re.compile(r"^(?:counter|histogram|summary|gauge_[a-z]+)_\d+\.db$")


def _pipeline(settings: Settings) -> Pipeline:
    """The adapters of a command that reads and writes both Redis and S3, each reached first
    (exit 2 with one line when one cannot be; a local S3 gets its bucket on first use)."""
    from worker.pipeline.steps import Pipeline

    redis = reach_redis(settings)
    return Pipeline(settings, reach_s3(settings), redis)


def _fail(message: str, code: int = 2) -> NoReturn:
    click.echo(f"rl-health: {message}", err=True)
    sys.exit(code)


def _entry_line(entry: VerdictEntry, as_json: bool) -> str:
    """One verdict as a line; no value can carry a terminal escape (JSON: every non-ASCII and
    control character escaped; text: controls written as visible escapes)."""
    data = entry.model_dump(mode="json")
    if as_json:
        return json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    more = f" (+{len(entry.event_ids) - 1} coalesced)" if len(entry.event_ids) > 1 else ""
    job, event, uri = (escape_controls(data[k]) for k in ("job_id", "event_id", "report_uri"))
    return (
        f"{data['captured_at']}  {entry.verdict.value:<7} "
        f"{entry.confidence.value:<6} {job}  {event}{more}  {uri}"
    )


def _refused(refusal: object) -> None:
    """A refused entry on stderr, one line (`REFUSED <entry id>: <reason>`, escaped)."""
    click.echo(str(refusal), err=True)


def _metrics_port_option(what: str) -> Callable[[FC], FC]:
    return click.option(
        "--metrics-port",
        type=click.IntRange(1, 65535),
        help=f"Serve Prometheus metrics of {what} on this port (/metrics).",
    )


def _health_port_option(what: str) -> Callable[[FC], FC]:
    return click.option(
        "--health-port",
        type=click.IntRange(1, 65535),
        help=f"Answer GET /healthz and /readyz on this port: 200 while {what} goes round "
        "(RLHEALTH_METRICS_ADDR; for the kubelet's probes).",
    )


def _serve_health(port: int | None, settings: Settings) -> None:
    """Start the health endpoint (worker.pipeline.health): stale after a lease without a beat."""
    if port is None:
        return
    import redis

    from worker.pipeline.health import LIVENESS, redis_away, serve_health

    LIVENESS.stale_after_s = max(60.0, settings.lease_s)
    ping = redis.Redis.from_url(settings.redis_url, socket_timeout=1, socket_connect_timeout=1)
    LIVENESS.excuse = redis_away(ping)
    try:
        serve_health(port, settings.metrics_addr)
    except OSError as exc:
        _fail(f"--health-port {port} on {settings.metrics_addr}: {exc.strerror or exc}")


def _prepare_metrics_dir(directory: Path | None) -> Path:
    """Empty the pool's metric directory of the files prometheus-client writes there (counts of
    an earlier run must not be added to this one's) — nothing else in it, never through a
    symlink — and name it in PROMETHEUS_MULTIPROC_DIR, before prometheus-client is imported (it
    reads the variable once, at its import)."""
    if "prometheus_client" in sys.modules:
        _fail("prometheus-client was imported before its multiprocess directory was set", 1)
    target = directory or Path(tempfile.mkdtemp(prefix="rlhealth-metrics-"))
    try:
        target.mkdir(parents=True, exist_ok=True)
        with os.scandir(target) as entries:
            for entry in entries:
                if _METRIC_FILE.match(entry.name) and entry.is_file(follow_symlinks=False):
                    Path(entry.path).unlink()
    except OSError as exc:
        _fail(f"--metrics-dir {target} is not a usable directory: {exc.strerror or exc}")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(target)
    return target


# --- alert ----------------------------------------------------------------------------------------


@click.command("alert")
@click.argument("job_dir")
@click.option("--reason", default="", help="Why the watcher suspects the job.")
@click.option("--mode", type=click.Choice(MODES), help="Declare the mode explicitly.")
@click.option("--probes", help="A recorded probe directory under the bundle root.")
@click.option("--now", type=ISO_DATETIME, help="Judge the evidence as of this time.")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=1),
    is_flag=False,
    flag_value=WAIT_S,
    default=None,
    metavar="[SECONDS]",
    help=f"Then wait up to SECONDS (default {WAIT_S:g}) for this event's verdict and print it; "
    "exit 1 when none came, or when ingest refused the alert.",
)
@click.option("--json", "as_json", is_flag=True, help="With --wait: the verdict entry as JSON.")
def alert_command(
    job_dir: str,
    reason: str,
    mode: str | None,
    probes: str | None,
    now: datetime | None,
    wait_s: float | None,
    as_json: bool,
) -> None:
    """Publish a suspect-job event for JOB_DIR and print its event id.

    JOB_DIR is resolved against RLHEALTH_BUNDLE_ROOT when relative, and must stay inside it.
    With --wait the verdict stream is read from before the alert is published, so a verdict
    that comes quickly is not missed; only a verdict signed with the verdict key is printed.
    """
    from shared.alerts import publish_alert

    settings = load_settings()
    _check_alert_paths(settings, job_dir, probes)
    keys = load_verdict_keys(settings) if wait_s is not None else None
    client = reach_redis(settings)
    watch = _answer_watch(client, settings, keys) if keys is not None else None
    kwargs: dict[str, Any] = {"reason": reason, "mode": mode, "probes": probes, "now": now}
    event_id = publish_alert(client, job_dir, settings=settings, **kwargs)
    click.echo(event_id)
    if watch is not None and wait_s is not None:
        click.echo(_entry_line(_await_verdict(*watch, event_id, wait_s), as_json))


def _check_alert_paths(settings: Settings, job_dir: str, probes: str | None) -> None:
    from shared.alerts import OutsideBundleRootError, confine

    if not job_dir.strip():
        _fail("JOB_DIR is empty: name a job directory under the bundle root")
    try:
        for path in (job_dir, probes):
            if path and not (settings.bundle_root / confine(settings.bundle_root, path)).is_dir():
                _fail(f"{path} is not a directory under the bundle root {settings.bundle_root}")
    except OutsideBundleRootError as exc:
        _fail(str(exc))
    except (OSError, ValueError) as exc:  # a NUL byte, a name too long, a loop of links
        _fail(f"{job_dir!r} is not a usable path: {exc}")


def _answer_watch(client: Any, settings: Settings, keys: KeyRing) -> tuple[VerdictReader, Refusals]:
    """A verdict reader anchored at the newest entry and a watch on the dead-letter stream,
    both made before the alert is published: nothing said about it can come before them."""
    from shared.alerts import Refusals
    from shared.supervisor import VerdictReader

    reader = VerdictReader(client, settings, keys=keys, on_refused=_refused, reader="cli")
    reader.anchor()
    return reader, Refusals(client, settings)


def _await_verdict(
    reader: VerdictReader, refusals: Refusals, event_id: str, wait_s: float
) -> VerdictEntry:
    """The first verified verdict answering `event_id` within `wait_s`; exit 1 (one line) on
    time-out or when ingest dead-lettered the alert."""
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        for entry in reader.follow(timeout_s=min(left, 2.0)):
            if event_id in entry.event_ids:
                return entry
        refused = refusals.reason(event_id)
        if refused is not None:
            _fail(
                f"alert {event_id} was refused (dead-letter stream): {escape_controls(refused)}", 1
            )
    _fail(
        f"no verdict for {event_id} within {wait_s:g} s: are `rl-health worker` and "
        "`rl-health ingest` running? (`rl-health verdicts --event ID` asks again later)",
        1,
    )


# --- ingest ---------------------------------------------------------------------------------------


@click.command("ingest")
@click.option("--once", is_flag=True, help="Handle the alerts waiting now, then exit.")
@click.option("--max-events", type=click.IntRange(min=1), help="Exit after this many alerts.")
@click.option("--consumer", help="Consumer name in the `ingest` group (default: the host name).")
@_metrics_port_option(
    "ingest (alerts by outcome, coalesced, dead letters by reason, queue depths read from Redis)"
)
@_health_port_option("the read loop")
def ingest_command(
    once: bool,
    max_events: int | None,
    consumer: str | None,
    metrics_port: int | None,
    health_port: int | None,
) -> None:
    """Consume the alert stream and start one diagnosis per job in need (until interrupted)."""
    from functools import partial

    settings = load_settings()  # before the app module reads them
    load_verdict_keys(settings)  # ingest signs re-announced verdicts and ERROR answers
    pipeline = _pipeline(settings)  # Redis and S3 reached first: exit 2 with one line if not
    from worker.pipeline.ingest import Ingest
    from worker.pipeline.logsetup import configure_logging
    from worker.pipeline.tasks import dispatch, draw_later, resend
    from worker.pipeline.watchdog import Watchdog

    if metrics_port is not None:
        from shared.streams import StreamNames
        from worker.pipeline.depth import QueueDepth
        from worker.pipeline.metrics import serve

        depth = QueueDepth.from_url(settings.redis_url, StreamNames(settings.stream_prefix))
        serve(metrics_port, settings.metrics_addr, role="ingest", extra=[depth])
    _serve_health(health_port, settings)

    configure_logging(logging.DEBUG if _debugging() else logging.INFO, fmt=settings.log_format)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    started = partial(dispatch, register=False)  # the admission registered the lead
    watchdog = Watchdog(pipeline, resend, draw=draw_later)
    ingest = Ingest(pipeline, started, consumer=consumer, watchdog=watchdog)
    log.info(
        "ingest started: consumer %s reads %s (group ingest) at Redis %s; events archived in "
        "S3 %s; bundle root %s%s",
        ingest.consumer,
        pipeline.names.alerts,
        redis_address(settings.redis_url),
        s3_address(settings),
        settings.bundle_root,
        f"; metrics on {settings.metrics_addr}:{metrics_port}" if metrics_port else "",
    )
    try:
        handled = ingest.run(
            stop=lambda: bool(stopping),
            max_events=max_events,
            until_idle=once,
            stop_on_fault=once,  # `--once` reports an outage (exit 2) instead of waiting it out
        )
    except KeyboardInterrupt:
        handled = sum(ingest.outcomes.values())
    summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(ingest.outcomes.items()))
    click.echo(f"ingest: {handled} alert(s) handled ({summary or 'none'})", err=True)


# --- worker ---------------------------------------------------------------------------------------


@click.command("worker")
@click.option("--concurrency", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--pool",
    type=click.Choice(["prefork", "solo", "threads"]),
    default="prefork",
    show_default=True,
)
@click.option("--loglevel", default="INFO", show_default=True)
@click.option("--hostname", help="Celery node name (default: rlhealth@<host>).")
@_metrics_port_option("the whole pool (diagnoses, verdicts, stage durations, retries)")
@click.option(
    "--metrics-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Where pool processes keep their metric files (the files they wrote there are removed "
    "at start, nothing else; default: a new temporary directory).",
)
@_health_port_option("the main process's event loop")
def worker_command(
    concurrency: int,
    pool: str,
    loglevel: str,
    hostname: str | None,
    metrics_port: int | None,
    metrics_dir: Path | None,
    health_port: int | None,
) -> None:
    """Start a Celery worker running the diagnosis tasks."""
    settings = load_settings()  # before the app module reads them
    load_verdict_keys(settings)  # the worker signs every verdict and stored report
    if metrics_port is not None:
        _prepare_metrics_dir(metrics_dir)  # before the tasks import prometheus-client
    _check_live_capture(settings)  # the settings first: a refused one names itself
    _check_cache_dir(settings)
    reach_redis(settings)  # the broker: exit 2 with one line when it cannot be reached
    reach_s3(settings)  # and S3 (a local S3 gets its bucket before the first task)
    import worker.pipeline.tasks  # noqa: F401 - registers the tasks
    from shared.streams import StreamNames
    from worker.pipeline.app import app

    _celery_logs_ours(loglevel, redis_address(settings.redis_url), settings.log_format)

    if metrics_port is not None:
        from worker.pipeline.metrics import serve

        # in this main process: every child's sum, the worker's metrics only
        serve(metrics_port, settings.metrics_addr, role="worker")
    _serve_health(health_port, settings)

    argv = [
        "worker",
        f"--concurrency={concurrency}",
        f"--pool={pool}",
        f"--loglevel={loglevel}",
        f"--queues={StreamNames(settings.stream_prefix).task_queue}",
        f"--hostname={hostname or 'rlhealth@%h'}",
    ]
    app.worker_main(argv)


def _debugging() -> bool:
    from worker.cli.options import debugging

    return debugging()


def _celery_logs_ours(loglevel: str, broker: str, fmt: Literal["text", "json"]) -> None:
    """Celery configures no logging of its own: ours (`worker.pipeline.logsetup`, text or
    JSON, the event id on every line, task results at DEBUG) in this process and its pool."""
    from celery import signals

    from worker.pipeline.logsetup import configure_logging

    level = "DEBUG" if _debugging() else loglevel

    def ours(**_: Any) -> None:
        configure_logging(level, broker=broker, fmt=fmt)

    signals.setup_logging.connect(ours, weak=False)
    configure_logging(level, broker=broker, fmt=fmt)


def _check_cache_dir(settings: Settings) -> None:
    """The worker's cache directory must be its own (`shared.safefs`): exit 2 otherwise, before
    a task could read an entry another user put there."""
    from shared.safefs import UnsafeDirectoryError, owned_directory

    try:
        owned_directory(settings.cache_root())
    except UnsafeDirectoryError as exc:
        _fail(f"cache directory (RLHEALTH_CACHE_DIR): {exc}")


def _check_live_capture(settings: Settings) -> None:
    """With a live backend enabled: the capture budget must fit the capture task's time limits
    and the cluster tools must resolve, before the worker takes a task (exit 2 otherwise)."""
    from shared.redact import clean
    from worker.pipeline.capture import CaptureSettingsError, LiveCapture

    if not settings.enabled_backends():
        return
    try:
        LiveCapture.start(settings)
    except CaptureSettingsError as exc:
        _fail(f"live capture settings refused: {clean(str(exc))}")


# --- verdicts -------------------------------------------------------------------------------------


@click.command("verdicts")
@click.option("--follow", is_flag=True, help="Wait for new verdicts and print them as they come.")
@click.option("--count", type=click.IntRange(min=1), help="Stop after N verdicts (default: 10).")
@click.option("--timeout", type=click.FloatRange(min=0), help="Stop following after SECONDS.")
@click.option("--json", "as_json", is_flag=True, help="One verdict entry per line, as JSON.")
@click.option("--group", help="Read as this consumer group: each verdict once per group, acked.")
@click.option(
    "--channel",
    is_flag=True,
    help="With --follow: listen on the pub/sub channel instead of the stream (live only: "
    "verdicts published while nobody listened are not shown; the stream keeps them).",
)
@click.option(
    "--event",
    "event_id",
    metavar="ID",
    help="Print the verdict answering this event id (exit 1 when there is none yet); with "
    "--follow, wait for it up to --timeout.",
)
def verdicts_command(
    follow: bool,
    count: int | None,
    timeout: float | None,
    as_json: bool,
    group: str | None,
    channel: bool,
    event_id: str | None,
) -> None:
    """Read verdicts (the supervisor side): the latest ones, or new ones with --follow.

    Only verdicts signed with the verdict key are printed; any other entry is reported on
    stderr as `REFUSED <entry id>: <reason>` (and acked, in a --group). On a terminal,
    --follow without --json shows a live table; piped, one line per verdict.
    """
    from worker.cli.terminal import is_terminal, live_verdicts

    if channel and (group or not follow):
        raise click.UsageError("--channel needs --follow and cannot be read as a --group")
    settings = load_settings()
    if event_id is not None:
        if group or channel:
            raise click.UsageError("--event reads the stream itself: no --group or --channel")
        _one_verdict(settings, event_id, timeout if follow else None, as_json)
        return
    entries = _verdict_entries(settings, follow, count, timeout, group, channel)
    if follow and not as_json and is_terminal(sys.stdout):
        live_verdicts(entries)
        return
    for entry in entries:
        click.echo(_entry_line(entry, as_json))


def _one_verdict(settings: Settings, event_id: str, wait_s: float | None, as_json: bool) -> None:
    """The verdict answering `event_id`, from the stream as it is (and, with `wait_s`, as it
    grows); exit 1 with one line when there is none."""
    from shared.supervisor import VerdictReader

    keys = load_verdict_keys(settings)
    reader = VerdictReader(
        reach_redis(settings), settings, keys=keys, on_refused=_refused, reader="cli"
    )
    reader.anchor()  # before the search: a verdict published meanwhile is followed, not missed
    found = reader.find(event_id)
    if found is None and wait_s:
        found = next((e for e in reader.follow(timeout_s=wait_s) if event_id in e.event_ids), None)
    if found is None:
        waited = f" within {wait_s:g} s" if wait_s else " yet"
        _fail(f"no verdict for {escape_controls(event_id)}{waited}", 1)
    click.echo(_entry_line(found, as_json))


def _verdict_entries(
    settings: Settings,
    follow: bool,
    count: int | None,
    timeout: float | None,
    group: str | None,
    channel: bool,
) -> Iterator[VerdictEntry]:
    """The entries `verdicts` prints: from the channel, the stream (alone or as a group)."""
    from shared.supervisor import VerdictReader, follow_channel

    keys = load_verdict_keys(settings)
    client = reach_redis(settings)
    if channel:
        messages = follow_channel(
            client, settings, keys=keys, timeout_s=timeout, on_refused=_refused,
            reader="cli",
        )  # fmt: skip
        return islice(messages, count)
    reader = VerdictReader(
        client, settings, keys=keys, group=group, on_refused=_refused, reader="cli"
    )
    if follow or group:
        if group and not follow and timeout is None:
            timeout = 1.0  # a group read without --follow takes what is waiting
        return reader.follow(count=count, timeout_s=timeout)
    return iter(reader.recent(count or 10))


# --- replay ---------------------------------------------------------------------------------------


def _replay_event(pipeline: Pipeline, original: Event, fresh: bool) -> tuple[Event, str | None]:
    """The replay event and the evidence id it judges (None: a fresh capture)."""
    from shared.alerts import new_event_id
    from worker.pipeline.steps import frozen_now
    from worker.pipeline.store import ObjectMissingError

    evidence_id, now = None, None
    if not fresh:
        lead = pipeline.redis.get(pipeline.names.event(original.event_id))
        evidence_id = lead.decode() if lead else original.event_id
        try:
            now = frozen_now(pipeline.store, evidence_id)
        except ObjectMissingError:
            _fail(f"no frozen evidence for {original.event_id}; try --fresh")
    how = "with a fresh capture" if fresh else f"on the frozen evidence of {evidence_id}"
    event = Event(
        event_id=new_event_id(),
        job_dir=original.job_dir,
        reason=f"replay of {original.event_id} {how}",
        published_at=datetime.now(UTC),
        mode=original.mode,
        probes=original.probes,
        now=now,
        replay_of=original.event_id,
        backend=original.backend,  # a --fresh capture chooses the backend the original chose
    )
    return event, evidence_id


@click.command("replay")
@click.argument("event_id")
@click.option(
    "--fresh",
    is_flag=True,
    help="Capture the job again instead (the bundle, and live probes when a backend is set).",
)
@click.option("--timeout", type=click.FloatRange(min=1), default=120, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict entry as JSON.")
def replay_command(event_id: str, fresh: bool, timeout: float, as_json: bool) -> None:
    """Re-diagnose an archived event, on its frozen evidence unless --fresh; prints the verdict.

    Without --fresh nothing is probed: the verdict is reproduced offline from the evidence (and
    the live probes) frozen by the original capture. --fresh captures the job again, probing it
    live when the worker's backend (or the original event's) calls for it.

    The replay is an event of its own (with `replay_of`), archived and answered on the verdict
    stream like any other, but never coalesced with the job's live alerts.
    """
    settings = load_settings()  # before the app module reads them
    keys = load_verdict_keys(settings)
    from shared.alerts import confine
    from shared.supervisor import VerdictReader
    from worker.pipeline.failures import EvidenceLostError
    from worker.pipeline.store import ObjectMissingError, UnsafeKeyError
    from worker.pipeline.tasks import dispatch

    pipeline = _pipeline(settings)
    try:
        original = pipeline.events.load(event_id)
    except (ObjectMissingError, EvidenceLostError, UnsafeKeyError):
        _fail(f"no archived event {event_id}")
    replay, evidence_id = _replay_event(pipeline, original, fresh)
    reader = VerdictReader(pipeline.redis, settings, keys=keys, on_refused=_refused, reader="cli")
    reader.anchor()  # follow from the newest entry on
    pipeline.events.archive(replay)
    dispatch(
        replay.event_id, confine(settings.bundle_root, replay.job_dir), evidence_id=evidence_id
    )
    click.echo(f"replay {replay.event_id} of {event_id}", err=True)
    for entry in reader.follow(timeout_s=timeout):
        if entry.event_id == replay.event_id:
            click.echo(_entry_line(entry, as_json))
            return
    _fail(f"no verdict for {replay.event_id} within {timeout:g}s (are workers running?)", 1)
