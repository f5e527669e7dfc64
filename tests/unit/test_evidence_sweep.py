"""Retention of frozen evidence: an expired diagnosis goes, and a table part goes only when no kept
diagnosis references it (worker.retention's rule, applied by worker.pipeline.parts.sweep)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl
import pytest

from tests import factories
from tests.unit.test_frozen import assert_same
from worker.evidence.case import Evidence
from worker.evidence.frozen import MARKER, PART_ROWS, PARTS, freeze, thaw
from worker.pipeline.parts import PARTS_PREFIX, SharedParts, stored_parts, sweep
from worker.pipeline.store import MemoryStore
from worker.retention import FrozenRecord, expired_evidence, unreferenced_parts

KEEP_S = 7 * 86400.0
GRACE_S = 3600.0
NOW = 1_900_000_000.0
PLACE = f"{PARTS_PREFIX}job/"


def _evidence(rows: int) -> Evidence:
    values = {"reward/avg_raw_reward": [float(i % 5) for i in range(rows)]}
    return factories.evidence(log_tables=factories.logs(metrics=factories.metric_rows(values)))


def _frozen(store: MemoryStore, tmp: Path, evidence_id: str, evidence: Evidence, at: float) -> None:
    """Freeze as the pipeline's capture does: new parts to the job's place, the marker last."""
    directory = tmp / evidence_id
    for path in freeze(evidence, directory, parts_at=PLACE, stored=stored_parts(store, PLACE)):
        relative = path.relative_to(directory)
        key = (
            PLACE + path.name
            if relative.parts[0] == PARTS
            else f"evidence/{evidence_id}/{relative.as_posix()}"
        )
        store.put_once(key, path.read_bytes())
        store.written_at[key] = at


def _thawed(store: MemoryStore, tmp: Path, evidence_id: str) -> Evidence:
    directory = tmp / f"copy-{evidence_id}"
    directory.mkdir()
    (directory / MARKER).write_bytes(store.get(f"evidence/{evidence_id}/{MARKER}"))
    return thaw(directory, fetch=SharedParts(store, tmp / f"disk-{evidence_id}").fetch)


def test_evidence_expires_just_past_its_keep() -> None:
    records = [
        FrozenRecord("short", NOW - KEEP_S + 1, frozenset()),
        FrozenRecord("at", NOW - KEEP_S, frozenset()),
        FrozenRecord("past", NOW - KEEP_S - 1, frozenset()),
    ]
    assert expired_evidence(records, NOW, KEEP_S) == ["past"]


def test_a_part_goes_only_unreferenced_and_past_its_grace() -> None:
    kept = [FrozenRecord("k", NOW, frozenset({"p/referenced"}))]
    parts = {
        "p/referenced": NOW - 10 * GRACE_S,
        "p/young": NOW - GRACE_S + 1,
        "p/old": NOW - GRACE_S - 1,
    }
    assert unreferenced_parts(parts, kept, NOW, GRACE_S) == ["p/old"]


def _two_diagnoses(tmp_path: Path, first_at: float) -> tuple[MemoryStore, Evidence]:
    """Diagnosis d1 frozen at `first_at`; d2 after the log grew, at NOW - 60 (it reuses d1's
    full parts, and replaces its last one)."""
    store = MemoryStore()
    first = _evidence(PART_ROWS + 10)
    assert first.logs is not None
    tail = first.logs.metrics.tail(5).with_columns(pl.col("step") + 100_000)
    grown_logs = dataclasses.replace(first.logs, metrics=pl.concat([first.logs.metrics, tail]))
    second = dataclasses.replace(first, logs=grown_logs)
    _frozen(store, tmp_path, "d1", first, first_at)
    _frozen(store, tmp_path, "d2", second, NOW - 60)
    return store, second


def test_a_sweep_just_past_the_keep_removes_the_diagnosis_and_only_its_own_parts(
    tmp_path: Path,
) -> None:
    """d1 expired: its evidence and the part only it referenced go; the full part d2 re-uses
    stays, and d2 thaws whole from the store afterwards."""
    store, second = _two_diagnoses(tmp_path, NOW - KEEP_S - 1)
    parts_before = set(store.keys(PLACE))
    swept = sweep(store, keep_s=KEEP_S, grace_s=GRACE_S, now=NOW)
    assert swept.evidence == ["d1"] and len(swept.parts) == 1
    assert not store.keys("evidence/d1/")
    assert set(store.keys(PLACE)) == parts_before - set(swept.parts)
    assert_same(_thawed(store, tmp_path, "d2"), second)


def test_a_sweep_just_short_of_the_keep_removes_nothing(tmp_path: Path) -> None:
    store, _ = _two_diagnoses(tmp_path, NOW - KEEP_S + 1)
    before = dict(store.objects)
    swept = sweep(store, keep_s=KEEP_S, grace_s=GRACE_S, now=NOW)
    assert (swept.evidence, swept.parts) == ([], [])
    assert store.objects == before
    assert _thawed(store, tmp_path, "d1").logs is not None


def test_a_part_of_a_capture_in_flight_is_kept_within_the_grace(tmp_path: Path) -> None:
    """Parts written by a capture whose evidence.json is not there yet stay while younger than the
    grace; past it, unreferenced, they go."""
    store = MemoryStore()
    _frozen(store, tmp_path, "d3", _evidence(20), NOW - GRACE_S + 1)
    store.delete(f"evidence/d3/{MARKER}")  # still being captured
    assert sweep(store, keep_s=KEEP_S, grace_s=GRACE_S, now=NOW).parts == []
    parts = store.keys(PLACE)
    assert parts
    for key in parts:
        store.written_at[key] = NOW - GRACE_S - 1
    assert sweep(store, keep_s=KEEP_S, grace_s=GRACE_S, now=NOW).parts == parts
    assert not store.keys(PLACE)


def test_an_unreadable_kept_evidence_keeps_every_part(tmp_path: Path) -> None:
    """When a kept evidence.json does not read, what it references is unknown: no part goes."""
    store, _ = _two_diagnoses(tmp_path, NOW - KEEP_S - 1)
    store.objects["evidence/d9/evidence.json"] = b"{not json"
    store.written_at["evidence/d9/evidence.json"] = NOW
    parts = set(store.keys(PLACE))
    swept = sweep(store, keep_s=KEEP_S, grace_s=GRACE_S, now=NOW)
    assert swept.parts == [] and swept.notes
    assert set(store.keys(PLACE)) == parts


@pytest.mark.parametrize("gone", ["d1", "d2"])
def test_every_part_of_a_kept_diagnosis_survives_whichever_expires(
    tmp_path: Path, gone: str
) -> None:
    """Whichever of two diagnoses sharing parts expires, the other still thaws whole."""
    store = MemoryStore()
    evidence = _evidence(PART_ROWS + 3)
    at = {"d1": NOW - 60, "d2": NOW - 60, gone: NOW - KEEP_S - 1}
    _frozen(store, tmp_path, "d1", evidence, at["d1"])
    _frozen(store, tmp_path, "d2", evidence, at["d2"])
    for key in store.keys(PLACE):
        store.written_at[key] = NOW - KEEP_S - 1
    assert sweep(store, keep_s=KEEP_S, grace_s=GRACE_S, now=NOW).evidence == [gone]
    kept = "d2" if gone == "d1" else "d1"
    assert_same(_thawed(store, tmp_path, kept), evidence)
