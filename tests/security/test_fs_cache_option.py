"""Issue 28, Medium 4: `diagnose --cache DIR` on a directory another user owns.

Its entries were trusted on their own hashes: forged ones turned an unchanged log into a KILL.
Now `--cache` (of `diagnose` and of `parse`) must name a directory of this process's own: owned
by its uid, writable by neither group nor others; anything else stops the command with exit 2
and one line, before a log is read.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.security.forged_cache import forge
from tests.security.other_user import copy_tree_as_other_user, open_to_all
from tests.unit.test_pipeline_logcache import NOW, World
from worker.cli import main
from worker.diagnosis import collect_evidence
from worker.evidence.log_cache import LogCache


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _planted(world: World, shared: Path) -> Path:
    """A directory uid 4242 made (mode 0777) holding forged entries for the job's logs."""
    staging = shared / "staging"
    collect_evidence(world.job, now=NOW, log_cache=LogCache(directory=staging))
    forge(staging)
    open_to_all(staging)
    planted = shared / "their-cache"
    copy_tree_as_other_user(staging, planted)
    return planted


def _refused(result: Result, planted: Path) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("rl-health: --cache: refused ")
    assert str(planted) in lines[0] and "owned by uid 4242" in lines[0]


def test_diagnose_refuses_a_cache_another_user_owns(world: World, shared_tmp: Path) -> None:
    """`diagnose --cache` on uid 4242's directory of forged entries: exit 2, one line, and no
    report (nothing forged is judged)."""
    planted = _planted(world, shared_tmp)
    result = _run("diagnose", world.job, "--now", NOW.isoformat(), "--cache", planted)
    _refused(result, planted)
    assert "VERDICT" not in result.stdout


def test_parse_refuses_a_cache_another_user_owns(world: World, shared_tmp: Path) -> None:
    """`parse --cache` on uid 4242's directory: exit 2, one line, no table written."""
    planted = _planted(world, shared_tmp)
    out = world.tmp / "tables"
    _refused(_run("parse", world.job, "--cache", planted, "--out", out), planted)
    assert not list(out.glob("*.csv"))


@pytest.mark.parametrize(("mode", "usable"), [(0o755, True), (0o775, False), (0o757, False)])
def test_a_cache_of_this_process_is_used_unless_others_may_write_it(
    world: World, mode: int, usable: bool
) -> None:
    """A cache directory of this process's own is used at mode 0755; one its group (0775) or
    others (0757) may write is refused, naming its mode."""
    cache = world.tmp / "cache"
    cache.mkdir()
    cache.chmod(mode)
    result = _run("diagnose", world.job, "--now", NOW.isoformat(), "--cache", cache)
    if usable:
        assert result.exit_code == 0, result.output
        assert list(cache.glob("*/meta.json"))
    else:
        assert result.exit_code == 2
        assert f"its group or others may write it (mode {mode:04o})" in result.stderr
