"""The first reads of a log file and their native passes, begun before polars is imported.

`rl-health parse` spends its first ~0.3 s importing polars on one core while the other idles.
`Prelude.start` opens the log in a thread and reads it as the parse will (`reads.first_reads`,
with the budget's read size), running the native pass (`native.raw`, which releases the GIL) over
each read, until the parse takes them (`take`) or `reads` reads are held. The parse then scans
those reads first (`scan.scan(read, early)`: the pass is wrapped into frames, not run again) and
goes on reading from the same handle, so the reads, and the tables, are those of a parse without
a prelude.

Nothing here imports polars (a test checks it). Whatever goes wrong in the thread (the file
cannot be opened or read) is not raised there: `take` gives None and the parse reads the file
itself, meeting the same error as without a prelude. The thread is always joined: by `take`, or
by `close` (idempotent), which the parse calls whatever happens.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path
from typing import Final

from worker.evidence.logs import native
from worker.evidence.logs.budget import MemoryBudget
from worker.evidence.logs.reads import Read, first_reads
from worker.evidence.logs.rules import KEEP

__all__ = ["READS_AHEAD", "Prelude", "Taken"]

# At most this many reads are read and passed ahead (the short first read and three of the
# budget's size: ~40 MB for a 200 MB log), so the prelude holds no more than the parse's own
# reads in flight would.
READS_AHEAD: Final = 4


@dataclass(frozen=True)
class Taken:
    """What the prelude read: the open handle (positioned after its reads), the reads with their
    native passes (None: no extension), and the reads' iterator to go on with."""

    handle: BufferedReader
    done: deque[tuple[Read, native.Raw | None]]
    rest: Iterator[Read]

    @property
    def held(self) -> int:
        """The bytes of the reads done (what the prelude holds, but their passes' columns)."""
        return sum(len(read.data) for read, _ in self.done)

    def reads(self) -> Iterator[tuple[Read, native.Raw | None]]:
        """Every read of the file: those done, then the others (their pass not made). A read
        done is let go as it is handed on (nothing here keeps it once it is scanned)."""
        final = False
        while self.done:
            read, passed = self.done.popleft()
            final = read.final
            yield read, passed
            del read, passed
        if final:
            return
        for read in self.rest:
            yield read, None


class Prelude:
    """Reads of `path` from its start, read and passed in a thread until taken."""

    def __init__(self, path: Path, chunk_bytes: int, reads: int = READS_AHEAD) -> None:
        self.path = path
        self.chunk_bytes = chunk_bytes
        self._limit = reads
        self._stop = threading.Event()
        self._done: deque[tuple[Read, native.Raw | None]] = deque()
        self._handle: BufferedReader | None = None
        self._rest: Iterator[Read] | None = None
        self._failed = False
        self._taken = False
        self._thread = threading.Thread(target=self._work, name="rlhealth-prelude", daemon=True)

    @classmethod
    def start(cls, path: Path, reads: int = READS_AHEAD) -> Prelude:
        """A prelude reading `path` with the read size of its budget (`MemoryBudget.for_logs`),
        its thread started. `ValueError` (from the memory setting) or `OSError` (from the size)
        before any thread is started."""
        chunk_bytes = MemoryBudget.for_logs(path.stat().st_size).chunk_bytes
        prelude = cls(path, chunk_bytes, reads)
        prelude._thread.start()
        return prelude

    def _work(self) -> None:
        try:
            self._handle = self.path.open("rb")
            self._rest = first_reads(self._handle, self.chunk_bytes)
            while not self._stop.is_set() and len(self._done) < self._limit:
                read = next(self._rest, None)
                if read is None:
                    return
                self._done.append((read, native.raw(read.data, read.end, KEEP)))
                if read.final:
                    return
        except BaseException:  # the parse reads the file itself and meets it
            self._failed = True

    @property
    def alive(self) -> bool:
        """Whether its thread is still running."""
        return self._thread.is_alive()

    def take(self, chunk_bytes: int) -> Taken | None:
        """The reads done and the handle, the thread joined; None when the prelude failed or read
        with another read size than `chunk_bytes` (then nothing of it is used)."""
        self._stop.set()
        self._thread.join()
        if self._taken or self._failed or chunk_bytes != self.chunk_bytes:
            self.close()
            return None
        handle, rest = self._handle, self._rest
        if handle is None or rest is None:
            self.close()
            return None
        self._taken = True
        done, self._done = self._done, deque()
        return Taken(handle, done, rest)

    def close(self) -> None:
        """Stop and join the thread; close the handle unless it was taken."""
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join()
        if not self._taken and self._handle is not None:
            self._handle.close()
        self._done.clear()
