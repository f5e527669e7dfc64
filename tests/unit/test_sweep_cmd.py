"""`rl-health sweep` on the in-memory store: what it deletes (or would) just past and just short
of --keep and --grace, what it prints, and its exit codes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.unit.test_evidence_sweep import PLACE, _evidence, _frozen
from worker.cli import main
from worker.pipeline import store as store_module
from worker.pipeline.store import MemoryStore

DAY = 86400.0
MARGIN = 600.0  # well past the run's own duration, well short of any window here


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> MemoryStore:
    memory = MemoryStore()
    monkeypatch.setattr(store_module, "store_from_settings", lambda _settings: memory)
    return memory


def _sweep(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["sweep", *args])
    return result.exit_code, result.stdout, result.stderr


def _two_diagnoses(store: MemoryStore, tmp: Path, keep_s: float) -> tuple[set[str], set[str]]:
    """`old` judged just past `keep_s` ago, `young` just short of it, on a grown table: the
    parts only `old` references, and those `young` references too."""
    now = time.time()
    _frozen(store, tmp, "old", _evidence(100), now - keep_s - MARGIN)
    old_parts = set(store.keys(PLACE))
    _frozen(store, tmp, "young", _evidence(5000), now - keep_s + MARGIN)
    young_parts = set(store.keys(PLACE)) - old_parts
    return old_parts, young_parts


def test_just_past_keep_goes_just_short_stays(store: MemoryStore, tmp_path: Path) -> None:
    """With --keep 30d: the evidence judged just past 30 days ago is deleted with the parts only
    it used (older than the grace); the one just short of 30 days, and its parts, stay."""
    old_parts, young_parts = _two_diagnoses(store, tmp_path, 30 * DAY)
    code, out, err = _sweep("--keep", "30d")
    assert code == 0, err
    assert "deleted evidence memory://rlhealth/evidence/old/" in out.splitlines()
    assert "young" not in out
    assert not store.keys("evidence/old/") and store.keys("evidence/young/")
    referenced_by_young = set(store.keys(PLACE))
    assert young_parts <= referenced_by_young
    gone = old_parts - referenced_by_young
    assert gone and {f"deleted part memory://rlhealth/{key}" for key in gone} <= set(
        out.splitlines()
    )
    assert f"sweep: deleted 1 frozen evidence, {len(gone)} table part(s)" in err


def test_a_part_younger_than_the_grace_stays(store: MemoryStore, tmp_path: Path) -> None:
    """An unreferenced part just short of --grace stays; just past it, it goes."""
    now = time.time()
    store.put_once(f"{PLACE}young-part.parquet", b"x")
    store.written_at[f"{PLACE}young-part.parquet"] = now - 6 * 3600 + MARGIN
    store.put_once(f"{PLACE}old-part.parquet", b"x")
    store.written_at[f"{PLACE}old-part.parquet"] = now - 6 * 3600 - MARGIN
    code, out, _err = _sweep("--keep", "30d", "--grace", "6h")
    assert code == 0
    assert out.splitlines() == [f"deleted part memory://rlhealth/{PLACE}old-part.parquet"]
    assert store.keys(PLACE) == [f"{PLACE}young-part.parquet"]


def test_a_dry_run_prints_the_same_and_deletes_nothing(store: MemoryStore, tmp_path: Path) -> None:
    """--dry-run prints `would delete` for what the sweep deletes, and leaves every object."""
    _two_diagnoses(store, tmp_path, 7 * DAY)
    before = dict(store.objects)
    code, dry, err = _sweep("--keep", "7d", "--dry-run")
    assert code == 0 and "sweep: would delete 1 frozen evidence" in err
    assert store.objects == before
    code, real, _err = _sweep("--keep", "7d")
    assert dry.replace("would delete", "deleted") == real


@pytest.mark.parametrize("args", [["--keep", "0d"], ["--keep", "30"], ["--keep", "3y"], []])
def test_an_unusable_duration_exits_2(store: MemoryStore, args: list[str]) -> None:
    """A duration without a unit, of zero, of an unknown unit, or no --keep: exit 2, nothing
    deleted."""
    store.put_once("evidence-parts/job/p.parquet", b"x")
    store.written_at["evidence-parts/job/p.parquet"] = 0.0
    code, _out, _err = _sweep(*args)
    assert code == 2
    assert store.keys("") == ["evidence-parts/job/p.parquet"]


def test_s3_away_exits_1(store: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """An S3 fault (here: a connection refused while listing) exits 1 with one line."""

    def refused(_prefix: str) -> list[str]:
        raise ConnectionRefusedError("connection refused")

    monkeypatch.setattr(store, "keys", refused)
    code, _out, err = _sweep("--keep", "30d")
    assert code == 1
    assert err.startswith("rl-health: sweep stopped, S3 failed:")
