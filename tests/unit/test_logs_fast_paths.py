"""The parser's fast paths give exactly what their general paths give: record pairs split at
`, ` and `: ` against the pair pattern, and flags kept as index sets (hypothesis, adversarial
shapes); stat lines with a non-ASCII head split at their literal."""

from __future__ import annotations

import json

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from worker.evidence.logs import detect, engines, records

KEYS = st.text(alphabet=st.sampled_from(list('ab/_:, "\\{}')), min_size=0, max_size=6)
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.sampled_from(["NaN", "null", "true", "'0.5'", '"1.5"', "np.float64(2.0)", "{'a': 1}"]),
    st.text(alphabet=st.sampled_from(list("0123456789. ,}{[]e-")), min_size=1, max_size=5),
)


def _record(pairs: list[tuple[str, object]], separators: tuple[str, str]) -> str:
    item, key = separators
    parts = []
    for name, value in pairs:
        text = value if isinstance(value, str) else json.dumps(value)
        parts.append(json.dumps(name) + key + text)
    return "{" + item.join(parts) + "}"


@settings(max_examples=300, deadline=None)
@given(
    records_=st.lists(
        st.tuples(
            st.lists(st.tuples(KEYS, VALUES), max_size=5),
            st.sampled_from([(", ", ": "), (",", ":"), (", ", ":"), (",  ", ": ")]),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_split_record_pairs_equal_the_pattern(records_: list[tuple[list, tuple]]) -> None:  # type: ignore[type-arg]
    """Any record (odd keys, quoted or wrapped values, other separators) gives the same pairs
    through `_record_pairs` (split when plain) as through the pair pattern alone."""
    frame = pl.DataFrame(
        {
            "idx": pl.Series(range(len(records_)), dtype=pl.UInt32),
            "json": [_record(pairs, seps) for pairs, seps in records_],
        }
    )
    expected = records._explode_pairs(frame, "json", records._JSON_PAIR, records._JSON_KEY)
    assert_frame_equal(
        records._record_pairs(frame), expected.select("idx", "key", "value"), check_dtypes=False
    )


STAT = (
    "(AsyncVLLMInferenceEngine pid=7, ip=10.0.0.1) INFO 07-30 18:01:35 [loggers.py:248] "
    "Engine 000: Avg prompt throughput: {p} tokens/s, Avg generation throughput: {g} tokens/s, "
    "Running: {r} reqs, {swapped}Waiting: {w} reqs, GPU KV cache usage: {kv}%, "
    "Prefix cache hit rate: {hit}%{end}"
)
NUMBERS = st.one_of(
    st.integers(min_value=0, max_value=10**6).map(str),
    st.floats(min_value=0, max_value=1e5, allow_nan=False).map(lambda v: f"{v:.1f}"),
    st.sampled_from(["nan", "1e5", "-3", "٣", "", "1.2.3", " 4"]),
)


def test_flags_pick_the_same_lines_as_a_scan_of_every_line() -> None:
    """Stat, interesting and traceback lines found by the one pass and the index sets are the
    lines whose text holds those literals (stat literal after another literal included)."""
    lines = pl.Series(
        [
            "plain",
            "x Avg prompt throughput: 1",
            "Started: 'step' then Avg prompt throughput: 2",
            "Avg prompt throughput: 3 Traceback (most recent call last)",
            "Traceback (most recent call last):",
            "reward/x: 1 Unhandled error (suppress with 'X'): ray::A",
            "nothing here",
        ]
    )
    flags = detect._flags(lines)
    assert flags.engine.get_column("idx").to_list() == [1, 2, 3]
    assert flags.interest.to_list() == [4, 5]
    assert flags.tb.to_list() == [3, 4, 5]
    picked = detect._picked(flags, len(lines)).to_list()
    assert picked == list(range(len(lines)))  # every line is within a traceback window


def test_stat_lines_with_a_non_ascii_head_split_at_the_literal() -> None:
    """A non-ASCII character before the stat literal (a task name, a colour code's neighbour)
    does not move the head/tail split: the same engine id and numbers as the ASCII line (`find`
    counts bytes, slices count characters)."""
    line = STAT.format(p="1.5", g="2.5", r="3", w="4", kv="5.5", hit="6.5", swapped="", end="")
    raw = [f"[21:00:00] task=/ops/{task}/0 | {line}" for task in ("task", "tâsk", "タスク")]
    stats = pl.DataFrame({"idx": pl.Series(range(3), dtype=pl.UInt32), "raw": raw})
    fields = engines.engine_fields(stats).drop("idx")
    assert fields.n_unique() == 1
    assert fields.row(0, named=True) | {"tod": None} == {
        "index": "000",
        "pid": "7",
        "ip": "10.0.0.1",
        "vts": "07-30 18:01:35",
        "tod": None,
        "prompt": 1.5,
        "generation": 2.5,
        "running": 3.0,
        "waiting": 4.0,
        "kv": 5.5,
        "hit": 6.5,
    }
