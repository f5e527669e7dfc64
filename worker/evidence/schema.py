"""The column schemas of every evidence table, defined once.

Every row keeps its provenance so a gate can quote it: `source` (path relative to the job
directory, e.g. `finelog.log` or `pod_logs/x.log`), `line` (1-based), `timestamp` (UTC, null when
the line carries none and none could be inferred) and `attempt` (0-based attempt index in that file,
counted from Iris's setup lines and in-log restarts: `worker.evidence.logs.attempts`).

Tables built by the log parser (`worker.evidence.logs`):
- METRICS: long form, one row per (step, key) after stitching across attempts (newest attempt
  wins). `origin` names the serialization the value came from.
- TIMERS: every `Started:` / `Finished:` phase timer line; `step` is the step it ran in.
- PHASES: `step, phase, seconds` (finished timers, plus `timing/<phase>` metric keys for steps and
  phases no timer line covered).
- ENGINES: one row per vLLM stat line.
- PROGRESS: `Training Step Progress` and `Generation Buffer Progress` counters.
- BATCHES: agentic `Batch generation ...` lines with the preceding `Exception breakdown`.
- ERRORS: every failure a log shows (tracebacks, final exception lines, known failure lines, exit
  records) and notable lines; `kind` from ERROR_KINDS, meaning from the failure catalogue
  (`worker.evidence.failures`); `line` is the row's first line, `last_line` its last.
- RESUMES: attempt boundaries (Iris's setup line, or the first line of an in-log restart) and
  checkpoint resume lines.
Tables built by the trial reader (`worker.evidence.trials`): TRIALS.
"""

from __future__ import annotations

from typing import Final

import polars as pl

__all__ = [
    "BATCHES",
    "ENGINES",
    "ERRORS",
    "ERROR_KINDS",
    "HARD_ERROR_KINDS",
    "METRICS",
    "PHASES",
    "PROGRESS",
    "PROVENANCE",
    "RESUMES",
    "TIMERS",
    "TRIALS",
    "empty",
]

TS: Final = pl.Datetime("us", "UTC")

PROVENANCE: Final[dict[str, pl.DataType]] = {
    "source": pl.String(),
    "line": pl.Int64(),
    "timestamp": TS,
    "attempt": pl.Int32(),
}

METRICS: Final[dict[str, pl.DataType]] = {
    "step": pl.Int64(),
    "key": pl.String(),
    "value": pl.Float64(),
    # mirror | console | policy_dict | reward_line | batch
    "origin": pl.String(),
    **PROVENANCE,
}

TIMERS: Final[dict[str, pl.DataType]] = {
    "event": pl.String(),  # started | finished
    "phase": pl.String(),
    "seconds": pl.Float64(),  # null for started
    "step": pl.Int64(),  # null when it cannot be inferred
    **PROVENANCE,
}

PHASES: Final[dict[str, pl.DataType]] = {
    "step": pl.Int64(),
    "phase": pl.String(),
    "seconds": pl.Float64(),
    **PROVENANCE,
}

ENGINES: Final[dict[str, pl.DataType]] = {
    "timestamp": TS,
    "engine": pl.String(),  # "<pid>@<ip>/<engine index>", e.g. "287294@10.128.26.194/000"
    "running": pl.Int64(),
    "waiting": pl.Int64(),
    "kv_cache_pct": pl.Float64(),
    "generation_tokens_per_s": pl.Float64(),
    "prompt_tokens_per_s": pl.Float64(),
    "prefix_cache_hit_pct": pl.Float64(),
    "source": pl.String(),
    "line": pl.Int64(),
    "attempt": pl.Int32(),
}

PROGRESS: Final[dict[str, pl.DataType]] = {
    "kind": pl.String(),  # training_step | generation_buffer
    "done": pl.Int64(),
    "total": pl.Int64(),
    "elapsed_s": pl.Float64(),  # tqdm elapsed, when the bar shows it
    **PROVENANCE,
}

BATCHES: Final[dict[str, pl.DataType]] = {
    "step": pl.Int64(),
    "successful": pl.Int64(),
    "total": pl.Int64(),
    "failed": pl.Int64(),
    "masked": pl.Int64(),
    "exceptions": pl.String(),  # JSON object {exception type: count}, "{}" when none
    **PROVENANCE,
}

HARD_ERROR_KINDS: Final[tuple[str, ...]] = (
    "traceback",  # text = the exception line that ends the traceback
    "cuda_oom",
    "cuda_error",
    "internal_assert",
    "ray_task_error",
    "actor_died",
    "worker_crashed",
    "train_loop_failed",
    "config_override",
    "nccl_watchdog_timeout",
)
"""The kinds that can end a process: a failure signature is read from the first of them."""

ERROR_KINDS: Final[tuple[str, ...]] = (
    *HARD_ERROR_KINDS,
    "nccl_watchdog_stuck",
    "trajectory_failed",
    "verifier_error",
    "sandbox_error",
    "shm_broadcast",  # benign noise, kept so a gate can say it saw and discounted it
    "image_pull_backoff",  # benign when transient
    # from the failure catalogue (worker/evidence/failures/catalogue.toml)
    "engine_dead",
    "engine_error",
    "engine_config",
    "engine_preemption",
    "ray_unhandled",
    "host_oom",
    "node_died",
    "worker_died",
    "nccl_error",
    "nccl_network",
    "nccl_abort",
    "fatal_abort",
    "config_error",
    "job_error",
    "teardown",
    "preempted",
    "exit",
    "exception",  # a final `Type: message` line no catalogue entry knows
)

ERRORS: Final[dict[str, pl.DataType]] = {
    "source": pl.String(),
    "line": pl.Int64(),  # the first line: the traceback header for a traceback
    "timestamp": TS,
    "kind": pl.String(),
    "text": pl.String(),  # the final line: a traceback's exception line
    "attempt": pl.Int32(),
    "exc_type": pl.String(),  # last dotted name of the exception (a Ray wrapper's inner type)
    "message": pl.String(),  # the exception's message, or the line without its prefixes
    "component": pl.String(),  # policy | engine | driver | sandbox | controller | configuration
    "prefix": pl.String(),  # the first line's process prefixes `(Name pid=N, ip=X)`: who logged it
    "last_line": pl.Int64(),
    "entry": pl.String(),  # the catalogue entry id, null when none matched
    "failure_class": pl.String(),  # hard | transient | benign | configuration; null: uncatalogued
    "signature": pl.String(),  # exception type + normalised message (failures.signature)
    "specific": pl.Boolean(),  # the signature may stand for a failure (not a bare exit record)
}

RESUMES: Final[dict[str, pl.DataType]] = {
    "kind": pl.String(),  # attempt_boundary | scratch | checkpoint_loaded | resumed
    "step": pl.Int64(),  # resumed global step, when the line names one
    "text": pl.String(),
    **PROVENANCE,
}

TRIALS: Final[dict[str, pl.DataType]] = {
    "trial_name": pl.String(),
    "task_name": pl.String(),
    "status": pl.String(),  # finished | running (config.json only)
    "reward": pl.Float64(),
    "exception_type": pl.String(),
    "exception_message": pl.String(),
    "n_turns": pl.Int64(),
    "environment_setup_s": pl.Float64(),
    "agent_setup_s": pl.Float64(),
    "agent_execution_s": pl.Float64(),
    "verifier_s": pl.Float64(),
    "llm_request_s": pl.Float64(),  # sum of agent_result.metadata.api_request_times_msec
    "n_input_tokens": pl.Int64(),
    "n_output_tokens": pl.Int64(),
    "started_at": TS,
    "finished_at": TS,
    "format": pl.String(),  # harbor | terminal-bench
    "source": pl.String(),  # path of the result file relative to the job directory
    # the verifier output's line saying the tests could not run (trials.VERIFIER_NOT_RUN), its file
    "verifier_error": pl.String(),
    "verifier_source": pl.String(),
}


def empty(schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """An empty frame with the given schema."""
    return pl.DataFrame(schema=schema)
