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
from worker.cli import tables as write
from worker.cli.tables import ISO_UTC, redacted, write_frame, write_tables
from worker.evidence.logs import parse_log_file
from worker.evidence.model import LogTables

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
LOGS = sorted(p for p in FIXTURES.iterdir() if p.suffix in {".log", ".out", ".txt"})


def _iso(frame: pl.DataFrame) -> pl.DataFrame:
    """Datetimes formatted into strings (the plain way; the writer now formats them itself)."""
    stamps = [n for n, t in frame.schema.items() if isinstance(t, pl.Datetime)]
    return frame.with_columns(
        pl.col(n).dt.convert_time_zone("UTC").dt.strftime(ISO_UTC) for n in stamps
    )


def _plain(frame: pl.DataFrame, path: Path) -> None:
    """How the tables were written before: every cell redacted, then ISO datetimes, then CSV."""
    _iso(redact_frame(frame)).write_csv(path)


def _frames(tables: LogTables) -> dict[str, pl.DataFrame]:
    """The plain way's tables: the metrics pivoted first, on the caller's thread."""
    frames = {name: getattr(tables, name) for name in write.TABLE_NAMES}
    if write.wide_fits(tables.metrics):
        frames["metrics"] = tables.metrics_wide()
    else:
        frames["metrics_long"] = frames.pop("metrics")
    return frames


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


@pytest.mark.parametrize("unit", ["ms", "us", "ns"])
@pytest.mark.parametrize("zone", [None, "UTC", "Europe/Berlin", "America/Los_Angeles"])
def test_datetimes_are_written_as_the_strings_were(
    unit: str, zone: str | None, tmp_path: Path
) -> None:
    """The CSV writer's datetimes (naive UTC, `ISO_UTC`) are the bytes the strings were: any
    zone (a DST day), any unit (nanoseconds cut, not rounded), nulls, a leap day, before 1970."""
    from datetime import datetime

    stamps = [
        datetime(2026, 3, 29, 0, 59, 59, 999999),
        datetime(2026, 3, 29, 1, 0, 0, 1),
        datetime(2024, 2, 29, 23, 59, 59),
        datetime(1969, 12, 31, 23, 59, 59, 500000),
        None,
    ]
    series = pl.Series("t", stamps, dtype=pl.Datetime("us"))
    if unit == "ns":
        series = (series.cast(pl.Int64) * 1000 + 789).cast(pl.Datetime("ns"))
    else:
        series = series.cast(pl.Datetime(unit))  # type: ignore[arg-type]
    if zone is not None:
        series = series.dt.replace_time_zone("UTC").dt.convert_time_zone(zone)
    frame = pl.DataFrame({"t": series, "other": series.alias("other"), "n": range(5)})
    written = write_frame(frame, tmp_path, "stamps")
    _plain(frame, tmp_path / "plain.csv")
    assert written.read_bytes() == (tmp_path / "plain.csv").read_bytes()
    assert b"T00:59:59" in written.read_bytes() or zone not in (None, "UTC")


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
