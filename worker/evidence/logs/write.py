"""Writing the tables as `<table>.csv` or `<table>.parquet`, each only when it has rows, every
string column redacted (`shared.redact.redact_frame`). METRICS is written wide (`metrics`: `step`
and a column per key) unless that would be too wide (`wide_fits`): then long (`metrics_long`).

The tables are written at once in a few threads (polars releases the GIL while it writes); the
wide metrics table is pivoted in one of them, beside the other writes. A CSV table of more than
`SPLIT_ROWS` rows (the engines table of a busy log) is formatted in parts, one per thread: the
first is written to the file, the others to temporary files beside it, then appended after it
and removed (the same bytes as one write; no part is held in memory). A string column is
redacted through its distinct values (an engine or source column repeats a few values over
hundreds of thousands of rows). A CSV's datetimes are written by the CSV writer (as naive UTC
times in `ISO_UTC`), not formatted into string columns first.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

import polars as pl

from shared.redact import redact_columns, redact_frame

if TYPE_CHECKING:
    from worker.evidence.parsed import LogTables

__all__ = [
    "SPLIT_ROWS",
    "TABLE_NAMES",
    "WIDE_MAX_CELLS",
    "WIDE_MAX_KEYS",
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
_WRITERS: Final = 2
# A CSV table longer than this is formatted in `_WRITERS` parts at once.
SPLIT_ROWS: Final = 100_000
# A part's file is appended to its table in blocks of this size.
_COPY_BYTES: Final = 2**20
# A column with fewer distinct values than this share of its rows is redacted through them.
_DISTINCT_SHARE: Final = 0.5


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


def _write_csv(frame: pl.DataFrame, path: Path, *, header: bool = True) -> None:
    """`frame` as CSV, its datetimes as UTC in `ISO_UTC` (made naive, the writer formats them)."""
    stamps = [n for n, t in frame.schema.items() if isinstance(t, pl.Datetime)]
    naive = frame.with_columns(
        pl.col(n).dt.convert_time_zone("UTC").dt.replace_time_zone(None) for n in stamps
    )
    naive.write_csv(path, include_header=header, datetime_format=ISO_UTC)


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
    """Write every table with rows into `out_dir`; the paths written (in table order)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    frames, wide = _frames(tables)
    split = {
        n
        for n, f in frames.items()
        if fmt == "csv" and f.height > SPLIT_ROWS and not (wide and n == "metrics")
    }
    with ThreadPoolExecutor(_WRITERS) as pool:
        # the pivot and the long tables' parts first: the short tables then fill the threads
        whole = {"metrics": pool.submit(_write_wide, tables, out_dir, fmt)} if wide else {}
        parts = {name: _submit_parts(pool, frames[name], out_dir / f"{name}.csv") for name in split}
        whole |= {
            name: pool.submit(write_frame, frame, out_dir, name, fmt)
            for name, frame in frames.items()
            if name not in split and name not in whole
        }
        return [
            _join_parts(out_dir / f"{name}.csv", parts[name])
            if name in split
            else whole[name].result()
            for name in frames
        ]


def _write_wide(tables: LogTables, out_dir: Path, fmt: Literal["csv", "parquet"]) -> Path:
    """The metrics pivoted wide (`LogTables.metrics_wide`) and written as `metrics`."""
    return write_frame(tables.metrics_wide(), out_dir, "metrics", fmt)


def _submit_parts(pool: ThreadPoolExecutor, frame: pl.DataFrame, path: Path) -> list[Future[Path]]:
    """The parts of `frame` formatted at once: the first written to `path` (with the header),
    the others to temporary files beside it, to append after it (`_join_parts`)."""
    size = -(-frame.height // _WRITERS)
    return [
        pool.submit(_csv_part, frame.slice(start, size), path, first=start == 0)
        for start in range(0, frame.height, size)
    ]


def _csv_part(frame: pl.DataFrame, path: Path, *, first: bool) -> Path:
    """`frame` as CSV: written to `path` with the header (`first`), else its rows to a new
    temporary file beside `path` (on the disk, not in memory: the engines table of a busy log
    is tens of MB of text); the file written."""
    frame = redacted(frame)
    if first:
        _write_csv(frame, path)
        return path
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.part-")
    os.close(handle)
    part = Path(name)
    try:
        _write_csv(frame, part, header=False)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return part


def _join_parts(path: Path, parts: list[Future[Path]]) -> Path:
    """`path` with the other parts' files appended in order; those files removed whatever
    happens."""
    try:
        parts[0].result()
        with path.open("ab") as handle:
            for part in parts[1:]:
                with part.result().open("rb") as rows:
                    shutil.copyfileobj(rows, handle, _COPY_BYTES)
    finally:
        wait(parts)  # a part still being written when another failed is removed too
        for part in parts[1:]:
            if part.exception() is None:
                part.result().unlink(missing_ok=True)
    return path


def write_frame(
    frame: pl.DataFrame, out_dir: Path, name: str, fmt: Literal["csv", "parquet"] = "csv"
) -> Path:
    """Write one table as `<name>.csv` (datetimes as ISO-8601 UTC) or `<name>.parquet`."""
    path = out_dir / f"{name}.{fmt}"
    frame = redacted(frame)  # vectorised: only cells the prefilter flags are rewritten
    if fmt == "csv":
        _write_csv(frame, path)
    else:
        frame.write_parquet(path)
    return path
