"""A log file as reads of complete lines, and a read as a polars series of lines.

Long lines are cut (docs/parsing.md, "How a file is read"); a line longer than a read is never
held. Lines are split by polars' CSV reader with a separator that cannot occur; anything but plain
UTF-8 without NUL or CR takes a careful path, so nothing ever raises."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from io import BufferedReader
from typing import BinaryIO, Final, Literal

import polars as pl

from worker.evidence.logs.rules import LINE_MAX_BYTES

__all__ = [
    "Cut",
    "Read",
    "bound_lines",
    "iter_reads",
    "line_start",
    "read_tail",
    "split_lines",
    "split_read",
]

_MARKER_ROOM: Final = 64  # bytes kept free for the marker, so a cut line stays within the cap
# polars' CSV reader decompresses a buffer that starts with these (gzip, zlib, zstd)
_COMPRESSED: Final = (
    b"\x1f\x8b",
    b"\x78\x01",
    b"\x78\x5e",
    b"\x78\x9c",
    b"\x78\xda",
    b"\x28\xb5\x2f\xfd",
)


@dataclass(frozen=True)
class Cut:
    """A line cut to LINE_MAX_BYTES: its index in its read, its length, and the bytes of the file
    that are not in the read's data (only a line longer than a read is cut before it is split)."""

    idx: int
    length: int
    dropped: int = 0


def cut_marker(length: int) -> str:
    """What replaces the end of a cut line."""
    return f" [... line cut: {length:,} bytes]"


def cut_line(head: bytes, length: int, line_max: int = LINE_MAX_BYTES) -> str:
    """The text kept of a line of `length` bytes that starts with `head`: at most
    `line_max - 64` bytes of it (whole characters, NUL blanked) and the marker."""
    keep = max(line_max - _MARKER_ROOM, 0)
    text = head[:keep].decode("utf-8", errors="replace").replace("\x00", " ")
    text = text.encode()[:keep].decode("utf-8", errors="ignore")  # replacements may have grown it
    return text + cut_marker(length)


@dataclass(frozen=True)
class Read:
    """One read: its lines are `data[:end]`; `final`: the rest of the file. `long_line` > 0: one
    line of that many bytes, longer than a read, already cut (`data`: its head and marker)."""

    data: bytes
    end: int
    final: bool
    long_line: int = 0

    @property
    def size(self) -> int:
        """The bytes of the file this read stands for."""
        if not self.long_line:
            return self.end
        newline = 1 if self.data[self.end - 1 : self.end] == b"\n" else 0
        return self.long_line + newline

    @property
    def cuts(self) -> list[Cut]:
        """The line cut before splitting (a line longer than a read), if this read is one."""
        if not self.long_line:
            return []
        kept = self.end - (1 if self.data[self.end - 1 : self.end] == b"\n" else 0)
        return [Cut(0, self.long_line, self.long_line - kept)]


def _next_data(handle: BufferedReader) -> int:
    """Skip to where the next data of a sparse file starts (at or after the current position);
    the bytes skipped. A hole holds only NUL bytes, so no newline: it need not be read."""
    here = handle.tell()
    try:
        fd = handle.fileno()
        # where the buffered reader left the descriptor: put back after the probe, or a reader
        # holding bytes past `here` would read from the probe's position after them
        left = os.lseek(fd, 0, os.SEEK_CUR)
    except (OSError, AttributeError, ValueError):  # no descriptor (an in-memory file)
        return 0
    try:
        found = os.lseek(fd, here, os.SEEK_DATA)
    except OSError as exc:  # ENXIO: nothing but a hole is left
        found = os.fstat(fd).st_size if exc.errno == errno.ENXIO else here
    except (AttributeError, ValueError):  # no SEEK_DATA on this platform or file
        found = here
    finally:
        os.lseek(fd, left, os.SEEK_SET)
    handle.seek(found)
    return found - here


def _skip_line(handle: BufferedReader, data: bytes, chunk_bytes: int, line_max: int) -> Read:
    """The read of a line longer than a read (`data` its start): the rest is read into one buffer
    and dropped up to its newline, holes of a sparse file jumped."""
    head, length = data[:line_max], len(data)
    buffer = bytearray(min(chunk_bytes, 8 * 2**20))
    view = memoryview(buffer)
    while True:
        length += _next_data(handle)
        n = handle.readinto(view)
        if not n:
            text = cut_line(head, length, line_max).encode()
            return Read(text, len(text), final=True, long_line=length)
        newline = buffer.find(b"\n", 0, n)
        if newline >= 0:
            length += newline
            handle.seek(newline + 1 - n, os.SEEK_CUR)
            text = cut_line(head, length, line_max).encode() + b"\n"
            return Read(text, len(text), final=False, long_line=length)
        length += n


def iter_reads(
    handle: BufferedReader, chunk_bytes: int, line_max: int = LINE_MAX_BYTES
) -> Iterator[Read]:
    """Reads of complete lines of about `chunk_bytes` (the file sought back to the start of a
    partial last line); the last (`final`) holds the rest of the file."""
    pending = b""
    while True:
        data = handle.read(chunk_bytes)
        if not data:
            yield Read(pending, len(pending), final=True)
            return
        short = len(data) < chunk_bytes
        if pending:
            data, pending = pending + data, b""
        end = data.rfind(b"\n") + 1
        if short and end == len(data):
            yield Read(data, end, final=True)
            return
        if end == 0 and len(data) > line_max:
            read = _skip_line(handle, data, chunk_bytes, line_max)
            yield read
            if read.final:
                return
            continue
        if end == 0:
            pending = data
            continue
        if end < len(data):
            handle.seek(end - len(data), os.SEEK_CUR)
        yield Read(data, end, final=False)


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
    """`lines` with every line longer than `line_max` bytes cut (`cut_line`), and the cuts."""
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
