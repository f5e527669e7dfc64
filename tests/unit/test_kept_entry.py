"""`kept_entry`: a verdict entry kept in Redis (published or decided) is used only once it
verifies; anything else is no entry, with a warning."""

from __future__ import annotations

import logging

import pytest

from shared.models import VerdictEntry
from testkit.keys import OTHER_KEYS, TEST_KEYS
from worker.pipeline.coalesce import kept_entry

_ENTRY = VerdictEntry.model_validate(
    {
        "event_id": "e1",
        "event_ids": ["e1"],
        "job_id": "/ops/job",
        "verdict": "KILL",
        "confidence": "high",
        "report_uri": "s3://rlhealth/reports/cw/ops/job/2026-07-30T21:15:00Z-e1.json",
        "captured_at": "2026-07-30T21:15:00Z",
    }
)


def test_an_entry_signed_with_the_workers_key_is_kept() -> None:
    """The pipeline's own signed entry comes back as it was signed."""
    signed = _ENTRY.signed(TEST_KEYS)
    assert kept_entry(signed.model_dump_json(), TEST_KEYS, "x") == signed


@pytest.mark.parametrize(
    "raw",
    [
        _ENTRY.model_dump_json(),  # unsigned: what a `SET` by another hand writes
        _ENTRY.signed(OTHER_KEYS).model_dump_json(),  # signed with a key the worker lacks
        "not json",
    ],
)
def test_an_entry_that_does_not_verify_is_none_with_a_warning(
    raw: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Unsigned, foreign-signed or malformed: no entry, and the warning names what was read."""
    with caplog.at_level(logging.WARNING):
        assert kept_entry(raw, TEST_KEYS, "the decision kept for e1") is None
    assert "the decision kept for e1 is refused" in caplog.text


def test_nothing_kept_is_none() -> None:
    """No value in Redis: no entry, no warning."""
    assert kept_entry(None, TEST_KEYS, "x") is None
