"""The parse cache kept in a directory: a later process resumes a grown log at its committed
offset, reads a rewritten or rotated log whole, and never trusts a damaged or foreign entry."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from io import BufferedReader
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from worker.evidence.log_cache import VERSION, LogCache
from worker.evidence.logs import parse_job_logs, parse_log_file, reader
from worker.evidence.logs.reads import Read
from worker.evidence.model import LogTables

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"
TABLES = ("metrics", "timers", "phases", "engines", "progress", "batches", "errors", "resumes")
RL_HEALTH = str(Path(sys.executable).with_name("rl-health"))
EXAMPLE = Path(__file__).resolve().parents[2] / "examples/jobs/cw-rno2a/ops/rl-gsm8k-stalled"


_GENERATED: list[bytes] = []


def _log_bytes() -> bytes:
    """1.5 MB of the benchmark's generated finelog (steps, restarts, tracebacks, pprint-ed
    dicts, stat lines), made once."""
    if not _GENERATED:
        from testkit.gen_finelog import generate

        with tempfile.TemporaryDirectory() as tmp:
            _GENERATED.append(generate(Path(tmp) / "f.log", 1.5).read_bytes())
    return _GENERATED[0]


def _same(left: LogTables, right: LogTables) -> None:
    for name in TABLES:
        assert_frame_equal(getattr(left, name), getattr(right, name), check_row_order=True)
    assert left.summary == right.summary


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The byte offset each read of a file starts at (one per parse)."""
    found: list[int] = []
    original = reader.iter_reads

    def recording(handle: BufferedReader, chunk_bytes: int) -> Iterator[Read]:
        found.append(handle.tell())
        return original(handle, chunk_bytes)

    monkeypatch.setattr(reader, "iter_reads", recording)
    return found


def _grow(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


def test_a_later_process_reads_only_the_appended_bytes(tmp_path: Path, starts: list[int]) -> None:
    """A second cache object on the same directory (another process) resumes at the committed
    offset of the first, and the tables equal a full parse of the grown log."""
    data = _log_bytes()
    log, folder = tmp_path / "finelog.log", tmp_path / "cache"
    log.write_bytes(data[: len(data) // 2])
    parse_log_file(log, "finelog.log", cache=LogCache(directory=folder))
    _grow(log, data[len(data) // 2 :])
    later = LogCache(directory=folder)
    grown = parse_log_file(log, "finelog.log", cache=later)
    assert starts[0] == 0
    assert 0 < starts[1] <= len(data) // 2
    assert later.notes == []
    _same(grown, parse_log_file(log, "finelog.log"))


def test_a_job_directory_resumes_every_log_from_the_directory(
    tmp_path: Path, starts: list[int]
) -> None:
    """`parse_job_logs` with a directory cache resumes the grown finelog in a new process."""
    job = tmp_path / "job"
    shutil.copytree(EXAMPLE, job)
    size = (job / "finelog.log").stat().st_size
    cache_dir = tmp_path / "cache"
    parse_job_logs(job, cache=LogCache(directory=cache_dir))
    _grow(job / "finelog.log", (FIXTURES / "skyrl_gsm8k_yottalabs.log").read_bytes())
    grown = parse_job_logs(job, cache=LogCache(directory=cache_dir))
    assert starts[-1] > 0 and starts[-1] <= size
    full = parse_job_logs(job)
    assert grown is not None and full is not None
    _same(grown, full)


def test_a_log_rewritten_in_place_with_the_same_head_is_read_whole(
    tmp_path: Path, starts: list[int]
) -> None:
    """Same inode, same first 4 KiB, longer, but other bytes before the committed offset: the
    entry does not match and the log is read from byte 0."""
    data = _log_bytes()
    log, folder = tmp_path / "finelog.log", tmp_path / "cache"
    log.write_bytes(data[: len(data) // 2])
    parse_log_file(log, "finelog.log", cache=LogCache(directory=folder))
    inode = log.stat().st_ino
    rewritten = data[:4096] + data[len(data) // 2 :] + data[4096 : len(data) // 2]
    with log.open("r+b") as handle:  # in place: the inode stays
        handle.write(rewritten)
    assert log.stat().st_ino == inode
    again = parse_log_file(log, "finelog.log", cache=LogCache(directory=folder))
    assert starts[-1] == 0
    _same(again, parse_log_file(log, "finelog.log"))


def test_a_rotated_log_is_read_whole(tmp_path: Path, starts: list[int]) -> None:
    """A log replaced by a new file (a new inode: rotation) is read from byte 0."""
    data = _log_bytes()
    log, folder = tmp_path / "finelog.log", tmp_path / "cache"
    log.write_bytes(data[: len(data) // 2])
    parse_log_file(log, "finelog.log", cache=LogCache(directory=folder))
    (tmp_path / "new.log").write_bytes(data)
    (tmp_path / "new.log").replace(log)
    parse_log_file(log, "finelog.log", cache=LogCache(directory=folder))
    assert starts[-1] == 0


def test_a_shrunk_log_is_read_whole(tmp_path: Path, starts: list[int]) -> None:
    """A log truncated below what the entry read is read from byte 0."""
    data = _log_bytes()
    log, folder = tmp_path / "finelog.log", tmp_path / "cache"
    log.write_bytes(data)
    parse_log_file(log, "finelog.log", cache=LogCache(directory=folder))
    with log.open("r+b") as handle:
        handle.truncate(len(data) // 3)
    parse_log_file(log, "finelog.log", cache=LogCache(directory=folder))
    assert starts[-1] == 0


def _entry(folder: Path) -> Path:
    (entry,) = (p for p in folder.iterdir() if not p.name.startswith("."))
    return entry


def _damage_parquet(entry: Path) -> str:
    target = entry / "metrics.parquet"
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    target.write_bytes(bytes(raw))
    return "metrics.parquet does not match its hash"


def _other_version(entry: Path) -> str:
    meta = json.loads((entry / "meta.json").read_text())
    meta["version"] = "1"
    (entry / "meta.json").write_text(json.dumps(meta))
    return f"written by cache version '1', not {VERSION}"


def _garbled_meta(entry: Path) -> str:
    (entry / "meta.json").write_text('{"version": ')
    return "JSONDecodeError"


def _foreign_rows(entry: Path) -> str:
    """Rows of another shape written with a matching hash: refused by their columns."""
    import polars as pl

    target = entry / "metrics.parquet"
    pl.DataFrame({"step": [1], "key": ["x"]}).write_parquet(target)
    meta = json.loads((entry / "meta.json").read_text())
    from worker.evidence.log_cache import _sha256

    meta["files"]["metrics.parquet"] = _sha256(target)
    meta["rows"]["metrics"] = [1]
    (entry / "meta.json").write_text(json.dumps(meta))
    return "metrics.parquet lacks the columns of a parsed metrics table"


@pytest.mark.parametrize("damage", [_damage_parquet, _other_version, _garbled_meta, _foreign_rows])
def test_a_damaged_or_foreign_entry_is_ignored_with_a_note(
    tmp_path: Path, starts: list[int], damage: object
) -> None:
    """A flipped byte, another cache version, a cut meta.json or rows of another shape: the
    entry is not trusted, a note says why, the log is read whole and the result is a full
    parse; the entry is then replaced by a good one."""
    data = _log_bytes()
    log, folder = tmp_path / "finelog.log", tmp_path / "cache"
    log.write_bytes(data[: len(data) // 2])
    parse_log_file(log, "finelog.log", cache=LogCache(directory=folder))
    assert callable(damage)
    expected = damage(_entry(folder))
    _grow(log, data[len(data) // 2 :])
    cache = LogCache(directory=folder)
    again = parse_log_file(log, "finelog.log", cache=cache)
    assert starts[-1] == 0
    (note,) = cache.notes
    assert expected in note and "the log is read whole" in note
    _same(again, parse_log_file(log, "finelog.log"))
    fresh = LogCache(directory=folder)
    parse_log_file(log, "finelog.log", cache=fresh)
    assert fresh.notes == [] and starts[-1] > 0


def test_files_lists_what_to_copy_and_a_copy_is_picked_up(
    tmp_path: Path, starts: list[int]
) -> None:
    """`files()` names every file of the entries; copied elsewhere (as the pipeline copies them
    to and from S3), they resume the parse there."""
    data = _log_bytes()
    log, folder = tmp_path / "finelog.log", tmp_path / "cache"
    log.write_bytes(data[: len(data) // 2])
    cache = LogCache(directory=folder)
    parse_log_file(log, "finelog.log", cache=cache)
    listed = cache.files()
    assert {p.name for p in listed} >= {"meta.json", "state.json", "metrics.parquet"}
    copy = tmp_path / "synced"
    for relative in listed:
        (copy / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / relative, copy / relative)
    _grow(log, data[len(data) // 2 :])
    parse_log_file(log, "finelog.log", cache=LogCache(directory=copy))
    assert starts[-1] > 0


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHEALTH_")}
    return subprocess.run(
        [RL_HEALTH, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_diagnose_with_a_cache_gives_the_same_report(tmp_path: Path) -> None:
    """`rl-health diagnose --cache DIR`, run twice (the second from the cache), prints the same
    JSON report as without a cache."""
    now = "2026-07-30T19:17:00Z"
    plain = _cli("diagnose", EXAMPLE, "--now", now, "--format", "json")
    first = _cli("diagnose", EXAMPLE, "--now", now, "--format", "json", "--cache", tmp_path / "c")
    second = _cli("diagnose", EXAMPLE, "--now", now, "--format", "json", "--cache", tmp_path / "c")
    assert plain.returncode == first.returncode == second.returncode == 0, second.stderr
    assert json.loads(plain.stdout) == json.loads(first.stdout) == json.loads(second.stdout)
    assert any((tmp_path / "c").iterdir())


def test_parse_with_a_cache_writes_the_same_tables(tmp_path: Path) -> None:
    """`rl-health parse --cache DIR` of a grown log writes the tables a plain parse writes."""
    data = _log_bytes()
    log = tmp_path / "finelog.log"
    log.write_bytes(data[: len(data) // 2])
    assert _cli("parse", log, "--out", tmp_path / "a", "--cache", tmp_path / "c").returncode == 0
    _grow(log, data[len(data) // 2 :])
    assert _cli("parse", log, "--out", tmp_path / "b", "--cache", tmp_path / "c").returncode == 0
    assert _cli("parse", log, "--out", tmp_path / "p").returncode == 0
    written = sorted(path.name for path in (tmp_path / "p").iterdir())
    assert written == sorted(path.name for path in (tmp_path / "b").iterdir())
    assert {"metrics.csv", "engines.csv", "timers.csv"} <= set(written)
    for table in written:
        assert (tmp_path / "b" / table).read_bytes() == (tmp_path / "p" / table).read_bytes()
