"""The native stat-line pass (`_fastscan.c`) gives exactly what the polars path gives.

The extension must be built in the venv (`make venv`); every test below runs the same input
through both paths (the native pass on and off) and compares every scan frame, or every table
and the summary: fixture logs, the small hostile inputs, stat lines of every edge shape
(hypothesis), truncated and binary input.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from bench.gen_continuous import generate_continuous
from bench.gen_finelog import generate
from bench.hostile import INPUTS, build
from worker.evidence.logs import native, parse_job_logs, parse_log_file
from worker.evidence.logs.lines import Read
from worker.evidence.logs.scan import Scan, scan
from worker.evidence.model import LogTables

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
HOSTILE = ("long_line", "many_keys", "deep_mirror", "gzip_finelog")
TABLES = ("metrics", "phases", "engines", "progress", "batches", "errors", "timers", "resumes")

STAT = (
    "[21:00:04] task=/ops/rl-bench/0 | \x1b[36m(EngineCore_DP0 pid=28723, ip=10.0.0.3)\x1b[0m "
    "INFO 03-26 21:00:04 [loggers.py:123] Engine 000: Avg prompt throughput: 512.3 tokens/s, "
    "Avg generation throughput: 1024.0 tokens/s, Running: 24 reqs, Waiting: 2 reqs, "
    "GPU KV cache usage: 72.4%, Prefix cache hit rate: 28.5%"
)


@contextmanager
def _native(on: bool) -> Iterator[None]:
    saved = native.AVAILABLE
    native.AVAILABLE = on  # type: ignore[misc]
    try:
        yield
    finally:
        native.AVAILABLE = saved  # type: ignore[misc]


def _both_scans(data: bytes, end: int | None = None) -> tuple[Scan, Scan]:
    end = len(data) if end is None else end
    read = Read(data, end, final=True)
    with _native(False):
        plain = scan(read)
    with _native(True):
        fast = scan(read)
    return plain, fast


def _assert_same_scan(plain: Scan, fast: Scan) -> None:
    for name in ("ev", "stats", "mirrors", "pairs", "head"):
        assert_frame_equal(getattr(plain, name), getattr(fast, name), check_exact=True)
    for name in ("lines", "size", "first_content", "tail", "tail_lines", "cuts"):
        assert getattr(plain, name) == getattr(fast, name), name


def _assert_same_tables(plain: LogTables | None, fast: LogTables | None) -> None:
    assert (plain is None) == (fast is None)
    if plain is None or fast is None:
        return
    for name in TABLES:
        assert_frame_equal(getattr(plain, name), getattr(fast, name), check_exact=True)
    assert plain.summary == fast.summary


def test_the_extension_is_built_in_this_venv() -> None:
    """`make venv` builds it; without it the parser silently takes the slower polars path."""
    module = importlib.import_module("worker.evidence.logs._fastscan")
    assert callable(module.scan)
    assert native.native_scan(STAT.encode() + b"\n", len(STAT) + 1) is not None


def test_a_strict_stat_line_is_read_natively_and_others_are_left() -> None:
    data = f"{STAT}\nplain line\n{STAT} \n".encode()
    result = native.native_scan(data, len(data))
    assert result is not None
    assert result.n_lines == 3
    assert result.where.to_list() == [1, 2]  # the second stat line ends with a space
    assert result.rest == f"plain line\n{STAT} \n".encode()
    row = result.stats.row(0, named=True)
    assert row == {
        "idx": 0,
        "index": "000",
        "pid": "28723",
        "ip": "10.0.0.3",
        "vts": "03-26 21:00:04",
        "tod": 21 * 3600 + 4,
        "prompt": 512.3,
        "generation": 1024.0,
        "running": 24.0,
        "waiting": 2.0,
        "kv": 72.4,
        "hit": 28.5,
    }


@pytest.mark.parametrize("path", sorted(p for p in FIXTURES.iterdir() if p.suffix != ".json"))
def test_every_fixture_log_parses_the_same_both_ways(path: Path) -> None:
    with _native(False):
        plain = parse_log_file(path, path.name)
    with _native(True):
        fast = parse_log_file(path, path.name)
    _assert_same_tables(plain, fast)


@pytest.mark.parametrize("make", [generate, generate_continuous], ids=["generated", "continuous"])
def test_benchmark_logs_parse_the_same_both_ways(make: object, tmp_path: Path) -> None:
    """1.5 MB of each benchmark log (stat lines, tracebacks, restarts), in 256 KiB reads so
    chunks are cut and carried and traceback windows cross reads."""
    path = tmp_path / "finelog.log"
    make(path, 1.5)  # type: ignore[operator]
    with _native(False):
        plain = parse_log_file(path, path.name, chunk_bytes=256 * 1024)
    with _native(True):
        fast = parse_log_file(path, path.name, chunk_bytes=256 * 1024)
    _assert_same_tables(plain, fast)
    assert fast.engines.height > 1000


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_inputs_parse_the_same_both_ways(name: str, tmp_path: Path) -> None:
    item = next(i for i in INPUTS if i.name == name)
    job = build(item, tmp_path, full=False)
    memory_mb = item.memory_mb.get("small")
    results = []
    for on in (False, True):
        with _native(on):
            try:
                results.append(parse_job_logs(job, memory_mb=memory_mb))
            except ValueError as exc:  # a budget stop must be the same both ways
                results.append(str(exc))  # type: ignore[arg-type]
    if isinstance(results[0], str) or isinstance(results[1], str):
        assert results[0] == results[1]
    else:
        _assert_same_tables(results[0], results[1])


_NUMBER = st.one_of(
    st.integers(min_value=0, max_value=10**25).map(str),
    st.tuples(st.integers(0, 10**18), st.integers(0, 10**18)).map(lambda t: f"{t[0]}.{t[1]}"),
    st.floats(min_value=0, allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["nan", "inf", "-1", "1.", ".5", "1e5", "0x10", "", "١٢", "1_0", "00.00"]),
)
_HEAD = st.one_of(
    st.just("[21:00:04] task=/ops/rl-bench/0 | "),
    st.sampled_from(["[24:00:00] ", "[23:59:60] ", "[2:00:00] ", "[99:99:99]", "", "ünï "]),
    st.text(alphabet=st.sampled_from(list("[]:09 |=/(),.-\x1b\r\t\x00é")), max_size=12),
).flatmap(
    lambda iris: st.tuples(
        st.just(iris),
        st.sampled_from(
            [
                "(EngineCore_DP0 pid=28723, ip=10.0.0.3) ",
                "\x1b[36m(EngineCore_DP0 pid=1, ip=10.0.0.3)\x1b[0m ",
                "(pid=7) ",
                "pid=, ip=1 ",
                "(x pid=1, ip=) ",
                "pid=1, ip=a(b ",
                "[Name pid=5, ip=h pid=6] ",
                "pid=12pid=13 ",
                "",
            ]
        ),
        st.sampled_from(
            [
                "INFO 03-26 21:00:04 [loggers.py:123] ",
                "WARNING 12-31 23:59:59 ",
                "XDEBUG 01-01 00:00:00 ",
                "ERROR 1-01 00:00:00 ",
                "INFO 03-26 21:00:04.123 ",
                "ERRORINFO 03-26 21:00:04 ",
                "INFO 03-26 21:00:0 WARNING 03-26 21:00:05 ",
                "x-1 -- INFO 03-26 21:00:04 ",
                "DEBUG 03-26 21:00:04-05 ",
                "INFO  03-26 21:00:04 ",
                "Traceback (most recent call last)",
                "TracebackUnhandled error (suppress with ",
                "Traceback (most recent call last) ",
                "Unhandled error (suppress with ",
                "Avg prompt throughput ",
                "",
            ]
        ),
        st.sampled_from(
            ["Engine 000: ", "Engine 12: ", "Engine : ", "Engine 1:", "Engine 0: x", ""]
        ),
    )
)
_FRAGMENTS = (
    "Avg prompt throughput: ",
    " tokens/s, Avg generation throughput: ",
    " tokens/s, Running: ",
    " reqs, Waiting: ",
    " reqs, GPU KV cache usage: ",
    "%, Prefix cache hit rate: ",
)


@st.composite
def _stat_lines(draw: st.DrawFn) -> str:
    head = "".join(draw(_HEAD))
    numbers = [draw(_NUMBER) for _ in _FRAGMENTS]
    tail = "".join(f + n for f, n in zip(_FRAGMENTS, numbers, strict=True)) + "%"
    if draw(st.booleans()):  # vLLM's older tail, or a broken one
        tail = draw(
            st.sampled_from(
                [
                    tail.replace(" reqs, Waiting: ", " reqs, Swapped: 0 reqs, Waiting: "),
                    tail[: draw(st.integers(0, len(tail)))],
                    tail + draw(st.sampled_from(["\r", " ", "%", "x", "\x00"])),
                    tail.replace("Running", "running"),
                ]
            )
        )
    return head + tail


_OTHER = st.sampled_from(
    [
        "",
        "   ",
        "[21:00:05] task=/ops/rl-bench/0 | Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "ValueError: boom",
        '[21:00:05] task=/ops/rl-bench/0 | WANDB_MIRROR kind=train step=3 metrics={"a": 1}',
        "Training Step Progress: 3 / 9",
        "\x1b[31mError: red\x1b[0m",
        "ünïcode line ✓",
    ]
)


@settings(max_examples=250, deadline=None)
@given(
    lines=st.lists(st.one_of(_stat_lines(), _OTHER, st.just(STAT)), min_size=1, max_size=30),
    newline=st.sampled_from(["\n", "\r\n"]),
    last_newline=st.booleans(),
)
def test_stat_lines_of_every_shape_scan_the_same_both_ways(
    lines: list[str], newline: str, last_newline: bool
) -> None:
    """Non-ASCII heads, huge and odd numbers, missing fields, NaN/inf, CRLF, truncated tails,
    block literals before the stat literal, a last line without its newline."""
    text = newline.join(lines) + (newline if last_newline else "")
    _assert_same_scan(*_both_scans(text.encode("utf-8")))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=600), cut=st.integers(0, 600))
def test_binary_input_scans_the_same_both_ways(data: bytes, cut: int) -> None:
    """Any bytes (invalid UTF-8, NUL, lone CR), with a stat line around them."""
    blob = STAT.encode() + b"\n" + data + b"\n" + STAT.encode()
    _assert_same_scan(*_both_scans(blob, min(cut + len(STAT) + 1, len(blob))))


def test_every_truncation_of_a_stat_line_scans_the_same_both_ways() -> None:
    """A stat line cut at each byte (the end of a read of a log being written)."""
    line = STAT.encode()
    for stop in range(len(line) + 1):
        data = line[:stop]
        _assert_same_scan(*_both_scans(data))
        _assert_same_scan(*_both_scans(data + b"\n" + line + b"\n"))


def test_the_pass_is_bounded_by_end() -> None:
    """Only `data[:end]` is read; an `end` outside the buffer is refused."""
    module = importlib.import_module("worker.evidence.logs._fastscan")
    line = STAT.encode()
    n_lines, rows, rest, *_ = module.scan(line + b"\n" + line, len(line) + 1)
    assert (n_lines, rows, rest) == (1, 1, b"")
    for end in (-1, len(line) + 1):
        with pytest.raises(ValueError, match="end out of range"):
            module.scan(line, end)


def test_many_random_reads_scan_the_same_both_ways() -> None:
    """A few thousand lines mixing strict and broken stat lines with other output, one read."""
    rng = random.Random(12)
    pool = [STAT, STAT.replace("24 reqs", "2x reqs"), STAT.replace("ip=10.0.0.3", "ip=ü"), ""]
    pool += ["[21:00:05] task=/ops/rl-bench/0 | Traceback (most recent call last):", "x" * 300]
    text = "\n".join(rng.choice(pool) for _ in range(3000)) + "\n"
    plain, fast = _both_scans(text.encode())
    _assert_same_scan(plain, fast)
    assert fast.stats.height == plain.stats.height > 0


def test_the_native_columns_outlive_the_read() -> None:
    """The columns point into the extension's buffers (no copy): they stay valid after the
    read's bytes and the pass's result are gone."""
    data = (STAT + "\n") * 1000
    result = native.native_scan(data.encode(), len(data))
    assert result is not None
    stats = result.stats.clone()
    del result, data
    assert stats.height == 1000
    assert stats.get_column("pid").unique().to_list() == ["28723"]
    assert pl.Series(stats.get_column("hit")).sum() == pytest.approx(28.5 * 1000)
