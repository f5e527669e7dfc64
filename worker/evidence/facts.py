"""Facts derived from the evidence once, for every gate and the verdict: the job state, the current
attempt, the newest progress of each kind, evidence dated after `now`, the log's clock offset,
probes that failed, sources that disagree, and the failure that ended each attempt.

Time is checked, not assumed (docs/domain.md#what-established-means): a row dated after `now` is
never progress; one dated more than CLOCK_TOLERANCE_S after it is a discrepancy named in the report.
The parser has already reconciled each line's own time with its Iris prefix time
(`ParseSummary.clock`); a constant offset between them is stated as a clock or time-zone fact, and
the lines the log shipper re-sent (left out of the progress tables by the parser) are stated with
the newest consistent progress, which is what the gates judge.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

import polars as pl

from shared.models import Quote
from shared.redact import redact_text
from shared.times import duration_text
from worker.evidence import failures
from worker.evidence.jobstate import JobState
from worker.evidence.model import (
    BundleInfo,
    ClockSkew,
    LogTables,
    ProbeCommand,
    ProbeEvidence,
    TrialTables,
)
from worker.evidence.quotes import quote
from worker.evidence.schema import ERRORS, HARD_ERROR_KINDS

__all__ = [
    "CLOCK_TOLERANCE_S",
    "ENGINE_LINE",
    "FAILURE_CLASSES",
    "UNCATALOGUED_FAILURE_KINDS",
    "Facts",
    "Moment",
    "ProbeFailure",
    "Sources",
    "attempt_failures",
    "attempt_source",
    "derive",
    "newest_attempt",
    "row_signature",
]


class Sources(Protocol):
    """What the facts are derived from: the parts of `worker.evidence.case.Evidence` they read.

    A protocol, not the class, so that the evidence (which caches its facts) can import this
    module without this module importing it back.
    """

    @property
    def now(self) -> datetime: ...
    @property
    def bundle(self) -> BundleInfo: ...
    @property
    def logs(self) -> LogTables | None: ...
    @property
    def trials(self) -> TrialTables | None: ...
    @property
    def probes(self) -> ProbeEvidence | None: ...


CLOCK_TOLERANCE_S: Final = 60.0
"""Evidence dated up to this long after `now` is clock noise (a live capture runs a little past the
`now` the command fixed); later than that it is a discrepancy. Either way it is never progress."""

PHASE: Final = "phase"
STEP: Final = "step"
LOG_LINE: Final = "log line"
TRIAL: Final = "finished trial"
ENGINE_LINE: Final = "engine stat line"
"""Never progress (a wedged policy mesh leaves engines printing); only a discrepancy when it is
dated after `now`: a node clock ahead makes every line of that engine look fresher than it is."""

FAILURE_CLASSES: Final = ("hard", "configuration")
"""Catalogue classes that can be the failure of an attempt; benign and transient never are."""
UNCATALOGUED_FAILURE_KINDS: Final = ("traceback", "exception")
"""Kinds of rows no catalogue entry knows that still count: any traceback, any final exception."""

_SKEW_CONSTANT_S: Final = 60.0
"""Own-minus-prefix offsets spread by less than this over every line are one constant offset."""


@dataclass(frozen=True)
class Moment:
    """One dated piece of evidence: its kind of progress (or evidence), its time, its quote."""

    kind: str
    at: datetime
    quote: Quote


@dataclass(frozen=True)
class ProbeFailure:
    """A probe that failed: what it was for (stacks, gpus, controller, attempts, logs, other);
    for a failed `py-spy dump`, the process it was of (the target only when its output file
    names it)."""

    kind: str
    text: str
    quote: Quote
    pid: int | None = None
    target: str | None = None


@dataclass(frozen=True)
class Facts:
    """What several gates and the verdict read, computed once per Evidence."""

    now: datetime
    state: JobState | None
    state_source: str  # probes/controller.json | manifest.json | none
    newest_attempt: int  # the newest attempt index in the logs (0 when unmarked)
    attempt_started_at: datetime | None  # when the current attempt began
    progress: tuple[Moment, ...]  # the newest of each kind, none after `now`
    future: tuple[Moment, ...]  # evidence dated more than CLOCK_TOLERANCE_S after `now`
    clock_note: str | None  # the log's clock against the Iris prefix, when they disagree
    replay_note: str | None  # lines the log shipper re-sent (left out of the progress tables)
    probe_failures: tuple[ProbeFailure, ...]
    identity: str | None  # the manifest names another job than the directory holds
    # ERRORS rows: the failure of each attempt (`attempt_failures`); a table, so not compared
    attempt_failures: pl.DataFrame = field(compare=False)

    def newest(self, *kinds: str) -> Moment | None:
        """The newest progress of the given kinds (all kinds when none is given)."""
        found = [m for m in self.progress if not kinds or m.kind in kinds]
        return max(found, key=lambda m: m.at, default=None)

    def failed(self, *kinds: str) -> tuple[ProbeFailure, ...]:
        return tuple(f for f in self.probe_failures if f.kind in kinds)

    def discrepancies(self) -> tuple[str, ...]:
        """Time and identity facts to state in the report."""
        lines = [
            f"evidence dated after now ({_iso(self.now)}): {m.kind} at {_iso(m.at)}, "
            f"{_duration((m.at - self.now).total_seconds())} ahead "
            f"({m.quote.source}{f':{m.quote.line}' if m.quote.line else ''})"
            for m in self.future
        ]
        lines += [note for note in (self.clock_note, self.replay_note, self.identity) if note]
        return tuple(lines)


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the job state and the current attempt -----------------------------------------------------


def newest_attempt(logs: LogTables) -> int:
    """The newest attempt index seen in the logs (0 when none is marked)."""
    values = [
        frame["attempt"].max()
        for frame in (logs.timers, logs.metrics, logs.errors, logs.resumes)
        if not frame.is_empty()
    ]
    return max((int(v) for v in values if isinstance(v, int)), default=0)


def _state(evidence: Sources) -> tuple[JobState | None, str]:
    probes = evidence.probes
    if probes is not None and probes.controller is not None:
        return JobState.parse(probes.controller.state), "probes/controller.json"
    if evidence.bundle.state:
        return JobState.parse(evidence.bundle.state), "manifest.json"
    return None, "none"


def _log_start(logs: LogTables, attempt: int) -> datetime | None:
    firsts = [
        frame.filter(pl.col("attempt") == attempt)["timestamp"].min()
        for frame in (logs.timers, logs.resumes, logs.errors, logs.metrics)
        if not frame.is_empty()
    ]
    return min((t for t in firsts if isinstance(t, datetime)), default=None)


def _attempt_start(evidence: Sources, attempt: int) -> datetime | None:
    """The current attempt's start: the controller's record, else its first log line."""
    records = evidence.probes.attempts if evidence.probes else None
    starts = [r.started_at_ms for r in records or () if r.started_at_ms is not None]
    if starts:
        return datetime.fromtimestamp(max(starts) / 1000, tz=UTC)
    logs = evidence.logs
    found = _log_start(logs, attempt) if logs is not None else None
    return found or evidence.bundle.submitted_at


# --- progress and evidence from the future ------------------------------------------------------


def _text(frame: str, row: dict[str, Any]) -> str:
    if frame == "timers":
        what = "Finished" if row["event"] == "finished" else "Started"
        cost = f", time cost: {row['seconds']}s" if row.get("seconds") is not None else ""
        return f"{what}: '{row['phase']}'{cost} (step {row['step']})"
    if frame == "metrics":
        return f"train metrics step {row['step']}: {row['key']}={row['value']}"
    if frame == "progress":
        return f"{row['kind']} {row['done']}/{row['total']}"
    if frame == "engines":
        return (
            f"vLLM engine {row['engine']}: Avg generation throughput: "
            f"{row['generation_tokens_per_s']} tokens/s, Running: {row['running']} reqs, "
            f"Waiting: {row['waiting']} reqs"
        )
    return str(row.get("text") or row.get("kind") or frame)


def _moment(kind: str, frame_name: str, row: dict[str, Any]) -> Moment:
    at = row["timestamp"]
    q = quote(str(row.get("source") or "?"), _text(frame_name, row), row.get("line"), at)
    return Moment(kind, at, q)


def _newest_row(frame: pl.DataFrame, keep: pl.Expr) -> dict[str, Any] | None:
    """The newest dated row that `keep` keeps: the latest timestamp, then the highest line
    (None lines first, as a sort puts them). Vectorised: the rows at the newest time are found
    with one filter over the frame, and only those few are sorted (not the whole frame)."""
    dated = pl.col("timestamp").is_not_null() & keep
    newest = (
        frame.lazy()
        .filter(dated)
        .filter(pl.col("timestamp") == pl.col("timestamp").max())
        .collect()
    )
    if newest.is_empty():
        return None
    return newest.sort(["timestamp", "line"]).row(-1, named=True)


def _advancing(progress: pl.DataFrame) -> pl.DataFrame:
    """Progress counter rows whose count moved (a tqdm bar redrawn at the same N/M is no line of
    progress)."""
    if progress.is_empty():
        return progress
    ordered = progress.sort("source", "line")
    moved = pl.col("done") != pl.col("done").shift().over("source", "kind")
    return ordered.filter(moved.fill_null(value=True))


def _log_frames(logs: LogTables) -> Iterable[tuple[str, str, pl.DataFrame]]:
    """(progress kind, frame name, frame) of every trainer table that dates progress."""
    finished_step = (pl.col("event") == "finished") & (pl.col("phase") == "step")
    yield PHASE, "timers", logs.timers
    yield STEP, "timers", logs.timers.filter(finished_step)
    yield STEP, "metrics", logs.metrics
    for name in ("timers", "metrics", "resumes", "batches"):
        yield LOG_LINE, name, getattr(logs, name)
    yield LOG_LINE, "progress", _advancing(logs.progress)


def _log_moments(logs: LogTables, now: datetime, limit: datetime) -> tuple[list[Moment], ...]:
    """The newest row of each kind up to `now`, and the newest log line after `limit`. A frame
    that dates two kinds (timers: a phase and a log line) is searched once for both."""
    past: list[Moment] = []
    future: list[Moment] = []
    # by the frame's id, the frame kept alive beside its row so no other frame takes that id
    newest: dict[tuple[int, bool], tuple[pl.DataFrame, dict[str, Any] | None]] = {}

    def found(frame: pl.DataFrame, ahead: bool) -> dict[str, Any] | None:
        key = (id(frame), ahead)
        if key not in newest:
            keep = pl.col("timestamp") > limit if ahead else pl.col("timestamp") <= now
            newest[key] = (frame, _newest_row(frame, keep))
        return newest[key][1]

    for kind, name, frame in _log_frames(logs):
        row = found(frame, ahead=False)
        if row is not None:
            past.append(_moment(kind, name, row))
        if kind != LOG_LINE:
            continue
        ahead = found(frame, ahead=True)
        if ahead is not None:
            future.append(_moment(kind, name, ahead))
    return past, future


def _engine_moments(logs: LogTables, limit: datetime) -> list[Moment]:
    """The newest engine stat line dated after `limit` (now + CLOCK_TOLERANCE_S), if any."""
    row = _newest_row(logs.engines, pl.col("timestamp") > limit)
    return [_moment(ENGINE_LINE, "engines", row)] if row is not None else []


def _trial_moments(evidence: Sources, now: datetime, limit: datetime) -> tuple[list[Moment], ...]:
    table = evidence.trials
    if table is None or table.trials.is_empty():
        return [], []
    rows = table.trials.filter(pl.col("finished_at").is_not_null()).rename(
        {"finished_at": "timestamp"}
    )
    rows = rows.with_columns(line=pl.lit(None, dtype=pl.Int64), text=pl.col("trial_name"))
    found = []
    for keep in (pl.col("timestamp") <= now, pl.col("timestamp") > limit):
        row = _newest_row(rows.select("timestamp", "line", "source", "text"), keep)
        found.append([_moment(TRIAL, "trials", row)] if row else [])
    return found[0], found[1]


def _probe_moments(probes: ProbeEvidence | None, limit: datetime) -> list[Moment]:
    if probes is None:
        return []
    found = []
    if probes.captured_at is not None and probes.captured_at > limit:
        text = f"probes captured_at {_iso(probes.captured_at)}"
        found.append(Moment("probe capture", probes.captured_at, quote("probes/probes.json", text)))
    for dump in probes.stacks:
        if dump.captured_at is not None and dump.captured_at > limit:
            text = f"py-spy dump of pid {dump.pid} taken {_iso(dump.captured_at)}"
            found.append(Moment("stack dump", dump.captured_at, quote(dump.source, text)))
    return found[:3]


def _bundle_moments(evidence: Sources, limit: datetime) -> list[Moment]:
    synced = evidence.bundle.synced_at
    if synced is None or synced <= limit:
        return []
    return [Moment("manifest sync", synced, quote("manifest.json", f"synced_at {_iso(synced)}"))]


# --- the log's clock ---------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    return duration_text(seconds)


def _replay_note(clock: ClockSkew, newest: Moment | None) -> str | None:
    """Lines the log shipper sent again (`worker.evidence.logs.replays`): left out of the
    progress tables, so never progress; the newest consistent progress is what the gates judged."""
    if not clock.replayed:
        return None
    first = f" (first: {clock.replayed_examples[0]})" if clock.replayed_examples else ""
    judged = (
        f"newest consistent progress: {newest.kind} at {_iso(newest.at)} ({newest.quote.text})"
        if newest is not None
        else "no consistent progress"
    )
    return (
        f"{clock.replayed} line(s) re-sent by the log shipper: their own times are older than "
        f"the log's usual lag or than lines before them{first}; no step, phase or metric of "
        f"theirs is progress; {judged}"
    )


def _clock_note(clock: ClockSkew) -> str | None:
    """A constant offset is a clock or time-zone fact; a varying one is a disagreement."""
    if not clock.off_lines or clock.min_s is None or clock.max_s is None:
        return None
    where = f"{clock.source}:{clock.first_line}" if clock.first_line else clock.source or "the log"
    if clock.max_s - clock.min_s <= _SKEW_CONSTANT_S and clock.off_lines == clock.lines:
        side = "ahead of" if clock.min_s > 0 else "behind"
        return (
            f"clock offset: the log's own times run a constant {_duration(abs(clock.min_s))} "
            f"{side} the Iris prefix times (UTC) on all {clock.lines} dated lines (a clock or "
            "time-zone setting, not progress); judged by the prefix times"
        )
    return (
        f"clock disagreement: {clock.off_lines} of {clock.lines} lines carry an own time that "
        f"differs from their Iris prefix time by {_duration(clock.min_s)} to "
        f"{_duration(clock.max_s)} (first at {where}); judged by the prefix times"
    )


# --- probes ------------------------------------------------------------------------------------


def _probe_kind(command: ProbeCommand) -> str:
    output = command.output or ""
    words = " ".join(command.argv).lower()
    for kind, needles in _PROBE_KINDS:
        if output.startswith(f"{kind}/") or any(n in words for n in needles):
            return kind
    return "other"


_PROBE_KINDS: Final = (
    ("stacks", ("py-spy",)),
    ("gpus", ("nvidia-smi",)),
    ("attempts", ("attempt", "sacct")),
    ("logs", (" logs",)),
    ("controller", ("summary", "describe", "squeue", "kubectl get", "scontrol", "job list")),
)


def _command_failure(command: ProbeCommand) -> ProbeFailure | None:
    if command.exit_code == 0:
        return None
    why = command.why or (
        "timed out" if command.exit_code is None else f"exited {command.exit_code}"
    )
    text = f"`{shlex.join(command.argv)}` {why}"
    cited = quote("probes/probes.json", text, timestamp=command.started_at)
    kind = _probe_kind(command)
    pid, target = command.dumped() if kind == "stacks" else (None, None)
    return ProbeFailure(kind, text, cited, pid, target)


def _note_kind(note: str) -> str:
    lowered = note.lower()
    if "stack" in lowered or "py-spy" in lowered:
        return "stacks"
    return "gpus" if "gpu" in lowered else "other"


def _probe_failures(probes: ProbeEvidence | None) -> tuple[ProbeFailure, ...]:
    if probes is None:
        return ()
    found = [f for c in probes.commands if (f := _command_failure(c)) is not None]
    commands = {shlex.join(c.argv) for c in probes.commands}
    for note in probes.failures:
        if not any(cmd in note for cmd in commands):
            found.append(ProbeFailure(_note_kind(note), note, quote("probes/probes.json", note)))
    return tuple(found)


# --- identity ----------------------------------------------------------------------------------


def _identity(evidence: Sources) -> str | None:
    bundle = evidence.bundle
    name = bundle.job_name or (bundle.job_id.rsplit("/", 1)[-1] if bundle.job_id else None)
    probe_job = evidence.probes.job_id if evidence.probes else None
    if bundle.job_id and probe_job and probe_job.rstrip("/") != bundle.job_id.rstrip("/"):
        return f"sources disagree: the probes are of {probe_job}, the manifest of {bundle.job_id}"
    if name and name != bundle.job_dir.name:
        return (
            f"sources disagree: the manifest names job {bundle.job_id!r}, the directory is "
            f"{bundle.job_dir.name!r}"
        )
    return None


# --- the failure of each attempt ----------------------------------------------------------------


def attempt_source(logs: LogTables) -> str | None:
    """The file whose attempt numbering the gates follow: the one with attempt boundaries, else the
    finelog. Attempt indices of different files (a pod log holds only the newest attempt) do not
    line up, so an attempt's failure is read from this one file (None: every file)."""
    boundaries = logs.resumes.filter(pl.col("kind") == "attempt_boundary")
    if not boundaries.is_empty():
        return str(boundaries["source"].mode().sort()[0])
    sources = set(logs.errors["source"].unique().to_list())
    return "finelog.log" if "finelog.log" in sources else None


def _can_end_an_attempt() -> pl.Expr:
    """A row that may be an attempt's failure: a hard or configuration catalogue entry, an
    uncatalogued traceback or final exception line, or (rows the parser did not annotate: an
    older freeze, a hand-built table) an older hard kind. Benign and transient rows never are."""
    catalogued = pl.col("failure_class").is_in(FAILURE_CLASSES)
    unknown = pl.col("entry").is_null() & pl.col("kind").is_in(UNCATALOGUED_FAILURE_KINDS)
    legacy = pl.col("signature").is_null() & pl.col("kind").is_in(HARD_ERROR_KINDS)
    return (catalogued | unknown | legacy).fill_null(value=False)


def _after_the_last_advancement(logs: LogTables, rows: pl.DataFrame) -> pl.DataFrame:
    """The rows logged after their attempt's last timer or train metric line (same file): a
    failure the attempt trained past (a trial's verifier traceback, an error caught and logged)
    did not end it."""
    moved = pl.concat(
        [frame.select("attempt", "source", "line") for frame in (logs.timers, logs.metrics)]
    )
    last = moved.group_by("attempt", "source").agg(_last=pl.col("line").max())
    joined = rows.join(last, on=["attempt", "source"], how="left", maintain_order="left")
    return joined.filter(pl.col("_last").is_null() | (pl.col("line") > pl.col("_last")))


def attempt_failures(logs: LogTables) -> pl.DataFrame:
    """One ERRORS row per attempt of the attempt source: the failure that ended it. Among the rows
    that may end an attempt (`_can_end_an_attempt`) and come after its last advancement, the
    first (by line) whose signature is specific, else the first (a generic exit record or banner,
    never a signature on its own): a Hydra banner before the real exception, or torchrun's exit
    record after it, does not hide it. A specific configuration-class row goes before the other
    specific rows: it is the cause the others follow from (Ray's "actor died because of an error
    raised in its creation task" is logged before the `ModuleNotFoundError` that raised it).
    Vectorised: one join and one sort over the few rows."""
    errors = logs.errors
    if errors.is_empty():
        return _no_failures()
    source = attempt_source(logs)
    rows = errors.filter(_can_end_an_attempt())
    if source is not None:
        rows = rows.filter(pl.col("source") == source)
    rows = _after_the_last_advancement(logs, rows)
    ranked = rows.with_columns(_rank=_failure_rank())
    first = ranked.sort("attempt", "_rank", "line").unique("attempt", keep="first")
    return first.sort("attempt").drop("_rank", "_last")


def _failure_rank() -> pl.Expr:
    """0 for a specific configuration-class row, 1 for another specific row, 2 for the rest."""
    specific = pl.col("specific").fill_null(value=False)
    configuration = (pl.col("failure_class") == "configuration").fill_null(value=False)
    return (
        pl.when(specific & configuration)
        .then(pl.lit(0, pl.Int8))
        .when(specific)
        .then(pl.lit(1, pl.Int8))
        .otherwise(pl.lit(2, pl.Int8))
    )


def row_signature(row: dict[str, Any]) -> str | None:
    """The signature of a failure row as a report may show it: the parser's signature of the
    row's message with credentials redacted *first* (normalising replaces the digits inside a
    token, which would hide it from the redaction). Equal to the row's `signature` when the line
    holds no credential; a row the parser did not sign (an older freeze) has none."""
    if row.get("signature") is None:
        return None
    message = redact_text(str(row.get("message") or ""))
    return failures.signature(row.get("exc_type"), message, message) or row.get("signature")


def _no_failures() -> pl.DataFrame:
    return pl.DataFrame(schema=ERRORS)


# --- the whole -----------------------------------------------------------------------------------


def derive(evidence: Sources) -> Facts:
    """Every derived fact of one evidence (call `Evidence.facts`, which caches it)."""
    now = evidence.now
    limit = now + timedelta(seconds=CLOCK_TOLERANCE_S)
    logs = evidence.logs
    attempt = newest_attempt(logs) if logs is not None else 0
    past, future = _log_moments(logs, now, limit) if logs is not None else ([], [])
    trials_past, trials_future = _trial_moments(evidence, now, limit)
    future += _engine_moments(logs, limit) if logs is not None else []
    future += trials_future + _probe_moments(evidence.probes, limit)
    future += _bundle_moments(evidence, limit)
    state, source = _state(evidence)
    newest_by_kind = {m.kind: m for m in sorted(past + trials_past, key=lambda m: m.at)}
    # the newest consistent progress the report names: a step before a phase at the same time
    newest = max(newest_by_kind.values(), key=lambda m: (m.at, m.kind == STEP), default=None)
    return Facts(
        now=now,
        state=state,
        state_source=source,
        newest_attempt=attempt,
        attempt_started_at=_attempt_start(evidence, attempt),
        progress=tuple(newest_by_kind.values()),
        future=tuple(future),
        clock_note=_clock_note(logs.summary.clock) if logs is not None else None,
        replay_note=_replay_note(logs.summary.clock, newest) if logs is not None else None,
        probe_failures=_probe_failures(evidence.probes),
        identity=_identity(evidence),
        attempt_failures=attempt_failures(logs) if logs is not None else _no_failures(),
    )
