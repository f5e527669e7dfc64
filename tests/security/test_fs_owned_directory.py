"""The rule every cache and output directory passes (`shared.safefs.owned_directory`, issue 28):
owned by this process's uid, writable by neither its group nor others, and no directory above it
another user could change (each root's or this uid's, and sticky when others may write it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.safefs import UnsafeDirectoryError, owned_directory
from tests.security.other_user import as_other_user


def test_a_directory_another_user_made_is_refused(shared_tmp: Path) -> None:
    """Made by uid 4242 (even mode 0700): refused, naming the path and its owner."""
    theirs = shared_tmp / "theirs"
    as_other_user(lambda: theirs.mkdir(mode=0o700))
    with pytest.raises(UnsafeDirectoryError, match=f"refused {theirs}: it is owned by uid 4242"):
        owned_directory(theirs)


def test_a_directory_under_another_users_directory_is_refused(shared_tmp: Path) -> None:
    """This process's own 0700 directory inside a directory of uid 4242 (who could rename it
    away and put another in its place): refused, naming the directory above."""
    theirs = shared_tmp / "theirs"
    as_other_user(lambda: theirs.mkdir(mode=0o755))
    as_other_user(lambda: theirs.chmod(0o777))
    mine = theirs / "mine"
    mine.mkdir(mode=0o700)
    with pytest.raises(UnsafeDirectoryError, match=f"{theirs} above it is owned by uid 4242"):
        owned_directory(mine)


@pytest.mark.parametrize(("mode", "usable"), [(0o1777, True), (0o0777, False)])
def test_a_directory_others_may_write_above_is_refused_unless_sticky(
    shared_tmp: Path, mode: int, usable: bool
) -> None:
    """Above the directory, root's world-writable `/tmp`-like directory is fine when sticky
    (others cannot rename what is not theirs), refused when not."""
    above = shared_tmp / "above"
    above.mkdir()
    above.chmod(mode)
    if usable:
        assert owned_directory(above / "cache") == above / "cache"
    else:
        with pytest.raises(UnsafeDirectoryError, match=r"others may write .* not sticky"):
            owned_directory(above / "cache")


def test_missing_levels_are_made_private_whatever_the_umask(tmp_path: Path) -> None:
    """Every level made is 0700 (a umask of 0 cannot open them), the last one checked."""
    old = os.umask(0)
    try:
        made = owned_directory(tmp_path / "a" / "b" / "c")
    finally:
        os.umask(old)
    for level in (tmp_path / "a", tmp_path / "a" / "b", made):
        assert level.stat().st_mode & 0o777 == 0o700


def test_a_symlink_is_refused_by_the_name_given(tmp_path: Path) -> None:
    """A symlink where the directory should be (even to a directory of this process's own) is
    refused, naming the link, not its target."""
    target = tmp_path / "hidden-target"
    target.mkdir(mode=0o700)
    link = tmp_path / "cache"
    link.symlink_to(target)
    with pytest.raises(UnsafeDirectoryError) as refused:
        owned_directory(link)
    assert str(link) in str(refused.value) and "hidden-target" not in str(refused.value)
