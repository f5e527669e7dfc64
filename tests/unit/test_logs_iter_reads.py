"""`iter_reads` with read sizes that leave the file handle's own buffer (8 KiB) holding bytes.

The command's reads are multiples of 4 KiB (`ParseBudget.for_logs`), and a random search over such
sizes found no fault; other sizes (any `chunk_bytes` a library caller passes) leave the buffered
reader holding bytes past its position. The sparse-file probe (`SEEK_DATA`, taken while a long
line is skipped) moved the descriptor under those bytes, and the reader went on from the probe's
position: a 70,000-byte line was measured 5.6 MB long in a 5.5 MB file, and a random search over
such files was killed for its memory. Every test below but the 8 KiB and 64 KiB cases failed then.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from worker.evidence.logs.reads import iter_reads

BUFFER = 8192  # io.DEFAULT_BUFFER_SIZE


@pytest.mark.parametrize("chunk", [1000, BUFFER - 1, BUFFER, BUFFER + 1, 65_536])
def test_a_long_line_is_measured_exactly_whatever_the_read_size(tmp_path: Path, chunk: int) -> None:
    path = tmp_path / "long.log"
    path.write_bytes(b"a\n" + b"x" * 70_000 + b"\n" + b"tail\n" * 3000)
    with path.open("rb") as handle:
        found = list(iter_reads(handle, chunk, 50_000))
    long = [read for read in found if read.long_line]
    assert [read.long_line for read in long] == [70_000]
    assert sum(read.size for read in found) == path.stat().st_size
    assert found[found.index(long[0]) + 1].data.startswith(b"tail\n")


@pytest.mark.parametrize("chunk", [1000, BUFFER + 1])
def test_a_hole_inside_a_long_line_is_jumped_and_the_line_after_it_is_read(
    tmp_path: Path, chunk: int
) -> None:
    """A line that runs into a hole (NUL bytes the file system does not store) is skipped to the
    next data; what follows the hole is read once, from the right place."""
    path = tmp_path / "sparse.log"
    with path.open("wb") as out:
        out.write(b"a\n" + b"x" * 60_000)
        out.seek(4 * 2**20)
        out.write(b"y" * 100 + b"\nafter the hole\n" + b"tail\n" * 2000)
    with path.open("rb") as handle:
        found = list(iter_reads(handle, chunk, 50_000))
    assert sum(read.size for read in found) == path.stat().st_size
    text = b"".join(read.data[: read.end] for read in found)
    assert text.count(b"after the hole\n") == 1
    assert text.count(b"tail\n") == 2000
    long = [read.long_line for read in found if read.long_line]
    assert long == [4 * 2**20 + 100 - 2]


def test_any_read_size_covers_a_file_of_long_and_short_lines_once(tmp_path: Path) -> None:
    """Random files of short lines and lines past the cap, random read sizes (most not a
    multiple of the handle's buffer): every byte is counted once, every line end kept once."""
    rng = random.Random(7)
    path = tmp_path / "mixed.log"
    for _ in range(60):
        lines = [
            b"x" * rng.randint(40_000, 200_000)
            if rng.random() < 0.2
            else b"l" * rng.randint(0, 3000)
            for _ in range(rng.randint(1, 20))
        ]
        path.write_bytes(b"\n".join(lines) + b"\n")
        chunk = rng.randint(500, 100_000)
        with path.open("rb") as handle:
            found = list(iter_reads(handle, chunk, 32_768))
        assert sum(read.size for read in found) == path.stat().st_size, chunk
        kept = b"".join(read.data[: read.end] for read in found)
        assert kept.count(b"\n") == len(lines), chunk
