"""Issue 28, Medium 5: `--out DIR` and `parse --out DIR` wrote through symlinks planted there.

Root-owned 0600 files were overwritten with the report. Now `--out` must be a directory of this
process's own (another user's is refused with exit 2 and one line), and every file is written
under a new name opened with `O_EXCL|O_NOFOLLOW`, then renamed over its own: a symlink in the
folder is replaced, never written through.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.security.other_user import as_other_user
from tests.unit.test_pipeline_logcache import NOW, World
from worker.cli import main

SECRET = b"root's own, mode 0600\n"
DIAGNOSE_FILES = ("report.txt", "report.json", "report.html")
PARSE_FILES = ("metrics.csv", "phases.csv", "engines.csv")


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _victim(where: Path) -> Path:
    victim = where / "victim"
    victim.write_bytes(SECRET)
    victim.chmod(0o600)
    return victim


def _their_out(shared: Path, victim: Path, names: tuple[str, ...]) -> Path:
    """An output folder uid 4242 made (mode 0777) with each of `names` a symlink to `victim`."""
    out = shared / "out"

    def plant() -> None:
        out.mkdir(mode=0o777)
        for name in names:
            (out / name).symlink_to(victim)

    as_other_user(plant)
    return out


def _command(kind: str, world: World, out: Path) -> Result:
    if kind == "diagnose":
        return _run("diagnose", world.job, "--now", NOW.isoformat(), "--out", out)
    return _run("parse", world.job, "--out", out)


@pytest.mark.parametrize(("kind", "names"), [("diagnose", DIAGNOSE_FILES), ("parse", PARSE_FILES)])
def test_an_out_folder_another_user_made_is_refused(
    world: World, shared_tmp: Path, kind: str, names: tuple[str, ...]
) -> None:
    """`--out` made by uid 4242 with the output names linked to a root-owned file: exit 2 with
    one line naming the folder and its owner; the file is untouched."""
    victim = _victim(shared_tmp)
    out = _their_out(shared_tmp, victim, names)
    result = _command(kind, world, out)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rl-health: --out: refused ")
    assert str(out) in lines[0] and "owned by uid 4242" in lines[0]
    assert victim.read_bytes() == SECRET


@pytest.mark.parametrize(("kind", "names"), [("diagnose", DIAGNOSE_FILES), ("parse", PARSE_FILES)])
def test_a_symlink_in_an_own_out_folder_is_replaced_not_written_through(
    world: World, kind: str, names: tuple[str, ...]
) -> None:
    """In an `--out` of this process's own, output names that are symlinks to a 0600 file are
    replaced by the outputs (regular files); the file they pointed to is untouched."""
    victim = _victim(world.tmp)
    out = world.tmp / "out"
    out.mkdir()
    for name in names:
        (out / name).symlink_to(victim)
    result = _command(kind, world, out)
    assert result.exit_code in (0, 1), result.output
    assert victim.read_bytes() == SECRET
    for name in names:
        assert not (out / name).is_symlink() and (out / name).is_file()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temporary left
