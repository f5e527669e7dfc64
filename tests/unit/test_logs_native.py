"""The native stat-line pass (`_fastscan.c`) gives exactly what the polars path gives.

The extension must be built in the venv (`make venv`); every test below runs the same input
through both paths (the native pass on and off) and compares every scan frame, or every table
and the summary: fixture logs, the small hostile inputs, stat lines of every edge shape
(hypothesis), truncated and binary input.
"""

from __future__ import annotations

import importlib
import random
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from testkit.gen_continuous import generate_continuous
from testkit.gen_finelog import generate
from testkit.gen_records import generate_dense, generate_noisy
from testkit.hostile import INPUTS, build
from worker.evidence.logs import native, parse_job_logs, parse_log_file, rules
from worker.evidence.logs.reads import Read
from worker.evidence.logs.rules import (
    HEAD_SCAN_LINES,
    KEEP,
    LINE_MAX_BYTES,
    TRACEBACK,
    WINDOW_LINES,
)
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
    assert callable(module.scan) and module.API == 2
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


@pytest.mark.parametrize(
    "make",
    [generate, generate_continuous, generate_dense, generate_noisy],
    ids=["generated", "continuous", "dense", "noisy"],
)
def test_benchmark_logs_parse_the_same_both_ways(make: object, tmp_path: Path) -> None:
    """1.5 MB of each benchmark log (stat lines, records, noise, tracebacks, restarts), in 256 KiB
    reads so chunks are cut and carried and traceback windows cross reads."""
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


# ---- The rest lines the native pass drops (`native.Rules`, `scan.KEEP`) ---------------------
#
# A read of FIRST noise lines (always kept: the first window and the head), then the lines under
# test. Each case checks which lines are kept (just past and just short of each rule) and that the
# scan with the drop equals the polars path's.

FIRST = max(HEAD_SCAN_LINES, WINDOW_LINES + 1)
NOISE = "[21:00:05] task=/ops/rl-bench/0 | (AsyncVLLMInferenceEngine pid=28720) Added request x"
REAL_TEXT = [
    line["text"]
    for path in sorted((FIXTURES.parent / "real_failures").glob("*.toml"))
    for line in tomllib.loads(path.read_text())["line"]
]


def _kept(body: list[str] | list[bytes], first: int = FIRST) -> tuple[list[int], bytes]:
    """The indices (counted from the first body line) of the body lines kept, and the read."""
    lines = [NOISE.encode()] * first + [b if isinstance(b, bytes) else b.encode() for b in body]
    data = b"\n".join(lines) + b"\n"
    result = native.native_scan(data, len(data), KEEP)
    assert result is not None
    return [i - first for i in result.where.to_list() if i >= first], data


def _check(body: list[str] | list[bytes], kept: list[int], first: int = FIRST) -> None:
    found, data = _kept(body, first)
    assert found == kept
    _assert_same_scan(*_both_scans(data))


def test_noise_after_the_first_lines_is_dropped_and_the_first_lines_are_kept() -> None:
    found, _ = _kept([NOISE] * 3, first=FIRST - 1)  # the last first line is kept, then dropped
    assert found == [0]
    _check([NOISE] * 3, [])


@pytest.mark.parametrize("literal", rules.FLAG_LITERALS)
def test_a_flag_literal_keeps_its_line_anywhere_and_not_when_a_byte_short(literal: str) -> None:
    short = literal[:-1]
    short_kept = [4] if any(other in short for other in rules.FLAG_LITERALS) else []
    body = [literal, f"x {literal}", f"{NOISE} {literal}", NOISE, short, literal[-1]]
    opens = any(block in literal for block in rules.BLOCK_STARTS)  # a window: all kept
    _check(body, list(range(6)) if opens else [0, 1, 2, *short_kept])


def test_a_literal_split_across_a_line_end_keeps_neither_line() -> None:
    _check(["x Tracebac", "k (most recent call last)", "x Erro", "r: boom", NOISE], [])


def test_a_flagged_line_after_dropped_ones_keeps_its_index() -> None:
    _check([NOISE, NOISE, "ValueError: boom", NOISE, "Training Step Progress: 3 / 9"], [2, 4])


@pytest.mark.parametrize("block", rules.BLOCK_STARTS)
def test_a_traceback_window_keeps_window_lines_after_it_and_not_one_more(block: str) -> None:
    body = [f"[21:00:05] task=/ops/rl-bench/0 | {block}"] + [NOISE] * (WINDOW_LINES + 3)
    _check(body, list(range(WINDOW_LINES + 1)))


def test_a_window_that_ends_exactly_at_a_later_traceback_is_extended() -> None:
    body = [TRACEBACK] + [NOISE] * (WINDOW_LINES - 1) + [TRACEBACK] + [NOISE] * (WINDOW_LINES + 2)
    _check(body, list(range(2 * WINDOW_LINES + 1)))


def test_a_nul_byte_keeps_its_line_and_may_open_a_window() -> None:
    """NUL is blanked before the flags are searched: `x\\0error` holds ` error`, and
    `Traceback\\0(most recent call last)` opens a traceback window."""
    blanked = TRACEBACK.replace(" ", "\x00", 1)
    body = ["x\x00error", NOISE, blanked] + [NOISE] * (WINDOW_LINES + 2)
    _check(body, [0, 1, *range(2, 2 + WINDOW_LINES + 1)])


def test_a_cr_byte_keeps_its_line() -> None:
    _check([NOISE + "\r", NOISE, "a\rb", NOISE], [0, 2])


def test_invalid_utf8_keeps_its_line_and_valid_non_ascii_does_not() -> None:
    _check(
        [b"x \xff y", NOISE.encode(), "Trajectories: 79%|███████   |".encode(), b"\xe2\x82"], [0, 3]
    )


def test_a_line_that_could_be_cut_is_kept() -> None:
    long_line = KEEP.long_line
    body = ["y" * (long_line - 1), "y" * long_line, "z" * (LINE_MAX_BYTES + 10), NOISE]
    _check(body, [1, 2])
    _, data = _kept(body)
    assert len(scan(Read(data, len(data), final=True)).cuts) == 1


def test_the_head_keeps_lines_up_to_the_first_with_a_printable_byte() -> None:
    """Blank and Unicode-whitespace lines past the first lines, then content: every line up to
    the first that holds a printable ASCII byte is kept (the first non-blank line); a line of
    Unicode whitespace only is blank to polars (`strip_chars`)."""
    blank = ["", "   ", "\t", "\u3000", "\u00a0\u2003", "\u2028\u205f", "\x0b\x0c"]
    lines = blank * (FIRST // len(blank) + 30)
    body = [*lines, "é", NOISE, "\u3000x", NOISE, NOISE]
    data = ("\n".join(body) + "\n").encode()
    result = native.native_scan(data, len(data), KEEP)
    assert result is not None
    kept = result.where.to_list()
    assert kept[-1] == len(lines) + 1 and len(body) - 1 not in kept
    plain, fast = _both_scans(data)
    _assert_same_scan(plain, fast)
    assert fast.first_content == len(lines)


def test_a_bom_line_first_in_the_rest_after_many_stat_lines() -> None:
    """polars drops a BOM that starts its input: the first rest line is kept, so it is the
    same line with or without the drop."""
    data = ((STAT + "\n") * (FIRST + 5) + "\ufeffnoise\n" + (NOISE + "\n") * 3).encode()
    result = native.native_scan(data, len(data), KEEP)
    assert result is not None and result.where.to_list() == [FIRST + 5]
    _assert_same_scan(*_both_scans(data))


def test_rules_with_a_literal_the_bytes_cannot_show_keep_every_line() -> None:
    for bad in ("x", "a\x00b", "\ufffd!", "a\nb"):
        assert native.rules((bad,), (), 1, 1, 10)._capsule is None
    assert KEEP._capsule is not None


def test_most_of_the_continuous_log_is_dropped(tmp_path: Path) -> None:
    """The drop is on: of a continuous benchmark read, most rest lines never reach polars."""
    data = generate_continuous(tmp_path / "finelog.log", 1.0).read_bytes()
    result = native.native_scan(data, len(data), KEEP)
    assert result is not None
    assert result.dropped > 2 * len(result.where) > 0


_NOISE_LINES = st.sampled_from(
    [
        NOISE,
        "",
        "   ",
        "\u3000",
        "plain words here",
        "batch_num_seq: 5228, padded: 1172",
        "Generating Trajectories: 21%|██        | 1071/5120",
    ]
)


@st.composite
def _mixed_body(draw: st.DrawFn) -> list[str]:
    """Noise with flag literals put anywhere in it, real failure text, stat lines, tracebacks,
    runs of noise as long as a window, NUL and CR bytes."""
    body: list[str] = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.integers(0, 6))
        if kind == 0:
            body += [draw(_NOISE_LINES)] * draw(st.integers(1, WINDOW_LINES + 3))
        elif kind == 1:
            noise, literal = draw(_NOISE_LINES), draw(st.sampled_from(rules.FLAG_LITERALS))
            at = draw(st.integers(0, len(noise)))
            body.append(noise[:at] + literal + noise[at:])
        elif kind == 2:
            body.append(draw(st.sampled_from(REAL_TEXT)))
        elif kind == 3:
            body.append(draw(st.one_of(_stat_lines(), st.just(STAT))))
        elif kind == 4:
            body += [TRACEBACK, '  File "x.py", line 1, in <module>', "ValueError: boom"]
        elif kind == 5:
            noise = draw(_NOISE_LINES)
            at = draw(st.integers(0, len(noise)))
            body.append(
                noise[:at] + draw(st.sampled_from(["\x00", "\r", "\x00error"])) + noise[at:]
            )
        else:
            body.append(draw(_OTHER))
    return body


@settings(max_examples=60, deadline=None)
@given(body=_mixed_body(), first=st.sampled_from([0, 5, FIRST - 3, FIRST + 2]))
def test_random_noise_with_flag_literals_scans_the_same_with_the_drop(
    body: list[str], first: int
) -> None:
    data = ("\n".join([NOISE] * first + body) + "\n").encode()
    _assert_same_scan(*_both_scans(data))


SCALAR = native.rules(
    *(KEEP.literals, KEEP.blocks, KEEP.window, KEEP.first_lines, KEEP.long_line),
    vector=False,
    classes=KEEP.classes,
    kinds=KEEP.kinds,
)


@settings(max_examples=60, deadline=None)
@given(body=_mixed_body(), pad=st.integers(0, 40))
def test_the_vector_and_scalar_literal_searches_keep_the_same_lines(
    body: list[str], pad: int
) -> None:
    """The AVX2 search (32 positions at a time, reading past a line's end within the read) and
    the scalar one keep the same lines, the last line ending at the read's last byte or not."""
    data = ("\n".join([NOISE] * (FIRST + 1) + body) + "\n" + "y" * pad).encode()
    for end in (len(data), len(data) - pad):
        kept = [native.native_scan(data, end, rules) for rules in (KEEP, SCALAR)]
        assert kept[0] is not None and kept[1] is not None
        assert kept[0].where.to_list() == kept[1].where.to_list()
        assert kept[0].rest == kept[1].rest
        assert_frame_equal(kept[0].picked, kept[1].picked, check_exact=True)


@pytest.mark.parametrize("keep", [KEEP, SCALAR], ids=["vector", "scalar"])
def test_a_literal_at_every_offset_of_a_line_is_found(keep: native.Rules) -> None:
    """Every literal at each offset 0-69 (across the 32-byte blocks of the vector search), at
    the end of its line or not, and at the very end of the read (no newline after it)."""
    for literal in rules.FLAG_LITERALS:
        body = [
            ("x" * offset + literal + tail).encode()
            for offset in range(70)
            for tail in ("", "y", "y" * 40)
        ]
        lines = [NOISE.encode()] * (FIRST + 1) + body
        data = b"\n".join(lines)
        result = native.native_scan(data, len(data), keep)
        assert result is not None
        kept = [*range(FIRST), *range(FIRST + 1, len(lines))]
        assert result.where.to_list() == kept, literal
        assert result.dropped == 1, literal  # the noise line just past the first lines


def test_an_extension_built_from_an_older_source_is_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stale build (without `API` 2: an older _fastscan.c, with `rules` or without) leaves the
    polars path on, never a crash at import; `test_the_extension_is_built_in_this_venv` is what
    fails for it."""
    import importlib.util
    import sys
    import types

    import worker.evidence.logs as package

    stale = types.ModuleType("worker.evidence.logs._fastscan")
    stale.scan = lambda *args: None  # type: ignore[attr-defined]
    stale.rules = lambda *args: None  # type: ignore[attr-defined]  # the fourth round's build
    monkeypatch.setattr(package, "_fastscan", stale)
    monkeypatch.setitem(sys.modules, "worker.evidence.logs._fastscan", stale)
    spec = importlib.util.spec_from_file_location("native_stale", native.__file__)
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "native_stale", copy)
    spec.loader.exec_module(copy)
    assert copy._fastscan is None and copy.AVAILABLE is False
    assert copy.native_scan(b"x\n", 2) is None


# ---- The timer lines the native pass reads (`picked_line` in _fastscan.c) --------------------
#
# After FIRST noise lines, a strict timer line is read natively (`Native.picked`, not a rest
# line); each rule has a case just past it (left to the polars path) and one just short (read
# natively), and every case scans the same both ways.

IRIS = "[21:00:05] task=/ops/rl-bench/0 | "
RAY = "\x1b[36m(skyrl_entrypoint pid=8455)\x1b[0m "
LOGURU = "2026-03-26 21:00:05.123 | INFO     | skyrl.train.trainer:train:210 - "
TIMER = IRIS + RAY + LOGURU + "Started: 'generate'"
FINISHED = IRIS + RAY + LOGURU + "Finished: 'generate', time cost: 251.67s"


def _read_natively(body: list[str], first: int = FIRST) -> list[int]:
    """The indices (from the first body line) of the body lines read natively as timer lines;
    the scan with them equals the polars path's."""
    data = ("\n".join([NOISE] * first + body) + "\n").encode()
    result = native.native_scan(data, len(data), KEEP)
    assert result is not None
    picked = result.picked.get_column("idx").to_list()
    assert not set(picked) & set(result.where.to_list())
    _assert_same_scan(*_both_scans(data))
    return [i - first for i in picked]


def test_a_strict_timer_line_is_read_natively_with_the_polars_columns() -> None:
    assert ("Started: '", "timer") in rules.NATIVE_KINDS == KEEP.kinds
    data = ("\n".join([NOISE] * FIRST + [TIMER, FINISHED]) + "\n").encode()
    result = native.native_scan(data, len(data), KEEP)
    assert result is not None
    assert result.picked.get_column("idx").to_list() == [FIRST, FIRST + 1]
    row = result.picked.row(0, named=True)
    assert {k: v for k, v in row.items() if k != "ldt"} == {
        "idx": FIRST,
        "text": LOGURU + "Started: 'generate'",
        "msg": "Started: 'generate'",
        "prefix": "[21:00:05] task=/ops/rl-bench/0 | (skyrl_entrypoint pid=8455)",
        "task": "/ops/rl-bench/0",
        "tod": 21 * 3600 + 5,
        "pid": "8455",
        "ip": None,
        "rank": None,
        "kind": "timer",
        "actor": "/ops/rl-bench/0|8455@",
    }
    assert str(row["ldt"]) == "2026-03-26 21:00:05.123000+00:00"
    _assert_same_scan(*_both_scans(data))


@pytest.mark.parametrize(
    ("past", "short"),
    [
        # the message: a flag literal after its first byte (an error or failure literal)
        (TIMER.replace("'generate'", "'generate_failed'"), TIMER.replace("'generate'", "'g_fail'")),
        (TIMER.replace("'generate'", "'Error'"), TIMER.replace("'generate'", "'Erro'")),
        (FINISHED + " error", FINISHED + " erro"),
        # Ray's repeated suffix (stripped by the polars path), and any line ending in `]` or ` `
        (TIMER + " [repeated 2x across cluster]", TIMER + " [repeated 2x across cluster"),
        (TIMER + " ", TIMER + "."),
        # the stat and block literals anywhere in the line
        (TIMER + " Avg prompt throughput", TIMER + " Avg prompt throughpu"),
        (TIMER + " " + TRACEBACK, TIMER + " " + TRACEBACK[:-1]),
        (IRIS.replace("/0", "/Avg prompt throughput") + LOGURU + "Started: 'x'", TIMER),
        # bytes: non-ASCII, a control byte, a broken colour code
        (TIMER.replace("generate", "générer"), TIMER.replace("generate", "generer")),
        (TIMER.replace("generate", "gen\tx"), TIMER.replace("generate", "gen x")),
        (TIMER.replace("generate", "gen\x7fx"), TIMER.replace("generate", "gen~x")),
        (TIMER.replace("generate", "gen\x1fx"), TIMER.replace("generate", "gen x")),
        (TIMER.replace("\x1b[0m", "\x1b[0"), TIMER.replace("\x1b[0m", "\x1b[;0;m")),
        # the Iris prefix
        (TIMER.replace("[21:00:05]", "[21:00:5]"), TIMER.replace("[21:00:05]", "[99:99:99]")),
        (TIMER.replace(" | ", "  | ", 1), TIMER.replace(" | ", " |", 1)),
        # the process prefixes: Ray's first form only
        (TIMER.replace("pid=8455)", "pid=8455,)"), TIMER.replace("pid=8455)", "pid=8455, ip=h)")),
        (
            TIMER.replace("(skyrl_entrypoint ", "[skyrl_entrypoint "),
            TIMER.replace("(sk", "(pid=1) (sk"),
        ),
        (TIMER.replace(RAY, "(raylet) "), TIMER.replace(RAY, "")),
        (TIMER.replace(RAY, "host:1:2 [3] "), TIMER.replace(RAY, "(pid=1, ip=10.0.0.1) ")),
        # the fields read from the prefixes: the leftmost match of each, in the task too
        (TIMER.replace(RAY, "(pid=1, ip=a b) "), TIMER.replace(RAY, "(pid=1, ip=a]b) ")),
        (
            TIMER.replace("/0", "/pid=7/zip=]/[rank2]") + "]",
            TIMER.replace("/0", "/pid=7/zip=]/[rank2]"),
        ),
        # the loguru header: a valid date and time, three fraction digits
        (TIMER.replace(".123 |", ".1234 |"), TIMER.replace(".123 |", ".999 |")),
        (TIMER.replace("2026-03-26", "2023-02-29"), TIMER.replace("2026-03-26", "2024-02-29")),
        (
            TIMER.replace("21:00:05.123", "21:00:60.123"),
            TIMER.replace("21:00:05.123", "23:59:59.123"),
        ),
        (TIMER.replace("2026-03-26", "0999-03-26"), TIMER.replace("2026-03-26", "1000-03-26")),
        (TIMER.replace("2026-03-26", "2026-13-26"), TIMER.replace("2026-03-26", "2026-12-31")),
        (TIMER.replace("INFO     |", "info     |"), TIMER.replace("INFO     |", "INFO|")),
        (TIMER.replace(" - Started", " -- Started"), TIMER.replace(" - Started", " -Started")),
        # the message's kind
        (TIMER.replace("Started: '", "Started: "), TIMER.replace(LOGURU, "")),
        (TIMER.replace("Started", "started"), FINISHED),
        (IRIS + "[iris setup] step 1/2", IRIS + "Training Step Progress: 3 / 9"),
        (IRIS + " Training Step Progress: 3 / 9", IRIS + "Training Step Progress: 3 / 9 x"),
        (
            IRIS + LOGURU + "WANDB_MIRROR kind=x .errors.",
            IRIS + LOGURU + "WANDB_MIRROR kind=x .errors",
        ),
        (
            TIMER.replace("Started: '", "Batch generation"),
            TIMER.replace("Started: '", "Batch generation "),
        ),
        # a flag literal that classifies nothing else (`': `, `{'`, `Progress`) does not stop it
        (TIMER + " Exception", TIMER + ": {'a': 1} Progress"),
        (IRIS + LOGURU + "{'loss': 0.5, 'Error': 1}", IRIS + LOGURU + "{'loss': 0.5, 'Erro': 1}"),
    ],
)
def test_each_timer_rule_just_past_and_just_short(past: str, short: str) -> None:
    assert _read_natively([past, short]) == [1]


def test_the_kinds_read_natively_are_those_no_prefix_or_other_kind_can_start_at() -> None:
    """`rules._native_kind`, each gate just past and just short; and every kind the native pass
    reads classifies its lines as the polars path does."""
    kinds = dict(rules.NATIVE_KINDS)
    assert kinds["Started: '"] == "timer" and kinds["WANDB_MIRROR kind="] == "mirror"
    assert "[iris setup] step 1/" not in kinds  # `[` may open a process prefix
    past_short = [
        ("host:1", "host: 1"),  # NCCL's host:pid
        ("host:", "host;"),
        ("(name", "name("),
        ("[x", "x["),
        ("1st ", "st1 "),
        ("word", "word "),  # a word the message may follow with `:1:2 [3]`
        (" '", "' "),
        ("INFO ", "INFA "),
        ("WARNING 1", "WARNIN 1"),
        ("Started: 'x", "Startedx "),  # a kind literal starts with it
        ("Started", "Starts "),  # it starts a kind literal
        ("caf\u00e9 ", "cafe "),
    ]
    for past, short in past_short:
        assert (rules._native_kind(past), rules._native_kind(short)) == (False, True), past
    body = [f"{IRIS}{LOGURU}{literal}x 1" for literal in kinds]
    picked = _read_natively(body)
    data = ("\n".join([NOISE] * FIRST + body) + "\n").encode()
    result = native.native_scan(data, len(data), KEEP)
    assert result is not None
    classes = any(c in lit for lit in kinds for c in rules.CLASS_LITERALS)
    assert len(picked) == len(body) - classes  # `Exception breakdown: ` holds `Exception`
    assert result.picked.get_column("kind").to_list() == [
        kinds[lit] for lit in kinds if not any(c in lit for c in rules.CLASS_LITERALS)
    ]


def test_prefix_fields_that_overlap_the_task_in_a_line_near_the_limit() -> None:
    """pid, ip and rank all inside a task of ~3,900 bytes: the actor (task, pid, ip and rank
    joined) is several times longer than the line."""
    task = "/pid=" + "1" * 1300 + "/ip=" + "a" * 1300 + "/[rank" + "2" * 1290 + "]"
    line = f"[21:00:05] task={task} | Started: 'x'"
    assert 3900 < len(line) < 4096
    assert _read_natively([line]) == [0]


def test_a_long_timer_line_is_left_and_one_a_byte_shorter_is_read() -> None:
    """A line of 4,096 bytes (MAX_LINE) is left to the polars path; 4,095 is read natively."""
    pad = 4096 - len(TIMER.encode())
    long = TIMER.replace("'generate'", "'" + "g" * (pad + 8) + "'")
    assert len(long.encode()) == 4096
    assert _read_natively([long, long.replace("gg", "g", 1)]) == [1]


def test_timer_lines_in_the_first_lines_or_before_the_first_content_are_left() -> None:
    """The head reads the first lines and the first rest line with a printable byte."""
    assert _read_natively([TIMER] * 3, first=FIRST - 1) == [1, 2]
    data = ("\n".join([STAT] * FIRST + [TIMER, TIMER]) + "\n").encode()
    result = native.native_scan(data, len(data), KEEP)
    assert result is not None
    assert result.picked.get_column("idx").to_list() == [FIRST + 1]
    _assert_same_scan(*_both_scans(data))


def test_a_timer_line_in_a_traceback_window_is_read_and_the_window_ends_the_same() -> None:
    body = [IRIS + TRACEBACK + ":", '  File "x.py", line 1', TIMER, "ValueError: boom", TIMER]
    assert _read_natively(body) == [2, 4]


TASKS = (
    *("/ops/rl-bench/0", "/u/pid=77/t", "/u/zip=9/t", "/u/zip=a]b", "/u/[rank3]/t"),
    *("/u/[rank]/x[rank12]", "/u/[rank3x]/[rank4]", "/u/pid=x/pid=5", "/u/ip=", "/u/ip=)", "x"),
)
_TASKS = st.sampled_from(TASKS)


@pytest.mark.parametrize("task", TASKS)
def test_the_prefix_fields_are_the_leftmost_matches_as_the_polars_path_reads_them(
    task: str,
) -> None:
    """pid, ip and rank come from the whole prefix (the task too), each its leftmost match."""
    processes = ["", RAY, "(pid=5, ip=10.0.0.1]x) ", "(Name pid=5, ip=h)(Other pid=6, ip=g) "]
    body = [f"[21:00:05] task={task} | {p}{LOGURU}Started: 'x'" for p in processes]
    assert _read_natively(body) == list(range(len(body)))


_PROCESSES = st.sampled_from(
    [
        "",
        RAY,
        "(skyrl_entrypoint pid=8455) ",
        "(pid=5)",
        "(pid=5, ip=10.0.0.1) ",
        "(pid=5, ip=10.0.0.1]x) ",
        "(Name pid=5, ip=10.0.0.1)(Other pid=6) ",
        "(pid=5 pid=6) ",
        "(Name pid=) ",
        "(Name pid=5, ip=) ",
        "[rank1]: ",
        "(raylet, ip=1.2.3.4) ",
        "host:1:2 [3] ",
        "\x1b[1;32m(x pid=1)\x1b[0m ",
        "\x1b[1m",
    ]
)
_HEADERS = st.sampled_from(
    [
        "",
        LOGURU,
        "2024-02-29 00:00:00.000 | DEBUG | m - ",
        "2024-02-29 00:00:00.000 | DEBUG | m -",
        "2023-02-29 00:00:00.000 | DEBUG | m - ",
        "1970-01-01 00:00:00.000 | WARNING  | m:f:1 -  ",
        "1969-12-31 23:59:59.999 | INFO | m - ",
        "2026-03-26 21:00:05.12 | INFO | m - ",
        "2026-03-26 21:00:05 | INFO | m - ",
        "INFO 03-26 21:00:04 [loggers.py:123] ",
        "2026-03-26 21:00:05.123 | INFO | a b - ",
    ]
)
_MESSAGES = st.sampled_from(
    [
        *(f"{lit}{tail}" for lit, _ in rules.NATIVE_KINDS for tail in ("", " 3 / 9", "x")),
        '{"a": 1}',
        'WANDB_MIRROR kind=train step=3 metrics={"a": 1, "b": "x"}',
        "{'trainer/global_step': 3, 'loss': 0.5}",
        "reward/avg: 0.5, reward/x: 1, avg_final_rewards: 2",
        "Generation Buffer Progress: 75%|███| 24/32 [41:07<00:01]",
        "Training Step Progress: 1 / 100000",
        "Started: 'step'",
        "Started: 'x'",
        "Started: ''",
        "Finished: 'generate', time cost: 85.14s",
        "Finished: 'a_failed', time cost: 1s",
        "Finished: 'x', time cost: 1e400s",
        "Started: 'CUDA out of memory'",
        "Started: 'x': {'a': 1}",
        "Started: 'x' \x1b[31mError: red\x1b[0m",
        "Started: 'x' [repeated 3x across cluster]  ",
        "Started: 'x'\r",
        "Started: 'ü'",
        "Finished: 'x', time cost: 12345678901234567890123.5s",
    ]
)


@st.composite
def _timer_lines(draw: st.DrawFn) -> str:
    clock = draw(st.sampled_from(["[21:00:05]", "[00:00:00]", "[29:61:99]", "[1:00:05]"]))
    iris = draw(st.sampled_from([f"{clock} task={draw(_TASKS)} | ", f"{clock} task=x |", ""]))
    return iris + draw(_PROCESSES) + draw(_PROCESSES) + draw(_HEADERS) + draw(_MESSAGES)


@settings(max_examples=150, deadline=None)
@given(
    body=st.lists(
        st.one_of(_timer_lines(), _OTHER, st.just(TIMER), st.just(NOISE)), min_size=1, max_size=25
    ),
    first=st.sampled_from([FIRST - 2, FIRST]),
)
def test_timer_lines_of_every_shape_scan_the_same_both_ways(body: list[str], first: int) -> None:
    """Tasks holding `pid=`, `ip=` or `[rank1]`, nested, nameless, broken and other process
    prefixes, colour codes, valid and invalid dates, other headers, messages with error and
    failure literals, dict text, repeated suffixes, CR, non-ASCII, huge numbers, tracebacks."""
    _read_natively(body, first)


@settings(max_examples=40, deadline=None)
@given(body=_mixed_body(), timers=st.lists(_timer_lines(), min_size=1, max_size=8))
def test_timer_lines_among_noise_and_real_failure_text_scan_the_same(
    body: list[str], timers: list[str]
) -> None:
    _read_natively(body + timers + body)
