"""The log parser on constructed logs: multi-line dicts, chunks, attempts, dates and errors."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl
import pytest

from worker.cli.tables import write_tables
from worker.evidence.logs import parse_job_logs, parse_log_file

RAY = "\x1b[36m(skyrl_entrypoint pid=8455, ip=10.0.0.1)\x1b[0m "
IRIS = "[10:00:0{}] task=/u/job/0 | "


def _write(tmp_path: Path, lines: list[str], name: str = "finelog.log") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _loguru(msg: str, second: int = 0) -> str:
    return (
        f"{RAY}2026-05-01 12:00:{second:02d}.000 | INFO     | skyrl.train.trainer:train:1 - {msg}"
    )


def _pprint_dict(step: int, reward: str) -> list[str]:
    return [
        _loguru("{'async/staleness_max': 0,"),
        f"{RAY} 'async/staleness_mean': '0.0000',",
        f"{RAY} 'reward/avg_raw_reward': '{reward}',",
        f"{RAY} 'trainer/global_step': {step}}}",
    ]


def test_pprint_dict_with_ray_prefixes_is_joined(tmp_path: Path) -> None:
    """A console dict pprint-ed over lines that each carry a Ray prefix is one record."""
    path = _write(tmp_path, ["noise", *_pprint_dict(3, "0.2174")])
    tables = parse_log_file(path, "finelog.log")
    wide = tables.metrics_wide()
    assert wide.get_column("step").to_list() == [3]
    assert wide.get_column("reward/avg_raw_reward").to_list() == [0.2174]
    assert wide.get_column("async/staleness_mean").to_list() == [0.0]
    assert tables.metrics.get_column("line").unique().to_list() == [2]


def _boundary_log() -> list[str]:
    lines = ["noise line"] * 5 + _pprint_dict(1, "0.1") + ["noise"] * 3
    lines += ["Traceback (most recent call last):", '  File "x.py", line 1, in f']
    lines += ["    raise ValueError('bad')", "ValueError: bad", *_pprint_dict(2, "0.2")]
    return lines


@pytest.mark.parametrize("chunk_bytes", [16, 64, 200, 1 << 20])
def test_dict_and_traceback_straddling_chunks_read_the_same(
    tmp_path: Path, chunk_bytes: int
) -> None:
    """Tiny chunks cut through dicts and tracebacks without changing the tables."""
    path = _write(tmp_path, _boundary_log())
    tables = parse_log_file(path, "f.log", chunk_bytes=chunk_bytes)
    assert tables.metrics_wide().get_column("reward/avg_raw_reward").to_list() == [0.1, 0.2]
    errors = tables.errors
    assert errors.get_column("kind").to_list() == ["traceback"]
    assert errors.get_column("text").to_list() == ["ValueError: bad"]
    assert errors.get_column("line").to_list() == [13]


def test_traceback_end_is_found_in_the_same_actor(tmp_path: Path) -> None:
    """Lines of another actor inside a traceback do not end it."""
    other = "\x1b[36m(AsyncVLLMInferenceEngine pid=7)\x1b[0m INFO 05-01 12:00:00 [x.py:1] hi"
    lines = [f"{RAY}Traceback (most recent call last):", other, f'{RAY}  File "a.py", line 3']
    lines.append(f"{RAY}RuntimeError: boom")
    tables = parse_log_file(_write(tmp_path, lines), "f.log")
    assert tables.errors.get_column("text").to_list() == ["RuntimeError: boom"]


def _attempts_log() -> list[str]:
    return [
        IRIS.format(0) + "[iris setup] step 1/2",
        IRIS.format(1) + 'WANDB_MIRROR kind=train step=1 metrics={"reward/x": 1.0}',
        IRIS.format(2) + 'WANDB_MIRROR kind=train step=2 metrics={"reward/x": 2.0}',
        IRIS.format(3) + "[iris setup] step 1/2",
        IRIS.format(4) + "Resuming from global_step: 1",
        IRIS.format(5) + 'WANDB_MIRROR kind=train step=2 metrics={"reward/x": 20.0}',
        IRIS.format(6) + "Finished: 'step', time cost: 3.00s",
    ]


def test_file_starting_with_a_boundary_is_attempt_zero(tmp_path: Path) -> None:
    """The first boundary, with nothing before it, keeps attempt 0; the second starts attempt 1."""
    tables = parse_log_file(_write(tmp_path, _attempts_log()), "f.log")
    resumes = tables.resumes
    assert resumes.get_column("kind").to_list() == [
        "attempt_boundary",
        "attempt_boundary",
        "resumed",
    ]
    assert resumes.get_column("attempt").to_list() == [0, 1, 1]
    assert resumes.get_column("step").to_list() == [None, None, 1]


def test_content_before_the_first_boundary_bumps_the_attempt(tmp_path: Path) -> None:
    """A line before the first boundary makes that boundary start attempt 1."""
    tables = parse_log_file(_write(tmp_path, ["hello", *_attempts_log()]), "f.log")
    assert tables.resumes.get_column("attempt").to_list() == [1, 2, 2]


def test_newest_attempt_wins_a_repeated_step(tmp_path: Path) -> None:
    """Step 2 logged by two attempts keeps the newer attempt's value."""
    tables = parse_log_file(_write(tmp_path, _attempts_log()), "f.log")
    metrics = tables.metrics.sort("step")
    assert metrics.get_column("value").to_list() == [1.0, 20.0]
    assert metrics.get_column("attempt").to_list() == [0, 1]
    assert tables.phases.get_column("step").to_list() == [3]


def test_explicit_step_beats_an_inferred_one(tmp_path: Path) -> None:
    """A mirror record wins over a reward line inferred to the same step, whatever the order."""
    lines = ["Started: 'step'", "reward/avg_raw_reward: 0.9", "Finished: 'step', time cost: 1.0s"]
    lines.append('WANDB_MIRROR kind=train step=1 metrics={"reward/avg_raw_reward": 0.5}')
    metrics = parse_log_file(_write(tmp_path, lines), "f.log").metrics
    assert metrics.select("step", "value", "origin").rows() == [(1, 0.5, "mirror")]


def test_iris_time_rolls_over_midnight(tmp_path: Path) -> None:
    """Iris times going back past midnight move to the next day after a dated anchor."""
    lines = [
        "[23:59:58] task=/u/j/0 | " + _loguru("Started: 'step'").replace("12:00:00", "23:59:58"),
        "[23:59:59] task=/u/j/0 | CUDA error: an illegal memory access",
        "[00:00:03] task=/u/j/0 | CUDA error: again",
    ]
    errors = parse_log_file(_write(tmp_path, lines), "f.log").errors
    assert errors.get_column("timestamp").to_list() == [
        datetime(2026, 5, 1, 23, 59, 59, tzinfo=UTC),
        datetime(2026, 5, 2, 0, 0, 3, tzinfo=UTC),
    ]


def test_vllm_stat_line_takes_its_year_from_the_reference_date(tmp_path: Path) -> None:
    """A vLLM stat line without a year gets one from the date anchor and an engine id."""
    line = (
        "\x1b[36m(AsyncVLLMInferenceEngine pid=287294, ip=10.128.26.194)\x1b[0m "
        "INFO 02-08 00:56:50 [loggers.py:248] Engine 000: Avg prompt throughput: 23.1 tokens/s, "
        "Avg generation throughput: 0.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
        "GPU KV cache usage: 0.2%, Prefix cache hit rate: 0.0%"
    )
    path = _write(tmp_path, [line])
    engines = parse_log_file(path, "f.log", reference_date=date(2026, 1, 5)).engines
    row = engines.row(0, named=True)
    assert row["engine"] == "287294@10.128.26.194/000"
    assert row["timestamp"] == datetime(2026, 2, 8, 0, 56, 50, tzinfo=UTC)
    assert (row["running"], row["waiting"], row["kv_cache_pct"]) == (1, 0, 0.2)
    assert row["prompt_tokens_per_s"] == 23.1


def test_literals_inside_an_iris_job_name_do_not_hide_lines(tmp_path: Path) -> None:
    """A job named `...-reward/0` still has its engine stat lines and timers read."""
    prefix = "[18:01:35] task=/ops/rl-zero-reward/0 | "
    engine = (
        "(AsyncVLLMInferenceEngine pid=7, ip=10.0.0.1) INFO 07-30 18:01:35 [loggers.py:248] "
        "Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
        "Running: 3 reqs, Waiting: 4 reqs, GPU KV cache usage: 5.0%, Prefix cache hit rate: 6.0%"
    )
    lines = [prefix + engine, prefix + "Finished: 'step', time cost: 2.00s"]
    tables = parse_log_file(_write(tmp_path, lines), "f.log", reference_date=date(2026, 7, 30))
    assert tables.engines.get_column("engine").to_list() == ["7@10.0.0.1/000"]
    assert tables.phases.get_column("seconds").to_list() == [2.0]


def test_error_kinds_are_recognised(tmp_path: Path) -> None:
    """Each notable error line gets its kind, with prefixes stripped from the text."""
    lines = [
        f"{RAY}ray.exceptions.ActorDiedError: The actor died unexpectedly",
        "[rank0]:[E ProcessGroupNCCL.cpp:1] Watchdog caught collective operation timeout: x",
        "Could not override 'trainer.foo'. Key 'foo' is not in struct",
        "Trajectory abc123 attempt 1/2 failed: AgentTimeoutError",
        "WARNING shm_broadcast.py:1 No available shared memory broadcast block found in 60s",
        "Back-off pulling image: ImagePullBackOff",
        _loguru("Train loop failed"),
    ]
    errors = parse_log_file(_write(tmp_path, lines), "f.log").errors
    assert errors.get_column("kind").to_list() == [
        "actor_died",
        "nccl_watchdog_timeout",
        "config_override",
        "trajectory_failed",
        "shm_broadcast",
        "image_pull_backoff",
        "train_loop_failed",
    ]
    assert errors.get_column("text")[0].startswith("ray.exceptions.ActorDiedError")


def test_mirror_values_nan_strings_and_booleans(tmp_path: Path) -> None:
    """Bare NaN/Infinity and quoted numbers are kept; strings, booleans and null are dropped."""
    line = (
        'WANDB_MIRROR kind=train step=4 metrics={"a": NaN, "b": -Infinity, "c": "0.5", '
        '"d": "text", "e": true, "f": null, "g": 1e-3}'
    )
    metrics = parse_log_file(_write(tmp_path, [line]), "f.log").metrics
    values = dict(zip(metrics.get_column("key"), metrics.get_column("value"), strict=True))
    assert sorted(values) == ["a", "b", "c", "g"]
    assert values["b"] == float("-inf") and values["c"] == 0.5 and values["g"] == 0.001


def test_malformed_lines_are_counted_and_quoted(tmp_path: Path) -> None:
    """Truncated mirror records and an unclosed console dict are malformed, never a crash."""
    lines = [
        'WANDB_MIRROR kind=train step=1 metrics={"a": 1',
        "WANDB_MIRROR kind=train step=",
        "{'reward/avg_raw_reward': 0.1,",
    ]
    summary = parse_log_file(_write(tmp_path, lines), "f.log").summary
    assert summary.malformed == 3
    assert summary.malformed_examples[1] == "f.log:2: WANDB_MIRROR kind=train step="


def test_job_dir_prefers_finelog_and_fills_engines_from_ray_logs(tmp_path: Path) -> None:
    """Pod logs do not add metrics when the finelog has them; Ray worker logs add engines."""
    _write(tmp_path, ['WANDB_MIRROR kind=train step=1 metrics={"r": 1.0}'])
    _write(tmp_path, ['WANDB_MIRROR kind=train step=9 metrics={"r": 9.0}'], "pod_logs/p.log")
    engine = (
        "INFO 02-08 00:56:50 [loggers.py:248] Engine 001: Avg prompt throughput: 1.0 tokens/s, "
        "Avg generation throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: 4 reqs, "
        "GPU KV cache usage: 5.0%, Prefix cache hit rate: 6.0%"
    )
    _write(tmp_path, [engine], "ray_vllm_logs/pod0/worker-abc-01-123.out")
    tables = parse_job_logs(tmp_path, reference_date=date(2026, 2, 1))
    assert tables is not None
    assert tables.metrics.get_column("step").to_list() == [1]
    assert tables.engines.get_column("engine").to_list() == [
        "ray_vllm_logs/pod0/worker-abc-01-123.out/001"
    ]
    assert "pod_logs/p.log" in tables.summary.files


def test_job_dir_without_finelog_reads_pod_logs(tmp_path: Path) -> None:
    """With no finelog, pod logs are the source; with no log at all the answer is None."""
    assert parse_job_logs(tmp_path) is None
    _write(tmp_path, ['WANDB_MIRROR kind=train step=9 metrics={"r": 9.0}'], "pod_logs/p.log")
    tables = parse_job_logs(tmp_path)
    assert tables is not None
    assert tables.metrics.get_column("source").to_list() == ["pod_logs/p.log"]


def test_write_tables_writes_wide_metrics_and_iso_timestamps(tmp_path: Path) -> None:
    """CSV metrics are wide and timestamps ISO-8601 UTC; empty tables are not written."""
    lines = [_loguru('WANDB_MIRROR kind=train step=2 metrics={"r": 1.5}'), _loguru("CUDA error: x")]
    tables = parse_log_file(_write(tmp_path, lines), "f.log")
    written = write_tables(tables, tmp_path / "out", "csv")
    assert sorted(p.name for p in written) == ["errors.csv", "metrics.csv"]
    assert pl.read_csv(tmp_path / "out" / "metrics.csv").rows() == [(2, 1.5)]
    errors = (tmp_path / "out" / "errors.csv").read_text()
    assert "2026-05-01T12:00:00.000000Z" in errors
    parquet = write_tables(tables, tmp_path / "pq", "parquet")
    assert pl.read_parquet(parquet[0]).columns == ["step", "r"]


def test_lines_after_a_traceback_keep_their_step(tmp_path: Path) -> None:
    """Traceback lines (read only as possible ends) do not blank the step of later lines."""
    lines = ["Started: 'step'", "Traceback (most recent call last):", '  File "x.py", line 1']
    lines += ["ValueError: bad", "Finished: 'step', time cost: 1.00s"]
    tables = parse_log_file(_write(tmp_path, lines), "f.log")
    assert tables.timers.get_column("step").to_list() == [1, 1]
    ending = _write(tmp_path, ["Finished: 'step'Traceback (most recent call last)"])
    assert parse_log_file(ending, "f.log", chunk_bytes=37).summary.lines == 1


def _stat_line(clock: str) -> str:
    return (
        f"INFO 05-01 {clock} [loggers.py:248] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
        "Avg generation throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: 0 reqs, "
        "GPU KV cache usage: 5.0%, Prefix cache hit rate: 6.0%"
    )


@pytest.mark.parametrize(
    ("clock", "attempt"),
    [("12:00:20", 1), ("12:00:19", 0), ("12:00:40", 1), ("11:59:00", 0)],
)
def test_rows_of_ray_worker_logs_join_the_attempt_they_were_logged_in(
    tmp_path: Path, clock: str, attempt: int
) -> None:
    """A Ray worker log marks no attempt: its engine and error rows take the finelog's attempt
    begun at or before them (the restart at 12:00:20: at it and after, the second; a second
    before, and before the first attempt, the first), so the gates count them with that
    attempt's engines and failures."""

    def iris(second: int, msg: str) -> str:
        return f"[12:00:{second:02d}] task=/u/job/0 | {msg}"

    _write(
        tmp_path,
        [
            iris(0, "[iris setup] step 1/2"),
            iris(10, _loguru("Started: 'step'", 10)),
            iris(20, "[iris setup] step 1/2"),
            iris(20, _loguru("No checkpoint found, starting training from scratch", 20)),
            iris(21, _loguru("Started: 'step'", 21)),
        ],
    )
    died = f"ERROR 05-01 {clock} [core.py:1] EngineCore encountered a fatal error."
    _write(tmp_path, [_stat_line(clock), died], "ray_vllm_logs/pod0/worker-abc-01-123.out")
    tables = parse_job_logs(tmp_path, reference_date=date(2026, 5, 1))
    assert tables is not None
    assert tables.timers.get_column("attempt").to_list() == [0, 1]
    ray = pl.col("source").str.starts_with("ray_vllm_logs")
    assert tables.engines.filter(ray).get_column("attempt").to_list() == [attempt]
    errors = tables.errors.filter(ray)
    assert errors.height == 1 and errors.get_column("attempt").to_list() == [attempt]
