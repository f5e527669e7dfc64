"""The helpers the tests and the benchmark share live in `testkit/`, and imports run one way:
`tests/` and `bench/` import `testkit/`; `testkit/` imports neither; `bench/` never imports
`tests/`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_roots(path: Path) -> set[str]:
    """The top-level package of every module `path` imports (absolute imports only)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def offenders(folder: str, forbidden: set[str]) -> list[str]:
    """`file: packages` for every module under `folder` that imports one of `forbidden`."""
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        bad = imported_roots(path) & forbidden
        if bad:
            found.append(f"{path.relative_to(ROOT)}: {', '.join(sorted(bad))}")
    return found


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [("testkit", {"tests", "bench"}), ("bench", {"tests"})],
)
def test_shared_helpers_never_import_back(folder: str, forbidden: set[str]) -> None:
    """No module of `testkit/` imports `tests` or `bench`, and none of `bench/` imports `tests`."""
    assert offenders(folder, forbidden) == []


def test_the_check_sees_an_import_back(tmp_path: Path) -> None:
    """A module importing `tests.…` is reported by the same check (it can fail)."""
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom tests.integration.conftest import Services\n")
    assert imported_roots(module) == {"os", "tests"}
