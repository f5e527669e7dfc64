"""Chunked reading of a log file into polars line series, split natively (the reads themselves,
polars-free, are `reads.py`'s; this module re-exports them, and the window and line caps of
`rules.py`).

A read is a run of complete lines (each ended by a newline); the file is sought back to the start
of a partial last line, so no read is copied to be joined with the next. Lines are split by polars'
CSV reader with a separator byte that cannot occur. The fast path (valid UTF-8, no NUL or CR byte)
is checked by summing the line lengths; anything else takes the careful path (NUL blanked, invalid
UTF-8 replaced, line count checked against the newlines), so nothing ever raises.

Reads are bounded: a line longer than LINE_MAX_BYTES is cut to its head and a marker naming its
length (`cut_line`). A line longer than a whole read is never held: its head is kept and the rest
is skipped, a read at a time, to the next newline (`Read.long_line`); memory stays one read plus
one cap whatever the file holds (one 300 MB line, a 2 GB sparse file of NUL bytes). A read that
begins with the magic bytes of a compressed stream is never handed to polars' CSV reader as such
(it would decompress it).
"""

from __future__ import annotations

import os
from typing import BinaryIO, Final, Literal

import polars as pl

from worker.evidence.logs.reads import Cut, Read, cut_line, cut_marker, iter_reads
from worker.evidence.logs.rules import LINE_MAX_BYTES, WINDOW_LINES

__all__ = [
    "CHUNK_BYTES",
    "LINE_MAX_BYTES",
    "WINDOW_LINES",
    "Cut",
    "Read",
    "cut_line",
    "cut_marker",
    "iter_reads",
    "line_start",
    "read_tail",
    "split_lines",
    "split_read",
]

CHUNK_BYTES: Final = 48 * 2**20
# polars' CSV reader decompresses a buffer that starts with these (gzip, zlib, zstd)
_COMPRESSED: Final = (
    b"\x1f\x8b",
    b"\x78\x01",
    b"\x78\x5e",
    b"\x78\x9c",
    b"\x78\xda",
    b"\x28\xb5\x2f\xfd",
)


def _count_lines(raw: bytes) -> int:
    return raw.count(b"\n") + (0 if raw.endswith(b"\n") else 1)


def _python_split(raw: bytes) -> pl.Series:
    text = raw.decode("utf-8", errors="replace")
    parts = text.split("\n")
    if raw.endswith(b"\n"):
        parts.pop()
    return pl.Series("line", [p.removesuffix("\r") for p in parts], dtype=pl.String)


def _read_csv(raw: bytes, encoding: Literal["utf8", "utf8-lossy"]) -> pl.Series | None:
    if raw.startswith(_COMPRESSED):
        # one blank line first, so the reader sees text and not a compressed stream to expand
        lines = _read_csv(b"\n" + raw, encoding)
        return lines.slice(1) if lines is not None else None
    try:
        frame = pl.read_csv(
            raw,
            has_header=False,
            separator="\x00",
            quote_char=None,
            new_columns=["line"],
            infer_schema=False,
            encoding=encoding,
            truncate_ragged_lines=True,
        )
    except (pl.exceptions.PolarsError, OSError):
        return None
    return frame.to_series().fill_null("").alias("line") if frame.width == 1 else None


def split_lines(raw: bytes) -> pl.Series:
    """The lines of `raw` as a String series (newline and a trailing CR removed)."""
    if not raw:
        return pl.Series("line", [], dtype=pl.String)
    if b"\x00" in raw:
        raw = raw.replace(b"\x00", b" ")
    lines = _read_csv(raw, "utf8-lossy")
    if lines is None or len(lines) != _count_lines(raw):
        return _python_split(raw)
    return lines


def _split_fast(data: bytes, end: int) -> pl.Series | None:
    """The lines of `data[:end]` when `data` is plain UTF-8 without NUL or CR, else None."""
    if b"\x00" in data or b"\r" in data:
        return None
    lines = _read_csv(data, "utf8")
    if lines is None:
        return None
    # `data[end:]` (no newline in it) is one more line when not empty.
    n_lines = len(lines) - (1 if end < len(data) else 0)
    lines = lines.head(n_lines)
    newlines = n_lines - (0 if data[end - 1 : end] == b"\n" else 1)
    total = lines.str.len_bytes().sum() + newlines
    return lines if total == end else None


def split_read(data: bytes, end: int) -> pl.Series:
    """The lines of `data[:end]` (which is empty or ends with a newline, or ends the file)."""
    if end <= 0:
        return pl.Series("line", [], dtype=pl.String)
    fast = _split_fast(data, end)
    return fast if fast is not None else split_lines(data[:end])


def bound_lines(lines: pl.Series, line_max: int = LINE_MAX_BYTES) -> tuple[pl.Series, list[Cut]]:
    """`lines` with every line longer than `line_max` bytes cut (`cut_line`), and the cuts.

    Such lines are rare (at most one per `line_max` bytes read), so they are cut one by one.
    """
    lengths = lines.str.len_bytes()
    longest = lengths.max()
    if not isinstance(longest, int) or longest <= line_max:
        return lines, []
    where = (lengths > line_max).arg_true()
    cuts = [Cut(int(i), int(lengths[int(i)])) for i in where]
    texts = [cut_line(lines[c.idx].encode(), c.length, line_max) for c in cuts]
    return lines.scatter(where, texts), cuts


def line_start(raw: bytes, end: int, n_lines: int, index: int) -> int:
    """Byte offset in `raw[:end]` (`n_lines` lines, ending with a newline) of line `index`."""
    if index <= 0:
        return 0
    if index >= n_lines:
        return end
    pos = end
    for _ in range(n_lines - index + 1):
        pos = raw.rfind(b"\n", 0, pos)
    return pos + 1


def read_tail(log: BinaryIO, size: int, tail_bytes: int = 65536) -> bytes:
    """The last `tail_bytes` of the first `size` bytes of the open file, starting at a line
    start (read at that offset: the file's position is left where it is)."""
    start = max(0, size - tail_bytes)
    data = os.pread(log.fileno(), size - start, start)
    if start > 0:
        cut = data.find(b"\n")
        data = data[cut + 1 :] if cut >= 0 else b""
    return data
