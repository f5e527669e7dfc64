"""Writing the tables (issue 12 speed work): the tables written in parallel, with string columns
redacted through their distinct values, are byte for byte what the plain way writes (every cell
through `redact_frame`, one table after another) on every fixture log."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from shared.redact import redact_frame
from tests.security.corpus import HF, JWT
from worker.evidence.logs import parse_log_file
from worker.evidence.logs.write import _frames, _iso, redacted, write_tables

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
LOGS = sorted(p for p in FIXTURES.iterdir() if p.suffix in {".log", ".out", ".txt"})


def _plain(frame: pl.DataFrame, path: Path) -> None:
    """How the tables were written before: every cell redacted, then ISO datetimes, then CSV."""
    _iso(redact_frame(frame)).write_csv(path)


@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
def test_written_tables_equal_the_plain_way(log: Path, tmp_path: Path) -> None:
    """Each fixture's CSV tables equal, byte for byte, the plain way's; same tables, same order."""
    tables = parse_log_file(log, log.name)
    written = write_tables(tables, tmp_path / "fast")
    expected = []
    for name, frame in _frames(tables).items():
        if not frame.is_empty():
            (tmp_path / "plain").mkdir(exist_ok=True)
            _plain(frame, tmp_path / "plain" / f"{name}.csv")
            expected.append(f"{name}.csv")
    assert [p.name for p in written] == expected
    for name in expected:
        assert (tmp_path / "fast" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()


def _frame(rows: int, distinct: int) -> pl.DataFrame:
    secrets = [f"token {HF}", f"Authorization: Bearer {JWT}", "plain text", None]
    values = [secrets[i % len(secrets)] if i < distinct else secrets[0] for i in range(rows)]
    unique = [f"row {i} key={HF}{i}" for i in range(rows)]
    return pl.DataFrame({"repeated": values, "unique": unique, "n": list(range(rows))})


@pytest.mark.parametrize(("rows", "distinct"), [(8, 4), (7, 4), (2, 2), (1, 1), (0, 0)])
def test_redaction_through_distinct_values_equals_every_cell(rows: int, distinct: int) -> None:
    """A column with few distinct values (4 of 8: through them) and one with as many as rows
    (cell by cell), and the cases either side of half (4 of 7), give `redact_frame`'s frame."""
    frame = _frame(rows, distinct)
    assert_frame_equal(redacted(frame), redact_frame(frame))
    if rows:
        assert HF not in redacted(frame).write_csv()
