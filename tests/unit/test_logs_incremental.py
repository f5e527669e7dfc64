"""Incremental parsing equals a full parse; arbitrary bytes never raise (hypothesis)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from worker.evidence.log_cache import LogCache
from worker.evidence.logs import parse_log_file
from worker.evidence.model import LogTables

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"
TABLES = ("metrics", "timers", "phases", "engines", "progress", "batches", "errors", "resumes")


def _corpus() -> bytes:
    """Every fixture log plus constructed multi-line constructs, concatenated."""
    names = [
        "skyrl_gsm8k_yottalabs.log",
        "training_metrics__ansi_ray_prefix_and_malformed.log",
        "parse_skyrl__agentic_step_batch_errors.log",
        "parse_skyrl__legacy_python_dict.out",
        "job_logs_crashloop.txt",
    ]
    ray = b"(skyrl_entrypoint pid=1) "
    extra = [
        b"[09:00:00] task=/u/j/0 | [iris setup] step 1/2",
        ray + b"{'async/staleness_max': 0,",
        ray + b" 'reward/avg_raw_reward': '0.3',",
        ray + b" 'trainer/global_step': 5}",
        b"Traceback (most recent call last):",
        b'  File "x.py", line 2, in g',
        b"KeyError: 'k'",
    ]
    parts = [(FIXTURES / name).read_bytes().rstrip(b"\n") for name in names]
    return b"\n".join([*parts, *extra]) + b"\n"


def _assert_same(left: LogTables, right: LogTables) -> None:
    for name in TABLES:
        assert_frame_equal(getattr(left, name), getattr(right, name), check_row_order=True)
    assert left.summary == right.summary


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cuts=st.lists(st.floats(min_value=0, max_value=1), min_size=1, max_size=3))
def test_growing_file_parsed_incrementally_equals_full_parse(
    tmp_path_factory: object, cuts: list[float]
) -> None:
    """Re-parsing a file as it grows (cut at random bytes) gives exactly the full parse."""
    data = _corpus()
    folder: Path = tmp_path_factory.mktemp("grow")  # type: ignore[attr-defined]
    path = folder / "finelog.log"
    cache = LogCache()
    positions = sorted(int(c * len(data)) for c in cuts)
    path.write_bytes(b"")
    for pos in [*positions, len(data)]:
        with path.open("ab") as handle:
            handle.write(data[path.stat().st_size : pos])
        grown = parse_log_file(path, "finelog.log", cache=cache, chunk_bytes=97)
    full = parse_log_file(path, "finelog.log")
    _assert_same(grown, full)


def test_second_parse_reads_only_the_appended_bytes(tmp_path: Path) -> None:
    """A cached parse of a grown file starts at the committed offset, not at byte 0."""
    data = _corpus()
    path = tmp_path / "finelog.log"
    path.write_bytes(data[: len(data) // 2])
    cache = LogCache()
    parse_log_file(path, "finelog.log", cache=cache)
    (entry,) = cache._entries.values()
    assert 0 < entry.state.offset <= len(data) // 2
    with path.open("ab") as handle:
        handle.write(data[len(data) // 2 :])
    _assert_same(
        parse_log_file(path, "finelog.log", cache=cache), parse_log_file(path, "finelog.log")
    )


def test_rewritten_file_is_read_again_whole(tmp_path: Path) -> None:
    """A file replaced by another (new inode, shorter) is not served from the cache."""
    path = tmp_path / "finelog.log"
    path.write_bytes(_corpus())
    cache = LogCache(directory=tmp_path / "cache")
    parse_log_file(path, "finelog.log", cache=cache)
    replacement = tmp_path / "new.log"
    replacement.write_bytes(b'WANDB_MIRROR kind=train step=3 metrics={"r": 3.0}\n')
    replacement.replace(path)
    tables = parse_log_file(path, "finelog.log", cache=cache)
    assert tables.metrics.get_column("step").to_list() == [3]


def test_disk_cache_is_reused_by_a_new_cache_object(tmp_path: Path) -> None:
    """Entries written to the cache directory serve a fresh LogCache with identical results."""
    data = _corpus()
    path = tmp_path / "finelog.log"
    path.write_bytes(data[:1000])
    parse_log_file(path, "finelog.log", cache=LogCache(directory=tmp_path / "c"))
    with path.open("ab") as handle:
        handle.write(data[1000:])
    again = parse_log_file(path, "finelog.log", cache=LogCache(directory=tmp_path / "c"))
    _assert_same(again, parse_log_file(path, "finelog.log"))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    blob=st.binary(max_size=600)
    | st.lists(
        st.sampled_from(
            [
                b"WANDB_MIRROR kind=train step=1 metrics={",
                b"{'trainer/global_step': ",
                b"Traceback (most recent call last):",
                b"\x1b[36m(pid=1)\x1b[0m ",
                b"[10:00:00] task=/a/b/0 | ",
                b"\n",
                b"\r",
                b"\x00\xff\xfe",
                b"Engine 000: Avg prompt throughput: 1 tokens/s, Running: x",
                b"Finished: 'step', time cost: s",
                b"Exception breakdown: {",
                b"Batch generation complete: 1/2 successful, 1 failed instances, 0 masked",
            ]
        ),
        max_size=40,
    ).map(b"".join)
)
def test_arbitrary_bytes_never_raise(tmp_path_factory: object, blob: bytes) -> None:
    """Any bytes at all parse into (possibly empty) tables without an exception."""
    folder: Path = tmp_path_factory.mktemp("bytes")  # type: ignore[attr-defined]
    path = folder / "x.log"
    path.write_bytes(blob)
    tables = parse_log_file(path, "x.log", chunk_bytes=37)
    assert tables.summary.bytes == len(blob)
    assert isinstance(tables.metrics, pl.DataFrame)
