"""Reads stay inside the bundle: one place decides whether a path may be opened.

A path that leaves its root, through `..` or through a symlink whose target lies outside, is
refused with `PathEscapeError`; listings skip such entries and report them, so the report can list
them as discrepancies.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

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
        raise PathEscapeError(f"refused {str(relative)!r}: {_why(exc)}") from exc
    if resolved != base and base not in resolved.parents:
        raise PathEscapeError(
            f"refused {str(relative)!r}: it resolves to {resolved}, outside {base}"
        )
    return resolved


def _why(exc: BaseException) -> str:
    text = str(exc)
    if "loop" in text.lower() or getattr(exc, "errno", None) == errno.ELOOP:
        return "a symlink loop"
    return f"it cannot be resolved ({type(exc).__name__})"


@dataclass
class BundleFiles:
    """Lists files under a root without following anything that leaves it."""

    root: Path
    refused: list[str] = field(default_factory=list)

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root.resolve()).as_posix()

    def open_path(self, relative: str | Path) -> Path | None:
        """The resolved path, or None (recorded in `refused`) when it escapes the root."""
        try:
            return resolve_inside(self.root, relative)
        except PathEscapeError as exc:
            self.refused.append(str(exc))
            return None

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
