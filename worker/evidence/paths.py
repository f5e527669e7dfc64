"""Reads stay inside the bundle: one place decides whether a path may be opened, and opens it.

A path that leaves its root, through `..` or through a symlink whose target lies outside, is
refused with `PathEscapeError`; listings skip such entries and report them, so the report can list
them as discrepancies. A refusal names the path as the bundle gives it, never where a symlink
points (that could be anything on the machine: `/proc/self/fd/3`, the working directory).

A file is read through `BundleFiles.open`: its path resolved and checked as above, then opened
beneath the root's descriptor one component at a time without following any symlink, and checked
with `fstat` to be a regular file (`shared.safefs.Beneath`). A file swapped for a symlink between
the check and the open is refused by the open itself: the check and the read are one act.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from io import BufferedReader
from pathlib import Path, PurePath

from shared.safefs import Beneath, RefusedFileError

__all__ = ["BundleFiles", "PathEscapeError", "resolve_inside"]


class PathEscapeError(ValueError):
    """A path that would leave the directory it must stay in."""


def resolve_inside(root: Path, relative: str | Path) -> Path:
    """`root / relative`, resolved, or `PathEscapeError` when the result is not under `root`."""
    candidate = Path(relative)
    try:
        base = root.resolve()
        joined = candidate if candidate.is_absolute() else base / candidate
        resolved = joined.resolve()
    except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError before Python 3.13)
        raise PathEscapeError(f"refused {_named(base, candidate)!r}: {_why(exc)}") from exc
    if resolved != base and base not in resolved.parents:
        raise PathEscapeError(f"refused {_named(base, candidate)!r}: it leads outside {root}")
    return resolved


def _named(base: Path, path: Path) -> str:
    """`path` as the bundle names it: relative to the root when under it, else as given."""
    try:
        return path.relative_to(base).as_posix() if path.is_absolute() else path.as_posix()
    except ValueError:
        return path.as_posix()


def _why(exc: BaseException) -> str:
    text = str(exc)
    if "loop" in text.lower() or getattr(exc, "errno", None) == errno.ELOOP:
        return "a symlink loop"
    return f"it cannot be resolved ({type(exc).__name__})"


@dataclass
class BundleFiles:
    """Lists and opens files under a root without following anything that leaves it."""

    root: Path
    refused: list[str] = field(default_factory=list)
    _beneath: Beneath | None = field(default=None, init=False, repr=False, compare=False)

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root.resolve()).as_posix()

    def open_path(self, relative: str | Path) -> Path | None:
        """The resolved path, or None (recorded in `refused`) when it escapes the root."""
        try:
            return resolve_inside(self.root, relative)
        except PathEscapeError as exc:
            self.refused.append(str(exc))
            return None

    def open(self, relative: str | Path) -> BufferedReader | None:
        """The file, opened for reading beneath the root's descriptor (module docstring); None
        (recorded in `refused`) when it escapes the root, a symlink took a place on its way since
        it was checked, or it is not a regular file. `OSError` when it cannot be opened otherwise
        (gone, say)."""
        resolved = self.open_path(relative)
        if resolved is None:
            return None
        inside = PurePath(os.path.relpath(resolved, self.root.resolve()))
        try:
            return self._root().open(inside)
        except RefusedFileError as exc:
            self.refused.append(f"refused {_named(self.root.resolve(), Path(relative))!r}: {exc}")
            return None

    def _root(self) -> Beneath:
        if self._beneath is None:
            self._beneath = Beneath(self.root.resolve())
        return self._beneath

    def walk(self, relative: str | Path = ".", pattern: str = "*") -> Iterator[Path]:
        """Regular files under `relative` matching `pattern`, sorted, escapes refused."""
        top = self.open_path(relative)
        if top is None or not top.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
            here = Path(dirpath)
            dirnames[:] = sorted(d for d in dirnames if self._keep_dir(here / d))
            for name in sorted(filenames):
                path = self._keep_file(here / name)
                if path is not None and path.match(pattern):
                    yield path

    def _keep_dir(self, path: Path) -> bool:
        if not path.is_symlink():
            return True
        return self.open_path(path) is not None

    def _keep_file(self, path: Path) -> Path | None:
        if not path.is_symlink():
            return path if path.is_file() else None
        resolved = self.open_path(path)
        return resolved if resolved is not None and resolved.is_file() else None
