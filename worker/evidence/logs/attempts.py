"""Attempt boundaries: Iris's setup lines, and restarts the log shows by itself.

**Iris.** A boundary `[iris setup] step 1/2` of the first Iris task seen with one starts a new
attempt, unless no non-blank line precedes it (a file that starts with a boundary is attempt 0).

**In-log restart.** Hypothesis: a process that restarts without Iris's setup lines in the log (a
supervisor inside the container, a watcher whose log source drops them, a pod log) still shows
the restart, in this order: the old attempt ends with a death line (a traceback or Ray's
unhandled-error block, `Train loop failed`, an actor death, a worker crash, a CUDA or NCCL fault,
a config override error: `DEATH_KINDS`); then the process starts again and logs a start-up line
(`Started a local Ray instance`, `Connecting to existing Ray cluster`, `Ray cluster initialized`,
`No checkpoint found`, `Loading checkpoint from`, `Resuming from global_step`: `START_KINDS`)
either as the launcher (no process prefix: Ray's own start-up lines) or as the driver
(`DRIVER_ACTORS`, the Ray prefix `(skyrl_entrypoint pid=N)`) with a pid other than the driver's
when the death was logged. The first such start-up line after a death starts the new attempt.

What is no restart, and why:
- a new pid alone: engines, policy workers and helpers come and go within one attempt;
- a start-up line of another Ray actor (a policy worker loading its checkpoint);
- a start-up line without a death before it in the attempt (`Resuming from` logged by a running
  attempt: the driver never resumes in place, and a restart always follows an end);
- a death followed by a start-up line of the *same* driver pid: the process that logged the death
  is still the one logging (a caught and logged error);
- a replayed line (`replays`): a re-sent chunk shows old deaths and starts again.

A death without a start-up line after it is no boundary: the attempt may still be dying.
Steps, errors and metrics after the boundary belong to the new attempt.

Every expression is cumulative from the chunk's first line, seeded from the carried state, so a
chunked or incremental parse finds the same boundaries as one pass.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from worker.evidence.logs.state import ParserState

__all__ = ["DEATH_KINDS", "DRIVER_ACTORS", "START_KINDS", "advance", "with_starts"]

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
    """Add to `frame` (classified lines with `replayed`) `_start` (the line starts an attempt),
    `restart` (an in-log restart starts it) and the columns `advance` carries on (`_drv`,
    `_dpid`, `_dead`). `state` is not changed, but its attempt task is fixed when first seen."""
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
