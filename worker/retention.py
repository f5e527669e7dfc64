"""Retention: which evidence expires when.

The job's trial artifacts: the campaign's `artifact_retention_days` wins; otherwise a
`ttl=<n><unit>` segment of the manifest's `trials_uri` (e.g. `s3://bucket/tmp/ttl=14d/...`) is
read. The note never changes a verdict; it tells the operator what to preserve before it
disappears.

Our own frozen evidence (`worker.pipeline.parts.sweep` applies this): a diagnosis whose
`evidence.json` was written more than `keep_s` ago expires; a table part (shared by the
diagnoses of a job) goes only when no kept diagnosis references it and it is older than
`grace_s` (a younger one may belong to a capture whose `evidence.json` is not written yet).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import polars as pl

from shared.models import iso_utc
from worker.evidence.case import Evidence

__all__ = [
    "FrozenRecord",
    "expired_evidence",
    "retention_note",
    "retention_period",
    "unreferenced_parts",
]

_TTL: Final = re.compile(r"(?:^|/)ttl=(\d+(?:\.\d+)?)([smhdw])(?:/|$)", re.IGNORECASE)
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def retention_period(evidence: Evidence) -> tuple[timedelta, str] | None:
    """The retention period and where it was read from, or None when nothing sets one."""
    days = evidence.thresholds.artifact_retention_days
    if days is not None:
        return timedelta(days=days), "campaign artifact_retention_days"
    uri = evidence.bundle.trials_uri or ""
    match = _TTL.search(uri)
    if match is None:
        return None
    seconds = float(match.group(1)) * _UNIT_S[match.group(2).lower()]
    return timedelta(seconds=seconds), f"ttl={match.group(1)}{match.group(2)} in trials_uri"


def _oldest_trial(evidence: Evidence) -> datetime | None:
    if evidence.trials is None or evidence.trials.trials.is_empty():
        return None
    value = evidence.trials.trials.select(pl.col("started_at").min()).item()
    return value if isinstance(value, datetime) else None


def retention_note(evidence: Evidence) -> str | None:
    """A sentence naming the retention period and when the oldest trial evidence expires."""
    found = retention_period(evidence)
    if found is None:
        return None
    period, origin = found
    days = period.total_seconds() / 86400
    where = evidence.bundle.trials_uri or "the trials prefix"
    oldest = _oldest_trial(evidence) or evidence.bundle.submitted_at
    if oldest is None:
        return (
            f"Retention: trial artifacts under {where} expire {days:g} days after they are "
            f"written ({origin})."
        )
    expires = oldest + period
    state = "already expired" if expires <= evidence.now else "expire"
    return (
        f"Retention: trial artifacts under {where} are kept {days:g} days ({origin}); the oldest "
        f"({iso_utc(oldest)}) {state} at {iso_utc(expires)} — preserve quoted trial evidence "
        "before then."
    )


# --- frozen evidence ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrozenRecord:
    """One diagnosis's frozen evidence as retention sees it: its id, when its `evidence.json`
    was written (seconds since the epoch), and the keys of the table parts it references."""

    evidence_id: str
    written_at: float
    parts: frozenset[str]


def expired_evidence(records: Iterable[FrozenRecord], now: float, keep_s: float) -> list[str]:
    """The ids of the frozen evidence written more than `keep_s` before `now`."""
    return sorted(r.evidence_id for r in records if now - r.written_at > keep_s)


def unreferenced_parts(
    parts: Mapping[str, float], kept: Iterable[FrozenRecord], now: float, grace_s: float
) -> list[str]:
    """The part keys (with when each was written) that no kept record references and that are
    older than `grace_s`: those may be deleted."""
    referenced = frozenset().union(*(record.parts for record in kept))
    return sorted(
        key
        for key, written_at in parts.items()
        if key not in referenced and now - written_at > grace_s
    )
