"""Writing the tables as `<table>.csv` or `<table>.parquet`, each only when it has rows, every
string column redacted (`shared.redact.redact_frame`). METRICS is written wide (`metrics`: `step`
and a column per key) unless that would be too wide (`wide_fits`): then long (`metrics_long`).

A string column is redacted through its distinct values when they are few (an engine or source
column repeats a few values over hundreds of thousands of rows). A CSV's datetimes are written by
the CSV writer (as naive UTC times in `ISO_UTC`), not formatted into string columns first.

A CSV cell or column name that a spreadsheet would run as a formula (it starts with `=`, `+`, `-`,
`@`, a tab or a carriage return: `=HYPERLINK(...)`, `+cmd|...`) is written behind a `'`, which
spreadsheets show as text (`inert`); Parquet keeps the values as they are.

The directory must be this process's own (`shared.safefs.owned_directory`, made when missing), and
every table is written under a new name and renamed over its own (`shared.safefs.replacing`): a
symlink planted in the directory is replaced, never written through.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Final, Literal

import polars as pl

from shared.redact import redact_columns, redact_frame
from shared.safefs import OUTPUT_MODE, owned_directory, replacing

if TYPE_CHECKING:
    from worker.evidence.parsed import LogTables

__all__ = [
    "FORMULA_START",
    "TABLE_NAMES",
    "WIDE_MAX_CELLS",
    "WIDE_MAX_KEYS",
    "inert",
    "wide_fits",
    "write_frame",
    "write_tables",
]

TABLE_NAMES: Final = (
    "metrics",
    "phases",
    "engines",
    "errors",
    "timers",
    "progress",
    "batches",
    "resumes",
)
ISO_UTC: Final = "%Y-%m-%dT%H:%M:%S%.6fZ"
# Past these the wide metrics table (a column per key, a row per step) is not built: the long
# table is written as `metrics_long` instead (hundreds of thousands of keys would make a table of
# billions of cells).
WIDE_MAX_KEYS: Final = 10_000
WIDE_MAX_CELLS: Final = 20_000_000
# A column with fewer distinct values than this share of its rows is redacted through them.
_DISTINCT_SHARE: Final = 0.5
# What a spreadsheet takes for the start of a formula (OWASP's list for CSV injection).
FORMULA_START: Final = r"^[=+\-@\t\r]"
_FORMULA_CHARS: Final = ("=", "+", "-", "@", "\t", "\r")


def wide_fits(metrics: pl.DataFrame) -> bool:
    """True when the metrics can be written wide (`metrics`), false: long (`metrics_long`)."""
    if metrics.is_empty():
        return True
    keys, steps = metrics.select(pl.col("key").n_unique(), pl.col("step").n_unique()).row(0)
    return bool(keys <= WIDE_MAX_KEYS and keys * steps <= WIDE_MAX_CELLS)


def _frames(tables: LogTables) -> tuple[dict[str, pl.DataFrame], bool]:
    """The tables with rows, by file name, and whether `metrics` is to be written wide (it then
    holds the long rows, pivoted by the writer: `_write_wide`)."""
    frames = {name: getattr(tables, name) for name in TABLE_NAMES}
    frames = {name: frame for name, frame in frames.items() if not frame.is_empty()}
    wide = "metrics" in frames and wide_fits(tables.metrics)
    if "metrics" in frames and not wide:
        frames["metrics_long"] = frames.pop("metrics")
    return frames, wide


def inert(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with every string cell and column name that starts like a formula (`FORMULA_START`)
    put behind a `'`, so a spreadsheet opening the CSV shows it as text (vectorised)."""
    strings = [n for n, t in frame.schema.items() if t == pl.String]
    if strings and not frame.is_empty():
        found = frame.select(pl.col(n).str.contains(FORMULA_START).any() for n in strings).row(0)
        hit = [n for n, any_cell in zip(strings, found, strict=True) if any_cell]
        frame = frame.with_columns(pl.col(n).str.replace(FORMULA_START, "'$0") for n in hit)
    names = _inert_names(frame.columns)
    return frame.rename(names) if names else frame


def _inert_names(columns: list[str]) -> dict[str, str]:
    """The new name of each column name that starts like a formula: behind as many `'` as make
    it a name no other column has."""
    taken, names = set(columns), {}
    for name in columns:
        if name.startswith(_FORMULA_CHARS):
            new = f"'{name}"
            while new in taken:
                new = f"'{new}"
            taken.add(new)
            names[name] = new
    return names


def _write_csv(frame: pl.DataFrame, target: BinaryIO) -> None:
    """`frame` as CSV, its datetimes as UTC in `ISO_UTC` (made naive, the writer formats them),
    formulas made inert."""
    stamps = [n for n, t in frame.schema.items() if isinstance(t, pl.Datetime)]
    naive = inert(frame).with_columns(
        pl.col(n).dt.convert_time_zone("UTC").dt.replace_time_zone(None) for n in stamps
    )
    naive.write_csv(target, datetime_format=ISO_UTC)


def _redacted_column(column: pl.Series) -> pl.Series:
    """`column` redacted: through its distinct values when they are few, else cell by cell."""
    distinct = column.unique()
    if len(distinct) > _DISTINCT_SHARE * len(column):
        return redact_frame(column.to_frame()).to_series()
    fixed = redact_frame(distinct.to_frame()).to_series()
    changed = distinct.ne_missing(fixed)
    if not changed.any():
        return column
    return column.replace(distinct.filter(changed), fixed.filter(changed))


def redacted(frame: pl.DataFrame) -> pl.DataFrame:
    """Every string column of `frame` redacted (`shared.redact.redact_frame`, the same cells)."""
    frame = redact_columns(frame)
    strings = [name for name, dtype in frame.schema.items() if dtype == pl.String]
    if not strings or frame.is_empty():
        return frame
    return frame.with_columns(_redacted_column(frame.get_column(name)) for name in strings)


def write_tables(
    tables: LogTables, out_dir: Path, fmt: Literal["csv", "parquet"] = "csv"
) -> list[Path]:
    """Write every table with rows into `out_dir` (made when missing; this process's own, or
    `shared.safefs.UnsafeDirectoryError`); the paths written (in table order)."""
    owned_directory(out_dir, mode=OUTPUT_MODE)
    frames, wide = _frames(tables)
    return [
        write_frame(
            tables.metrics_wide() if wide and name == "metrics" else frame, out_dir, name, fmt
        )
        for name, frame in frames.items()
    ]


def write_frame(
    frame: pl.DataFrame, out_dir: Path, name: str, fmt: Literal["csv", "parquet"] = "csv"
) -> Path:
    """Write one table as `<name>.csv` (datetimes as ISO-8601 UTC, formulas inert) or
    `<name>.parquet`, under a new name renamed into place in `out_dir` (this process's own)."""
    frame = redacted(frame)  # vectorised: only cells the prefilter flags are rewritten
    with replacing(out_dir, f"{name}.{fmt}") as handle:
        if fmt == "csv":
            _write_csv(frame, handle)
        else:
            frame.write_parquet(handle)
    return out_dir / f"{name}.{fmt}"
