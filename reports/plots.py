"""The plots of one diagnosis, drawn server-side with matplotlib's Agg renderer, as PNG bytes.

Reads only the Evidence tables the gates judged (and the thresholds they judged with); it never
re-reads a log. Each plot is one `Plot`: a PNG, or the reason there is nothing to draw ("a plot
without data says so"). Figures are built with `matplotlib.figure.Figure` directly, never pyplot,
so no GUI backend is touched and nothing is global: two threads may render at once.

- reward (with its W-step moving average, W = MIN_WINDOW_STEPS), entropy, TIS importance ratio
  (the healthy band shaded) and |log ratio|, grad norm: one point per step, the judged window (the
  last W steps that carry any canonical metric, as the dynamics gate takes it) shaded;
- phase seconds per step, stacked, with the step total as a line;
- vLLM engines: running and waiting requests summed over engines, and mean KV-cache use, per time
  bucket (the line), with each bucket's lowest to highest sample shaded;
- runs with trials (agentic): finished trials by outcome (the rollouts gate's causes, else
  reward > 0 / reward 0 / no reward) over time, and the duty-cycle shares of trial wall time.

Every time axis carries the events that matter as vertical lines: restarts (attempt boundaries in
the log, attempt starts in the controller's history), the newest progress (the newest finished step
or metric row not after the capture), each stack dump, and the capture time (`evidence.now`).
A series with rows that carry no timestamp is drawn by step instead, and its caption says that the
event lines are left out.

Bounded cost, whatever the log's size: a series or phase table longer than MAX_POINTS rows is
downsampled by `reports.downsample` (each stretch keeps its first, last, lowest and highest rows,
so no spike or final stall is thinned away; non-finite values are left out before, and counted)
and its caption says `N of M points drawn`; engine samples are bucketed in time; times become
matplotlib date numbers in one vectorised pass; event lines are one artist per kind, however many
restarts. What still reads every row is vectorised polars (filters and group-bys over the
tables), measured in `bench/bench_report.py`.

Text drawn from the evidence (phase names, trial outcomes) is a label, never markup: it passes the
redactor (a PNG is an output like any other, and `diagnose` draws from evidence not yet frozen) and
its `$` is escaped, so matplotlib never reads it as mathtext (`_label`). Data never names a column
of the frames drawn: phases are pivoted to columns of their own (`_stacked`), so a phase called
`step` or `timestamp` is a phase like any other.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Final, Literal

import numpy as np
import polars as pl
from matplotlib import dates as mdates
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from reports.downsample import Downsampled, downsample
from shared.models import Mode
from shared.redact import clean
from shared.settings import Thresholds
from worker.evidence.case import Evidence
from worker.evidence.model import LogTables
from worker.gates import metric_keys as mk
from worker.gates.duty_cycle import duty_shares
from worker.gates.progress import finished_steps
from worker.gates.rollouts import cause_expr

__all__ = [
    "ENGINE_BUCKETS",
    "MARKED_POINTS",
    "MAX_POINTS",
    "Marker",
    "MarkerKind",
    "Plot",
    "markers",
    "plan",
    "render_plots",
]

MAX_POINTS: Final = 1200
"""At most this many rows of one frame are drawn: a longer series (or phase table) is downsampled
by `reports.downsample` after its moving average is taken, keeping in each stretch its first, last,
lowest and highest rows, and its caption says `N of M points drawn`. The axes
are ~570 px wide: 1,200 points is two per pixel column, so nothing visible is lost."""

MARKED_POINTS: Final = 300
"""A line of at most this many points also marks each point; a denser one is a plain line."""

TOP_PHASES: Final = 7
"""Phases stacked one by one; the rest are summed as `other`."""

ENGINE_BUCKETS: Final = 200
"""Engine samples are averaged per engine into at most about this many time buckets."""

MarkerKind = Literal["restart", "progress", "stack", "capture"]

_LineStyle = Literal["-", "--", "-.", ":"]

MARKER_STYLE: Final[dict[str, tuple[str, _LineStyle, str]]] = {
    # kind: colour, line style, legend label
    "restart": ("#7b1fa2", "--", "restart"),
    "progress": ("#2e7d32", "-.", "newest progress"),
    "stack": ("#ef6c00", ":", "stack dump"),
    "capture": ("#c62828", "-", "capture time"),
}
_SAME_RESTART_S: Final = 60.0
_WINDOW_COLOUR: Final = "#90caf9"
_DPI: Final = 96
_WIDTH_IN: Final = 9.0
_AXES_RIGHT: Final = 0.74
_LOG_SPAN: Final = 100.0
_SERIES_SCHEMA: Final = {
    "step": pl.Int64(),
    "timestamp": pl.Datetime("us", "UTC"),
    "value": pl.Float64(),
}


@dataclass(frozen=True)
class Marker:
    """An event drawn as a vertical line on every time axis."""

    at: datetime
    kind: MarkerKind


@dataclass(frozen=True)
class Plot:
    """One plot of the report: a PNG, or why there is nothing to draw."""

    slug: str
    title: str
    png: bytes | None = None
    empty: str | None = None
    caption: str = ""
    points: int = 0  # rows drawn (after downsampling), over every line of the plot
    rows: int = 0  # rows those lines had before downsampling


# --- the events -----------------------------------------------------------------------------------


def _stamps(series: pl.Series) -> list[datetime]:
    return [t for t in series.drop_nulls().to_list() if isinstance(t, datetime)]


def _restart_times(evidence: Evidence) -> list[datetime]:
    found: list[datetime] = []
    if evidence.logs is not None and not evidence.logs.resumes.is_empty():
        rows = evidence.logs.resumes.filter(pl.col("kind") == "attempt_boundary")
        found.extend(_stamps(rows["timestamp"]))
    attempts = evidence.probes.attempts if evidence.probes is not None else None
    for attempt in attempts or ():
        if attempt.attempt_id > 0 and attempt.started_at_ms is not None:
            found.append(datetime.fromtimestamp(attempt.started_at_ms / 1000, UTC))
    kept: list[datetime] = []
    for moment in sorted(found):  # the log and the controller mark one restart a little apart
        if not kept or (moment - kept[-1]).total_seconds() > _SAME_RESTART_S:
            kept.append(moment)
    return kept


def _newest_progress(logs: LogTables | None, now: datetime) -> datetime | None:
    """The newest finished step or metric row not after the capture (a later stamp is not
    progress anyone could have seen at capture time)."""
    if logs is None:
        return None
    newest = [
        _newest_until(frame["timestamp"], now) for frame in (finished_steps(logs), logs.metrics)
    ]
    return max((t for t in newest if t is not None), default=None)


def _newest_until(series: pl.Series, now: datetime) -> datetime | None:
    """The newest stamp of `series` not after `now`, in one vectorised pass."""
    if series.is_empty() or not isinstance(series.dtype, pl.Datetime):
        return None
    bound = pl.lit(now).cast(series.dtype)
    newest = series.to_frame("t").select(pl.col("t").filter(pl.col("t") <= bound).max()).item()
    return newest if isinstance(newest, datetime) else None


def markers(evidence: Evidence) -> tuple[Marker, ...]:
    """Restarts, the newest progress, each stack dump and the capture time, oldest first."""
    found = [Marker(t, "restart") for t in _restart_times(evidence)]
    newest = _newest_progress(evidence.logs, evidence.now)
    if newest is not None:
        found.append(Marker(newest, "progress"))
    stacks = evidence.probes.stacks if evidence.probes is not None else ()
    dumps = {d.captured_at.replace(microsecond=0) for d in stacks if d.captured_at is not None}
    found.extend(Marker(t, "stack") for t in dumps)
    found.append(Marker(evidence.now, "capture"))
    return tuple(sorted(found, key=lambda m: (m.at, m.kind)))


def _num(moment: datetime) -> float:
    """A time as matplotlib's date number (days since its epoch), for any axis call."""
    return float(mdates.date2num(moment))  # type: ignore[no-untyped-call]


_UNIX: Final = datetime(1970, 1, 1, tzinfo=UTC)
_US_PER_DAY: Final = 86_400_000_000


def _days(stamps: pl.Series) -> np.ndarray:
    """A column of times as matplotlib date numbers, in one vectorised pass (no per-row Python)."""
    micros = stamps.dt.epoch("us").cast(pl.Float64).to_numpy()
    return np.asarray(micros / _US_PER_DAY + _num(_UNIX), dtype=np.float64)


def _values(frame: pl.DataFrame, column: str) -> np.ndarray:
    """A column as float64 numbers for matplotlib (null as NaN)."""
    return frame[column].cast(pl.Float64).to_numpy()


# --- figures and axes -----------------------------------------------------------------------------


def _figure(rows: int = 1, height: float = 2.7) -> tuple[Figure, list[Axes]]:
    """Fixed margins, the legend to the right of the axes: a layout engine would cost a second
    draw of every figure."""
    total = height * rows
    figure = Figure(figsize=(_WIDTH_IN, total), dpi=_DPI)
    grid = figure.subplots(rows, 1, sharex=True, squeeze=False)
    figure.subplots_adjust(
        left=0.075, right=_AXES_RIGHT, top=1 - 0.12 / total, bottom=0.5 / total, hspace=0.12
    )
    return figure, [grid[i][0] for i in range(rows)]


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def _points_note(drawn: Sequence[Downsampled]) -> list[str]:
    """`N of M points drawn` when any line was downsampled (else nothing)."""
    points, rows = sum(d.points for d in drawn), sum(d.rows for d in drawn)
    if points >= rows:
        return []
    return [
        f"{points:,} of {rows:,} points drawn (each stretch of the series keeps its first, last, "
        "lowest and highest values)"
    ]


def _label(text: str) -> str:
    """Text from the evidence as a plot draws it: redacted, controls escaped, `$` escaped (so it
    is never mathtext: a `$...$` phase name would stop the plot or draw as formula)."""
    return clean(text).replace("$", r"\$")


def _legend(ax: Axes, *more: Axes, offset: float = 1.01) -> None:
    """One legend for `ax` (and its twins), outside the axes on the right."""
    handles, labels = ax.get_legend_handles_labels()
    for other in more:
        extra = other.get_legend_handles_labels()
        handles, labels = handles + extra[0], labels + extra[1]
    unique = dict(zip(labels, handles, strict=True))  # event lines repeat on every axes
    if unique:
        ax.legend(
            list(unique.values()),
            list(unique),
            loc="upper left",
            bbox_to_anchor=(offset, 1.0),
            fontsize=7,
        )


def _draw_markers(ax: Axes, marks: Sequence[Marker], lo: datetime, hi: datetime) -> None:
    """One artist per kind of event (however many restarts), spanning the axes' height."""
    for kind, (colour, style, label) in MARKER_STYLE.items():
        xs = [_num(m.at) for m in marks if m.kind == kind and lo <= m.at <= hi]
        if xs:
            lines = LineCollection(
                [[(x, 0.0), (x, 1.0)] for x in xs],
                transform=ax.get_xaxis_transform(),  # x in data, y across the whole axes
                colors=colour,
                linestyles=style,
                linewidths=1.2,
                label=label,
            )
            ax.add_collection(lines, autolim=False)  # the lines never move the data limits


@dataclass(frozen=True)
class _Context:
    """What every plot of one evidence shares."""

    evidence: Evidence
    logs: LogTables
    keys: mk.ResolvedKeys
    canonical: pl.DataFrame  # the metric rows of the canonical keys that carry a value
    marks: tuple[Marker, ...]
    window_steps: tuple[int, int] | None
    window_times: tuple[datetime, datetime] | None

    @property
    def limits(self) -> Thresholds:
        return self.evidence.thresholds


@dataclass(frozen=True)
class _Axis:
    """How one plot places its points: by time (with the event lines) or by step."""

    by_time: bool
    ctx: _Context

    @property
    def column(self) -> str:
        return "timestamp" if self.by_time else "step"

    def xs(self, frame: pl.DataFrame) -> np.ndarray:
        return _days(frame["timestamp"]) if self.by_time else _values(frame, "step")

    def window(self, ax: Axes) -> None:
        times, steps = self.ctx.window_times, self.ctx.window_steps
        span = (_num(times[0]), _num(times[1])) if self.by_time and times else None
        if not self.by_time and steps:
            span = (float(steps[0]), float(steps[1]))
        if span is not None:
            ax.axvspan(span[0], span[1], color=_WINDOW_COLOUR, alpha=0.35, label="judged window")

    def finish(self, axes: Sequence[Axes], frame: pl.DataFrame) -> None:
        """Limits, event lines and labels of the x axis, from the rows drawn."""
        if not self.by_time:
            axes[-1].set_xlabel("step")
            return
        lo, hi = frame["timestamp"].min(), frame["timestamp"].max()
        assert isinstance(lo, datetime) and isinstance(hi, datetime)
        end = max(hi, self.ctx.evidence.now)
        pad = max((end - lo) * 0.02, timedelta(seconds=1))
        for ax in axes:
            _draw_markers(ax, self.ctx.marks, lo, end)
            ax.set_xlim(_num(lo - pad), _num(end + pad))
        locator = mdates.AutoDateLocator(tz=UTC)  # type: ignore[no-untyped-call]
        formatter = mdates.ConciseDateFormatter(locator, tz=UTC)  # type: ignore[no-untyped-call]
        axes[-1].xaxis.set_major_locator(locator)
        axes[-1].xaxis.set_major_formatter(formatter)
        axes[-1].set_xlabel("time (UTC)")

    def note(self) -> list[str]:
        if self.by_time:
            return []
        return ["some rows carry no timestamp: drawn by step, without the event lines"]


def _axis(ctx: _Context, frame: pl.DataFrame) -> _Axis:
    by_time = frame.height > 0 and frame["timestamp"].null_count() == 0
    return _Axis(by_time=by_time, ctx=ctx)


def _canonical(logs: LogTables, keys: mk.ResolvedKeys) -> pl.DataFrame:
    """The metric rows every series plot and the window read, filtered once from the table."""
    wanted = list(keys.by_signal.values())
    rows = logs.metrics.filter(pl.col("key").is_in(wanted) & pl.col("value").is_not_null())
    return rows.select("key", "step", "timestamp", "value")


def _window(canonical: pl.DataFrame, size: int) -> pl.DataFrame:
    """Step and newest timestamp of the last `size` steps that carry any canonical metric."""
    steps = canonical.group_by("step").agg(pl.col("timestamp").max()).sort("step")
    return steps.tail(size)


def _context(evidence: Evidence, logs: LogTables) -> _Context:
    keys = mk.resolve(mk.present_keys(logs.metrics))
    canonical = _canonical(logs, keys)
    window = _window(canonical, evidence.thresholds.min_window_steps)
    steps = (int(window["step"][0]), int(window["step"][-1])) if window.height else None
    stamps = _stamps(window["timestamp"])
    times = (min(stamps), max(stamps)) if stamps and len(stamps) == window.height else None
    return _Context(evidence, logs, keys, canonical, markers(evidence), steps, times)


# --- per-step series ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Line:
    signal: str
    label: str
    colour: str
    right: bool = False  # on a second y axis


@dataclass(frozen=True)
class _SeriesSpec:
    slug: str
    title: str
    what: str  # "no <what> logged"
    ylabel: str
    lines: tuple[_Line, ...]
    log_scale: bool = False
    band: Callable[[Thresholds], tuple[float, float]] | None = None  # healthy range, shaded
    moving_mean: bool = False  # the W-step moving average of the first line


def _series(ctx: _Context, signal: str) -> tuple[pl.DataFrame, int]:
    """`step, timestamp, value` of a canonical signal (finite values only), and how many
    non-finite values were left out."""
    key = ctx.keys.get(signal)
    if key is None:
        return pl.DataFrame(schema=_SERIES_SCHEMA), 0
    rows = ctx.canonical.filter(pl.col("key") == key)
    rows = rows.select("step", "timestamp", "value").sort("step")
    finite = rows.filter(pl.col("value").is_finite())
    return finite, rows.height - finite.height


def _draw_line(
    ax: Axes, axis: _Axis, frame: pl.DataFrame, line: _Line, spec: _SeriesSpec
) -> Downsampled:
    """Draw one series (downsampled to MAX_POINTS after its moving average); returns what was
    drawn."""
    columns = ["value"]
    if spec.moving_mean:
        size = axis.ctx.limits.min_window_steps
        frame = frame.with_columns(mean=pl.col("value").rolling_mean(size, min_samples=1))
        columns.append("mean")
    drawn = downsample(frame, columns, MAX_POINTS)
    xs = axis.xs(drawn.frame)
    colour = "#90a4ae" if spec.moving_mean else line.colour
    width = 1.0 if spec.moving_mean else 1.5
    marker = "." if drawn.points <= MARKED_POINTS else None
    ys = _values(drawn.frame, "value")
    ax.plot(xs, ys, color=colour, label=line.label, linewidth=width, marker=marker, markersize=4)
    if spec.moving_mean:
        label = f"{axis.ctx.limits.min_window_steps}-step mean"
        ax.plot(xs, _values(drawn.frame, "mean"), color=line.colour, linewidth=2, label=label)
    return drawn


def _series_plot(ctx: _Context, spec: _SeriesSpec) -> Plot:
    found = {line.signal: _series(ctx, line.signal) for line in spec.lines}
    present = [line for line in spec.lines if not found[line.signal][0].is_empty()]
    if not present:
        return Plot(spec.slug, spec.title, empty=_nothing_to_draw(spec, found))
    rows = pl.concat([found[line.signal][0] for line in present])
    axis = _axis(ctx, rows)
    figure, (ax,) = _figure()
    axis.window(ax)
    first_drawn = present[0] is spec.lines[0]
    if spec.band is not None and first_drawn:  # the band belongs to the first series' scale
        low, high = spec.band(ctx.limits)
        ax.axhspan(low, high, color="#c8e6c9", alpha=0.6, label="healthy range")
    right = ax.twinx() if any(line.right for line in present) and not present[0].right else None
    drawn = [
        _draw_line(right if line.right and right else ax, axis, found[line.signal][0], line, spec)
        for line in present
    ]
    _scale(ax, rows, spec)
    ax.set_ylabel(spec.ylabel if first_drawn else present[0].label)
    axis.finish([ax], rows)
    if right is not None:
        right.set_ylabel(present[-1].label)
        _legend(ax, right, offset=1.11)
    else:
        _legend(ax)
    keys = [ctx.keys.get(line.signal) or line.signal for line in present]
    dropped = sum(found[line.signal][1] for line in present)
    caption = _series_caption(keys, dropped, axis, drawn)
    points, total = sum(d.points for d in drawn), sum(d.rows for d in drawn)
    return Plot(spec.slug, spec.title, _png(figure), caption=caption, points=points, rows=total)


def _nothing_to_draw(spec: _SeriesSpec, found: dict[str, tuple[pl.DataFrame, int]]) -> str:
    dropped = sum(count for _frame, count in found.values())
    if dropped:
        return f"every logged {spec.what} value is non-finite (NaN or ±inf): {dropped} value(s)"
    looked = [k for line in spec.lines for k in mk.CANDIDATES[line.signal]]
    return f"no {spec.what} logged (looked for {', '.join(looked)})"


def _scale(ax: Axes, drawn: pl.DataFrame, spec: _SeriesSpec) -> None:
    """A log axis only for a positive series spanning more than two decades (an exploding grad
    norm), where a linear one would flatten everything before the blow-up."""
    smallest, largest = drawn["value"].min(), drawn["value"].max()
    if not (spec.log_scale and isinstance(smallest, float) and isinstance(largest, float)):
        return
    if smallest > 0 and largest / smallest > _LOG_SPAN:
        ax.set_yscale("log")


def _series_caption(
    keys: Sequence[str], dropped: int, axis: _Axis, drawn: Sequence[Downsampled]
) -> str:
    parts = [f"logged as {', '.join(keys)}"]
    if dropped:
        parts.append(f"{dropped} non-finite value(s) not drawn (NaN or ±inf)")
    return "; ".join([*parts, *_points_note(drawn), *axis.note()])


def _tis_band(limits: Thresholds) -> tuple[float, float]:
    return limits.tis_ratio_mean_min, limits.tis_ratio_mean_max


SERIES: Final = (
    _SeriesSpec(
        "reward",
        "Reward per step",
        "reward",
        "reward",
        (_Line("reward", "reward", "#1565c0"),),
        moving_mean=True,
    ),
    _SeriesSpec(
        "entropy",
        "Policy entropy per step",
        "entropy",
        "entropy",
        (_Line("entropy", "entropy", "#6a1b9a"),),
    ),
    _SeriesSpec(
        "tis",
        "TIS importance ratio and |log ratio| per step",
        "TIS metric",
        "importance-ratio mean",
        (
            _Line("tis_ratio", "ratio mean", "#2e7d32"),
            _Line("tis_log_abs", "|log ratio| mean", "#d84315", right=True),
        ),
        band=_tis_band,
    ),
    _SeriesSpec(
        "grad_norm",
        "Grad norm per step",
        "grad norm",
        "grad norm",
        (_Line("grad_norm", "grad norm", "#00838f"),),
        log_scale=True,
    ),
)


# --- phases ---------------------------------------------------------------------------------------


def _phase_rows(logs: LogTables) -> pl.DataFrame:
    """`step, phase, seconds, timestamp`: timer phases, else `timing/<phase>` metric keys."""
    if not logs.phases.is_empty():
        rows = logs.phases.select("step", "phase", "seconds", "timestamp")
    else:
        rows = logs.metrics.filter(pl.col("key").str.starts_with(mk.PHASE_PREFIX)).select(
            "step",
            pl.col("key").str.strip_prefix(mk.PHASE_PREFIX).alias("phase"),
            pl.col("value").alias("seconds"),
            "timestamp",
        )
    rows = rows.drop_nulls(["step", "phase", "seconds"]).filter(pl.col("seconds").is_finite())
    return rows.unique(["step", "phase"], keep="last")  # later use is keyed by step and phase


_OTHER: Final = "_other"


def _stacked(rows: pl.DataFrame) -> tuple[pl.DataFrame, list[str], list[str]]:
    """One row per step: `step, timestamp`, one column per stacked phase (0 when absent); the
    columns and their labels. The columns are `_p0`, `_p1`, ... and `_other` (the phases past
    TOP_PHASES), not the phases' names: a phase may be called `step` or `timestamp`."""
    parts = rows.filter(pl.col("phase") != mk.STEP_PHASE)
    totals = parts.group_by("phase").agg(pl.col("seconds").sum()).sort("seconds", descending=True)
    top = totals["phase"].head(TOP_PHASES).to_list()
    ids = {name: f"_p{i}" for i, name in enumerate(top)}
    named = parts.with_columns(
        phase=pl.col("phase").replace_strict(ids, default=_OTHER, return_dtype=pl.String)
    )
    wide = named.pivot(on="phase", index="step", values="seconds", aggregate_function="sum")
    stamps = rows.group_by("step").agg(pl.col("timestamp").max())
    other = _OTHER in wide.columns
    columns = [*ids.values(), *([_OTHER] if other else [])]
    labels = [*top, *(["other"] if other else [])]
    filled = wide.with_columns(pl.exclude("step").fill_null(0.0))
    table = filled.join(stamps, on="step", how="left").sort("step")
    return table.select("step", "timestamp", *columns), columns, labels


def _phases(ctx: _Context) -> Plot:
    title = "Phase seconds per step (stacked)"
    rows = _phase_rows(ctx.logs)
    if rows.filter(pl.col("phase") != mk.STEP_PHASE).is_empty():
        return Plot(
            "phases",
            title,
            empty=f"no phase timings logged (no timer lines, no {mk.PHASE_PREFIX}<phase> keys)",
        )
    table, columns, labels = _stacked(rows)
    total = rows.filter(pl.col("phase") == mk.STEP_PHASE).select("step", total="seconds")
    has_total = not total.is_empty()
    if has_total:
        table = table.join(total, on="step", how="left", maintain_order="left")
    drawn = downsample(table, [*columns, *(["total"] if has_total else [])], MAX_POINTS)
    axis = _axis(ctx, table)
    figure, (ax,) = _figure(height=3.2)
    axis.window(ax)
    xs = axis.xs(drawn.frame)
    stacks = [_values(drawn.frame, c) for c in columns]
    ax.stackplot(xs, *stacks, labels=[_label(name) for name in labels], alpha=0.85)
    if has_total:
        ys = _values(drawn.frame, "total")
        ax.plot(xs, ys, color="black", linewidth=1, label="step total")
    ax.set_ylabel("seconds")
    axis.finish([ax], table)
    _legend(ax)
    caption = "; ".join([f"{len(columns)} phase(s) stacked", *_points_note([drawn]), *axis.note()])
    png = _png(figure)
    return Plot("phases", title, png, caption=caption, points=drawn.points, rows=drawn.rows)


# --- engines --------------------------------------------------------------------------------------


_ENGINE_COLUMNS: Final = {"running": "running", "waiting": "waiting", "kv": "kv_cache_pct"}


def _engine_buckets(rows: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """`timestamp` (bucket start) and, for `running` and `waiting` (summed over engines) and `kv`
    (mean over engines): the bucket's mean and its `<name>_lo` / `<name>_hi` band, each engine's
    lowest and highest sample in the bucket (summed, or for `kv` the extremes over engines), so a
    short spike inside a bucket still shows; and how many engines the samples come from."""
    lo, hi = rows["timestamp"].min(), rows["timestamp"].max()
    assert isinstance(lo, datetime) and isinstance(hi, datetime)
    seconds = max(10, math.ceil((hi - lo).total_seconds() / ENGINE_BUCKETS))
    bucketed = rows.with_columns(pl.col("timestamp").dt.truncate(f"{seconds}s"))
    per_engine = bucketed.group_by("timestamp", "engine").agg(
        *(pl.col(src).mean().alias(name) for name, src in _ENGINE_COLUMNS.items()),
        *(pl.col(src).min().alias(f"{name}_lo") for name, src in _ENGINE_COLUMNS.items()),
        *(pl.col(src).max().alias(f"{name}_hi") for name, src in _ENGINE_COLUMNS.items()),
    )
    summed = [f"{n}{end}" for n in ("running", "waiting") for end in ("", "_lo", "_hi")]
    engines = per_engine["engine"].n_unique()  # over the few bucket rows, not every sample
    buckets = (
        per_engine.group_by("timestamp")
        .agg(
            *(pl.col(name).sum() for name in summed),
            pl.col("kv").mean(),
            pl.col("kv_lo").min(),
            pl.col("kv_hi").max(),
        )
        .sort("timestamp")
    )
    return buckets, engines


def _engines(ctx: _Context) -> Plot:
    title = "vLLM engines: running and waiting requests, KV-cache use"
    now = ctx.evidence.now
    engines = ctx.logs.engines
    rows = engines.filter(pl.col("timestamp").is_not_null() & (pl.col("timestamp") <= now))
    if rows.is_empty():
        return Plot("engines", title, empty="no vLLM engine stat lines with a timestamp logged")
    buckets, n = _engine_buckets(rows)
    axis = _Axis(by_time=True, ctx=ctx)
    figure, axes = _figure(rows=3, height=1.5)
    xs = axis.xs(buckets)
    series = (
        ("running", "running", "running", "#1565c0"),
        ("waiting", "waiting", "waiting", "#ef6c00"),
        ("kv", "KV %", "KV cache %", "#6a1b9a"),
    )
    for ax, (column, label, ylabel, colour) in zip(axes, series, strict=True):
        low, high = _values(buckets, f"{column}_lo"), _values(buckets, f"{column}_hi")
        ax.fill_between(xs, low, high, step="post", color=colour, alpha=0.18, linewidth=0)
        ys = _values(buckets, column)
        ax.plot(xs, ys, color=colour, drawstyle="steps-post", label=label)
        ax.set_ylabel(ylabel, fontsize=8)
    axis.finish(axes, buckets)
    _legend(axes[0], *axes[1:])
    caption = (
        f"{n} engine(s), summed per time bucket: {buckets.height:,} buckets of {rows.height:,} "
        "samples (line: the bucket's mean; shaded: its lowest to highest sample)"
    )
    png = _png(figure)
    return Plot("engines", title, png, caption=caption, points=buckets.height, rows=rows.height)


# --- trials (agentic) -----------------------------------------------------------------------------


def _outcomes(trials: pl.DataFrame) -> pl.DataFrame:
    reward = pl.col("reward")
    outcome = (
        pl.when(cause_expr().is_not_null())
        .then(cause_expr())
        .when(reward > 0)
        .then(pl.lit("reward > 0"))
        .when(reward.is_null())
        .then(pl.lit("no reward"))
        .otherwise(pl.lit("reward 0"))
    )
    finished = trials.filter(pl.col("status") == "finished")
    return finished.with_columns(outcome=outcome).select("outcome", "finished_at")


def _trial_outcomes(ctx: _Context) -> Plot:
    title = "Finished trials by outcome"
    trials = ctx.evidence.trials
    rows = _outcomes(trials.trials) if trials is not None else pl.DataFrame()
    if rows.is_empty():
        return Plot("trials", title, empty="no finished trial in the trials directory")
    counts = rows.group_by("outcome").len().sort("len", descending=True)
    names = [_label(str(name)) for name in counts["outcome"].to_list()]
    if rows["finished_at"].null_count():
        figure, (ax,) = _figure()
        ax.barh(names, counts["len"].to_list(), color="#5c6bc0")
        ax.set_xlabel("trials")
        return Plot("trials", title, _png(figure), caption="some trials carry no finish time")
    figure, (ax,) = _figure()
    outcomes = counts["outcome"].to_list()
    groups = [_days(rows.filter(pl.col("outcome") == n)["finished_at"]) for n in outcomes]
    bins = min(30, max(5, rows.height // 5))
    ax.hist(groups, bins=bins, stacked=True, label=names)
    ax.set_ylabel("trials finished")
    _Axis(by_time=True, ctx=ctx).finish([ax], rows.rename({"finished_at": "timestamp"}))
    _legend(ax)
    summary = ", ".join(f"{n} {c}" for n, c in counts.iter_rows())
    return Plot("trials", title, _png(figure), caption=f"{rows.height} finished: {summary}")


_SHARES: Final = ("llm", "tools", "sandbox", "agent_setup", "verifier", "unattributed")
_SHARE_COLOURS: Final = ("#1565c0", "#43a047", "#ef6c00", "#8e24aa", "#00838f", "#9e9e9e")
_TRIAL_PHASES: Final = ("environment_setup_s", "agent_setup_s", "agent_execution_s", "verifier_s")


def _timed_trials(trials: pl.DataFrame) -> pl.DataFrame:
    duration = (pl.col("finished_at") - pl.col("started_at")).dt.total_seconds(fractional=True)
    return (
        trials.filter(
            (pl.col("status") == "finished") & pl.col("environment_setup_s").is_not_null()
        )
        .with_columns(wall_s=pl.coalesce(duration, pl.sum_horizontal(_TRIAL_PHASES)))
        .filter(pl.col("wall_s") > 0)
    )


def _duty_cycle(ctx: _Context) -> Plot:
    title = "Duty cycle: shares of trial wall time"
    trials = ctx.evidence.trials
    timed = _timed_trials(trials.trials) if trials is not None else pl.DataFrame()
    if timed.is_empty():
        return Plot("duty_cycle", title, empty="no finished trial with phase timings")
    shares = duty_shares(timed)
    figure, (ax,) = _figure(height=1.6)
    left = 0.0
    for name, colour in zip(_SHARES, _SHARE_COLOURS, strict=True):
        share = max(shares.get(name) or 0.0, 0.0)  # phases past the wall leave nothing over
        ax.barh([0], [share], left=left, color=colour, label=f"{name} {share:.0%}")
        left += share
    ax.set_xlim(0, max(1.0, left))
    ax.set_yticks([])
    ax.set_xlabel("share of wall time")
    _legend(ax)
    return Plot("duty_cycle", title, _png(figure), caption=f"{timed.height} timed trial(s)")


# --- all of them ----------------------------------------------------------------------------------


def _has_trials(evidence: Evidence) -> bool:
    has_rows = evidence.trials is not None and not evidence.trials.trials.is_empty()
    return evidence.mode.mode is Mode.AGENTIC or has_rows


def _guarded(draw: Callable[[_Context], Plot], ctx: _Context, slug: str) -> Plot:
    """A plot that fails to draw says why instead of costing the report (odd evidence must
    never stop a verdict from being stored)."""
    try:
        return draw(ctx)
    except Exception as exc:
        return Plot(
            slug, slug.replace("_", " "), empty=f"could not draw: {type(exc).__name__}: {exc}"
        )


def plan(evidence: Evidence) -> tuple[_Context, list[tuple[str, Callable[[_Context], Plot]]]]:
    """What every plot shares (window, event lines) and each plot's slug and drawing, in report
    order (split from `render_plots` so `bench/bench_report.py` can time each plot alone)."""
    logs = evidence.logs or LogTables()
    ctx = _context(evidence, logs)
    draws: list[tuple[str, Callable[[_Context], Plot]]] = [
        (spec.slug, partial(_series_plot, spec=spec)) for spec in SERIES
    ]
    draws += [("phases", _phases), ("engines", _engines)]
    if _has_trials(evidence):
        draws += [("trials", _trial_outcomes), ("duty_cycle", _duty_cycle)]
    return ctx, draws


def render_plots(evidence: Evidence) -> tuple[Plot, ...]:
    """Every plot of one evidence, in report order."""
    ctx, draws = plan(evidence)
    plots = [_guarded(draw, ctx, slug) for slug, draw in draws]
    if evidence.logs is None:
        note = "no trainer log in the evidence"
        plots = [p if p.png else Plot(p.slug, p.title, empty=f"{note}; {p.empty}") for p in plots]
    return tuple(plots)
