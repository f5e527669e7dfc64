"""Files of this process, and files of trees others write, handled so no other user can steer them.

Another user of the machine must not choose what this process reads, writes or deletes (issue 28):

- **Owned directories.** A cache or output directory is used only when it is this process's own:
  owned by its effective uid, writable by neither its group nor others, and every directory above
  it owned by root or that uid and, when others may write it, sticky (as `/tmp`): nobody else can
  then put, swap or remove anything in it. A missing directory is made, every missing level with
  the mode asked (0700 for caches), whatever the umask. Anything else is `UnsafeDirectoryError`,
  one line naming the path given (`owned_directory`).
- **Writes replace, never follow.** A file is written to a new name opened with
  `O_CREAT|O_EXCL|O_NOFOLLOW` under the directory's descriptor, then renamed over its name: a
  symlink planted there is replaced, never written through, and a reader never sees half a file
  (`replacing`, `write_file`).
- **Deletes never follow.** A directory is listed and its entries removed through its descriptor
  (opened with `O_NOFOLLOW`): a symlink is unlinked, never entered; a directory is removed by
  `shutil.rmtree` under that descriptor (which opens every level with `O_NOFOLLOW` itself)
  (`Folder`, `remove_tree`).
- **Reads of others' trees beneath a descriptor.** A file of a tree someone else writes (a bundle)
  is opened from the tree root's descriptor one component at a time with `O_NOFOLLOW`, then checked
  with `fstat`: a path swapped for a symlink after it was checked is refused by the open itself,
  so the check and the read are one act (`Beneath`).

Pure standard library: the parse command imports it before polars.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path, PurePath
from typing import BinaryIO, Final

__all__ = [
    "Beneath",
    "DirEntry",
    "Folder",
    "RefusedFileError",
    "UnsafeDirectoryError",
    "owned_directory",
    "remove_tree",
    "replacing",
    "write_file",
]

CACHE_MODE: Final = 0o700
OUTPUT_MODE: Final = 0o755
FILE_MODE: Final = 0o644
_DIRECTORY: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted in place of a file must not block the open (fstat refuses it after)
_READ: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_NEW: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OTHERS_WRITE: Final = stat.S_IWGRP | stat.S_IWOTH
_SYMLINK_ERRNOS: Final = (errno.ELOOP, errno.ENOTDIR)


class UnsafeDirectoryError(ValueError):
    """A directory this process will not use: another user could change what is in it."""


class RefusedFileError(ValueError):
    """A file of another's tree that is not opened: a symlink on its way, or not a regular file."""


def _refused(path: Path, why: str) -> UnsafeDirectoryError:
    return UnsafeDirectoryError(f"refused {path}: {why}")


def _check_own(path: Path, found: os.stat_result, *, alone: bool = True) -> None:
    """`path` (stat `found`) must be this process's own and, with `alone`, no one else's to
    write."""
    me = os.geteuid()
    if found.st_uid != me:
        raise _refused(path, f"it is owned by uid {found.st_uid}, not by this process (uid {me})")
    if alone and found.st_mode & _OTHERS_WRITE:
        mode = stat.S_IMODE(found.st_mode)
        raise _refused(path, f"its group or others may write it (mode {mode:04o})")


def _check_above(path: Path, above: Path) -> None:
    """A directory above `path` must be root's or this process's, and sticky if others write."""
    found = above.stat()
    if found.st_uid not in (0, os.geteuid()):
        raise _refused(path, f"{above} above it is owned by uid {found.st_uid}")
    if found.st_mode & _OTHERS_WRITE and not found.st_mode & stat.S_ISVTX:
        raise _refused(path, f"others may write {above} above it (and it is not sticky)")


def _above(path: Path) -> set[Path]:
    """The directories above `path`, as written (`..` folded) and as resolved."""
    return {*_written(path).parents, *path.resolve().parents}


def _written(path: Path) -> Path:
    """`path` absolute, `..` folded without resolving symlinks."""
    return Path(os.path.normpath(path.absolute()))


def _make(path: Path, mode: int) -> None:
    """Make `path` and every missing level above it with `mode` (the umask only takes bits)."""
    missing: list[Path] = []
    for level in [path, *_written(path).parents]:
        if os.path.lexists(level):
            break
        missing.append(level)
    for level in reversed(missing):
        try:
            level.mkdir(mode)
        except FileExistsError:  # made meanwhile: checked below like any directory found
            continue


def _open_directory(path: Path | str, dir_fd: int | None = None) -> int:
    return os.open(path, _DIRECTORY, dir_fd=dir_fd)


def owned_directory(path: Path, *, mode: int = CACHE_MODE) -> Path:
    """`path`, made with `mode` when missing, once it is checked to be this process's own
    (module docstring); `UnsafeDirectoryError` naming `path` as given otherwise."""
    try:
        _make(path, mode)
        fd = _open_directory(path)
    except OSError as exc:
        if exc.errno in _SYMLINK_ERRNOS:
            raise _refused(path, "it is a symlink or not a directory") from None
        raise _refused(path, exc.strerror or str(exc)) from None
    try:
        _check_own(path, os.fstat(fd))
    finally:
        os.close(fd)
    for above in sorted(_above(path)):
        _check_above(path, above)
    return path


@dataclass(frozen=True)
class DirEntry:
    """One entry of a directory as it is, not followed: a symlink is neither file nor directory."""

    name: str
    is_dir: bool
    is_file: bool
    mtime: float


class Folder:
    """A directory held open by its descriptor (its last component not followed), to list its
    entries and remove them without following a symlink; closed on leaving the `with`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = _open_directory(path)

    @classmethod
    def existing(cls, path: Path) -> Folder | None:
        """`path` held open, or None when it is missing or not a directory (a symlink, even to
        one): there is then nothing of this process's to list or remove."""
        try:
            return cls(path)
        except OSError:
            return None

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *_exc: object) -> None:
        os.close(self.fd)

    def entries(self) -> list[DirEntry]:
        """Every entry, by name, as `lstat` sees it (one gone meanwhile is left out)."""
        found: list[DirEntry] = []
        with os.scandir(self.fd) as listing:
            for item in listing:
                try:
                    seen = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                is_dir, is_file = stat.S_ISDIR(seen.st_mode), stat.S_ISREG(seen.st_mode)
                found.append(DirEntry(item.name, is_dir, is_file, seen.st_mtime))
        return sorted(found, key=lambda entry: entry.name)

    def remove(self, name: str) -> bool:
        """Remove entry `name`: a directory with everything under it, anything else unlinked
        (a symlink itself, never what it points to). False when it could not be (gone already
        included): a tidy-up that fails costs disk, never the work it tidies after."""
        try:
            seen = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            if stat.S_ISDIR(seen.st_mode):
                shutil.rmtree(name, dir_fd=self.fd)
            else:
                os.unlink(name, dir_fd=self.fd)
        except OSError:
            return False
        return True

    def size(self, name: str) -> int:
        """The bytes of the regular files under entry `name` (symlinks not followed; 0 when it
        is gone)."""
        try:
            seen = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return 0
        if not stat.S_ISDIR(seen.st_mode):
            return seen.st_size if stat.S_ISREG(seen.st_mode) else 0
        fd = _open_directory(name, self.fd)
        try:
            return _tree_bytes(fd)
        finally:
            os.close(fd)


def _tree_bytes(fd: int) -> int:
    total = 0
    for top, _dirs, files, top_fd in os.fwalk(dir_fd=fd, follow_symlinks=False):
        del top
        for name in files:
            try:
                seen = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            total += seen.st_size if stat.S_ISREG(seen.st_mode) else 0
    return total


def remove_tree(path: Path) -> bool:
    """Remove `path` (a directory with everything under it, or a file, or a symlink itself)
    without following a symlink anywhere; False when it could not be (gone already included)."""
    try:
        parent = Folder(path.parent)
    except OSError:
        return False
    with parent:
        return parent.remove(path.name)


@contextmanager
def replacing(directory: Path, name: str, mode: int = FILE_MODE) -> Iterator[BinaryIO]:
    """A new file to write `directory/name` into: a fresh name opened under the directory's
    descriptor (`O_EXCL|O_NOFOLLOW`), renamed over `name` when the block ends (removed when it
    raises). `directory` must be owned by this process (`UnsafeDirectoryError` otherwise; the
    directory the caller was given is checked whole by `owned_directory` first, the folders it
    makes below it need only be its own)."""
    if os.sep in name or name in ("", ".", ".."):
        raise ValueError(f"{name!r} is not a file name")
    dir_fd = _open_directory(directory)
    try:
        _check_own(directory, os.fstat(dir_fd), alone=False)
        staged = f".{name}.{secrets.token_hex(6)}.tmp"
        handle = os.fdopen(os.open(staged, _NEW, mode, dir_fd=dir_fd), "wb")
        try:
            with handle:
                yield handle
            os.replace(staged, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            os.unlink(staged, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


def write_file(directory: Path, name: str, data: bytes, mode: int = FILE_MODE) -> Path:
    """`directory/name` written whole through `replacing`; its path."""
    with replacing(directory, name, mode) as handle:
        handle.write(data)
    return directory / name


class Beneath:
    """A tree others write (a bundle), its root held by a descriptor: files are opened beneath
    it one component at a time, no symlink followed, and checked to be regular files."""

    def __init__(self, root: Path) -> None:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the root as named
        self.fd = fd
        self._close = weakref.finalize(self, os.close, fd)

    def close(self) -> None:
        self._close()

    def open(self, relative: PurePath) -> BufferedReader:
        """File `relative` (no `..`, not absolute) beneath the root, opened for reading.
        `RefusedFileError` when a component is a symlink or the file is not a regular file;
        `OSError` when it cannot be opened otherwise (missing, say)."""
        parts = relative.parts
        if not parts or relative.is_absolute() or ".." in parts:
            raise RefusedFileError("it is not a path beneath the root")
        opened: list[int] = []
        try:
            here = self.fd
            for part in parts[:-1]:
                here = _open_directory(part, here)
                opened.append(here)
            fd = os.open(parts[-1], _READ, dir_fd=here)
        except OSError as exc:
            if exc.errno in _SYMLINK_ERRNOS:
                raise RefusedFileError("a symlink stands on its way") from None
            raise
        finally:
            for level in opened:
                os.close(level)
        return _regular(fd)


def _regular(fd: int) -> BufferedReader:
    """`fd` as a binary reader when it is a regular file (else closed, `RefusedFileError`)."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RefusedFileError("it is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")
