"""Reading a log file into reads of complete lines, without polars.

A read is a run of complete lines (each ended by a newline); the file is sought back to the start
of a partial last line, so no read is copied to be joined with the next. Reads are bounded: a
line longer than LINE_MAX_BYTES is cut to its head and a marker naming its length (`cut_line`). A
line longer than a whole read is never held: its head is kept and the rest is skipped, a read at
a time, to the next newline (`Read.long_line`); memory stays one read plus one cap whatever the
file holds (one 300 MB line, a 2 GB sparse file of NUL bytes).

This module imports no polars: `rl-health parse` begins reading before polars is imported
(`worker.evidence.logs.prelude`). `lines` re-exports what it defines.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from io import BufferedReader
from typing import Final

from worker.evidence.logs.rules import LINE_MAX_BYTES

__all__ = [
    "FIRST_READ_BYTES",
    "Cut",
    "Read",
    "cut_line",
    "cut_marker",
    "first_reads",
    "iter_reads",
]

_MARKER_ROOM: Final = 64  # bytes kept free for the marker, so a cut line stays within the cap
# The first read of a file is at most this long (`first_reads`).
FIRST_READ_BYTES: Final = 2 * 2**20


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
    """One read: its complete lines are `data[:end]`; `final` is the rest of the file.

    `long_line` > 0: the read is one line of that many bytes, longer than a read, already cut
    (`data` holds its head and marker); the file bytes it stands for are `long_line` plus its
    newline.
    """

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
    """The read of a line longer than a read, of which `data` was read: the rest is read and
    dropped, a block at a time into one buffer (holes of a sparse file are jumped over), up to
    its newline; the file is left after it."""
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
    """Reads of complete lines (about `chunk_bytes` each), then one final read of the rest.

    After a read the file is sought back to the start of its partial last line, which the next
    read begins with. A partial line is kept until it is longer than `line_max`; then it is cut
    and the rest of it skipped (`_skip_line`), so no read holds more than `chunk_bytes` +
    `line_max` bytes.
    """
    pending = b""
    while True:
        data = handle.read(chunk_bytes)
        if not data:
            yield Read(pending, len(pending), final=True)
            return
        if pending:
            data, pending = pending + data, b""
        end = data.rfind(b"\n") + 1
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


def first_reads(handle: BufferedReader, chunk_bytes: int) -> Iterator[Read]:
    """The reads of `handle` from where it is: a short first one (its scan soon tells how much
    a read of this log costs, so the next reads are scanned at once), then `chunk_bytes` each."""
    first = min(chunk_bytes, FIRST_READ_BYTES)
    if first < chunk_bytes:
        read = next(iter_reads(handle, first, LINE_MAX_BYTES))
        yield read
        if read.final:
            return
    yield from iter_reads(handle, chunk_bytes, LINE_MAX_BYTES)
