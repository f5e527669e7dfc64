"""Engine-window analysis: the vLLM saturation tuple over the newest window, per engine.

An engine is judged by a tuple over a window, never by one sample: waiting queue depth, KV-cache
use, running requests and generation throughput. The window of one engine is its newest
`STARVED_WINDOW_S` of ENGINES rows plus the sample that opened it (so a window is *covered* only
when the engine was already reporting before the window began). Engines whose newest sample is
older than one window before the fleet's newest sample are gone (an earlier attempt's pids) and are
left out. Rows after `evidence.now` or without a timestamp are ignored.

Each engine gets one state (first match wins):

- `wedged` / `held`: the engine's newest stat line (of the newest attempt, at or before `now`) has
  the wedge shape — Waiting > 0, Running 0, 0 prompt and 0 generation tok/s — and so has every line
  of the run that ends there (`engine_wedges`). Wedged when the run is *logged* (at least
  `WEDGE_MIN_INTERVALS` lines spanning at least STALL_FLOOR_S) or *silent* (no line of the engine
  for STALL_FLOOR_S after it while its log goes on: vLLM logs an interval without throughput at
  DEBUG, so a wedge at INFO shows one such line and then nothing); held otherwise (a pause, or a
  wedge not yet long enough). Such an engine is kept even when its silence made it look gone.
- `sparse`: fewer than `MIN_ENGINE_SAMPLES` samples in the window; not judged.
- `saturated`: waiting > 0 at some sample and mean KV use above `KV_BUSY_PCT`.
- `quiet`: running ≤ 1 and waiting 0 throughout, every generation-throughput sample under
  `STARVED_TOKENS_PER_S`, over a covered window (the starvation tuple; whether it is starvation or
  a colocated engine sleeping while the policy trains depends on what the trainer is doing).
- `under-fed`: waiting 0 throughout and KV use under `KV_FLOOR_PCT` throughout.
- `swinging`: waiting 0 throughout while running swings from a peak above one request to a trough
  at or under `SWING_TROUGH_RATIO` of it (the backpressure sawtooth).
- `busy`: anything else (requests in flight; a queue with KV use under `KV_BUSY_PCT`).

The launched command also says what demand and supply were configured: demand is
`n_concurrent_trials`, supply is `max_num_seqs x num_inference_engines`
(docs/domain.md#healthy-ranges-and-thresholds).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime

import polars as pl

from shared.models import Table
from shared.settings import Thresholds

__all__ = [
    "MIN_ENGINE_SAMPLES",
    "STATE_ORDER",
    "SWING_TROUGH_RATIO",
    "WEDGE_MIN_INTERVALS",
    "EngineConfig",
    "engine_config",
    "engine_states",
    "engine_wedges",
    "engine_window",
    "wedge_shape",
]

MIN_ENGINE_SAMPLES = 3
"""At least this many stat lines per engine in the window before its tuple means anything."""

SWING_TROUGH_RATIO = 0.5
"""A trough at or under this share of the peak running count is a swing, not jitter."""

WEDGE_MIN_INTERVALS = 3
"""A logged wedge is at least this many consecutive stat lines of the wedge shape (vLLM logs one
every 10 s by default): one or two such lines are the interval after a burst, not a state."""

STATE_ORDER = (
    "wedged", "held", "saturated", "busy", "swinging", "under-fed", "quiet", "sparse",
)  # fmt: skip
"""Engine states, in the order a fleet line lists them."""

_ts = pl.col("timestamp")


def engine_window(engines: pl.DataFrame, now: datetime, window_s: float) -> pl.DataFrame:
    """The rows of live engines inside each engine's newest window, with a `covered` column."""
    rows = engines.filter(_ts.is_not_null() & (_ts <= now))
    if rows.is_empty():
        return rows.with_columns(covered=pl.lit(value=False))
    span = pl.duration(seconds=window_s)
    fleet_newest = rows["timestamp"].max()
    marked = (
        rows.with_columns(newest=_ts.max().over("engine"))
        .filter(pl.col("newest") >= pl.lit(fleet_newest) - span)
        .with_columns(cutoff=pl.col("newest") - span)
        .with_columns(opening=pl.when(_ts <= pl.col("cutoff")).then(_ts).max().over("engine"))
    )
    inside = marked.filter(_ts >= pl.coalesce("opening", "cutoff"))
    return inside.with_columns(covered=pl.col("opening").is_not_null()).drop(
        "newest", "cutoff", "opening"
    )


def _per_engine(window: pl.DataFrame) -> pl.DataFrame:
    return window.group_by("engine").agg(
        samples=pl.len(),
        first=_ts.min(),
        last=_ts.max(),
        covered=pl.col("covered").any(),
        waiting_max=pl.col("waiting").max(),
        waiting_mean=pl.col("waiting").mean(),
        kv_mean=pl.col("kv_cache_pct").mean(),
        kv_max=pl.col("kv_cache_pct").max(),
        running_min=pl.col("running").min(),
        running_max=pl.col("running").max(),
        gen_mean=pl.col("generation_tokens_per_s").mean(),
        gen_max=pl.col("generation_tokens_per_s").max(),
        last_running=pl.col("running").sort_by(_ts).last(),
        last_waiting=pl.col("waiting").sort_by(_ts).last(),
        last_kv=pl.col("kv_cache_pct").sort_by(_ts).last(),
        last_gen=pl.col("generation_tokens_per_s").sort_by(_ts).last(),
        source=pl.col("source").sort_by(_ts).last(),
        line=pl.col("line").sort_by(_ts).last(),
        timestamp=_ts.max(),
    )


def _state(t: Thresholds) -> pl.Expr:
    no_queue = pl.col("waiting_max") == 0
    swing = (pl.col("running_max") > 1) & (
        pl.col("running_min") <= SWING_TROUGH_RATIO * pl.col("running_max")
    )
    quiet = (
        no_queue
        & (pl.col("running_max") <= 1)
        & (pl.col("gen_max") < t.starved_tokens_per_s)
        & pl.col("covered")
    )
    return (
        pl.when(pl.col("samples") < MIN_ENGINE_SAMPLES)
        .then(pl.lit("sparse"))
        .when((pl.col("waiting_max") > 0) & (pl.col("kv_mean") > t.kv_busy_pct))
        .then(pl.lit("saturated"))
        .when(quiet)
        .then(pl.lit("quiet"))
        .when(no_queue & (pl.col("kv_max") < t.kv_floor_pct))
        .then(pl.lit("under-fed"))
        .when(no_queue & swing)
        .then(pl.lit("swinging"))
        .otherwise(pl.lit("busy"))
    )


def _ts_type(engines: pl.DataFrame) -> pl.DataType:
    return engines.schema.get("timestamp", pl.Datetime("us", "UTC"))


def _with_span(per_engine: pl.DataFrame) -> pl.DataFrame:
    return per_engine.with_columns(
        span_s=(pl.col("last") - pl.col("first")).dt.total_seconds(fractional=True)
    )


def engine_states(
    engines: pl.DataFrame,
    now: datetime,
    t: Thresholds,
    *,
    attempt: int | None = None,
    horizon: pl.Expr | None = None,
) -> pl.DataFrame:
    """One row per live engine: the window's tuple statistics and its `state`, sorted by engine.

    Engines of `attempt` (all rows when None) whose newest line has the wedge shape are `wedged`
    or `held` (`engine_wedges`, with `horizon`; `stuck_since` is when that run began), kept even
    when the window left them out."""
    window = engine_window(engines, now, t.starved_window_s)
    no_run = pl.lit(None, dtype=_ts_type(engines))
    if window.is_empty():
        empty = _with_span(_per_engine(window)).with_columns(state=pl.lit("", dtype=pl.String()))
        return empty.with_columns(stuck_since=no_run)
    states = _with_span(_per_engine(window)).with_columns(state=_state(t))
    rows = engines if attempt is None else engines.filter(pl.col("attempt") == attempt)
    runs = _wedge_runs(rows, now)
    if runs.is_empty():
        return states.with_columns(stuck_since=no_run).sort("engine")
    stuck = _wedge_stats(runs, t, horizon).select(
        "engine", _stuck=_stuck_state(), stuck_since="since"
    )
    gone = runs.join(states.select("engine"), on="engine", how="anti")
    if not gone.is_empty():
        added = _with_span(_per_engine(gone.with_columns(covered=pl.lit(value=False))))
        states = pl.concat([states, added.with_columns(state=pl.lit(""))])
    marked = states.join(stuck, on="engine", how="left")
    return marked.with_columns(state=pl.coalesce("_stuck", "state")).drop("_stuck").sort("engine")


# --- wedged engines -------------------------------------------------------------------------------


def wedge_shape() -> pl.Expr:
    """A stat line of an engine that holds requests and runs none: Waiting > 0, Running 0, no
    prompt or generation tokens in the interval."""
    idle = (pl.col("generation_tokens_per_s") == 0) & (
        pl.col("prompt_tokens_per_s").fill_null(0) == 0
    )
    return ((pl.col("waiting") > 0) & (pl.col("running") == 0) & idle).fill_null(value=False)


def _wedge_runs(engines: pl.DataFrame, now: datetime) -> pl.DataFrame:
    """The rows of each engine's newest run of wedge-shaped lines, when its newest line at or
    before `now` has the shape."""
    rows = engines.filter(_ts.is_not_null() & (_ts <= now))
    if rows.is_empty():
        return rows
    # only engines whose newest line has the shape have a run: usually none, so no sort at all
    last = rows.group_by("engine").agg(pl.all().get(_ts.arg_max()))
    shaped = last.filter(wedge_shape())["engine"]
    if shaped.is_empty():
        return rows.clear()
    rows = rows.filter(pl.col("engine").is_in(shaped.implode())).sort("engine", "timestamp", "line")
    broken = (~wedge_shape()).cast(pl.Int32).cum_sum().over("engine")
    marked = rows.with_columns(_w=wedge_shape(), _broken=broken)
    newest = pl.col("_broken") == pl.col("_broken").max().over("engine")
    return marked.filter(pl.col("_w") & newest).drop("_w", "_broken")


def _wedge_stats(runs: pl.DataFrame, t: Thresholds, horizon: pl.Expr | None) -> pl.DataFrame:
    """One row per run: its lines, span, the silence after it up to `horizon` (the newest time
    the engine's log is known to reach; the run's own end when None), and whether it is wedged."""
    per = runs.group_by("engine").agg(
        lines=pl.len(),
        since=_ts.min(),
        last=_ts.max(),
        waiting=pl.col("waiting").sort_by(_ts).last(),
        kv=pl.col("kv_cache_pct").sort_by(_ts).last(),
        source=pl.col("source").sort_by(_ts).last(),
        line=pl.col("line").sort_by(_ts).last(),
        timestamp=_ts.max(),
    )
    reach = pl.max_horizontal(pl.col("last"), horizon) if horizon is not None else pl.col("last")
    per = per.with_columns(
        run_s=(pl.col("last") - pl.col("since")).dt.total_seconds(fractional=True),
        silent_s=(reach - pl.col("last")).dt.total_seconds(fractional=True),
    )
    logged = (pl.col("lines") >= WEDGE_MIN_INTERVALS) & (pl.col("run_s") >= t.stall_floor_s)
    silent = pl.col("silent_s") >= t.stall_floor_s
    return per.with_columns(logged=logged, silent=silent, wedged=logged | silent).sort("engine")


def _stuck_state() -> pl.Expr:
    return pl.when(pl.col("wedged")).then(pl.lit("wedged")).otherwise(pl.lit("held"))


def engine_wedges(
    engines: pl.DataFrame, now: datetime, t: Thresholds, horizon: pl.Expr | None = None
) -> pl.DataFrame:
    """One row per engine whose newest stat line at or before `now` has the wedge shape:
    `lines`, `since`, `last` of the run of such lines ending there, `run_s`, `silent_s` (to
    `horizon`), `waiting`, `kv`, the newest line's `source`/`line`/`timestamp`, and `logged`,
    `silent`, `wedged` (see the module docstring)."""
    return _wedge_stats(_wedge_runs(engines, now), t, horizon)


# --- the launched configuration -----------------------------------------------------------------


@dataclass(frozen=True)
class EngineConfig:
    """What the entrypoint says about rollout demand and engine supply (None when absent)."""

    n_concurrent_trials: int | None = None
    max_num_seqs: int | None = None
    num_inference_engines: int | None = None
    colocate_all: bool | None = None

    @property
    def supply(self) -> int | None:
        if self.max_num_seqs is None or self.num_inference_engines is None:
            return None
        return self.max_num_seqs * self.num_inference_engines

    def describe(self) -> str | None:
        """One line for the report, or None when the entrypoint names none of the numbers."""
        demand = self.n_concurrent_trials
        if demand is None and self.supply is None:
            return None
        supply = "unknown" if self.supply is None else str(self.supply)
        parts = (
            f"max_num_seqs {self.max_num_seqs} x num_inference_engines {self.num_inference_engines}"
        )
        text = (
            f"demand n_concurrent_trials={demand if demand is not None else 'unknown'} vs supply "
        )
        text += f"{parts} = {supply}"
        if demand is not None and self.supply is not None:
            text += f" (demand/supply {demand / self.supply:.2f})"
        return text


def _argv(entrypoint: str | None) -> str:
    """The launched command as one string (argv joined), whatever shape the JSON has."""
    if not entrypoint:
        return ""
    try:
        parsed = json.loads(entrypoint)
    except json.JSONDecodeError:
        return entrypoint
    argv = parsed.get("argv") if isinstance(parsed, dict) else parsed
    if isinstance(argv, list):
        return " ".join(str(item) for item in argv)
    return entrypoint


def _setting(command: str, name: str) -> str | None:
    match = re.search(rf"(?:^|[\s.\-]){name}(?:=|\s+)([^\s,]+)", command)
    return match.group(1).strip("'\"") if match else None


def _int_setting(command: str, name: str) -> int | None:
    value = _setting(command, name)
    return int(value) if value is not None and value.isdigit() else None


def engine_config(entrypoint: str | None) -> EngineConfig:
    """Demand and supply numbers from the entrypoint (`key=value` overrides or `--key value`)."""
    command = _argv(entrypoint)
    colocate = _setting(command, "colocate_all")
    return EngineConfig(
        n_concurrent_trials=_int_setting(command, "n_concurrent_trials"),
        max_num_seqs=_int_setting(command, "max_num_seqs"),
        num_inference_engines=_int_setting(command, "num_inference_engines"),
        colocate_all=None if colocate is None else colocate.lower() in {"true", "1", "yes"},
    )


def stat_text() -> pl.Expr:
    """A quote text for an engine's newest sample, in the vLLM stat line's own words."""
    return pl.format(
        "vLLM engine {}: Avg generation throughput: {} tokens/s, Running: {} reqs, "
        "Waiting: {} reqs, GPU KV cache usage: {}%",
        pl.col("engine"),
        pl.col("last_gen").round(1),
        pl.col("last_running"),
        pl.col("last_waiting"),
        pl.col("last_kv").round(1),
    )


def engine_table(states: pl.DataFrame) -> Table:
    """The engines' window tuples as data, one row per engine."""
    columns = (
        "engine", "state", "samples", "window s", "running min", "running max", "waiting max",
        "KV% mean", "KV% max", "gen tok/s mean",
    )  # fmt: skip
    names = (
        "engine", "state", "samples", "span_s", "running_min", "running_max", "waiting_max",
        "kv_mean", "kv_max", "gen_mean",
    )  # fmt: skip
    rows = tuple(tuple(row) for row in states.select(names).iter_rows())
    return Table(title="engines over the newest window", columns=columns, rows=rows)


def fleet_line(states: pl.DataFrame) -> str:
    """One line for the fleet: engine states, waiting max, KV mean, running range, generation."""
    counts = dict(states.group_by("state").len().iter_rows())
    parts = ", ".join(f"{counts[s]} {s}" for s in STATE_ORDER if s in counts)
    stats = states.select(
        waiting=pl.col("waiting_max").max(),
        kv=pl.col("kv_mean").mean(),
        rmin=pl.col("running_min").min(),
        rmax=pl.col("running_max").max(),
        gen=pl.col("gen_mean").sum(),
    ).row(0, named=True)
    return (
        f"{states.height} engine(s): {parts}; waiting max {stats['waiting']}, "
        f"KV mean {_num(stats['kv'])}%, running {stats['rmin']}-{stats['rmax']}, "
        f"generation {_num(stats['gen'], 0)} tok/s total"
    )


def _num(value: float | None, digits: int = 1) -> str:
    return "?" if value is None else f"{value:.{digits}f}"
