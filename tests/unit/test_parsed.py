"""The parse's results without pydantic: the summary's JSON is what the pydantic model wrote
(frozen evidence from before still thaws), and a crafted summary is refused, naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from worker.evidence.logs import parse_log_file
from worker.evidence.parsed import ClockSkew, ParseSummary

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
LOGS = sorted(p for p in FIXTURES.iterdir() if p.suffix in {".log", ".out", ".txt"})

# What `ParseSummary.model_dump(mode="json")` of the pydantic model gave (main, 2026-12-03) for
# gate__train_plus_eval_lines.log, head shortened.
PYDANTIC_ERA: dict[str, Any] = {
    "files": ["finelog.log"],
    "lines": 3,
    "bytes": 717,
    "records": {"wandb_mirror": 3},
    "malformed": 0,
    "malformed_examples": [],
    "serializations": ["wandb_mirror"],
    "first_timestamp": "2026-07-14T09:00:00Z",
    "last_timestamp": "2026-07-14T09:00:00Z",
    "head": ["2026-07-14 09:00:00.000 | INFO     | x - WANDB_MIRROR kind=train step=1"],
    "head_lines": [1],
    "head_source": None,
    "clock": {
        "lines": 0,
        "min_s": None,
        "max_s": None,
        "off_lines": 0,
        "first_line": None,
        "source": "finelog.log",
    },
    "cut_lines": 0,
    "cut_examples": [],
    "notes": [],
}


def test_a_summary_written_by_the_pydantic_model_reads_back_the_same() -> None:
    summary = ParseSummary.from_json(PYDANTIC_ERA)
    assert summary.first_timestamp == datetime(2026, 7, 14, 9, tzinfo=UTC)
    assert summary.files == ("finelog.log",) and summary.head_lines == (1,)
    assert summary.clock == ClockSkew(source="finelog.log")
    assert summary.to_json() == PYDANTIC_ERA


@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
def test_every_fixture_summary_goes_through_json_unchanged(log: Path) -> None:
    summary = parse_log_file(log, log.name).summary
    data = json.loads(json.dumps(summary.to_json()))
    assert ParseSummary.from_json(data) == summary


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lines", "3"),
        ("lines", True),
        ("lines", 3.0),
        ("files", "finelog.log"),
        ("files", ["a", 1]),
        ("records", {"wandb_mirror": "3"}),
        ("records", ["wandb_mirror"]),
        ("head_lines", [1.5]),
        ("first_timestamp", "yesterday"),
        ("first_timestamp", 1752483600),
        ("clock", {"lines": 0, "min_s": "7190"}),
        ("clock", {"min_s": float("nan")}),
        ("clock", "skewed"),
        ("notes", None),
    ],
)
def test_a_crafted_summary_is_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        ParseSummary.from_json({**PYDANTIC_ERA, field: value})


def test_unknown_keys_are_ignored_and_missing_ones_default() -> None:
    summary = ParseSummary.from_json({"lines": 7, "from_a_later_version": [1, 2]})
    assert summary == ParseSummary(lines=7)
    with pytest.raises(ValueError, match="not an object"):
        ParseSummary.from_json(["lines", 7])


def test_times_are_utc_and_sequences_tuples() -> None:
    """Naive times are UTC, aware ones converted; lists become tuples (as pydantic did)."""
    plus_two = timezone(timedelta(hours=2))
    summary = ParseSummary(
        files=["a"],  # type: ignore[arg-type]
        first_timestamp=datetime(2026, 7, 14, 11, tzinfo=plus_two),
        last_timestamp=datetime(2026, 7, 14, 9),
    )
    assert summary.files == ("a",)
    assert summary.first_timestamp == summary.last_timestamp == datetime(2026, 7, 14, 9, tzinfo=UTC)
    assert summary.first_timestamp.tzinfo is UTC
    assert ParseSummary.from_json({"first_timestamp": "2026-07-14T09:00:00"}).first_timestamp == (
        datetime(2026, 7, 14, 9, tzinfo=UTC)
    )
    assert ClockSkew(min_s=7190).to_json()["min_s"] == 7190.0


def test_a_parse_loads_no_contract_models() -> None:
    """A parse of a log imports none of the contract models (its results are dataclasses)."""
    code = (
        "import sys; from pathlib import Path; from worker.evidence.logs import parse_log_file; "
        f"parse_log_file(Path({str(LOGS[0])!r}), 'finelog.log'); "
        "print(sorted(m for m in sys.modules if m in ('shared.models', 'worker.evidence.model')))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert found.stdout.strip() == "[]"
