"""Downsampling for plots that must not hide the evidence: a bounded number of rows per series,
chosen so a spike, a non-finite value, the first point and the final stall all survive.

`downsample(frame, columns, max_points)` keeps `frame` (rows in drawing order) as it is when it has
at most `max_points` rows. A longer frame is cut into consecutive stretches of equal row count,
and from each stretch it keeps, by their row positions: the first and the last row, and for each
value column the row of its lowest and of its highest finite value and its first non-finite value
(NaN or ±inf). So the frame's first and last rows are always kept (the newest point of a stalled
series is never thinned away), a single spike or dip is the extreme of its stretch, and a NaN is
never averaged or skipped out of sight. The rows kept stay in their order, so a line drawn through
them is the envelope of the series. Null cells are neither extreme nor non-finite (no value).

One vectorised polars `group_by` over the frame: no per-row Python, whatever its length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

__all__ = ["Downsampled", "downsample", "per_stretch"]

_ROW: str = "__row"
_STRETCH: str = "__stretch"


@dataclass(frozen=True)
class Downsampled:
    """The rows kept, and how many the frame had (`rows == frame.height` when nothing was cut)."""

    frame: pl.DataFrame
    rows: int

    @property
    def points(self) -> int:
        return self.frame.height

    @property
    def thinned(self) -> bool:
        return self.points < self.rows


def per_stretch(columns: int) -> int:
    """Rows one stretch can keep: first, last, and lowest, highest and first non-finite per
    value column."""
    return 2 + 3 * columns


def _picks(columns: Sequence[str]) -> list[pl.Expr]:
    row = pl.col(_ROW)
    picks = [row.first().alias("first"), row.last().alias("last")]
    for i, name in enumerate(columns):
        value = pl.col(name)
        finite = pl.when(value.is_finite()).then(value)  # NaN, ±inf and null become null
        picks += [
            row.get(finite.arg_min()).alias(f"min{i}"),  # null when the stretch has none
            row.get(finite.arg_max()).alias(f"max{i}"),
            row.filter(value.is_finite().not_()).first().alias(f"bad{i}"),
        ]
    return picks


def downsample(frame: pl.DataFrame, columns: Sequence[str], max_points: int) -> Downsampled:
    """At most `max_points` rows of `frame` (see the module); `columns` are its value columns."""
    rows = frame.height
    if rows <= max_points:
        return Downsampled(frame, rows)
    stretches = max(1, max_points // per_stretch(len(columns)))
    indexed = frame.with_row_index(_ROW).with_columns(
        (pl.col(_ROW).cast(pl.Int64) * stretches // rows).alias(_STRETCH)
    )
    picked = indexed.group_by(_STRETCH).agg(_picks(columns))
    keep = picked.drop(_STRETCH).unpivot()["value"].drop_nulls().unique()
    kept = indexed.filter(pl.col(_ROW).is_in(keep.implode())).sort(_ROW)
    return Downsampled(kept.drop(_ROW, _STRETCH), rows)
