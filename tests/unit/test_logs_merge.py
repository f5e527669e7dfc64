"""Consecutive scans parsed as one chunk (issue 12 speed work): fewer chunk parses, the same
tables and summary as one parse per read, and scans wait only while their frames stay within one
read's bytes (a log of nothing but metric records is parsed read by read)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.gen_continuous import generate_continuous
from worker.evidence.logs import LogCache, reader
from worker.evidence.logs.reader import parse_log_file

CHUNK = 256 * 1024
PARSE_CHUNK = reader.parse_chunk


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2 MB continuous log: about eight reads of 256 KiB, half the bytes vLLM stat lines."""
    return generate_continuous(tmp_path_factory.mktemp("busy") / "finelog.log", 2)


def _records(path: Path, lines: int) -> Path:
    keys = ", ".join(f'"policy/k{i}": 0.{i}' for i in range(40))
    path.write_text(
        "".join(f"WANDB_MIRROR kind=train step={s} metrics={{{keys}}}\n" for s in range(lines))
    )
    return path


def _parses(monkeypatch: pytest.MonkeyPatch, merge: int) -> list[int]:
    """Set MERGE_READS; the line counts of every chunk parse that follows."""
    monkeypatch.setattr(reader, "MERGE_READS", merge)
    sizes: list[int] = []

    def counted(chunk, *args, **kwargs):  # type: ignore[no-untyped-def]
        sizes.append(chunk.lines)
        return PARSE_CHUNK(chunk, *args, **kwargs)

    monkeypatch.setattr(reader, "parse_chunk", counted)
    return sizes


def test_merged_scans_give_the_tables_of_one_parse_per_read(
    busy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four scans a chunk: at most half the chunk parses of one a read, equal tables/summary."""
    one = _parses(monkeypatch, 1)
    single = parse_log_file(busy, "finelog.log", chunk_bytes=CHUNK)
    four = _parses(monkeypatch, 4)
    merged = parse_log_file(busy, "finelog.log", chunk_bytes=CHUNK)
    assert len(one) >= 8 and len(four) <= len(one) // 2 + 1
    for name in ("metrics", "timers", "phases", "engines", "progress", "errors", "resumes"):
        assert getattr(merged, name).equals(getattr(single, name)), name
    assert merged.summary == single.summary


def test_scans_waiting_at_the_end_are_committed_for_the_cache(
    busy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scans still waiting when the last read comes are parsed (committed) first: the cache
    resumes after them, and the grown log's tables equal a full parse."""
    _parses(monkeypatch, 4)
    data = busy.read_bytes()
    log = tmp_path / "finelog.log"
    log.write_bytes(data[: len(data) // 2])
    cache = LogCache()
    parse_log_file(log, "finelog.log", cache=cache, chunk_bytes=CHUNK)
    (entry,) = cache._entries.values()  # the committed offset is the point
    assert entry.state.offset > len(data) // 4
    with log.open("ab") as handle:
        handle.write(data[len(data) // 2 :])
    grown = parse_log_file(log, "finelog.log", cache=cache, chunk_bytes=CHUNK)
    full = parse_log_file(log, "finelog.log", chunk_bytes=CHUNK)
    assert grown.metrics.equals(full.metrics) and grown.engines.equals(full.engines)


def test_records_only_logs_are_parsed_read_by_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Metric records make frames larger than their read: no scan waits (as many chunk parses
    as with merging off), so merging never holds more than a read's worth of frames."""
    log = _records(tmp_path / "finelog.log", 3000)
    one = _parses(monkeypatch, 1)
    parse_log_file(log, "finelog.log", chunk_bytes=CHUNK)
    four = _parses(monkeypatch, 4)
    parse_log_file(log, "finelog.log", chunk_bytes=CHUNK)
    assert len(one) >= 4 and len(four) == len(one)
