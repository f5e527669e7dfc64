"""A second user of the machine (uid and gid 4242) for the file-system attacks of issue 28.

Attacker steps run in a forked child that drops every group and becomes uid/gid 4242 before it
does anything (`as_other_user`), then ends with `os._exit`: the test process stays root. A test
that needs it is skipped, with its reason printed, when the suite does not run as root (CI runs it
as root).

`shared_directory` makes a directory both users reach, like `/tmp` (mode 1777, root's), under
`/tmp` itself: pytest's own temporary directories are closed to other users (the `shared_tmp`
fixture of `tests/security/conftest.py`).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import pytest

__all__ = [
    "OTHER_UID",
    "as_other_user",
    "copy_tree_as_other_user",
    "needs_root",
    "open_to_all",
    "shared_directory",
]

OTHER_UID: Final = 4242


def needs_root() -> None:
    """Skip the test, its reason printed, unless it runs as root."""
    if os.geteuid() != 0:
        reason = "needs root to act as a second user (uid 4242): CI runs tests/security as root"
        print(f"skipped: {reason}")
        pytest.skip(reason)


def as_other_user(step: Callable[[], None]) -> None:
    """Run `step` in a forked child as uid/gid 4242 with no supplementary group; fails the
    test when it raises (its traceback printed)."""
    pid = os.fork()
    if pid == 0:  # the child: only file-system calls, then _exit (never back into pytest)
        code = 1
        try:
            os.setgroups([])
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            step()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the second user's step failed"


def open_to_all(top: Path) -> None:
    """Let every user read `top` and what is under it (the attacker copies it)."""
    for path in [top, *top.rglob("*")]:
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode):
            added = 0o555 if stat.S_ISDIR(mode) else 0o444
            path.chmod(stat.S_IMODE(mode) | added)


def copy_tree_as_other_user(source: Path, target: Path) -> None:
    """As uid 4242: make `target` (and missing levels, mode 0777) and copy `source` into it."""

    def step() -> None:
        target.mkdir(mode=0o777, parents=True, exist_ok=True)
        target.chmod(0o777)
        shutil.copytree(source, target, dirs_exist_ok=True)

    as_other_user(step)


@contextmanager
def shared_directory() -> Iterator[Path]:
    """A directory like `/tmp` (root's, mode 1777) that both users reach; removed afterwards."""
    needs_root()
    path = Path(tempfile.mkdtemp(prefix="rlhealth-shared-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
