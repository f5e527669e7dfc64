"""Downsampling for plots (`reports.downsample`): a bounded number of rows, and never the ones
that carry the evidence — a spike, a dip, a NaN or ±inf, the first and the last point."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from reports.downsample import downsample, per_stretch

N = 100_000
BUDGET = 1_200


def _wave(n: int = N) -> pl.DataFrame:
    """A smooth series (|value| ≤ 1), one row per step."""
    steps = np.arange(n, dtype=np.int64)
    return pl.DataFrame({"step": steps, "value": np.sin(steps / 500.0)})


def _with(frame: pl.DataFrame, column: str, at: dict[int, float]) -> pl.DataFrame:
    values = frame[column].to_numpy().copy()
    for row, value in at.items():
        values[row] = value
    return frame.with_columns(pl.Series(column, values))


def _kept_steps(frame: pl.DataFrame, columns: list[str], budget: int = BUDGET) -> list[int]:
    return downsample(frame, columns, budget).frame["step"].to_list()


def test_a_frame_of_at_most_the_budget_is_kept_whole_and_one_row_more_is_cut() -> None:
    """Exactly `max_points` rows: the same frame; one row more: downsampled, within the budget."""
    whole = downsample(_wave(BUDGET), ["value"], BUDGET)
    assert not whole.thinned and whole.frame.equals(_wave(BUDGET))
    cut = downsample(_wave(BUDGET + 1), ["value"], BUDGET)
    assert cut.thinned and cut.rows == BUDGET + 1 and cut.points <= BUDGET


@pytest.mark.parametrize("columns", [1, 2, 9])
def test_the_rows_kept_stay_within_the_budget_in_their_order(columns: int) -> None:
    """However many value columns, at most `max_points` rows, in the frame's order."""
    frame = _wave().with_columns(
        *(pl.col("value").mul(i).alias(f"c{i}") for i in range(1, columns))
    )
    names = ["value", *(f"c{i}" for i in range(1, columns))]
    kept = downsample(frame, names, BUDGET)
    assert 0 < kept.points <= BUDGET
    assert kept.frame["step"].is_sorted()
    assert kept.points >= (BUDGET // per_stretch(columns)) * 2  # first and last of each stretch


def test_a_single_spike_and_a_single_dip_survive() -> None:
    """One step at 50 and one at -40 in 100,000 steps of |value| ≤ 1 are both drawn; every-k-th
    thinning (the old way) would have lost both."""
    spike, dip = 12_347, 77_771
    frame = _with(_wave(), "value", {spike: 50.0, dip: -40.0})
    kept = _kept_steps(frame, ["value"])
    assert spike in kept and dip in kept
    stride = math.ceil(N / BUDGET)
    assert spike % stride and dip % stride  # a stride would have skipped both: the test can fail


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_single_non_finite_value_survives(bad: float) -> None:
    """A lone NaN / +inf / -inf is kept (and is never taken for the stretch's extreme)."""
    row = 55_555
    frame = _with(_wave(), "value", {row: bad})
    kept = downsample(frame, ["value"], BUDGET).frame
    assert row in kept["step"].to_list()
    finite = kept.filter(pl.col("value").is_finite())["value"]
    assert finite.max() == pytest.approx(1.0, abs=1e-3)  # the highest finite value, not inf
    assert finite.min() == pytest.approx(-1.0, abs=1e-3)


def test_the_first_and_the_last_point_survive_a_flat_tail() -> None:
    """A series that stalls (the same value for its last 30,000 steps) keeps its first row and
    its very last row, where the stall's newest point is."""
    frame = _wave().with_columns(
        pl.when(pl.col("step") >= N - 30_000).then(0.25).otherwise(pl.col("value")).alias("value")
    )
    kept = _kept_steps(frame, ["value"])
    assert kept[0] == 0 and kept[-1] == N - 1


def test_each_value_column_keeps_its_own_extremes() -> None:
    """A spike in the second column (a phase) is kept even when the first one is smooth."""
    frame = _wave().with_columns(other=pl.lit(1.0))
    frame = _with(frame, "other", {31_337: 900.0})
    assert 31_337 in _kept_steps(frame, ["value", "other"])
    assert 31_337 not in _kept_steps(frame, ["value"])  # only because that column was asked for


def test_null_cells_are_neither_extreme_nor_kept_for_themselves() -> None:
    """A column of nulls (a phase not logged at these steps) adds no row: the same rows as a
    second column that repeats the first (whose picks are the first's own)."""
    frame = _wave().with_columns(empty=pl.lit(None, dtype=pl.Float64), same=pl.col("value"))
    with_empty = downsample(frame, ["value", "empty"], BUDGET)
    assert with_empty.thinned
    assert with_empty.frame.equals(downsample(frame, ["value", "same"], BUDGET).frame)
