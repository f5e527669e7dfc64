"""The failure catalogue: known failure lines and what they mean, read from `catalogue.toml`.

The catalogue is data. Each entry names a literal (the parser's prefilter searches it), an optional
regex, the ERRORS `kind` it gives, the component and class it means, whether it is a generic exit
record, and the public source of a real example. The first entry that matches a line wins.
Matching is vectorised: one `contains` per entry over the few candidate rows of a chunk.

A `configuration` entry may also carry its handoff (docs/domain.md#deaths-that-need-a-change):
a `subject` regex whose first group reads the affected key, module or path from the
line, the thing to `change` (`{subject}` stands for what the regex read), the `behaviour` to
propose and the `test` that proves the fix. `worker.gates.configuration.config_handoff` falls
back on the component's text for an entry without them.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import Any, Final

import polars as pl

__all__ = [
    "CATALOGUE_FILE",
    "Catalogue",
    "CatalogueError",
    "Component",
    "Entry",
    "FailureClass",
    "catalogue",
    "load_catalogue",
]

CATALOGUE_FILE: Final = "catalogue.toml"
_FIELDS: Final = frozenset(
    {
        "id",
        "literal",
        "pattern",
        "kind",
        "component",
        "class",
        "generic",
        "source",
        "note",
        "subject",
        "change",
        "behaviour",
        "test",
    }
)
_REQUIRED: Final = ("id", "literal", "kind", "component", "class", "source", "note")


class FailureClass(StrEnum):
    """What a failure means for a verdict."""

    HARD = "hard"  # can end a process: a death, an abort, a crash
    TRANSIENT = "transient"  # infrastructure that a restart may not meet again
    BENIGN = "benign"  # noise that looks scary and is not a failure by itself
    CONFIGURATION = "configuration"  # deterministic: fails the same way until the config changes


class Component(StrEnum):
    """Which part of the job a failure belongs to."""

    POLICY = "policy"  # a policy (or reference, critic) training rank
    ENGINE = "engine"  # an inference engine
    DRIVER = "driver"  # the trainer's driver process
    SANDBOX = "sandbox"  # an agentic sandbox or verifier
    CONTROLLER = "controller"  # the scheduler, raylet, kubelet: what runs the processes
    CONFIGURATION = "configuration"  # the job's configuration


class CatalogueError(ValueError):
    """A catalogue file that does not describe entries correctly."""


@dataclass(frozen=True)
class Entry:
    """One known failure."""

    id: str
    literal: str
    pattern: str | None
    kind: str
    component: Component | None  # None: read it from the line (process prefix, `ray::Class`)
    failure_class: FailureClass
    generic: bool
    source: str
    note: str
    subject: str | None = None  # regex: group 1 is the affected key, module or path
    change: str | None = None  # what to change; `{subject}` is replaced by what `subject` read
    behaviour: str | None = None  # the behaviour a handoff proposes
    test: str | None = None  # the test that proves the fix

    def subject_of(self, text: str) -> str | None:
        """The key, module or path this failure names in `text`, when the entry can read it."""
        if self.subject is None:
            return None
        found = re.search(self.subject, text)
        return found.group(1) if found and found.group(1) else None

    def condition(self, text: pl.Expr) -> pl.Expr:
        """True where `text` is this failure (the literal, then the regex when there is one)."""
        found = text.str.contains(self.literal, literal=True)
        return found & text.str.contains(self.pattern) if self.pattern else found

    def matches(self, line: str) -> bool:
        """Whether one line is this failure (for tests and the `signatures` command)."""
        if self.literal not in line:
            return False
        return self.pattern is None or re.search(self.pattern, line) is not None


def _check_fields(raw: dict[str, Any], where: str) -> None:
    unknown = set(raw) - _FIELDS
    missing = [name for name in _REQUIRED if not raw.get(name)]
    if unknown or missing:
        raise CatalogueError(f"{where}: unknown {sorted(unknown)}, missing {missing}")


def _pattern(raw: dict[str, Any], where: str) -> str | None:
    """The entry's regex, checked with `re` (no polars work at import: a forked Celery worker
    must not inherit polars' thread pool from its parent)."""
    pattern = raw.get("pattern") or None
    if pattern is None:
        return None
    try:
        re.compile(pattern)
    except re.error as exc:
        raise CatalogueError(f"{where}: pattern {pattern!r} does not compile: {exc}") from exc
    return str(pattern)


def _subject(raw: dict[str, Any], where: str) -> str | None:
    """The entry's subject regex: it must compile and capture the subject in a group."""
    subject = raw.get("subject") or None
    if subject is None:
        return None
    try:
        groups = re.compile(subject).groups
    except re.error as exc:
        raise CatalogueError(f"{where}: subject {subject!r} does not compile: {exc}") from exc
    if groups < 1:
        raise CatalogueError(f"{where}: subject {subject!r} captures nothing")
    return str(subject)


def _text_field(raw: dict[str, Any], name: str) -> str | None:
    value = raw.get(name)
    return str(value) if value else None


def _entry(raw: dict[str, Any], index: int) -> Entry:
    where = f"entry {index} ({raw.get('id', '?')})"
    _check_fields(raw, where)
    try:
        component = None if raw["component"] == "auto" else Component(raw["component"])
        failure_class = FailureClass(raw["class"])
    except ValueError as exc:
        raise CatalogueError(f"{where}: {exc}") from exc
    return Entry(
        id=str(raw["id"]),
        literal=str(raw["literal"]),
        pattern=_pattern(raw, where),
        kind=str(raw["kind"]),
        component=component,
        failure_class=failure_class,
        generic=bool(raw.get("generic", False)),
        source=str(raw["source"]),
        note=str(raw["note"]),
        subject=_subject(raw, where),
        change=_text_field(raw, "change"),
        behaviour=_text_field(raw, "behaviour"),
        test=_text_field(raw, "test"),
    )


@dataclass(frozen=True)
class Catalogue:
    """The entries in priority order."""

    entries: tuple[Entry, ...]

    def __post_init__(self) -> None:
        ids = [entry.id for entry in self.entries]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise CatalogueError(f"repeated entry ids: {repeated}")

    @property
    def literals(self) -> tuple[str, ...]:
        """Every entry's literal, once each."""
        return tuple(dict.fromkeys(entry.literal for entry in self.entries))

    def by_id(self, entry_id: str) -> Entry:
        """The entry named `entry_id`."""
        return next(e for e in self.entries if e.id == entry_id)

    def first_match(self, line: str) -> Entry | None:
        """The entry a single line matches first, or None."""
        return next((entry for entry in self.entries if entry.matches(line)), None)

    def match_expr(self, text: pl.Expr) -> pl.Expr:
        """The id of the first entry `text` matches, else null (String)."""
        found = pl.lit(None, dtype=pl.String)
        for entry in reversed(self.entries):
            found = pl.when(entry.condition(text)).then(pl.lit(entry.id)).otherwise(found)
        return found

    def table(self) -> pl.DataFrame:
        """The entries as a frame (entry, entry_kind, entry_component, failure_class, generic)."""
        return pl.DataFrame(
            {
                "entry": [e.id for e in self.entries],
                "entry_kind": [e.kind for e in self.entries],
                "entry_component": [
                    e.component.value if e.component else None for e in self.entries
                ],
                "failure_class": [e.failure_class.value for e in self.entries],
                "generic": [e.generic for e in self.entries],
            },
            schema={
                "entry": pl.String,
                "entry_kind": pl.String,
                "entry_component": pl.String,
                "failure_class": pl.String,
                "generic": pl.Boolean,
            },
        )


def load_catalogue(text: str) -> Catalogue:
    """A catalogue from TOML text (`[[entry]]` tables), validated."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogueError(f"not TOML: {exc}") from exc
    raw = data.get("entry")
    if not isinstance(raw, list) or not raw:
        raise CatalogueError("no [[entry]] tables")
    return Catalogue(tuple(_entry(item, i) for i, item in enumerate(raw, 1)))


@cache
def catalogue() -> Catalogue:
    """The catalogue shipped with the package (read once)."""
    text = resources.files(__package__).joinpath(CATALOGUE_FILE).read_text(encoding="utf-8")
    return load_catalogue(text)
