"""The prelude (`worker.evidence.logs.prelude`): a log's first reads and native passes, begun in a
thread before polars is imported. The tables are those of a parse without it, whatever the file
(several reads, one, none, no final newline, compressed, gone or not a file), with or without
the extension; its thread is always joined and its handle closed; it imports no polars."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from polars.testing import assert_frame_equal

from bench.gen_continuous import generate_continuous
from worker.cli import main
from worker.evidence.logs import LogBudgetError, MemoryBudget, native, parse_log_file, reader
from worker.evidence.logs.prelude import READS_AHEAD, Prelude
from worker.evidence.logs.reads import FIRST_READ_BYTES, first_reads
from worker.evidence.parsed import LogTables

MB = 2**20
CHUNK = 3 * MB
TABLES = ("metrics", "phases", "timers", "engines", "progress", "batches", "errors", "resumes")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 7 MB of continuous finelog: a short first read and two or three of CHUNK."""
    return generate_continuous(tmp_path_factory.mktemp("prelude") / "finelog.log", 7)


def _same(found: LogTables, expected: LogTables) -> None:
    for name in TABLES:
        assert_frame_equal(getattr(found, name), getattr(expected, name))
    assert found.summary == expected.summary


def _no_prelude_thread() -> bool:
    return not any(t.name == "rlhealth-prelude" for t in threading.enumerate())


def _started(path: Path, reads: int, chunk: int = CHUNK, *, wait: bool = True) -> Prelude:
    """A prelude of `path`; with `wait`, its thread has done all it will before it is taken."""
    prelude = Prelude(path, chunk, reads)
    prelude._thread.start()
    if wait:
        prelude._thread.join()
    return prelude


def _with(
    path: Path, reads: int, chunk: int = CHUNK, *, wait: bool = True
) -> tuple[LogTables, Prelude]:
    prelude = _started(path, reads, chunk, wait=wait)
    return parse_log_file(path, path.name, chunk_bytes=chunk, prelude=prelude), prelude


@pytest.mark.parametrize("reads", [1, 2, 3, READS_AHEAD, 50])
def test_the_tables_are_those_without_a_prelude(log: Path, reads: int) -> None:
    """One read ahead, a few, as many as the file has (3: the last is the final one) and more:
    the same tables and summary as a parse that reads the file itself."""
    expected = parse_log_file(log, log.name, chunk_bytes=CHUNK)
    found, prelude = _with(log, reads)
    _same(found, expected)
    assert found.engines.height > 10_000
    assert not prelude.alive and _no_prelude_thread()


def test_taken_while_it_still_reads(log: Path) -> None:
    """Taken at once (its thread stopped after whatever read it was in): the same tables."""
    found, prelude = _with(log, READS_AHEAD, wait=False)
    _same(found, parse_log_file(log, log.name, chunk_bytes=CHUNK))
    assert not prelude.alive


def test_the_reads_handed_on_are_the_files_reads(log: Path) -> None:
    """The prelude's reads, then the handle's next ones: the reads a fresh handle gives."""
    with log.open("rb") as handle:
        plain = [(r.data[: r.end], r.final) for r in first_reads(handle, CHUNK)]
    prelude = _started(log, 2)
    taken = prelude.take(CHUNK)
    assert taken is not None and len(taken.done) == 2
    with taken.handle:
        handed = [(r.data[: r.end], r.final, p is not None) for r, p in taken.reads()]
    assert [(d, f) for d, f, _ in handed] == plain
    assert [p for _, _, p in handed] == [native.AVAILABLE] * 2 + [False] * (len(plain) - 2)
    assert not taken.done  # let go as handed on
    assert prelude.take(CHUNK) is None  # taken once


@pytest.mark.parametrize(
    "content",
    [b"", b"one line\n", b"no newline at the end", b"\n\n\n", b"x" * (FIRST_READ_BYTES + 10)],
    ids=["empty", "one-line", "unterminated", "blank-lines", "one-line-longer-than-a-read"],
)
@pytest.mark.parametrize("reads", [1, READS_AHEAD])
def test_a_file_shorter_than_a_read_or_empty(content: bytes, reads: int, tmp_path: Path) -> None:
    path = tmp_path / "finelog.log"
    path.write_bytes(content)
    expected = parse_log_file(path, path.name, chunk_bytes=CHUNK)
    found, prelude = _with(path, reads)
    _same(found, expected)
    assert not prelude.alive


def test_a_prelude_of_another_read_size_is_not_used(log: Path) -> None:
    """Reads of another size than the parse's are dropped (the parse reads the file itself)."""
    prelude = _started(log, READS_AHEAD, CHUNK // 2)
    found = parse_log_file(log, log.name, chunk_bytes=CHUNK, prelude=prelude)
    _same(found, parse_log_file(log, log.name, chunk_bytes=CHUNK))
    assert not prelude.alive and prelude._handle is not None and prelude._handle.closed


def test_start_reads_with_the_budgets_read_size(log: Path) -> None:
    prelude = Prelude.start(log)
    try:
        assert prelude.chunk_bytes == MemoryBudget.for_logs(log.stat().st_size).chunk_bytes
    finally:
        prelude.close()
    assert not prelude.alive


def test_without_the_extension(log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the native pass off (RLHEALTH_PARSE_NATIVE=0, or not built) the prelude only reads;
    the tables are the polars path's."""
    monkeypatch.setattr(native, "AVAILABLE", False)
    taken = _started(log, 2).take(CHUNK)
    assert taken is not None and len(taken.done) == 2
    with taken.handle:
        assert all(passed is None for _, passed in taken.done)
    found, prelude = _with(log, 2)
    assert not prelude.alive
    _same(found, parse_log_file(log, log.name, chunk_bytes=CHUNK))


def test_a_file_that_cannot_be_read_gives_the_parses_own_error(tmp_path: Path) -> None:
    """A path the thread cannot open (a directory here; a file gone after the start) is not an
    error in the thread: the parse meets and raises it, and the thread is joined."""
    folder = tmp_path / "finelog.log"
    folder.mkdir()
    prelude = _started(folder, READS_AHEAD)
    assert prelude._failed
    assert prelude.take(CHUNK) is None
    assert not prelude.alive
    gone = tmp_path / "gone.log"
    gone.write_bytes(b"one line\n" * 10)
    prelude = Prelude(gone, CHUNK, READS_AHEAD)
    gone.unlink()
    prelude._thread.start()
    with pytest.raises(FileNotFoundError):
        parse_log_file(gone, gone.name, chunk_bytes=CHUNK, prelude=prelude)
    assert not prelude.alive and _no_prelude_thread()


def test_a_missing_file_fails_before_any_thread(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Prelude.start(tmp_path / "missing.log")
    assert _no_prelude_thread()


def test_a_compressed_file_is_not_read_and_the_thread_is_joined(tmp_path: Path) -> None:
    path = tmp_path / "finelog.log"
    path.write_bytes(gzip.compress(b"WANDB_MIRROR kind=train step=1 metrics={}\n" * 1000))
    found, prelude = _with(path, READS_AHEAD)
    assert found.summary.notes and "gzip-compressed" in found.summary.notes[0]
    assert found.metrics.is_empty()
    assert not prelude.alive and prelude._handle is not None and prelude._handle.closed


def test_the_thread_is_joined_when_the_parse_fails(
    log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parse stopped by the budget (or anything else) still joins the prelude and closes its
    handle."""

    def refused(*_args: object, **_kwargs: object) -> None:
        raise LogBudgetError("over the budget")

    monkeypatch.setattr(reader.MemoryBudget, "check", refused)
    prelude = _started(log, READS_AHEAD)
    with pytest.raises(LogBudgetError):
        parse_log_file(log, log.name, chunk_bytes=CHUNK, prelude=prelude)
    assert not prelude.alive and _no_prelude_thread()
    assert prelude._handle is not None and prelude._handle.closed


@pytest.mark.parametrize("cache", [False, True])
def test_the_command_joins_the_prelude(log: Path, cache: bool, tmp_path: Path) -> None:
    """`rl-health parse FILE` (prelude) and with `--cache` (none): same output, no thread left."""
    args = ["parse", str(log), "--out", str(tmp_path / "out")]
    if cache:
        args += ["--cache", str(tmp_path / "cache")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "engines" in result.output and _no_prelude_thread()


def test_the_prelude_imports_no_polars() -> None:
    """What the prelude needs (its module, the rules, the reads, the budget, the native pass)
    is importable without polars: the point is to read while polars is imported."""
    code = (
        "import sys; import worker.evidence.logs.prelude; "
        "import worker.evidence.logs.rules, worker.evidence.logs.reads, "
        "worker.evidence.logs.budget, worker.evidence.logs.native; "
        "sys.exit('polars' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False, timeout=60)
    assert done.returncode == 0


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (None, "narenas:1,muzzy_decay_ms:0"),
        ("dirty_decay_ms:0", "dirty_decay_ms:0,narenas:1,muzzy_decay_ms:0"),
        ("narenas:4", "narenas:4,muzzy_decay_ms:0"),  # the operator's choice stands
        ("muzzy_decay_ms:50, narenas:2", "muzzy_decay_ms:50, narenas:2"),
        ("narenas_x:3", "narenas_x:3,narenas:1,muzzy_decay_ms:0"),  # another option's name
    ],
)
def test_the_command_asks_for_one_allocator_arena(
    before: str | None, after: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before polars is imported the parse asks jemalloc for one arena and no lazily freed
    pages, keeping what the operator set."""
    from worker.cli import parse_cmd

    if before is None:
        monkeypatch.delenv("_RJEM_MALLOC_CONF", raising=False)
    else:
        monkeypatch.setenv("_RJEM_MALLOC_CONF", before)
    monkeypatch.delitem(sys.modules, "polars")
    parse_cmd._allocator()
    assert os.environ["_RJEM_MALLOC_CONF"] == after


def test_once_polars_is_imported_the_allocator_is_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from worker.cli import parse_cmd

    monkeypatch.setenv("_RJEM_MALLOC_CONF", "dirty_decay_ms:0")
    assert "polars" in sys.modules
    parse_cmd._allocator()
    assert os.environ["_RJEM_MALLOC_CONF"] == "dirty_decay_ms:0"


@pytest.mark.parametrize(
    ("before", "after"), [(None, "in-memory"), ("streaming", "streaming"), ("auto", "auto")]
)
def test_the_command_asks_polars_for_its_in_memory_engine(
    before: str | None, after: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parse's many small queries run on polars' in-memory engine, unless the operator
    named an engine; afterwards the environment is as it was."""
    from worker.cli import parse_cmd

    if before is None:
        monkeypatch.delenv("POLARS_ENGINE_AFFINITY", raising=False)
    else:
        monkeypatch.setenv("POLARS_ENGINE_AFFINITY", before)
    with parse_cmd._engine():
        assert os.environ["POLARS_ENGINE_AFFINITY"] == after
    assert os.environ.get("POLARS_ENGINE_AFFINITY") == before


@pytest.mark.parametrize("fails", [False, True])
def test_the_command_in_process_leaves_the_engine_setting_as_it_was(
    log: Path, fails: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rl-health parse` run in process (CliRunner, as a test runner or a caller does) reads on
    the in-memory engine and leaves no setting behind, whether it ends well or fails."""
    from worker.cli import parse_cmd

    monkeypatch.delenv("POLARS_ENGINE_AFFINITY", raising=False)
    seen: list[str | None] = []
    read_logs = parse_cmd._read_logs

    def recorded(*args: object, **kwargs: object) -> object:
        seen.append(os.environ.get("POLARS_ENGINE_AFFINITY"))
        if fails:
            raise LogBudgetError("over the budget")
        return read_logs(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(parse_cmd, "_read_logs", recorded)
    result = CliRunner().invoke(main, ["parse", str(log), "--out", str(tmp_path / "out")])
    assert result.exit_code == (1 if fails else 0), result.output
    assert seen == ["in-memory"]
    assert "POLARS_ENGINE_AFFINITY" not in os.environ


def test_the_trim_threshold_is_set_where_mallopt_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    """glibc's `mallopt(M_TRIM_THRESHOLD, 1 MiB)`; a C library without mallopt is left alone."""
    import ctypes

    from worker.cli import parse_cmd

    calls: list[tuple[int, int]] = []

    def mallopt(option: int, value: int) -> int:
        calls.append((option, value))
        return 1

    monkeypatch.setattr(ctypes, "CDLL", lambda _name: SimpleNamespace(mallopt=mallopt))
    parse_cmd._trim_freed_memory()
    assert calls == [(-1, 2**20)]
    monkeypatch.setattr(ctypes, "CDLL", lambda _name: object())
    parse_cmd._trim_freed_memory()  # no mallopt: nothing happens, nothing raised
    assert calls == [(-1, 2**20)]


def test_the_prelude_reads_count_against_the_budget(log: Path) -> None:
    """The budget's RSS base is read after the prelude's reads were made: they are counted as
    the parse's own (the base is lowered by their bytes), so a budget is no looser with them."""
    prelude = _started(log, 2)
    budget = MemoryBudget.for_logs(log.stat().st_size)
    assert budget.base_rss is not None
    base = budget.base_rss
    parse_log_file(log, log.name, chunk_bytes=CHUNK, budget=budget, prelude=prelude)
    assert base - budget.base_rss == FIRST_READ_BYTES + CHUNK
    unused = _started(log, 2, CHUNK // 2)  # another read size: nothing of it is used
    budget = MemoryBudget.for_logs(log.stat().st_size)
    base = budget.base_rss
    parse_log_file(log, log.name, chunk_bytes=CHUNK, budget=budget, prelude=unused)
    assert budget.base_rss == base
