"""Line classification: which lines matter, their prefixes stripped, their kind."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import polars as pl

from worker.evidence.logs.native import Native
from worker.evidence.logs.rules import (
    ENGINE_LITERAL,
    ERROR_RULES,
    FAILURE_LITERALS,
    FLAG_LITERALS,
    KIND_RULES,
    TRACEBACK,
    UNHANDLED,
    WINDOW_LINES,
)

__all__ = ["evidence_lines", "in_windows", "strip_sgr"]

SGR: Final = r"\x1b\[[0-9;]*m"
# Whole-match patterns (group 0 only, so the regex engine can use its fast path).
_PROCESS: Final = (
    r"(?:\((?:[^\s()]+ )?pid=\d+(?:, ip=[^\s()]+)?\)"  # Ray: (Name pid=N, ip=X)
    r"|\[(?:[^\s\[\]]+ )?pid=\d+(?:, ip=[^\s\[\]]+)?\]"  # [Name pid=N]
    r"|\((?:raylet|gcs_server|autoscaler|monitor|dashboard|log_monitor)(?:, ip=[^\s()]+)?\)"
    r"|\[rank\d+\]:"  # torchrun
    r"|[\w.-]+:\d+:\d+ \[\d+\]"  # NCCL: host:pid:tid [device]
    r") ?"
)
_OUTER: Final = (
    r"^(?:\[\d\d:\d\d:\d\d\] task=\S+ \| ?"  # Iris
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z "  # kubectl logs --timestamps
    r"|[\w.-]+-\d+ +\| )?"  # docker compose: `service-1  | `
    rf"(?:{_PROCESS})*"
)
_HEADER: Final = (
    r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \| *[A-Z]+ *\| \S+ - ?"
    r"|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
    r"(?:\[[^\]]*\]|[\w./-]+:\d+\]) ?)"
)
_REPEATED: Final = r"\[repeated \d+x across cluster\]\s*$"
_ANY_FLAG: Final = "|".join(re.escape(lit) for lit in FLAG_LITERALS)


def strip_sgr(expr: pl.Expr) -> pl.Expr:
    """`expr` without SGR colour codes."""
    return expr.str.replace_all(SGR, "")


def _with(frame: pl.DataFrame, literal: str) -> pl.Series:
    """`idx` of the rows of `frame` whose line holds `literal`."""
    return frame.filter(pl.col("raw").str.contains(literal, literal=True)).get_column("idx")


@dataclass(frozen=True)
class _Flags:
    """Indices (sorted, UInt32) of a read's lines: vLLM stat lines (with their text), other
    lines holding a flag literal, and the lines that open a traceback or Ray unhandled-error
    block."""

    engine: pl.DataFrame  # idx, raw
    interest: pl.Series
    tb: pl.Series


def _flags(lines: pl.Series, where: pl.Series | None = None) -> _Flags:
    """One capture-free regex finds each line's first flag literal; only the lines with a hit are
    searched again for the engine and traceback literals (which may follow another). `where`:
    the line index of each of `lines` in the read, when the native pass took the others."""
    first = lines.str.extract(_ANY_FLAG, 0)
    hit = first.is_not_null()
    at = hit.arg_true()
    hits = pl.DataFrame(
        {
            "idx": at if where is None else where.gather(at),
            "raw": lines.filter(hit),
            "first": first.filter(hit),
        }
    )
    is_engine = pl.col("first") == ENGINE_LITERAL
    engine_first, others = hits.filter(is_engine), hits.filter(~is_engine)
    later = others.filter(pl.col("raw").str.contains(ENGINE_LITERAL, literal=True))
    engine_later = later.get_column("idx")
    tb = pl.concat(
        [_with(others, TRACEBACK), _with(others, UNHANDLED), _with(engine_first, TRACEBACK)]
    )
    engine = pl.concat([engine_first.select("idx", "raw"), later.select("idx", "raw")])
    interest = others.filter(~pl.col("idx").is_in(engine_later.implode())).get_column("idx")
    return _Flags(engine=engine.sort("idx"), interest=interest, tb=tb.unique().sort())


def _picked(flags: _Flags, n_lines: int) -> pl.Series:
    """Interesting lines, lines up to WINDOW_LINES after a traceback, and the first WINDOW_LINES
    (which may close a traceback of an earlier read; `in_windows` drops those that do not)."""
    starts = pl.concat([pl.Series([0], dtype=pl.UInt32), flags.tb])
    ends = pl.concat(
        [pl.Series([WINDOW_LINES], dtype=pl.UInt32), flags.tb + (WINDOW_LINES + 1)]
    ).clip(upper_bound=n_lines)
    windows = pl.int_ranges(starts, ends, dtype=pl.UInt32, eager=True).explode().drop_nulls()
    return pl.concat([flags.interest, windows]).unique().sort()


def in_windows(ev: pl.DataFrame) -> pl.DataFrame:
    """`ev` without the window-only lines that follow no traceback within WINDOW_LINES lines."""
    idx = pl.col("idx").cast(pl.Int64)
    since = idx - pl.when(pl.col("tb")).then(idx).forward_fill()
    keep = ~pl.col("window_only") | (since <= WINDOW_LINES).fill_null(False)
    return ev.filter(keep)


def _prefix_fields(outer: pl.Expr, header: pl.Expr) -> dict[str, pl.Expr]:
    # `[HH:MM:SS] task=` is 16 characters; the task runs to the space that ends the match.
    iris = outer.str.extract(r"^\[\d\d:\d\d:\d\d\] task=\S+ ", 0)

    def clock(start: int) -> pl.Expr:
        return iris.str.slice(start, 2).cast(pl.Int32, strict=False)

    loguru = header.str.extract(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?", 0)
    return {
        "task": iris.str.slice(16).str.head(-1),
        "tod": clock(1) * 3600 + clock(4) * 60 + clock(7),
        "pid": outer.str.extract(r"pid=(\d+)", 1),
        "ip": outer.str.extract(r"ip=([^\s()\]]+)", 1),
        "rank": outer.str.extract(r"\[rank\d+\]", 0),
        "ldt": loguru.str.to_datetime(
            "%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us", time_zone="UTC"
        ),
        "vts": header.str.extract(r"^[A-Z]+ (\d\d-\d\d \d\d:\d\d:\d\d)", 1),
    }


def _strip_prefixes(frame: pl.LazyFrame) -> pl.LazyFrame:
    line = strip_sgr(pl.col("raw")).str.replace(_REPEATED, "")
    frame = frame.select("idx", "window_only", "tb", line=line)
    frame = frame.with_columns(_outer=pl.col("line").str.extract(_OUTER, 0))
    text = pl.col("line").str.slice(pl.col("_outer").str.len_chars())
    frame = frame.with_columns(text=text).drop("line")
    frame = frame.with_columns(_header=pl.col("text").str.extract(_HEADER, 0))
    skip = pl.col("_header").str.len_chars().fill_null(0)
    fields = _prefix_fields(pl.col("_outer"), pl.col("_header"))
    msg = pl.col("text").str.slice(skip)
    prefix = pl.col("_outer").str.strip_chars_end()
    return frame.select("idx", "window_only", "tb", "text", msg=msg, prefix=prefix, **fields)


def _alternation(literals: list[tuple[str, bool]]) -> str:
    """One regex matching any literal (anchored when it must start the message), longest first."""
    ordered = sorted(set(literals), key=lambda item: len(item[0]), reverse=True)
    return "|".join(("^" if anchored else "") + re.escape(lit) for lit, anchored in ordered)


_KIND_OF: Final = {lit: kind for kind, lit, _ in KIND_RULES}
_KIND_ALT: Final = _alternation([(lit, starts) for _, lit, starts in KIND_RULES])
_ERROR_RULES_PLAIN: Final = [(k, lit) for k, lit in ERROR_RULES if k != "trajectory_failed"]
_ERROR_RANK: Final = {lit: rank for rank, (_, lit) in enumerate(_ERROR_RULES_PLAIN)}
_ERROR_BY_RANK: Final = {rank: kind for rank, (kind, _) in enumerate(_ERROR_RULES_PLAIN)}
_ERROR_ALT: Final = _alternation([(lit, False) for _, lit in _ERROR_RULES_PLAIN])
_TRAJECTORY: Final = r"Trajectory \S+ attempt \d+/\d+ failed"
_FAILURE_ALT: Final = _alternation([(lit, False) for lit in FAILURE_LITERALS])


def _kind_expr() -> pl.Expr:
    msg = pl.col("msg")
    cont = pl.col("text").str.starts_with(" '") & (msg == pl.col("text"))
    found = msg.str.extract(_KIND_ALT, 0).replace_strict(_KIND_OF, default=None)
    return pl.when(cont).then(pl.lit("dict_cont")).otherwise(found)


def _error_expr() -> pl.Expr:
    msg = pl.col("msg")
    ranks = msg.str.extract_all(_ERROR_ALT).list.eval(
        pl.element().replace_strict(_ERROR_RANK, default=None, return_dtype=pl.Int32)
    )
    best = ranks.list.min().replace_strict(_ERROR_BY_RANK, default=None, return_dtype=pl.String)
    return (
        pl.when(msg.str.starts_with(TRACEBACK))
        .then(pl.lit("traceback"))
        .when(best.is_not_null())
        .then(best)
        .when(msg.str.contains(_TRAJECTORY))
        .then(pl.lit("trajectory_failed"))
        .otherwise(pl.lit(None, dtype=pl.String))
    )


def _classify(frame: pl.LazyFrame) -> pl.LazyFrame:
    only = pl.col("window_only")
    null_str = pl.lit(None, dtype=pl.String)
    return frame.with_columns(
        kind=pl.when(only).then(null_str).otherwise(_kind_expr()),
        err=pl.when(only).then(null_str).otherwise(_error_expr()),
        failure=~only & pl.col("msg").str.contains(_FAILURE_ALT),
        ldt=pl.when(only).then(None).otherwise(pl.col("ldt")),
        vts=pl.when(only).then(null_str).otherwise(pl.col("vts")),
        tod=pl.when(only).then(None).otherwise(pl.col("tod")),
        actor=pl.concat_str(
            pl.col("task").fill_null(""),
            pl.lit("|"),
            pl.col("pid").fill_null(""),
            pl.lit("@"),
            pl.col("ip").fill_null(""),
            pl.col("rank").fill_null(""),
        ),
    )


def _raw(lines: pl.Series, native: Native, idx: pl.Series) -> pl.Series:
    """The text of the lines `idx` of the read: rest lines from `lines`, the stat lines the
    native pass read from the read's bytes (the window lines after a traceback, a few)."""
    if not len(lines):
        return pl.Series("raw", native.raw(idx.to_list()), dtype=pl.String)
    pos = native.where.search_sorted(idx).clip(upper_bound=len(lines) - 1)
    raw = lines.gather(pos)
    stat = (native.where.gather(pos) != idx).arg_true()
    if len(stat):
        raw = raw.scatter(stat, native.raw(idx.gather(stat).to_list()))
    return raw


def _native_rows(picked: pl.DataFrame) -> pl.DataFrame:
    """The lines the native pass read as evidence rows: interesting, no traceback, no vLLM
    time, no error or failure (the pass proved it)."""
    null = pl.lit(None, dtype=pl.String)
    return picked.select(
        "idx",
        pl.lit(False).alias("window_only"),
        pl.lit(False).alias("tb"),
        *("text", "msg", "prefix", "task", "tod", "pid", "ip", "rank", "ldt"),
        null.alias("vts"),
        "kind",
        null.alias("err"),
        pl.lit(False).alias("failure"),
        "actor",
    )


def evidence_lines(
    lines: pl.Series, native: Native | None = None
) -> tuple[pl.LazyFrame, pl.DataFrame]:
    """A query for the lines worth reading, classified (window_only: kept only as a possible
    block end; tb: a block starts), and the stat lines (`idx`, `raw`). With `native`, `lines`
    are its rest lines and the lines it read join the others."""
    flags = _flags(lines, None if native is None else native.where)
    idx = _picked(flags, len(lines) if native is None else native.n_lines)
    done = None if native is None or not len(native.picked) else native.picked
    if done is not None:
        idx = idx.filter(~idx.is_in(done.get_column("idx").implode()))
    raw = lines.gather(idx) if native is None else _raw(lines, native, idx)
    picked = pl.DataFrame({"idx": idx, "raw": raw}).with_columns(
        tb=pl.col("idx").is_in(flags.tb.implode()),
        window_only=~pl.col("idx").is_in(flags.interest.implode()),
    )
    ev = _classify(_strip_prefixes(picked.lazy()))
    if done is not None:
        ev = ev.merge_sorted(_native_rows(done).lazy(), key="idx")
    return ev, flags.engine
