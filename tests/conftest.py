"""Tests never read the developer's shell: every `RLHEALTH_*` variable is cleared for each test, so
thresholds and connections are the defaults or what the test passes explicitly — but for the
verdict key, which is set to the tests' own (`testkit/keys.py`), as every pipeline role needs one.

Tiers: `make test-fast` runs every test not marked `integration` or `slow` (pyproject.toml says
what each marker means); `make test` runs them all.
"""

from __future__ import annotations

import os

import pytest

# Parser tests (tests/unit/test_logs_*.py) that take more than about 1.5 s of CPU each: exhaustive
# sweeps over line shapes and truncations, tables past the split limit, tens of MB of generated
# log. They are marked `slow` here, by name, while the parser and its tests are rewritten beside
# this change (issue 29); the mark belongs in the test file, where it should move.
SLOW_PARSER_TESTS = frozenset(
    {
        "test_logs_cache_dir.py::test_diagnose_with_a_cache_gives_the_same_report",
        "test_logs_failures.py::test_failure_rows_do_not_depend_on_chunks",
        "test_logs_fast_paths.py::test_sliced_stat_numbers_equal_the_pattern",
        "test_logs_fast_paths.py::test_split_record_pairs_equal_the_pattern",
        "test_logs_incremental.py::test_arbitrary_bytes_never_raise",
        "test_logs_incremental.py::test_growing_file_parsed_incrementally_equals_full_parse",
        "test_logs_incremental_stitch.py::test_grown_finelog_restitched_equals_a_whole_read",
        "test_logs_native.py::test_binary_input_scans_the_same_both_ways",
        "test_logs_native.py::test_every_truncation_of_a_stat_line_scans_the_same_both_ways",
        "test_logs_native.py::test_random_noise_with_flag_literals_scans_the_same_with_the_drop",
        "test_logs_native.py::test_stat_lines_of_every_shape_scan_the_same_both_ways",
        "test_logs_native.py::test_timer_lines_of_every_shape_scan_the_same_both_ways",
        "test_logs_reads.py::test_stitching_early_equals_stitching_at_the_end",
        "test_logs_reads.py::test_tables_do_not_depend_on_scans_parsed_together",
        "test_logs_reads.py::test_the_next_read_is_handed_on_before_the_chunk_that_made_room_is_parsed",
        "test_logs_restitch.py::test_restitch_equals_full_stitch",
        "test_logs_write.py::test_a_failed_part_leaves_no_part_file",
        "test_logs_write.py::test_a_table_is_split_just_past_split_rows",
        "test_logs_write.py::test_the_parts_files_are_removed_once_appended",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the parser tests of `SLOW_PARSER_TESTS` slow (every parameter of each)."""
    for item in items:
        name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        if name in SLOW_PARSER_TESTS:
            item.add_marker(pytest.mark.slow)


def clear_rlhealth(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Remove every `RLHEALTH_*` variable (restored after the test); the names removed."""
    names = [n for n in os.environ if n.startswith("RLHEALTH_")]
    for name in names:
        monkeypatch.delenv(name)
    return names


@pytest.fixture(autouse=True)
def _no_rlhealth_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without the developer's `RLHEALTH_*` settings, with the tests' key."""
    from testkit.keys import TEST_KEY

    clear_rlhealth(monkeypatch)
    monkeypatch.setenv("RLHEALTH_VERDICT_KEY", TEST_KEY)
