"""Issue 28, High 1: forged verdicts through the default cache directory.

Without RLHEALTH_CACHE_DIR the worker cached under `$TMPDIR/rlhealth-cache` and made it with
`mkdir(exist_ok=True)`: another user who made it first put log-cache entries there, forged with
matching hashes, and the worker parsed them as the job's logs (NO-KILL became KILL), then shared
them through S3, where a worker with a clean disk took them too. Now the default is the user's own
cache directory, and a cache directory another user owns is refused with one line.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from shared.settings import Settings
from tests.security.forged_cache import forge, forged_in
from tests.security.other_user import as_other_user, copy_tree_as_other_user, open_to_all
from tests.unit.test_pipeline_logcache import JOB, World, _same_logs
from worker.cli import main
from worker.evidence.case import Evidence
from worker.pipeline.logcache import JobLogCache
from worker.pipeline.store import MemoryStore


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _capture(world: World, settings: Settings) -> Evidence:
    return JobLogCache(settings, world.store).collect(JOB, world.read)[0]


def _forged_cache(world: World, shared: Path, name: str) -> Path:
    """`shared/name`, made by uid 4242 (mode 0777) and filled with entries for the job's logs
    that an honest parse made and the attacker forged (their hashes recomputed)."""
    staging = shared / "staging"
    JobLogCache(Settings(bundle_root=world.root, cache_dir=staging), MemoryStore()).collect(
        JOB, world.read
    )
    forge(staging)
    open_to_all(staging)
    target = shared / name
    copy_tree_as_other_user(staging, target)
    return target


def test_a_cache_another_user_made_in_the_temp_directory_is_never_read(
    world: World, shared_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user makes `$TMPDIR/rlhealth-cache` first, with forged entries for the job: the
    worker's default cache is not there, so its capture reads the log as it is, and nothing
    forged reaches S3 (a worker with a clean disk reads the log as it is too)."""
    _forged_cache(world, shared_tmp, "rlhealth-cache")
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    monkeypatch.setenv("TMPDIR", str(shared_tmp))
    monkeypatch.setenv("XDG_CACHE_HOME", str(world.tmp / "xdg"))
    truth = world.read(None)
    found = _capture(world, Settings(bundle_root=world.root))
    assert found.logs is not None and not forged_in(found.logs.metrics)
    _same_logs(found.logs, truth.logs)
    fresh = _capture(world, Settings(bundle_root=world.root, cache_dir=world.tmp / "fresh"))
    _same_logs(fresh.logs, truth.logs)


def test_the_default_cache_is_the_users_own(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no RLHEALTH_CACHE_DIR the cache is under `$XDG_CACHE_HOME/rl-job-health` (else
    `~/.cache/rl-job-health`), made 0700, never under the temp directory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(world.tmp / "xdg"))
    cache = JobLogCache(Settings(bundle_root=world.root), world.store)
    assert cache.root == world.tmp / "xdg" / "rl-job-health" / "logs"
    assert (world.tmp / "xdg" / "rl-job-health").stat().st_mode & 0o777 == 0o700
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(world.tmp / "home"))
    cache = JobLogCache(Settings(bundle_root=world.root), world.store)
    assert cache.root == world.tmp / "home" / ".cache" / "rl-job-health" / "logs"


def test_a_cache_dir_setting_another_user_owns_is_refused(
    world: World, shared_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RLHEALTH_CACHE_DIR naming a directory uid 4242 made (forged entries in it): the capture
    refuses it, naming the path and its owner, and never reads an entry from it."""
    planted = _forged_cache(world, shared_tmp, "their-cache")
    settings = Settings(bundle_root=world.root, cache_dir=planted)
    with pytest.raises(ValueError, match=f"refused {planted}: it is owned by uid 4242"):
        _capture(world, settings)


def test_the_worker_will_not_start_on_a_cache_dir_another_user_owns(
    shared_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rl-health worker` with RLHEALTH_CACHE_DIR made by uid 4242 exits 2 with one line before
    the worker starts."""
    from worker.pipeline.app import app

    planted = shared_tmp / "their-cache"
    as_other_user(lambda: planted.mkdir(mode=0o777))

    def started(*_args: object) -> None:
        raise AssertionError("the worker started on another user's cache directory")

    monkeypatch.setattr(app, "worker_main", started)
    result = CliRunner().invoke(
        main, ["worker"], env={"RLHEALTH_CACHE_DIR": str(planted)}, catch_exceptions=False
    )
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "owned by uid 4242" in lines[0] and str(planted) in lines[0]
