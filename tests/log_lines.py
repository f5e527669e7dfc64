"""Small log lines in the real shapes (the Iris prefix, a Ray actor prefix, a loguru header; see
`tests/scenarios/builder.py` for their sources), and a parse that must give the same tables every
way the parser can read a file: the native pass on and off, one chunk or many, and grown."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from polars.testing import assert_frame_equal

from worker.evidence.log_cache import LogCache
from worker.evidence.logs import native, parse_log_file
from worker.evidence.model import LogTables

T0 = datetime(2026, 7, 30, 18, 0, tzinfo=UTC)
TASK = "/ops/rl-gsm8k/0"
TABLES = ("metrics", "phases", "engines", "progress", "batches", "errors", "timers", "resumes")
_START_LINES = Path(__file__).resolve().parent / "fixtures" / "start_lines.toml"


def start_line(name: str) -> str:
    """The verbatim start-up line `name` of `tests/fixtures/start_lines.toml`."""
    lines = tomllib.loads(_START_LINES.read_text("utf-8"))["line"]
    return str(next(line["text"] for line in lines if line["name"] == name))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def raw(collected: datetime, text: str) -> str:
    """A line as `iris job logs` shows it: the Iris prefix (collection time), then the text."""
    return f"[{collected:%H:%M:%S}] task={TASK} | {text}"


def actor_line(
    collected: datetime,
    message: str,
    *,
    actor: str = "skyrl_entrypoint pid=100",
    written: datetime | None = None,
    level: str = "INFO",
    iris: bool = True,
) -> str:
    """A loguru line behind a Ray actor prefix, collected at `collected`, written at `written`."""
    own = written or collected
    stamp = f"{own:%Y-%m-%d %H:%M:%S}.{own.microsecond // 1000:03d}"
    text = f"({actor}) {stamp} | {level:<8} | skyrl_train.trainer:train:210 - {message}"
    return raw(collected, text) if iris else text


@contextmanager
def _native(on: bool) -> Iterator[None]:
    saved = native.AVAILABLE
    native.AVAILABLE = on  # type: ignore[misc]
    try:
        yield
    finally:
        native.AVAILABLE = saved  # type: ignore[misc]


def _same(a: LogTables, b: LogTables) -> None:
    for name in TABLES:
        assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    assert a.summary == b.summary


def parse_every_way(lines: Sequence[str], tmp_path: Path) -> LogTables:
    """The tables of `lines` as `finelog.log`; the same with the native pass off, in 200-byte
    chunks, and grown line by line through the incremental cache (asserted)."""
    data = ("\n".join(lines) + "\n").encode()
    path = tmp_path / "finelog.log"
    path.write_bytes(data)
    with _native(True):
        tables = parse_log_file(path, "finelog.log", reference_date=T0.date())
    with _native(False):
        _same(tables, parse_log_file(path, "finelog.log", reference_date=T0.date()))
    chunked = parse_log_file(path, "finelog.log", reference_date=T0.date(), chunk_bytes=200)
    _same(tables, chunked)
    cache = LogCache()
    ends = [i for i, byte in enumerate(data, 1) if byte == ord("\n")]
    for end in ends[len(ends) // 3 :: max(len(ends) // 3, 1)]:
        path.write_bytes(data[:end])
        grown = parse_log_file(path, "finelog.log", reference_date=T0.date(), cache=cache)
    path.write_bytes(data)
    grown = parse_log_file(path, "finelog.log", reference_date=T0.date(), cache=cache)
    _same(tables, grown)
    return tables
