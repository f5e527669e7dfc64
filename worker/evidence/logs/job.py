"""The logs of a watcher job directory, read together (docs/parsing.md, "Public API"): the finelog
is the source, pod and Ray worker logs add the engine and error rows it lacks."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Final

import polars as pl

from worker.evidence.logs.budget import ParseBudget
from worker.evidence.logs.engines import engine_owner, worker_pid
from worker.evidence.logs.incremental import EntryCache, cache_key
from worker.evidence.logs.reader import FileRows, parse_file_rows
from worker.evidence.logs.stitch import Stitched, build_tables
from worker.evidence.parsed import LogTables, ParseSummary
from worker.evidence.paths import BundleFiles

__all__ = ["Progress", "parse_job_logs"]

# told `(source, bytes read before it, bytes in all)` before each log file is read
Progress = Callable[[str, int, int], None]

FINELOG: Final = "finelog.log"
_FILL_TABLES: Final = {"engines": ["engine", "timestamp"], "errors": ["kind", "text"]}
_USABLE: Final = ("metrics", "timers", "engines", "progress", "batches")
_NONE: Final = pl.DataFrame()


def _fill(
    base: dict[str, pl.DataFrame], extra: FileRows, starts: pl.DataFrame
) -> dict[str, pl.DataFrame]:
    """`base` with the engine and error rows of `extra` it lacks, placed in the attempts of
    `starts` (the primary logs', `_attempt_starts`)."""
    merged = dict(base)
    for name, keys in _FILL_TABLES.items():
        rows = extra.rows.get(name)
        if rows is None or rows.is_empty():
            continue
        rows = _in_attempts(rows, starts)
        have = merged.get(name)
        if have is None or have.is_empty():
            merged[name] = rows
            continue
        new = rows.join(have.select(keys).unique(), on=keys, how="anti", nulls_equal=True)
        if name == "errors":
            new = pl.concat([new, _other_process(rows, have, keys)])
        merged[name] = pl.concat([have, new])
    return merged


def _pid() -> pl.Expr:
    """The process a row is of: its prefix's `pid=N`, else the pid in a Ray worker log's name."""
    prefix = pl.col("prefix").str.extract(r"pid=(\d+)", 1)
    return pl.coalesce(prefix, worker_pid(pl.col("source")))


def _other_process(rows: pl.DataFrame, have: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Rows of `rows` whose text `have` holds only as another process's line (two engines that
    log the same death line died twice); an unknown process on either side is a copy."""
    same = rows.join(have.select(keys).unique(), on=keys, how="semi", nulls_equal=True)
    if same.is_empty():
        return same
    mine = same.with_row_index("_row").with_columns(_pid=_pid())
    theirs = have.join(same.select(keys).unique(), on=keys, how="semi", nulls_equal=True)
    theirs = theirs.select(*keys, _their=_pid())
    paired = mine.join(theirs, on=keys, how="left", nulls_equal=True)
    copy = (
        pl.col("_pid").is_null() | pl.col("_their").is_null() | (pl.col("_pid") == pl.col("_their"))
    )
    copies = paired.filter(copy).select("_row").unique()
    return mine.join(copies, on="_row", how="anti").select(rows.columns)


_DATED_TABLES: Final = ("timers", "resumes", "errors", "metrics", "engines")


def _attempt_starts(rows: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """When each attempt of the primary logs began (its first dated row), sorted by time."""
    frames = [
        rows[name].select("attempt", "timestamp")
        for name in _DATED_TABLES
        if name in rows and not rows[name].is_empty()
    ]
    if not frames:
        return pl.DataFrame(schema={"attempt": pl.Int32, "timestamp": pl.Datetime("us", "UTC")})
    found = pl.concat(frames).drop_nulls().group_by("attempt").agg(pl.col("timestamp").min())
    return found.sort("timestamp")


def _in_attempts(rows: pl.DataFrame, starts: pl.DataFrame) -> pl.DataFrame:
    """`rows` of another log in the primary logs' attempts: a dated row belongs to the last
    attempt begun at or before it; others keep the attempt their own file gave them."""
    if starts.height < 2:
        return rows
    starts = starts.select(_start="timestamp", _attempt="attempt")
    indexed = rows.with_row_index("_row")
    placed = (
        indexed.filter(pl.col("timestamp").is_not_null())
        .sort("timestamp")
        .join_asof(starts, left_on="timestamp", right_on="_start", strategy="backward")
        .select("_row", "_attempt")
    )
    joined = indexed.join(placed, on="_row", how="left", maintain_order="left")
    attempt = pl.coalesce("_attempt", "attempt").cast(rows.schema["attempt"])
    return joined.with_columns(attempt=attempt).select(rows.columns)


def _owners_by_pid(engines: pl.DataFrame | None) -> pl.DataFrame:
    """`_pid, _owner`: the `<pid>@<ip>` engine owner of each pid that names exactly one."""
    if engines is None or engines.is_empty():
        return pl.DataFrame(schema={"_pid": pl.String, "_owner": pl.String})
    owners = engines.select(_owner=engine_owner(pl.col("engine"))).unique()
    owners = owners.filter(pl.col("_owner").str.contains("@", literal=True)).with_columns(
        _pid=pl.col("_owner").str.split("@").list.first()
    )
    single = owners.group_by("_pid").agg(pl.col("_owner").first(), _n=pl.len())
    return single.filter(pl.col("_n") == 1).select("_pid", "_owner")


def _as_forwarded(extra: FileRows, owners: pl.DataFrame) -> FileRows:
    """`extra` with the unprefixed stat lines of a Ray worker log under the id of the engine
    whose pid the file's name carries."""
    engines = extra.rows.get("engines")
    if engines is None or engines.is_empty() or owners.is_empty():
        return extra
    unprefixed = pl.col("engine").str.starts_with(pl.concat_str("source", pl.lit("/")))
    index = pl.col("engine").str.extract(r"/([^/]*)$", 1)
    keyed = engines.with_columns(_pid=worker_pid(pl.col("source"))).join(
        owners, on="_pid", how="left", maintain_order="left"
    )
    renamed = (
        pl.when(unprefixed & pl.col("_owner").is_not_null())
        .then(pl.concat_str("_owner", pl.lit("/"), index))
        .otherwise("engine")
    )
    engines = keyed.with_columns(engine=renamed).select(engines.columns)
    return FileRows(rows={**extra.rows, "engines": engines}, summary=extra.summary)


def _union(parts: list[FileRows]) -> dict[str, pl.DataFrame]:
    names = {name for p in parts for name in p.rows}
    return {name: pl.concat([p.rows[name] for p in parts if name in p.rows]) for name in names}


def _parse_all(
    files: BundleFiles,
    paths: list[Path],
    reference_date: date | None,
    cache: EntryCache | None,
    budget: ParseBudget,
    announce: Callable[[Path], None] = lambda _path: None,
) -> list[FileRows]:
    found = []
    for path in paths:
        announce(path)
        opened = files.open(path)
        if opened is None:  # refused (a symlink took its place): said in `files.refused`
            continue
        source = files.relative(path)
        with opened:
            found.append(
                parse_file_rows(
                    path,
                    source,
                    reference_date=reference_date,
                    cache=cache,
                    budget=budget,
                    opened=opened,
                )
            )
    return found


def _announcer(files: BundleFiles, paths: list[Path], progress: Progress) -> Callable[[Path], None]:
    sizes = {path: _size(path) for path in paths}
    total, done = sum(sizes.values()), [0]

    def announce(path: Path) -> None:
        progress(files.relative(path), done[0], total)
        done[0] += sizes[path]

    return announce


def _size(path: Path) -> int:
    """The bytes of a listed log (of a symlink itself, if one took its place since: it is
    refused when opened)."""
    return path.lstat().st_size


def _ray_worker_logs(files: BundleFiles) -> list[Path]:
    found = files.walk("ray_vllm_logs", "worker-*")
    return [p for p in found if p.suffix in {".out", ".err"}]


def parse_job_logs(
    job_dir: Path,
    *,
    reference_date: date | None = None,
    files: BundleFiles | None = None,
    cache: EntryCache | None = None,
    progress: Progress | None = None,
    memory_mb: int | None = None,
) -> LogTables | None:
    """The tables of a job directory's logs (None: no log file at all), read together within
    one memory budget (`LogBudgetError` when they cannot be)."""
    files = files or BundleFiles(job_dir)
    finelog = files.open_path(FINELOG)
    main = [finelog] if finelog is not None and finelog.is_file() else []
    pods = list(files.walk("pod_logs", "*.log"))
    rays = _ray_worker_logs(files)
    if not (main or pods or rays):
        return None
    every = [*main, *pods, *rays]
    tick = _announcer(files, every, progress) if progress else lambda _path: None
    budget = ParseBudget.for_logs(sum(_size(path) for path in every), memory_mb)
    keys = [_stitch_key(files, path, reference_date, cache) for path in main]
    primary = _parse_all(files, main, reference_date, cache, budget, tick)
    secondary = _parse_all(files, pods, reference_date, cache, budget, tick)
    extras = _parse_all(files, rays, reference_date, cache, budget, tick)
    stitched: Stitched | None = None
    if not (primary and any(primary[0].rows.get(name, _NONE).height for name in _USABLE)):
        primary, secondary = primary + secondary, []
    elif cache is not None:
        stitched = cache.stitched(keys[0], primary[0].rows)
    rows = _union(primary) if primary else {}
    starts = _attempt_starts(rows)  # once: a job may have a thousand Ray worker logs
    for extra in secondary:
        rows = _fill(rows, extra, starts)
    owners = _owners_by_pid(rows.get("engines"))
    for extra in extras:
        rows = _fill(rows, _as_forwarded(extra, owners), starts)
    return build_tables(
        rows, ParseSummary.merged([p.summary for p in primary + secondary + extras]), stitched
    )


def _stitch_key(
    files: BundleFiles, path: Path, reference_date: date | None, cache: EntryCache | None
) -> str:
    """The cache key of the finelog, whose entries keep their stitched tables."""
    key = cache_key(path, files.relative(path), reference_date)
    if cache is not None:
        cache.keep_stitched(key)
    return key
