"""Re-stitching only the steps new rows touch equals stitching all rows (hypothesis)."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from worker.evidence import schema
from worker.evidence.logs.stitch import restitch, stitch

_ORIGINS = ("mirror", "console", "policy_dict", "reward_line")
_KEYS = ("a", "timing/gen", "timing/train")
_PHASES = ("gen", "train")

_metric = st.tuples(
    st.integers(0, 6) | st.none(),  # step
    st.sampled_from(_KEYS),
    st.sampled_from(_ORIGINS),
    st.integers(0, 2),  # attempt
)
_timer = st.tuples(
    st.integers(0, 6) | st.none(),
    st.sampled_from(_PHASES),
    st.sampled_from(("started", "finished")),
    st.integers(0, 2),
)
_batch = st.tuples(st.integers(0, 6) | st.none(), st.integers(0, 2))
_part = st.tuples(
    st.lists(_metric, max_size=25), st.lists(_timer, max_size=8), st.lists(_batch, max_size=4)
)


def _rows(part: tuple[list, list, list], first_line: int) -> dict[str, pl.DataFrame]:  # type: ignore[type-arg]
    """Raw rows numbered from `first_line`; metric rows are not in line order (as in a chunk)."""
    metrics, timers, batches = part
    n_m, n_t = len(metrics), len(timers)
    m_lines = [first_line + n_m - 1 - i for i in range(n_m)]
    t_lines = [first_line + n_m + i for i in range(n_t)]
    b_lines = [first_line + n_m + n_t + i for i in range(len(batches))]
    frames = {
        "metrics": {
            "step": [m[0] for m in metrics],
            "key": [m[1] for m in metrics],
            "value": [float(i) for i in range(n_m)],
            "origin": [m[2] for m in metrics],
            "source": ["f.log"] * n_m,
            "line": m_lines,
            "timestamp": [None] * n_m,
            "attempt": [m[3] for m in metrics],
        },
        "timers": {
            "event": [t[2] for t in timers],
            "phase": [t[1] for t in timers],
            "seconds": [1.0 + i for i in range(n_t)],
            "step": [t[0] for t in timers],
            "source": ["f.log"] * n_t,
            "line": t_lines,
            "timestamp": [None] * n_t,
            "attempt": [t[3] for t in timers],
        },
        "batches": {
            "step": [b[0] for b in batches],
            "successful": [1] * len(batches),
            "total": [2] * len(batches),
            "failed": [1] * len(batches),
            "masked": [0] * len(batches),
            "exceptions": ["{}"] * len(batches),
            "source": ["f.log"] * len(batches),
            "line": b_lines,
            "timestamp": [None] * len(batches),
            "attempt": [b[1] for b in batches],
        },
    }
    tables = {"metrics": schema.METRICS, "timers": schema.TIMERS, "batches": schema.BATCHES}
    return {name: pl.DataFrame(frames[name], schema=tables[name]) for name in tables}


def _joined(parts: list[dict[str, pl.DataFrame]]) -> dict[str, pl.DataFrame]:
    return {name: pl.concat([p[name] for p in parts]) for name in parts[0]}


@settings(max_examples=200, deadline=None)
@given(old=_part, new=st.lists(_part, min_size=1, max_size=2))
def test_restitch_equals_full_stitch(
    old: tuple[list, list, list],  # type: ignore[type-arg]
    new: list[tuple[list, list, list]],  # type: ignore[type-arg]
) -> None:
    """Old stitched rows plus the rows of new lines, re-stitched by touched step, equal a stitch."""
    parts = [_rows(old, 1)]
    for part in new:
        parts.append(_rows(part, 1 + sum(f.height for p in parts for f in p.values())))
    known = stitch(parts[0])
    everything = _joined(parts)
    merged = restitch(known, everything, parts[1:])
    full = stitch(everything)
    assert_frame_equal(merged.metrics, full.metrics, check_row_order=True)
    assert_frame_equal(merged.phases, full.phases, check_row_order=True)
