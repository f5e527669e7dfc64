"""Thresholds come from RLHEALTH_* variables and a campaign file overrides them."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.settings import CampaignError, Thresholds, load_thresholds


def test_defaults_follow_the_domain_table() -> None:
    """Defaults are docs/domain.md's threshold table."""
    t = Thresholds()
    assert (t.max_evidence_age_s, t.stall_floor_s, t.stall_factor, t.init_grace_s) == (
        900,
        600,
        4,
        2700,
    )
    assert (t.min_window_steps, t.kv_floor_pct, t.kv_busy_pct, t.same_cause_share) == (
        10,
        2,
        10,
        0.9,
    )


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """RLHEALTH_STALL_FLOOR_S sets stall_floor_s."""
    monkeypatch.setenv("RLHEALTH_STALL_FLOOR_S", "5")
    assert Thresholds().stall_floor_s == 5


def test_campaign_file_overrides_and_retention(tmp_path: Path) -> None:
    """A TOML campaign file overrides a threshold and sets the artifact retention."""
    path = tmp_path / "campaign.toml"
    path.write_text("artifact_retention_days = 7\n[thresholds]\nMIN_WINDOW_STEPS = 20\n")
    t = load_thresholds(path)
    assert t.min_window_steps == 20
    assert t.artifact_retention_days == 7


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"thresholds": {"NOT_A_THRESHOLD": 1}}', "unknown thresholds"),
        ("{broken", "does not parse"),
        ("[1, 2]", "must hold an object"),
    ],
)
def test_bad_campaign_files_are_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    """A campaign file that cannot be used is refused with a message naming the problem."""
    path = tmp_path / "campaign.json"
    path.write_text(text)
    with pytest.raises(CampaignError, match=message):
        load_thresholds(path)
