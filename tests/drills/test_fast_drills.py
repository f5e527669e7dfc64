"""The fast drills, run by every `make test`: one fault of each kind that a unit test cannot show,
once, on the real services (redis-server with AOF, moto's S3, a prefork worker, ingest).

The long, repeated drills are in test_drills.py (`make drills`); docs/reliability.md has figures.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.drills import drills
from tests.drills.drills import Session

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def assert_exactly_once(figures: dict[str, Any]) -> None:
    """Every alert answered, each by one diagnosis, one verdict entry and one report each (in
    S3 when its entry appeared, and still there unless the drill itself emptied S3)."""
    assert figures["answered"] == figures["alerts"], figures
    assert figures["answered_by_two_diagnoses"] == 0, figures
    assert figures["repeated_verdict_entries"] == 0, figures
    assert set(figures["reports_per_diagnosis"]) <= {1}, figures
    assert figures["verdict_before_report"] == 0, figures
    assert figures["entries_pointing_at_no_report"] == 0, figures


def test_a_child_killed_in_a_gate_gives_one_verdict(fast: Session) -> None:
    """SIGKILL of the pool child running a gate: the gate runs again, one verdict, one report."""
    figures = drills.worker_kill(fast, runs=1, task="rlhealth.gate", main_process=False)
    assert figures["missed"] == 0
    assert_exactly_once(figures)


def test_a_killed_worker_is_answered_within_the_lease(fast: Session) -> None:
    """SIGKILL of the worker's main process during a capture: the watchdog sends the diagnosis
    again once its 10 s lease runs out; answered in well under a minute, not 15."""
    figures = drills.worker_kill(
        fast, runs=1, task="rlhealth.capture", main_process=True, settle_s=120
    )
    assert figures["missed"] == 0
    assert_exactly_once(figures)
    assert 0 < figures["kill_to_verdict_s"][0] < 60
    assert figures["watchdog_resends"] >= 1


def test_a_gate_past_its_soft_limit_is_sent_again_never_evidence(fast: Session) -> None:
    """A gate stopped past its 12 s soft limit: the diagnosis is sent again (a second time limit
    would answer ERROR naming it), the limit is never quoted as evidence, and the next alert for
    the job is answered."""
    figures = drills.time_limit(fast, runs=1, task="rlhealth.gate", stall_s=13, kind="soft")
    assert_exactly_once(figures)
    assert figures["later_alerts_answered"] == 1
    assert figures["reports_quoting_a_time_limit_as_evidence"] == 0
    assert figures["watchdog_or_callback_resends"] >= 1
    assert all("soft time limit" in reason for reason in figures["failure_reasons"])


def test_a_poison_bundle_is_answered_and_dead_lettered(fast: Session) -> None:
    """A bundle whose report cannot be rendered is answered ERROR with a dead letter, and the
    alert after its repair gets a diagnosis of its own."""
    figures = drills.poison(fast, runs=1, later_s=1)
    assert_exactly_once(figures)
    assert figures["later_alerts_answered"] == 1
    assert figures["diagnoses_failed_and_dead_lettered"] == 1


def test_hostile_events_are_never_silent(fast: Session) -> None:
    """Event ids `.` and `..`, a job directory with CR/LF, a manifest whose cluster or user is
    `..` or whose job id holds CR/LF: each gets a dead letter or a verdict, and no S3 key has a
    `.`/`..` segment or a control character."""
    figures = drills.containment(fast)
    assert figures["silent"] == []
    assert figures["s3_keys_with_dot_segments_or_control_characters"] == []
