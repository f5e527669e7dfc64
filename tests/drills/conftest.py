"""The drills' fixtures. Tests marked `drill` (the long, repeated drills) run only when asked for
with `-m drill` (`make drills`); the fast subset runs with every `make test`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.drills.drills import Session, session

_DESELECTED = pytest.StashKey[int]()
FAST_ENV = {
    "RLHEALTH_LEASE_S": "10",  # a lost workflow is noticed in seconds, not minutes
    "RLHEALTH_GATE_TIME_LIMIT_S": "15",  # soft 12 s: a stopped gate passes it quickly
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "drill" in (config.getoption("markexpr") or ""):
        return
    slow = [item for item in items if item.get_closest_marker("drill")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("drill")]
        config.stash[_DESELECTED] = len(slow)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Say why the long drills did not run (they are deselected, not skipped)."""
    count = config.stash.get(_DESELECTED, 0)
    if count:
        terminalreporter.write_line(
            f"{count} long fault drills deselected: they run with `make drills` "
            "(pytest -m drill tests/drills; docs/reliability.md); "
            "the fast drills run with every make test"
        )


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """One stack for the fast drills, with a short lease and short gate limits."""
    workdir: Path = tmp_path_factory.mktemp("fast-drills")
    with session(workdir, env=FAST_ENV) as started:
        yield started
