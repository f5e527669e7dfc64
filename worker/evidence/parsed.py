"""What a parse returns: the log tables, the trial tables and the parse summary.

Typed frozen dataclasses without pydantic, so `rl-health parse` (and any parse) does not load the
model layer (pydantic and the contract models cost ~0.1 s of a parse's fixed cost).
`worker.evidence.model` re-exports them beside the other evidence types. A summary goes into the
frozen evidence as JSON (`to_json`) and comes back through `from_json`, which checks every field's
type and refuses what does not fit with a `ValueError` (a crafted document is an error, never a
summary with wrong types).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

import polars as pl

from shared.times import as_utc
from worker.evidence import schema

__all__ = ["ClockSkew", "LogTables", "ParseSummary", "TrialTables"]

_EXAMPLES = 5  # examples a summary of several files quotes (each file quotes as many)


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else as_utc(value)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


# --- checks of JSON values (from_json) -----------------------------------------------------------


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"not an integer: {value!r}")
    return value


def _opt_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _opt_float(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    return float(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"not a string: {value!r}")
    return value


def _opt_str(value: Any) -> str | None:
    return None if value is None else _str(value)


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(_str(item) for item in _list(value))


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(_int(item) for item in _list(value))


def _list(value: Any) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"not a list: {value!r}")
    return value


def _counts(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise ValueError(f"not an object: {value!r}")
    return {_str(key): _int(count) for key, count in value.items()}


def _when(value: Any) -> datetime | None:
    if value is None:
        return None
    try:
        return _utc(datetime.fromisoformat(_str(value)))
    except ValueError as exc:
        raise ValueError(f"not an ISO-8601 time: {value!r}") from exc


def _checked(cls: type, data: Any, checks: Mapping[str, Callable[[Any], Any]]) -> dict[str, Any]:
    """The fields of `cls` found in `data`, each checked; other keys are ignored."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: not an object: {data!r}")
    found = {}
    for name, check in checks.items():
        if name in data:
            try:
                found[name] = check(data[name])
            except ValueError as exc:
                raise ValueError(f"{cls.__name__}.{name}: {exc}") from None
    return found


# --- the summary ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClockSkew:
    """A log's own line times against the Iris prefix times (collection time, UTC).

    `min_s`/`max_s` are own time minus prefix time over the `lines` that carry both; `off_lines`
    differ by more than the parser's tolerance, the first of them at `source`:`first_line`.
    `replayed` lines were re-sent by the log shipper (`worker.evidence.logs.replays`): counted
    apart from the others, left out of the tables, the first few quoted in `replayed_examples`
    (`source:line: own time ..., collected ...: message`).
    """

    lines: int = 0
    min_s: float | None = None
    max_s: float | None = None
    off_lines: int = 0
    first_line: int | None = None
    source: str | None = None
    replayed: int = 0
    replayed_examples: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("min_s", "max_s"):  # seconds are floats, whole or not
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, float(value))
        object.__setattr__(self, "replayed_examples", tuple(self.replayed_examples))

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON; the replay fields only when a replay was seen (the summaries of
        logs without one read and write as before)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        if not self.replayed:
            del data["replayed"], data["replayed_examples"]
        else:
            data["replayed_examples"] = list(self.replayed_examples)
        return data

    @classmethod
    def from_json(cls, data: Any) -> ClockSkew:
        checks = {
            "lines": _int,
            "min_s": _opt_float,
            "max_s": _opt_float,
            "off_lines": _int,
            "first_line": _opt_int,
            "source": _opt_str,
            "replayed": _int,
            "replayed_examples": _strs,
        }
        return cls(**_checked(cls, data, checks))

    @classmethod
    def merged(cls, clocks: list[ClockSkew]) -> ClockSkew:
        """The statistics of several files as one; the first disagreeing line of the first."""
        mins = [c.min_s for c in clocks if c.min_s is not None]
        maxs = [c.max_s for c in clocks if c.max_s is not None]
        first = next((c for c in clocks if c.first_line is not None), None)
        return cls(
            lines=sum(c.lines for c in clocks),
            min_s=min(mins, default=None),
            max_s=max(maxs, default=None),
            off_lines=sum(c.off_lines for c in clocks),
            first_line=first.first_line if first else None,
            source=first.source if first else None,
            replayed=sum(c.replayed for c in clocks),
            replayed_examples=tuple(e for c in clocks for e in c.replayed_examples)[:_EXAMPLES],
        )


@dataclass(frozen=True)
class ParseSummary:
    files: tuple[str, ...] = ()
    lines: int = 0
    bytes: int = 0
    records: dict[str, int] = field(default_factory=dict)  # serialization -> records read
    malformed: int = 0
    malformed_examples: tuple[str, ...] = ()  # "source:line: text", the first few
    serializations: tuple[str, ...] = ()
    first_timestamp: datetime | None = None  # UTC
    last_timestamp: datetime | None = None  # newest timestamp of any line, UTC
    head: tuple[str, ...] = ()  # the first non-empty lines, to show what the log looks like
    head_lines: tuple[int, ...] = ()  # their 1-based line numbers, when the parser kept them
    head_source: str | None = None  # the file they come from (default: the first of `files`)
    clock: ClockSkew = ClockSkew()  # own line times against the Iris prefix times
    cut_lines: int = 0  # lines longer than the parser's cap (LINE_MAX_BYTES), cut with a marker
    cut_examples: tuple[str, ...] = ()  # "source:line: N bytes", the first few
    notes: tuple[str, ...] = ()  # what the report must state about reading the logs

    def __post_init__(self) -> None:
        for name in ("first_timestamp", "last_timestamp"):
            object.__setattr__(self, name, _utc(getattr(self, name)))
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):  # sequences are kept as tuples (frozen, comparable)
                object.__setattr__(self, f.name, tuple(value))

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON values (times ISO-8601 UTC with `Z`, sequences as lists)."""
        data: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, datetime):
                value = _iso(value)
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, ClockSkew):
                value = value.to_json()
            elif isinstance(value, dict):
                value = dict(value)
            data[f.name] = value
        return data

    @classmethod
    def from_json(cls, data: Any) -> ParseSummary:
        """The summary `to_json` wrote (also one a pydantic model wrote before 2026-12-03);
        `ValueError` naming the field when a value has the wrong type."""
        checks: dict[str, Callable[[Any], Any]] = {
            "files": _strs,
            "lines": _int,
            "bytes": _int,
            "records": _counts,
            "malformed": _int,
            "malformed_examples": _strs,
            "serializations": _strs,
            "first_timestamp": _when,
            "last_timestamp": _when,
            "head": _strs,
            "head_lines": _ints,
            "head_source": _opt_str,
            "clock": ClockSkew.from_json,
            "cut_lines": _int,
            "cut_examples": _strs,
            "notes": _strs,
        }
        return cls(**_checked(cls, data, checks))

    @classmethod
    def merged(cls, summaries: list[ParseSummary]) -> ParseSummary:
        """The summary of several files read together: counts summed, examples and notes in
        file order (the first few), the head of the first file that has one."""
        records: dict[str, int] = {}
        for summary in summaries:
            for name, count in summary.records.items():
                records[name] = records.get(name, 0) + count
        firsts = [s.first_timestamp for s in summaries if s.first_timestamp is not None]
        lasts = [s.last_timestamp for s in summaries if s.last_timestamp is not None]
        headed = next((s for s in summaries if s.head), None)
        head: dict[str, Any] = {}
        if headed is not None:
            source = headed.head_source or (headed.files[0] if headed.files else None)
            head = {"head": headed.head, "head_lines": headed.head_lines, "head_source": source}
        return cls(
            files=tuple(f for s in summaries for f in s.files),
            lines=sum(s.lines for s in summaries),
            bytes=sum(s.bytes for s in summaries),
            records=dict(sorted(records.items())),
            malformed=sum(s.malformed for s in summaries),
            malformed_examples=tuple(e for s in summaries for e in s.malformed_examples)[
                :_EXAMPLES
            ],
            serializations=tuple(sorted(k for k, v in records.items() if v)),
            first_timestamp=min(firsts, default=None),
            last_timestamp=max(lasts, default=None),
            clock=ClockSkew.merged([s.clock for s in summaries]),
            cut_lines=sum(s.cut_lines for s in summaries),
            cut_examples=tuple(e for s in summaries for e in s.cut_examples)[:_EXAMPLES],
            notes=tuple(n for s in summaries for n in s.notes),
            **head,
        )


# --- the tables ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogTables:
    """The tables read from the job's logs (schemas in `worker.evidence.schema`)."""

    metrics: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.METRICS))
    timers: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.TIMERS))
    phases: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.PHASES))
    engines: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.ENGINES))
    progress: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.PROGRESS))
    batches: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.BATCHES))
    errors: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.ERRORS))
    resumes: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.RESUMES))
    summary: ParseSummary = field(default_factory=ParseSummary)

    def metrics_wide(self, keys: Iterable[str] | None = None) -> pl.DataFrame:
        """`step` then one column per metric key, sorted by step: only the `keys` given (a gate
        names the few it reads; a key with no rows has no column), else every key.

        Each set of keys is pivoted once per `LogTables` (the gates ask again and again): a log
        with hundreds of thousands of distinct keys costs a filter, not a pivot of every key.
        """
        wanted = None if keys is None else tuple(sorted(set(keys)))
        pivots: dict[tuple[str, ...] | None, pl.DataFrame] = self.__dict__.setdefault("_wide", {})
        if wanted not in pivots:
            pivots[wanted] = _pivot(self.metrics, wanted)
        return pivots[wanted]


def _pivot(metrics: pl.DataFrame, keys: tuple[str, ...] | None) -> pl.DataFrame:
    rows = metrics if keys is None else metrics.filter(pl.col("key").is_in(list(keys)))
    if rows.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64()})
    wide = rows.pivot(on="key", index="step", values="value", aggregate_function="last")
    return wide.sort("step")


@dataclass(frozen=True)
class TrialTables:
    trials: pl.DataFrame = field(default_factory=lambda: schema.empty(schema.TRIALS))
    directory: str | None = None  # the trials directory relative to the job directory
    sync_selection: dict[str, Any] | None = None
    skipped_objects: tuple[Any, ...] = ()
    unreadable: tuple[str, ...] = ()  # "path: reason" for result files that did not parse
