"""The verdict does not depend on the developer's shell: tests start without `RLHEALTH_*`."""

from __future__ import annotations

import pytest

from shared.settings import Thresholds
from tests.conftest import clear_rlhealth


def test_shell_thresholds_are_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    """A threshold exported in the shell is removed, so Thresholds() reads the defaults."""
    monkeypatch.setenv("RLHEALTH_MIN_WINDOW_STEPS", "40")
    monkeypatch.setenv("RLHEALTH_STALL_FLOOR_S", "1")
    assert Thresholds().min_window_steps == 40
    assert sorted(clear_rlhealth(monkeypatch)) == [
        "RLHEALTH_MIN_WINDOW_STEPS",
        "RLHEALTH_STALL_FLOOR_S",
        "RLHEALTH_VERDICT_KEY",  # the tests' own key, which the conftest sets
    ]
    assert Thresholds() == Thresholds.model_validate({})
    assert (Thresholds().min_window_steps, Thresholds().stall_floor_s) == (10, 600)


def test_non_finite_persistence_has_a_default_and_a_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NON_FINITE_PERSIST_STEPS defaults to 3 and is read like every threshold."""
    assert Thresholds().non_finite_persist_steps == 3
    monkeypatch.setenv("RLHEALTH_NON_FINITE_PERSIST_STEPS", "5")
    assert Thresholds().non_finite_persist_steps == 5
