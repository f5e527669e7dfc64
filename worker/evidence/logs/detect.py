"""Line classification: which lines matter, their prefixes stripped, their kind.

Cheap literal filters (`contains_any`) pick the few lines worth reading; regexes run only on that
subset. Prefixes removed: SGR colour codes, Iris's `[HH:MM:SS] task=/u/j/t | `, Ray's
`(Name pid=N, ip=X)` and `[repeated Nx across cluster]`. A loguru or vLLM header leaves `msg`.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from worker.evidence.logs.lines import WINDOW_LINES

__all__ = ["ERROR_RULES", "KIND_RULES", "evidence_lines", "strip_sgr"]

SGR: Final = r"\x1b\[[0-9;]*m"
# Whole-match patterns (group 0 only, so the regex engine can use its fast path).
_IRIS: Final = r"^\[\d\d:\d\d:\d\d\] task=\S+ \| ?"
_RAY: Final = r"^\((?:[^\s()]+ )?pid=\d+(?:, ip=[^\s()]+)?\) ?"
_LOGURU: Final = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \| *[A-Z]+ *\| \S+ - ?"
_VLLM: Final = (
    r"^(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?"
)
_REPEATED: Final = r"\[repeated \d+x across cluster\]\s*$"
TRACEBACK: Final = "Traceback (most recent call last)"

# (kind, literal the message must start with or contain, starts_with?)
KIND_RULES: Final[tuple[tuple[str, str, bool], ...]] = (
    ("mirror", "WANDB_MIRROR kind=", False),
    ("dict_start", "{'", True),
    ("timer", "Started: '", True),
    ("timer", "Finished: '", True),
    ("reward", "reward/", True),
    ("reward", "avg_final_rewards: ", False),
    ("engine", "Avg prompt throughput", False),
    ("step_progress", "Training Step Progress", False),
    ("buffer_progress", "Generation Buffer Progress", False),
    ("breakdown", "Exception breakdown: ", False),
    ("batch", "Batch generation ", False),
    ("boundary", "[iris setup] step 1/", True),
    ("scratch", "No checkpoint found", False),
    ("checkpoint_loaded", "Loading checkpoint from", False),
    ("resumed", "Resuming from global_step", False),
)

# (error kind, literal); the first that matches names the line.
ERROR_RULES: Final[tuple[tuple[str, str], ...]] = (
    ("cuda_oom", "CUDA out of memory"),
    ("cuda_oom", "OutOfMemoryError"),
    ("cuda_error", "CUDA error"),
    ("internal_assert", "INTERNAL ASSERT"),
    ("nccl_watchdog_timeout", "Watchdog caught collective operation timeout"),
    ("nccl_watchdog_stuck", "ProcessGroupNCCL's watchdog got stuck"),
    ("actor_died", "ActorDiedError"),
    ("worker_crashed", "WorkerCrashedError"),
    ("ray_task_error", "RayTaskError"),
    ("train_loop_failed", "Train loop failed"),
    ("config_override", "Could not override '"),
    ("trajectory_failed", "failed: "),
    ("shm_broadcast", "No available shared memory broadcast block"),
    ("image_pull_backoff", "ImagePullBackOff"),
    ("sandbox_error", "Failed to create sandbox"),
    ("sandbox_error", "DaytonaError"),
    ("sandbox_error", "SandboxBuildFailedError"),
    ("verifier_error", "VerifierTimeoutError"),
    ("verifier_error", "RewardFileNotFoundError"),
    ("verifier_error", "RewardFileEmptyError"),
    ("verifier_error", "VerifierOutputParseError"),
)

_INTEREST: Final[list[str]] = sorted(
    {lit for _, lit, _ in KIND_RULES}
    | {lit for _, lit in ERROR_RULES if lit != "failed: "}
    | {"': ", "Trajectory ", TRACEBACK}
)


def strip_sgr(expr: pl.Expr) -> pl.Expr:
    """`expr` without SGR colour codes."""
    return expr.str.replace_all(SGR, "")


def _flags(lines: pl.Series) -> pl.DataFrame:
    interest = lines.str.contains_any(_INTEREST)
    tb = lines.str.contains(TRACEBACK, literal=True)
    if not tb.any():
        return pl.DataFrame(
            {"interest": interest, "window": pl.repeat(False, len(lines), eager=True)}
        )
    idx = pl.int_range(pl.len(), dtype=pl.Int64)
    window = (idx - pl.when(pl.col("tb")).then(idx).forward_fill()) <= WINDOW_LINES
    frame = pl.DataFrame({"interest": interest, "tb": tb})
    return frame.select("interest", window=window.fill_null(False))


def _cut(frame: pl.DataFrame, column: str, pattern: str, into: str) -> pl.DataFrame:
    """Move the match of `pattern` at the start of `column` into `into` (null when absent)."""
    found = pl.col(column).str.extract(pattern, 0)
    frame = frame.with_columns(found.alias(into))
    rest = pl.col(column).str.slice(pl.col(into).str.len_chars().fill_null(0))
    return frame.with_columns(rest.alias(column))


def _strip_prefixes(frame: pl.DataFrame) -> pl.DataFrame:
    text = strip_sgr(pl.col("raw")).str.replace(_REPEATED, "").str.strip_chars_end()
    frame = _cut(frame.with_columns(text=text), "text", _IRIS, "_iris")
    frame = _cut(frame, "text", _RAY, "_ray")
    frame = _cut(frame.with_columns(msg=pl.col("text")), "msg", _LOGURU, "_loguru")
    frame = _cut(frame, "msg", _VLLM, "_vllm")
    iris, ray = pl.col("_iris"), pl.col("_ray")

    def clock(start: int) -> pl.Expr:
        return iris.str.slice(start, 2).cast(pl.Int32, strict=False)

    ldt = pl.col("_loguru").str.extract(r"^[\d-]+ [\d:.]+", 0)
    return frame.select(
        "idx",
        "window_only",
        "text",
        "msg",
        task=iris.str.extract(r"task=(\S+)", 1),
        tod=clock(1) * 3600 + clock(4) * 60 + clock(7),
        pid=ray.str.extract(r"pid=(\d+)", 1),
        ip=ray.str.extract(r"ip=([^\s()]+)", 1),
        ldt=ldt.str.to_datetime(
            "%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us", time_zone="UTC"
        ),
        vts=pl.col("_vllm").str.extract(r"\d\d-\d\d \d\d:\d\d:\d\d", 0),
    )


def _first_match(rules: list[tuple[pl.Expr, str]]) -> pl.Expr:
    """The label of the first rule whose test holds, else null."""
    return pl.coalesce([pl.when(test).then(pl.lit(label)) for test, label in rules])


def _kind_expr() -> pl.Expr:
    msg = pl.col("msg")
    cont = pl.col("text").str.starts_with(" '") & (msg == pl.col("text"))
    rules = [(cont, "dict_cont")]
    for kind, literal, starts in KIND_RULES:
        test = msg.str.starts_with(literal) if starts else msg.str.contains(literal, literal=True)
        rules.append((test, kind))
    return _first_match(rules)


def _error_expr() -> pl.Expr:
    msg = pl.col("msg")
    traj = msg.str.contains(r"Trajectory \S+ attempt \d+/\d+ failed")
    rules = [(msg.str.starts_with(TRACEBACK), "traceback")]
    for kind, literal in ERROR_RULES:
        test = traj if kind == "trajectory_failed" else msg.str.contains(literal, literal=True)
        rules.append((test, kind))
    return _first_match(rules)


def _classify(frame: pl.DataFrame) -> pl.DataFrame:
    only = pl.col("window_only")
    null_str = pl.lit(None, dtype=pl.String)
    return frame.with_columns(
        kind=pl.when(only).then(null_str).otherwise(_kind_expr()),
        err=pl.when(only).then(null_str).otherwise(_error_expr()),
        ldt=pl.when(only).then(None).otherwise(pl.col("ldt")),
        vts=pl.when(only).then(null_str).otherwise(pl.col("vts")),
        tod=pl.when(only).then(None).otherwise(pl.col("tod")),
        actor=pl.concat_str(
            pl.col("task").fill_null(""),
            pl.lit("|"),
            pl.col("pid").fill_null(""),
            pl.lit("@"),
            pl.col("ip").fill_null(""),
        ),
    )


def evidence_lines(lines: pl.Series) -> pl.DataFrame:
    """The lines worth reading, with `idx` (0-based in `lines`), prefixes stripped and classified.

    Columns: idx, window_only (kept only as a possible traceback end), text, task, tod, pid, ip,
    ldt, vts, msg, kind, err, actor.
    """
    frame = pl.DataFrame({"raw": lines}).with_row_index("idx").hstack(_flags(lines))
    frame = frame.filter(pl.col("interest") | pl.col("window"))
    frame = frame.with_columns(window_only=~pl.col("interest")).drop("interest", "window")
    frame = _strip_prefixes(frame)
    return _classify(frame)
