"""The per-read work that needs no parser state (split, classify, read the stat lines), done in the
read-ahead thread; scans join in file order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl

from worker.evidence.logs import detect, engines, records
from worker.evidence.logs.native import Native, native_scan
from worker.evidence.logs.reads import Cut, Read, bound_lines, line_start, split_read
from worker.evidence.logs.rules import HEAD_LINES, HEAD_SCAN_LINES, KEEP, WINDOW_LINES

__all__ = ["Scan", "scan"]

# A chunk is cut at most WINDOW_LINES + 1 lines before its end; its tail bytes must cover the cut.
TAIL_LINES: Final = WINDOW_LINES + 2


@dataclass(frozen=True)
class Scan:
    """Consecutive lines of a file, scanned; `idx` columns count from the first of them."""

    lines: int
    size: int  # bytes, newlines included
    ev: pl.DataFrame  # detect.evidence_lines columns
    stats: pl.DataFrame  # engines.engine_fields columns
    mirrors: pl.DataFrame  # records.mirror_records columns but `json`
    pairs: pl.DataFrame  # records.mirror_pairs columns
    head: pl.DataFrame  # idx, text: first non-empty lines among the first HEAD_SCAN_LINES
    first_content: int | None  # idx of the first non-blank line
    tail: bytes  # the bytes of the last `tail_lines` lines (a cut line as cut)
    tail_lines: int
    cuts: tuple[Cut, ...] = ()  # lines cut to LINE_MAX_BYTES, by idx

    def then(self, other: Scan) -> Scan:
        """This scan followed by `other`."""
        if other.tail_lines < other.lines:
            tail, tail_lines = other.tail, other.tail_lines
        else:
            tail, tail_lines = self.tail + other.tail, self.tail_lines + other.tail_lines
        first = other.first_content
        return Scan(
            lines=self.lines + other.lines,
            size=self.size + other.size,
            ev=pl.concat([self.ev, _shifted(other.ev, self.lines)]),
            stats=pl.concat([self.stats, _shifted(other.stats, self.lines)]),
            mirrors=pl.concat([self.mirrors, _shifted(other.mirrors, self.lines)]),
            pairs=pl.concat([self.pairs, _shifted(other.pairs, self.lines)]),
            head=pl.concat([self.head, _shifted(other.head, self.lines)]),
            first_content=self.first_content
            if self.first_content is not None
            else (None if first is None else first + self.lines),
            tail=tail,
            tail_lines=tail_lines,
            cuts=self.cuts
            + tuple(Cut(c.idx + self.lines, c.length, c.dropped) for c in other.cuts),
        )

    def _within_tail(self, index: int) -> int:
        """Position in `tail` of line `index`, which must lie within the tail."""
        first = self.lines - self.tail_lines
        if index < first:
            raise ValueError(f"line {index} is before the scanned tail (line {first})")
        return line_start(self.tail, len(self.tail), self.tail_lines, index - first)

    def offset_of(self, index: int) -> int:
        """Byte offset of line `index`, which must lie within the tail (or be the end)."""
        if index >= self.lines:
            return self.size
        within = self._within_tail(index)
        # file bytes from line `index` on: the tail's from there, and what cuts dropped of them
        dropped = sum(c.dropped for c in self.cuts if c.idx >= index)
        return self.size - (len(self.tail) - within) - dropped

    def after(self, index: int) -> Scan:
        """The lines from `index` on (within the tail), already scanned."""
        start = self.offset_of(index)
        cut = self._within_tail(index) if index < self.lines else len(self.tail)
        return Scan(
            lines=self.lines - index,
            size=self.size - start,
            ev=_from(self.ev, index),
            stats=_from(self.stats, index),
            mirrors=_from(self.mirrors, index),
            pairs=_from(self.pairs, index),
            head=self.head.clear(),
            first_content=None,
            tail=self.tail[cut:],
            tail_lines=self.lines - index,
            cuts=tuple(
                Cut(c.idx - index, c.length, c.dropped) for c in self.cuts if c.idx >= index
            ),
        )


def _shifted(frame: pl.DataFrame, by: int) -> pl.DataFrame:
    if by == 0:
        return frame
    return frame.with_columns((pl.col("idx").cast(pl.Int64) + by).cast(pl.UInt32))


def _from(frame: pl.DataFrame, index: int) -> pl.DataFrame:
    return _shifted(frame.filter(pl.col("idx") >= index), -index)


def _head(lines: pl.Series, passed: Native | None) -> tuple[pl.DataFrame, int | None]:
    """The read's first non-empty lines among its first HEAD_SCAN_LINES (`idx`, `text`: at most
    HEAD_LINES) and the index of its first non-blank line: of `lines` (the native pass's rest
    lines, with `passed`) and of the stat lines the pass read."""
    where = (
        pl.int_range(len(lines), dtype=pl.UInt32, eager=True) if passed is None else passed.where
    )
    rest = pl.DataFrame({"idx": where, "line": lines})
    n_rest = where.search_sorted(HEAD_SCAN_LINES)
    parts, starts = [rest.head(n_rest)], []
    if passed is not None:
        stat_idx = passed.stats.get_column("idx")
        kept = stat_idx.head(min(stat_idx.search_sorted(HEAD_SCAN_LINES), HEAD_LINES))
        stat_lines = pl.Series("line", passed.raw(kept.to_list()), dtype=pl.String)
        parts.append(pl.DataFrame({"idx": kept, "line": stat_lines}))
        starts += stat_idx.head(1).to_list()
    text = detect.strip_sgr(pl.col("line")).str.strip_chars()
    head = pl.concat(parts).sort("idx").select("idx", text=text)
    head = head.filter(pl.col("text").str.len_bytes() > 0).head(HEAD_LINES)
    filled = pl.col("line").str.strip_chars().str.len_bytes() > 0
    found = rest.head(n_rest).filter(filled)
    found = found if len(found) else rest.filter(filled)
    starts += found.get_column("idx").head(1).to_list()
    return head, min(starts, default=None)


def _lines(read: Read, native: bool) -> tuple[pl.Series, list[Cut], Native | None]:
    """The lines of `read` for the polars path (all, or those the native pass left), cut to
    LINE_MAX_BYTES, the cuts (by line index in the read) and the native pass (with `native`,
    when the extension is built)."""
    passed = native_scan(read.data, read.end, KEEP) if native else None
    if passed is None:
        lines, cuts = bound_lines(split_read(read.data, read.end))
        return lines, cuts, None
    lines, cuts = bound_lines(split_read(passed.rest, len(passed.rest)))
    where = passed.where
    return lines, [Cut(int(where[c.idx]), c.length, c.dropped) for c in cuts], passed


def _stats(stat_lines: pl.DataFrame, native: Native | None) -> pl.DataFrame:
    """The fields of the stat lines: the native pass's and the polars path's (of the rest)."""
    if native is None:
        return engines.engine_fields(stat_lines)
    if not len(stat_lines):
        return native.stats
    stats = engines.engine_fields(stat_lines)
    return pl.concat([native.stats, stats]).sort("idx") if len(native.stats) else stats


def scan(read: Read, *, native: bool = True) -> Scan:
    """The scan of the complete lines of `read` (of all of it when final); with `native`, its
    strict lines are read by the native pass (when the extension is built)."""
    lines, cuts, passed = _lines(read, native)
    n_lines = len(lines) if passed is None else passed.n_lines
    ev_query, stat_lines = detect.evidence_lines(lines, passed)
    ev, stats = ev_query.collect(engine="in-memory"), _stats(stat_lines, passed)
    mirrors = records.mirror_records(ev)
    pairs = records.mirror_pairs(mirrors)
    head, first_content = _head(lines, passed)
    tail_lines = min(n_lines, TAIL_LINES)
    start = line_start(read.data, read.end, n_lines, n_lines - tail_lines)
    return Scan(
        lines=n_lines,
        size=read.size,
        ev=ev,
        stats=stats,
        mirrors=mirrors.drop("json"),
        pairs=pairs,
        head=head,
        first_content=first_content,
        tail=read.data[start : read.end],
        tail_lines=tail_lines,
        cuts=(*read.cuts, *cuts),
    )
