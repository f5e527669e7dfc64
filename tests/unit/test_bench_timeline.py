"""`bench/parse_timeline.py`: the phases of a run from its timed stages, and a real run."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.parse_timeline import Event, _run_child, phases
from testkit.gen_continuous import generate_continuous


def _events() -> list[Event]:
    return [
        ("rlhealth-prelude", "native_pass", 0.05, 0.07),
        ("ThreadPoolExecutor-0_0", "scan", 0.10, 0.14),
        ("ThreadPoolExecutor-0_0", "scan", 0.14, 0.20),
        ("MainThread", "parse_chunk", 0.16, 0.22),
        ("ThreadPoolExecutor-0_0", "scan", 0.25, 0.30),
        ("MainThread", "parse_chunk", 0.30, 0.40),
        ("ThreadPoolExecutor-1_0", "write_part", 0.41, 0.45),
        ("MainThread", "end", 0.50, 0.50),
    ]


def test_phases_split_a_run_at_the_first_scan_and_the_last_chunk_parse() -> None:
    found = phases(_events())
    assert found["start"] == pytest.approx(0.10)
    assert found["pipeline"] == pytest.approx(0.30)  # 0.10 to 0.40
    assert found["tail"] == pytest.approx(0.10)  # 0.40 to 0.50
    assert found["total"] == pytest.approx(0.50)
    assert found["scan_busy"] == pytest.approx(0.15 / 0.30)
    assert found["parse_busy"] == pytest.approx(0.16 / 0.30)
    assert (found["scans"], found["parses"]) == (3, 2)


def test_busy_time_outside_the_pipeline_is_not_counted() -> None:
    """A scan that ends after the last chunk parse (it cannot, but the clock may say so) counts
    only up to it."""
    events = [*_events(), ("ThreadPoolExecutor-0_0", "scan", 0.38, 0.46)]
    found = phases(events)
    assert found["pipeline"] == pytest.approx(0.30)
    assert found["scan_busy"] == pytest.approx((0.15 + 0.02) / 0.30)


@pytest.mark.slow
def test_a_real_run_times_every_stage_of_the_command(tmp_path: Path) -> None:
    """The command run as a user runs it (a fresh process), its stages timed: scans, chunk
    parses and tables written, in that order."""
    log = generate_continuous(tmp_path / "finelog.log", 3)
    events = _run_child(log)
    found = phases(events)
    assert found["scans"] >= 1 and found["parses"] >= 1
    assert found["start"] > 0 and found["pipeline"] > 0 and found["tail"] > 0
    stages = [stage for _, stage, _, _ in sorted(events, key=lambda e: e[2])]
    assert stages.index("scan") < stages.index("parse_chunk") < stages.index("write_frame")
    assert stages[-1] == "end"
