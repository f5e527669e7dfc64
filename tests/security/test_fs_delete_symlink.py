"""Issue 28, High 2: deletion through a symlink.

The same user made `logs` inside the worker's cache directory a symlink to another directory; the
worker's tidy-up (`JobLogCache.prune`, `LogCache.retain`) listed what the link pointed to and,
running as root, deleted that directory's `.ssh`, `.config` and `projects`. Now a cache another
user owns is refused, and the tidy-ups list and remove through the directory's descriptor: a
symlink is unlinked, never followed.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import fakeredis
import pytest

from shared.settings import Settings
from tests.security.other_user import as_other_user
from tests.unit.test_pipeline_logcache import JOB, World
from worker.evidence.log_cache import LogCache
from worker.pipeline.logcache import JobLogCache, job_id
from worker.pipeline.steps import Pipeline

_MONTH_AGO = time.time() - 30 * 86400


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _victim(top: Path) -> Path:
    """A home directory of someone else's: `.ssh`, `.config`, `projects`, a month old."""
    for name in (".ssh", ".config", "projects"):
        (top / name).mkdir(parents=True)
        (top / name / "keep").write_text(name)
        os.utime(top / name, (_MONTH_AGO, _MONTH_AGO))
    return top


def _intact(victim: Path) -> bool:
    return all((victim / name / "keep").is_file() for name in (".ssh", ".config", "projects"))


def test_a_logs_symlink_in_a_planted_cache_deletes_nothing(
    world: World, shared_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uid 4242 makes `$TMPDIR/rlhealth-cache/logs` a symlink to another directory: a capture
    and its tidy-up (with the default cache) leave that directory whole."""
    victim = _victim(shared_tmp / "victim")
    planted = shared_tmp / "rlhealth-cache"

    def plant() -> None:
        planted.mkdir(mode=0o777)
        (planted / "logs").symlink_to(victim)

    as_other_user(plant)
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    monkeypatch.setenv("XDG_CACHE_HOME", str(world.tmp / "xdg"))
    cache = JobLogCache(Settings(bundle_root=world.root), world.store)
    cache.collect(JOB, world.read)
    cache.prune()
    assert _intact(victim)


def test_a_planted_logs_symlink_in_a_named_cache_is_refused(world: World, shared_tmp: Path) -> None:
    """RLHEALTH_CACHE_DIR names a directory whose `logs` uid 4242 made a symlink: refused (one
    line naming the path given), and the directory it points to is left whole."""
    victim = _victim(shared_tmp / "victim")
    planted = shared_tmp / "their-cache"

    def plant() -> None:
        planted.mkdir(mode=0o777)
        (planted / "logs").symlink_to(victim)

    as_other_user(plant)
    with pytest.raises(ValueError, match=f"refused {planted}") as refused:
        JobLogCache(Settings(bundle_root=world.root, cache_dir=planted), world.store).prune()
    assert str(victim) not in str(refused.value)
    assert _intact(victim)


def test_prune_never_follows_a_logs_directory_swapped_for_a_symlink(world: World) -> None:
    """The worker's own cache, its `logs` swapped for a symlink after the cache was checked:
    `prune` opens `logs` without following it, so the month-old directories the link points
    to stay."""
    victim = _victim(world.tmp / "victim")
    cache = JobLogCache(Settings(bundle_root=world.root, cache_dir=world.tmp / "own"), world.store)
    cache.root.mkdir(parents=True, exist_ok=True)
    cache.root.rmdir()
    cache.root.symlink_to(victim, target_is_directory=True)
    cache.prune()
    assert _intact(victim)


def test_prune_leaves_a_symlinked_entry_and_what_it_points_to(world: World) -> None:
    """A month-old entry of the worker's cache that is a symlink to a directory is not a job
    folder: `prune` neither follows nor counts it, and the directory stays whole."""
    victim = _victim(world.tmp / "victim")
    cache = JobLogCache(Settings(bundle_root=world.root, cache_dir=world.tmp / "own"), world.store)
    cache.root.mkdir(parents=True, exist_ok=True)
    link = cache.root / ("0" * 32)
    link.symlink_to(victim, target_is_directory=True)
    os.utime(link, (_MONTH_AGO, _MONTH_AGO), follow_symlinks=False)
    assert cache.prune() == []
    assert _intact(victim)


def test_retain_never_follows_a_symlinked_cache_directory(world: World, shared_tmp: Path) -> None:
    """A `LogCache` whose directory is reached through another user's symlink is refused, so
    `retain` (which removes every entry not kept) never lists what the link points to."""
    victim = _victim(shared_tmp / "victim")
    theirs = shared_tmp / "theirs"

    def plant() -> None:
        theirs.mkdir(mode=0o777)
        (theirs / job_id(JOB)).symlink_to(victim)

    as_other_user(plant)
    with pytest.raises(ValueError, match="refused"):
        LogCache(directory=theirs / job_id(JOB)).retain([])
    assert _intact(victim)


def test_the_evidence_cache_prune_never_follows_a_symlink(world: World) -> None:
    """The pipeline's local copies of frozen evidence: a month-old entry that is a symlink to a
    directory is removed as a link; the directory stays."""
    victim = _victim(world.tmp / "victim")
    settings = Settings(bundle_root=world.root, cache_dir=world.tmp / "own")
    pipeline = Pipeline(settings, world.store, fakeredis.FakeRedis())
    pipeline.frozen.cache_root.mkdir(parents=True, exist_ok=True)
    link = pipeline.frozen.cache_root / "evt-old"
    link.symlink_to(victim, target_is_directory=True)
    os.utime(link, (_MONTH_AGO, _MONTH_AGO), follow_symlinks=False)
    (pipeline.frozen.cache_root / "evt-new").mkdir()
    pipeline.frozen.prune()
    assert not link.is_symlink() and _intact(victim)
    assert (pipeline.frozen.cache_root / "evt-new").is_dir()
