"""Attempt boundaries: Iris's setup lines, and restarts the log shows by itself (docs/parsing.md).

Hypothesis: a process that restarts without Iris's setup lines still shows it, in order: a death
line (`DEATH_KINDS`, or a block start), then a start-up line (`START_KINDS`) of the launcher (no
process prefix) or of a driver (`DRIVER_ACTORS`) with a pid other than the driver's at the death.
A new pid alone, another actor's start-up line, a start without a death before it, the same
driver pid again, a replayed line: no restart. Every expression is cumulative from the chunk's
first line, seeded from the carried state."""

from __future__ import annotations

from typing import Final

import polars as pl

from worker.evidence.logs.state import ParserState

__all__ = ["DEATH_KINDS", "DRIVER_ACTORS", "advance", "with_starts"]

DRIVER_ACTORS: Final = ("skyrl_entrypoint", "main_base")
"""Ray actor names of a SkyRL driver: the remote task that runs the trainer."""
DEATH_KINDS: Final = (
    "traceback",
    "cuda_oom",
    "cuda_error",
    "internal_assert",
    "nccl_watchdog_timeout",
    "actor_died",
    "worker_crashed",
    "ray_task_error",
    "train_loop_failed",
    "config_override",
)
"""Line kinds (`detect`'s `err`) that can end a process; a block start (`tb`) is one too."""
START_KINDS: Final = ("ray_start", "scratch", "checkpoint_loaded", "resumed")
"""Line kinds (`detect`'s `kind`) a process logs once, while it starts."""
_ACTOR_NAME: Final = r"[(\[]([\w.-]+) pid=\d+"
_ENDS_IN_PROCESS: Final = r"[)\]]$"


def _attempt_task(frame: pl.DataFrame, state: ParserState) -> str | None:
    """The Iris task whose boundaries start attempts: the state's, else the first a boundary of
    `frame` names ("" for a boundary without one), else None (no boundary seen yet)."""
    if state.attempt_task is not None:
        return state.attempt_task
    tasks = frame.filter(pl.col("kind") == "boundary").get_column("task")
    return (tasks[0] or "") if len(tasks) else None


def _iris_starts(frame: pl.DataFrame, state: ParserState) -> pl.Expr:
    first = state.first_content if state.first_content is not None else 0
    line = pl.col("idx").cast(pl.Int64) + state.line + 1
    task = _attempt_task(frame, state) or ""
    starts = (pl.col("kind") == "boundary") & (pl.col("task").fill_null("") == task)
    return (starts & (line > first)).fill_null(False)


def _lit(value: str | None) -> pl.Expr:
    return pl.lit(value, dtype=pl.String)


def _drivers(frame: pl.DataFrame) -> pl.Series:
    """The process prefixes of `frame` whose first actor is a driver (read once per prefix)."""
    prefixes = frame.get_column("prefix").fill_null("").unique()
    return prefixes.filter(prefixes.str.extract(_ACTOR_NAME, 1).is_in(DRIVER_ACTORS))


def with_starts(frame: pl.DataFrame, state: ParserState) -> pl.DataFrame:
    """Add `_start` (the line starts an attempt), `restart` (an in-log restart starts it) and
    what `advance` carries on (`_drv`, `_dpid`, `_dead`); the attempt task is fixed when seen."""
    if state.attempt_task is None:
        state.attempt_task = _attempt_task(frame, state)
    usable = ~pl.col("window_only") & ~pl.col("replayed")
    pid, prefix = pl.col("pid"), pl.col("prefix").fill_null("")
    driver = prefix.is_in(_drivers(frame).implode()) & pid.is_not_null()
    launcher = pid.is_null() & ~prefix.str.contains(_ENDS_IN_PROCESS)
    death = usable & (pl.col("err").is_in(DEATH_KINDS) | pl.col("tb")).fill_null(False)
    start_line = usable & pl.col("kind").is_in(START_KINDS).fill_null(False)
    drv = pl.when(usable & driver).then(pid).forward_fill().fill_null(_lit(state.driver_pid))
    frame = frame.with_columns(_drv=drv, _iris=_iris_starts(frame, state))
    dpid = pl.when(death).then(pl.col("_drv").fill_null("")).forward_fill()
    frame = frame.with_columns(_dpid=dpid.fill_null(_lit(state.death_pid)))
    # null `_dpid`: no death yet; "": no driver pid known at the death (any pid is another)
    qualifies = start_line & (launcher | (driver & pid.ne_missing(pl.col("_dpid"))))
    # True at a death, False at a start: whether a death came after the last start, at each line
    event = pl.when(death).then(True).when(qualifies | pl.col("_iris")).then(False)
    dead = event.forward_fill().fill_null(state.death_pending)
    frame = frame.with_columns(_dead=dead, _qualifies=qualifies)
    before = pl.col("_dead").shift(1).fill_null(state.death_pending)
    restart = (pl.col("_qualifies") & before).fill_null(False)
    frame = frame.with_columns(restart=restart)
    return frame.with_columns(_start=pl.col("_iris") | pl.col("restart")).drop(
        "_iris", "_qualifies"
    )


def _last(frame: pl.DataFrame, column: str) -> object:
    return frame.get_column(column)[-1]


def advance(frame: pl.DataFrame, state: ParserState) -> None:
    """Move the driver pid, the pid at the last death and the pending death past `frame`."""
    if frame.is_empty():
        return
    drv, dpid = _last(frame, "_drv"), _last(frame, "_dpid")
    state.driver_pid = drv if isinstance(drv, str) else state.driver_pid
    state.death_pid = dpid if isinstance(dpid, str) else state.death_pid
    state.death_pending = bool(_last(frame, "_dead"))
