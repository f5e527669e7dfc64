"""Tests never read the developer's shell: every `RLHEALTH_*` variable is cleared for each test, so
thresholds and connections are the defaults or what the test passes explicitly — but for the
verdict key, which is set to the tests' own (`tests/keys.py`), as every pipeline role needs one."""

from __future__ import annotations

import os

import pytest


def clear_rlhealth(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Remove every `RLHEALTH_*` variable (restored after the test); the names removed."""
    names = [n for n in os.environ if n.startswith("RLHEALTH_")]
    for name in names:
        monkeypatch.delenv(name)
    return names


@pytest.fixture(autouse=True)
def _no_rlhealth_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without the developer's `RLHEALTH_*` settings, with the tests' key."""
    from tests.keys import TEST_KEY

    clear_rlhealth(monkeypatch)
    monkeypatch.setenv("RLHEALTH_VERDICT_KEY", TEST_KEY)
