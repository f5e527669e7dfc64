"""The repository stands alone: no tracked file points at the handbook that lives outside it, and
every documentation page that a page, the README or a Python file cites (with its section, when
one is named) exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Files outside the repository that users never get. The names are assembled so that this file
# does not mention them itself.
OUTSIDE = (*(name + ".md" for name in ("DOMAIN", "CONTRACT", "STYLE")), "../" + "shared")


CITED_PAGE = re.compile(r"\bdocs/([A-Za-z0-9_./-]+\.md)(?:#([A-Za-z0-9_-]+))?")
RELATIVE_LINK = re.compile(r"\]\((?!https?:|#|/)([A-Za-z0-9_./-]+\.md)(?:#([A-Za-z0-9_-]+))?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _tracked() -> list[str]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    return [name for name in listed.decode().split("\0") if name]


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary file (NUL bytes or not UTF-8)."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    plain = heading.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", plain).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(title) for title in HEADING.findall(FENCE.sub("", page.read_text()))}


def _citing() -> list[Path]:
    """The README, every documentation page, and every tracked Python file (its docstrings)."""
    python = [ROOT / name for name in _tracked() if name.endswith(".py")]
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *python]


def _citations(page: Path) -> list[tuple[Path, str | None, str]]:
    """Every documentation page `page` cites: the target, its anchor, and the text as written."""
    text = page.read_text()
    cited = [
        (ROOT / "docs" / name, anchor, m.group(0))
        for m in CITED_PAGE.finditer(text)
        for name, anchor in [m.groups()]
    ]
    if page.is_relative_to(ROOT / "docs"):
        cited += [
            ((page.parent / name).resolve(), anchor, m.group(0))
            for m in RELATIVE_LINK.finditer(text)
            for name, anchor in [m.groups()]
        ]
    return cited


def test_no_tracked_file_points_outside_the_repository() -> None:
    """No tracked text file names the handbook's pages or its folder."""
    offenders = []
    for name in _tracked():
        path = ROOT / name
        if not path.is_file():
            continue
        text = _text(path)
        if text is None:
            continue
        offenders += [f"{name}: {outside}" for outside in OUTSIDE if outside in text]
    assert offenders == []


def test_every_cited_documentation_page_and_section_exists() -> None:
    """Every documentation page cited exists, and so does the section it names."""
    missing = []
    for page in _citing():
        for target, anchor, written in _citations(page):
            where = f"{page.relative_to(ROOT)}: {written}"
            if not target.is_file():
                missing.append(f"{where} (no such page)")
            elif anchor is not None and anchor not in _anchors(target):
                missing.append(f"{where} (no such section)")
    assert missing == []


def test_the_slug_follows_github() -> None:
    """Anchors are made as GitHub makes them, so a link that passes here works on the site."""
    assert _slug("Capture policy (`worker/pipeline/capture.py`)") == (
        "capture-policy-workerpipelinecapturepy"
    )
    assert _slug("Trainer–trial agreement is about the evidence") == (
        "trainertrial-agreement-is-about-the-evidence"
    )
    assert _slug('What "established" means: the proof rules') == (
        "what-established-means-the-proof-rules"
    )
