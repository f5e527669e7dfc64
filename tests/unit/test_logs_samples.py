"""The log parser on real sample logs (tests/fixtures/logs, values read off the files by hand)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl
import pytest

from worker.evidence.logs import parse_log_file

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"


def _parse(name: str, **kwargs: object) -> object:
    return parse_log_file(FIXTURES / name, name, **kwargs)  # type: ignore[arg-type]


def _value(metrics: pl.DataFrame, step: int, key: str) -> float:
    row = metrics.filter((pl.col("step") == step) & (pl.col("key") == key))
    assert row.height == 1, f"{key} at step {step}: {row}"
    return float(row.get_column("value")[0])


def test_ansi_ray_prefixed_mirror_gives_step_7_and_one_malformed() -> None:
    """The coloured, Ray-prefixed mirror record is read; the truncated one before it is counted."""
    tables = parse_log_file(
        FIXTURES / "training_metrics__ansi_ray_prefix_and_malformed.log", "a.log"
    )
    assert tables.metrics.get_column("step").unique().to_list() == [7]
    assert _value(tables.metrics, 7, "reward/avg_raw_reward") == pytest.approx(-0.9194)
    assert _value(tables.metrics, 7, "policy/policy_loss") == pytest.approx(2.77e-09)
    assert tables.summary.malformed == 1
    assert tables.summary.malformed_examples[0].startswith(
        "a.log:1: WANDB_MIRROR kind=train step=6"
    )
    assert tables.summary.records["wandb_mirror"] == 1


def test_skyrl_policy_dict_and_rewards_belong_to_step_one() -> None:
    """The unprefixed dict after `Finished: 'step'` and the earlier avg_final_rewards are step 1."""
    tables = parse_log_file(FIXTURES / "skyrl_gsm8k_yottalabs.log", "s.log")
    metrics = tables.metrics
    assert _value(metrics, 1, "policy/policy_entropy") == pytest.approx(0.36564826631365577)
    assert _value(metrics, 1, "loss/avg_final_rewards") == pytest.approx(0.13398437201976776)
    assert _value(metrics, 1, "policy/grad_norm") == pytest.approx(0.3702232241630554)
    assert _value(metrics, 2, "reward/avg_pass_at_5") == pytest.approx(0.6533203125)
    origins = set(metrics.get_column("origin").to_list())
    assert origins == {"policy_dict", "reward_line"}


def test_skyrl_phases_have_the_right_steps() -> None:
    """Timers up to `Finished: 'step'` are step 1; `generate` after `Started: 'step'` is 2."""
    phases = parse_log_file(FIXTURES / "skyrl_gsm8k_yottalabs.log", "s.log").phases
    by_phase = {(r["phase"], r["step"]): r["seconds"] for r in phases.iter_rows(named=True)}
    assert by_phase[("step", 1)] == pytest.approx(1331.13)
    assert by_phase[("policy_train", 1)] == pytest.approx(866.49)
    assert by_phase[("generate", 2)] == pytest.approx(78.47)
    assert ("generate", 1) not in by_phase


def test_skyrl_timestamps_are_utc_from_loguru() -> None:
    """A loguru line's own timestamp is its UTC timestamp."""
    timers = parse_log_file(FIXTURES / "skyrl_gsm8k_yottalabs.log", "s.log").timers
    first = timers.row(0, named=True)
    assert first["timestamp"] == datetime(2026, 3, 26, 14, 44, 59, 431000, tzinfo=UTC)
    assert first["line"] == 5


def test_iris_crashloop_gives_cuda_oom_errors_dated_from_reference_date() -> None:
    """Iris time-of-day lines take their date from reference_date."""
    tables = _parse("job_logs_crashloop.txt", reference_date=date(2026, 6, 20))
    errors = tables.errors  # type: ignore[attr-defined]
    assert errors.get_column("kind").to_list() == ["cuda_oom"] * 3
    assert errors.get_column("line").to_list() == [2, 4, 6]
    assert errors.get_column("timestamp")[0] == datetime(2026, 6, 20, 10, 12, 26, tzinfo=UTC)
    assert errors.get_column("text")[0].startswith("torch.OutOfMemoryError: CUDA out of memory")


def test_iris_healthy_counts_three_steps() -> None:
    """Three `Finished: 'step'` lines in a row are steps 1, 2 and 3."""
    phases = _parse("job_logs_healthy.txt").phases  # type: ignore[attr-defined]
    assert phases.get_column("step").to_list() == [1, 2, 3]
    assert phases.get_column("timestamp").null_count() == 3


def test_agentic_batches_match_the_upstream_totals() -> None:
    """Batch lines joined with their actor's breakdown give the totals MarinSkyRL asserts."""
    tables = parse_log_file(FIXTURES / "parse_skyrl__agentic_step_batch_errors.log", "b.log")
    expected = json.loads(
        (FIXTURES / "parse_skyrl__agentic_step_batch_errors.expected.json").read_text()
    )["1"]
    batches = tables.batches
    assert batches.height == expected["batch_errors/total_batches"]
    assert batches.get_column("total").sum() == expected["batch_errors/total_instances"]
    assert batches.get_column("successful").sum() == expected["batch_errors/total_successful"]
    assert batches.get_column("failed").sum() == expected["batch_errors/total_failed"]
    assert batches.get_column("masked").sum() == expected["batch_errors/total_masked"]
    counts = [json.loads(e)["DaytonaValidationError"] for e in batches.get_column("exceptions")]
    assert sum(counts) == expected["batch_errors/total_DaytonaValidationError"]
    assert _value(tables.metrics, 1, "batch_errors/total_failed") == 8


def test_legacy_console_dicts_use_their_global_step() -> None:
    """One-line console dicts are keyed by `trainer/global_step`."""
    tables = parse_log_file(FIXTURES / "parse_skyrl__legacy_python_dict.out", "d.out")
    wide = tables.metrics_wide()
    assert wide.get_column("step").to_list() == [20, 40, 60]
    assert wide.get_column("reward/avg_raw_reward").to_list() == [0.2, 0.8, 0.5]
    assert tables.summary.records["console_dict"] == 3


def test_eval_records_count_but_stay_out_of_metrics() -> None:
    """Eval mirror records are records but not training steps."""
    tables = parse_log_file(FIXTURES / "gate__train_plus_eval_lines.log", "g.log")
    assert tables.metrics.get_column("step").unique().to_list() == [1]
    assert tables.summary.records["wandb_mirror"] == 3
    assert _value(tables.metrics, 1, "reward/avg_raw_reward") == 0.25


def test_timing_keys_become_phases_when_no_timer_covers_them() -> None:
    """`timing/<phase>` keys fill PHASES for step 1."""
    phases = parse_log_file(FIXTURES / "parse_skyrl__timing_step1.out", "t.out").phases
    got = dict(zip(phases.get_column("phase"), phases.get_column("seconds"), strict=True))
    assert got == {
        "generate": 60.0,
        "policy_train": 28.0,
        "save_checkpoints": 45.0,
        "step": 100.0,
        "train_critic_and_policy": 30.0,
    }


def test_step_progress_line_is_recorded() -> None:
    """`Training Step Progress: 7 / 20` gives a progress row and the mirror step 7 TIS values."""
    tables = parse_log_file(FIXTURES / "watch__finelog_step7_tis.log", "w.log")
    row = tables.progress.row(0, named=True)
    assert (row["kind"], row["done"], row["total"]) == ("training_step", 7, 20)
    assert _value(tables.metrics, 7, "generate/tis/exact_match_fraction") == 0.975
