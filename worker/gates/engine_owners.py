"""Whose line is it: the inference engine an ERRORS row belongs to, in the ids of ENGINES.

ENGINES ids are `<owner>/<engine index>`; the owner is the Ray actor's `<pid>@<ip>` (or `<pid>`)
when the stat line carried the driver's `(Actor pid=N, ip=X)` prefix, else the file the line was
read from (a Ray worker log with no forwarded copy, or one engine's own log). An ERRORS row is
attributed, first match wins, to:

1. the actor a driver-side Ray error names: `ray::AsyncVLLMInferenceEngine.__init__() (pid=N,
   ip=X, ...)`;
2. the first `pid=N(, ip=X)` of the row's own process prefix (who logged it);
3. the engine its file speaks for when the line has no prefix: a Ray worker log
   (`worker-<id>-<job>-<pid>.out|.err`) belongs to the one engine owner with that pid, else to the
   file's own id; any other file to the engine whose stat lines it holds without a prefix.

A row none of these names has no owner (null).
"""

from __future__ import annotations

from typing import Final

import polars as pl

from worker.evidence.logs.engines import engine_owner, worker_pid

__all__ = ["owner_of_rows", "owners"]

# `ray::AsyncVLLMInferenceEngine.__init__() (pid=434344, ip=192.168.21.141, ...`: the actor a
# driver-side ActorDiedError names; else the first Ray prefix of the line (ENGINES' owner).
_NAMED_ACTOR: Final = r"ray::[\w.]+\(\) \(pid=(\d+)(?:, ip=([^\s,()]+))?"
_PREFIX_ACTOR: Final = r"pid=(\d+)(?:, ip=([^\s,()]+))?"


def owners(engines: pl.DataFrame) -> pl.Series:
    """The distinct engine owners of ENGINES rows (ids without their index)."""
    return engines.select(engine_owner(pl.col("engine")).alias("owner"))["owner"].unique()


def _named(text: pl.Expr, pattern: str) -> pl.Expr:
    groups = text.str.extract_groups(pattern)
    pid, ip = groups.struct.field("1"), groups.struct.field("2")
    return pl.when(ip.is_null()).then(pid).otherwise(pl.concat_str(pid, pl.lit("@"), ip))


def _file_owners(sources: pl.Series, engines: pl.DataFrame) -> pl.DataFrame:
    """`source, _file_owner`: the engine each file speaks for when its lines have no prefix."""
    known = pl.DataFrame({"_owner": owners(engines)}, schema={"_owner": pl.String})
    by_pid = (
        known.with_columns(_pid=pl.col("_owner").str.extract(r"^(\d+)(?:@|$)", 1))
        .drop_nulls("_pid")
        .group_by("_pid")
        .agg(pl.col("_owner").first(), _n=pl.len())
        .filter(pl.col("_n") == 1)
        .select("_pid", _by_pid="_owner")
    )
    files = pl.DataFrame({"source": sources.unique()}, schema={"source": pl.String})
    files = files.with_columns(_pid=worker_pid(pl.col("source")))
    files = files.join(by_pid, on="_pid", how="left")
    files = files.join(known.select(source="_owner", _self="_owner"), on="source", how="left")
    return files.select("source", _file_owner=pl.coalesce("_by_pid", "_self"))


def owner_of_rows(rows: pl.DataFrame, engines: pl.DataFrame) -> pl.DataFrame:
    """`rows` (ERRORS rows) with `_owner`: the engine owner each belongs to, or null."""
    named = _named(pl.col("message").fill_null(""), _NAMED_ACTOR)
    given = pl.col("prefix") if "prefix" in rows.columns else pl.lit(None, dtype=pl.String)
    prefix = _named(given.fill_null(""), _PREFIX_ACTOR)
    files = _file_owners(rows["source"], engines)
    joined = rows.join(files, on="source", how="left", maintain_order="left")
    return joined.with_columns(_owner=pl.coalesce(named, prefix, "_file_owner")).drop("_file_owner")
