"""The trial reader: Harbor and terminal-bench result files into the TRIALS table."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from worker.evidence import schema
from worker.evidence.paths import BundleFiles
from worker.evidence.trials import read_trials, verifier_not_run

FIXTURES = Path(__file__).parents[1] / "fixtures"
TB = FIXTURES / "terminal-bench"
HARBOR = FIXTURES / "harbor"


def job_with(tmp_path: Path, sample: str) -> Path:
    """A job directory whose trace_jobs/ is a copy of a Harbor sample directory."""
    job = tmp_path / "job"
    shutil.copytree(HARBOR / sample, job / "trace_jobs")
    return job


def one_row(job: Path) -> dict[str, Any]:
    tables = read_trials(job)
    assert tables is not None
    assert tables.unreadable == ()
    assert tables.trials.height == 1
    row: dict[str, Any] = tables.trials.row(0, named=True)
    return row


def tb_job(tmp_path: Path, *samples: str) -> Path:
    """A job directory with each terminal-bench sample at trace_jobs/<task>/<trial>/results.json."""
    job = tmp_path / "job"
    for sample in samples:
        data = json.loads((TB / f"tb_trial_{sample}.results.json").read_text())
        trial = job / "trace_jobs" / data["task_id"] / data["trial_name"]
        trial.mkdir(parents=True)
        shutil.copy(TB / f"tb_trial_{sample}.results.json", trial / "results.json")
    return job


def tb_row(tmp_path: Path, sample: str) -> dict[str, Any]:
    return one_row(tb_job(tmp_path, sample))


# --- terminal-bench ---------------------------------------------------------------------------


def test_tb_agent_timeout_unresolved(tmp_path: Path) -> None:
    """An unresolved agent timeout: reward 0, exception agent_timeout, null tokens stay null."""
    row = tb_row(tmp_path, "agent_timeout_unresolved")
    assert row["trial_name"] == "blind-maze-explorer-5x5.1-of-1.openhands-sonnet"
    assert row["task_name"] == "blind-maze-explorer-5x5"
    assert (row["reward"], row["exception_type"], row["format"]) == (
        0.0,
        "agent_timeout",
        "terminal-bench",
    )
    assert (row["n_input_tokens"], row["n_output_tokens"]) == (None, None)
    # agent 20:35:17.120229 -> 20:55:17.187393; test 20:55:18.681978 -> 20:55:22.285056
    assert row["agent_execution_s"] == pytest.approx(1200.067164)
    assert row["verifier_s"] == pytest.approx(3.603078)
    assert row["environment_setup_s"] == pytest.approx(5.377635)
    assert row["agent_setup_s"] is None
    assert row["started_at"] == datetime(2025, 7, 11, 20, 35, 11, 742594, tzinfo=UTC)


def test_tb_resolved_unset(tmp_path: Path) -> None:
    """A resolved trial with failure_mode `unset` has reward 1 and no exception."""
    row = tb_row(tmp_path, "resolved_unset")
    assert (row["reward"], row["exception_type"]) == (1.0, None)
    assert (row["n_input_tokens"], row["n_output_tokens"]) == (0, 0)
    assert row["status"] == "finished"


def test_tb_parse_error(tmp_path: Path) -> None:
    """is_resolved null gives a null reward; the failure mode parse_error is the exception."""
    row = tb_row(tmp_path, "parse_error")
    assert (row["reward"], row["exception_type"]) == (None, "parse_error")


def test_tb_test_timeout(tmp_path: Path) -> None:
    """A test timeout keeps a null reward and its ten-minute verifier time."""
    row = tb_row(tmp_path, "test_timeout")
    assert (row["reward"], row["exception_type"]) == (None, "test_timeout")
    assert row["verifier_s"] == pytest.approx(600.231946)


def test_tb_source_is_relative_to_the_job(tmp_path: Path) -> None:
    """Each row quotes its result file relative to the job directory."""
    tables = read_trials(tb_job(tmp_path, "parse_error", "resolved_unset"))
    assert tables is not None
    assert tables.directory == "trace_jobs"
    assert tables.trials["source"].to_list() == [
        "trace_jobs/blind-maze-explorer-algorithm.easy/"
        "blind-maze-explorer-algorithm.easy.1-of-1.openhands-sonnet/results.json",
        "trace_jobs/cron-broken-network/cron-broken-network.1-of-1.openhands-sonnet/results.json",
    ]


def test_a_run_level_results_file_is_not_a_trial(tmp_path: Path) -> None:
    """A results.json above trial directories (a run aggregate) is skipped."""
    job = tb_job(tmp_path, "resolved_unset")
    (job / "trace_jobs" / "results.json").write_text('{"results": [], "accuracy": 1.0}')
    assert read_trials(job) is not None
    assert one_row(job)["reward"] == 1.0


# --- Harbor -----------------------------------------------------------------------------------


def test_harbor_nested_job_trial(tmp_path: Path) -> None:
    """A Harbor trial nested under job/ gives reward, exception, turns and tokens."""
    row = one_row(job_with(tmp_path, "behavior__harbor_jobs"))
    assert row["trial_name"] == "trial-1"  # no trial_name in the file: the directory name
    assert row["task_name"] == "terminal-bench/sanitize-git-repo"
    assert (row["reward"], row["exception_type"], row["n_turns"]) == (0.0, "AgentTimeoutError", 3)
    assert (row["n_input_tokens"], row["n_output_tokens"]) == (98024, 20)
    assert row["started_at"] == datetime(2026, 8, 12, 21, 28, 45, tzinfo=UTC)
    assert row["finished_at"] is None
    assert row["source"] == "trace_jobs/job/trial-1/result.json"
    assert row["format"] == "harbor"


def test_harbor_minimal_result(tmp_path: Path) -> None:
    """The minimal result gives reward 1 and three turns, with phases null."""
    row = one_row(job_with(tmp_path, "parse_skyrl__trace_jobs_min"))
    assert (row["trial_name"], row["task_name"], row["reward"], row["n_turns"]) == (
        "trial-1",
        "task-1",
        1.0,
        3,
    )
    assert row["environment_setup_s"] is None
    assert row["exception_type"] is None


def test_harbor_phase_seconds(tmp_path: Path) -> None:
    """Phase start/finish pairs become seconds per phase."""
    row = one_row(job_with(tmp_path, "parse_skyrl__trace_jobs_phases"))
    phases = [row[f"{p}_s"] for p in ("environment_setup", "agent_setup", "agent_execution")]
    assert phases == [100.0, 20.0, 60.0]
    assert row["verifier_s"] == 10.0
    assert row["finished_at"] == datetime(2026, 1, 1, 0, 3, 20, tzinfo=UTC)


def test_simple_rollout_shape(tmp_path: Path) -> None:
    """The simple rollout result reads result.reward and counts steps as turns."""
    row = one_row(job_with(tmp_path, "behavior__rollouts_simple"))
    assert (row["trial_name"], row["task_name"], row["reward"], row["n_turns"]) == (
        "task-1",
        "task-1",
        1.0,
        3,
    )
    assert row["format"] == "simple"


def test_llm_request_time_is_summed(tmp_path: Path) -> None:
    """api_request_times_msec are summed into llm_request_s."""
    trial = tmp_path / "job" / "trace_jobs" / "t__abc1234"
    trial.mkdir(parents=True)
    result = {"agent_result": {"metadata": {"api_request_times_msec": [1500, 2500.5]}}}
    (trial / "result.json").write_text(json.dumps(result))
    assert one_row(tmp_path / "job")["llm_request_s"] == pytest.approx(4.0005)


def test_exception_txt_fills_a_missing_exception_info(tmp_path: Path) -> None:
    """The last line of exception.txt gives the type and message when result.json has none."""
    trial = tmp_path / "job" / "trace_jobs" / "task__abc1234"
    trial.mkdir(parents=True)
    (trial / "result.json").write_text('{"task_name": "task", "verifier_result": null}')
    (trial / "exception.txt").write_text(
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "daytona.common.errors.DaytonaError: Failed to create sandbox: "
        "Total CPU limit exceeded. Maximum allowed: 400\n\n"
    )
    row = one_row(tmp_path / "job")
    assert row["exception_type"] == "DaytonaError"
    assert row["exception_message"] == (
        "Failed to create sandbox: Total CPU limit exceeded. Maximum allowed: 400"
    )
    assert row["reward"] is None


def test_config_only_directory_is_running(tmp_path: Path) -> None:
    """A trial directory with only config.json is a running row with null results."""
    trial = tmp_path / "job" / "trace_jobs" / "task__run0000"
    trial.mkdir(parents=True)
    (trial / "config.json").write_text("{}")
    row = one_row(tmp_path / "job")
    assert (row["trial_name"], row["status"], row["reward"]) == ("task__run0000", "running", None)
    assert row["source"] == "trace_jobs/task__run0000/config.json"


def test_corrupt_result_is_listed_as_unreadable(tmp_path: Path) -> None:
    """A result.json cut off mid-write is listed with its reason; other trials still read."""
    job = job_with(tmp_path, "parse_skyrl__trace_jobs_min")
    broken = job / "trace_jobs" / "trial-2"
    broken.mkdir()
    (broken / "result.json").write_text('{"task_name": "task-2", "verifier')
    tables = read_trials(job)
    assert tables is not None
    assert tables.trials.height == 1
    assert len(tables.unreadable) == 1
    assert tables.unreadable[0].startswith("trace_jobs/trial-2/result.json: JSONDecodeError")


def test_result_that_is_not_an_object_is_unreadable(tmp_path: Path) -> None:
    """A result.json holding a list is unreadable, not a crash."""
    trial = tmp_path / "job" / "trace_jobs" / "t"
    trial.mkdir(parents=True)
    (trial / "result.json").write_text("[]")
    tables = read_trials(tmp_path / "job")
    assert tables is not None
    assert tables.unreadable == ("trace_jobs/t/result.json: not a JSON object but list",)


def test_schema_is_exactly_trials(tmp_path: Path) -> None:
    """The frame has the TRIALS schema, column for column, even with mixed formats."""
    job = tb_job(tmp_path, "resolved_unset")
    shutil.copytree(HARBOR / "parse_skyrl__trace_jobs_phases", job / "trace_jobs" / "harbor")
    tables = read_trials(job)
    assert tables is not None
    assert dict(tables.trials.schema) == schema.TRIALS
    assert tables.trials.height == 2


def test_sync_selection_and_skipped_objects_are_kept(tmp_path: Path) -> None:
    """The side files are kept whatever their shape."""
    job = job_with(tmp_path, "parse_skyrl__trace_jobs_min")
    (job / "trace_jobs" / "sync_selection.json").write_text('{"selected": ["trial-1"]}')
    (job / "trace_jobs" / "skipped_objects.json").write_text('[{"key": "a", "reason": "size"}]')
    tables = read_trials(job)
    assert tables is not None
    assert tables.sync_selection == {"selected": ["trial-1"]}
    assert tables.skipped_objects == ({"key": "a", "reason": "size"},)
    assert tables.trials.height == 1


def test_absent_trials_directory_is_none(tmp_path: Path) -> None:
    """No trace_jobs/ means no trial tables at all."""
    (tmp_path / "job").mkdir()
    assert read_trials(tmp_path / "job") is None


def test_empty_trials_directory_gives_an_empty_table(tmp_path: Path) -> None:
    """An empty trace_jobs/ gives a table with no rows and the TRIALS schema."""
    (tmp_path / "job" / "trace_jobs").mkdir(parents=True)
    tables = read_trials(tmp_path / "job")
    assert tables is not None
    assert tables.trials.is_empty()
    assert dict(tables.trials.schema) == schema.TRIALS


def test_explicit_trials_dir_outside_the_job(tmp_path: Path) -> None:
    """An explicit trials directory elsewhere (--trace-jobs-dir) is read as its own root."""
    (tmp_path / "job").mkdir()
    shutil.copytree(HARBOR / "parse_skyrl__trace_jobs_min", tmp_path / "traces")
    tables = read_trials(tmp_path / "job", tmp_path / "traces")
    assert tables is not None
    assert tables.trials["reward"].to_list() == [1.0]
    assert tables.trials["source"][0].endswith("traces/trial-1/result.json")


def test_trace_jobs_symlink_leaving_the_job_is_refused(tmp_path: Path) -> None:
    """A trace_jobs/ that links outside the job directory is not read and is recorded."""
    (tmp_path / "job").mkdir()
    shutil.copytree(HARBOR / "parse_skyrl__trace_jobs_min", tmp_path / "traces")
    (tmp_path / "job" / "trace_jobs").symlink_to(tmp_path / "traces")
    files = BundleFiles(tmp_path / "job")
    assert read_trials(tmp_path / "job", files=files) is None
    assert len(files.refused) == 1


def test_result_symlink_leaving_the_job_is_skipped(tmp_path: Path) -> None:
    """A result.json linking outside the job directory is not read."""
    trial = tmp_path / "job" / "trace_jobs" / "t"
    trial.mkdir(parents=True)
    (tmp_path / "foreign.json").write_text('{"verifier_result": {"rewards": {"reward": 1}}}')
    (trial / "result.json").symlink_to(tmp_path / "foreign.json")
    files = BundleFiles(tmp_path / "job")
    tables = read_trials(tmp_path / "job", files=files)
    assert tables is not None
    assert tables.trials.is_empty()
    assert len(files.refused) == 1


# --- the verifier's output ------------------------------------------------------------------------

PYTEST_NO_TESTS = """collected 0 items

============================ no tests ran in 0.00s =============================
ERROR: file or directory not found: tests/
"""  # NVlabs/RoboLab#17, verbatim
# bcmi/libcom#44, verbatim
PYTHON_NO_SCRIPT = (
    "python: can't open file 'test_objectstitch.py': [Errno 2] No such file or directory"
)
TEST_ON_MISSING_OUTPUT = (
    "E       FileNotFoundError: [Errno 2] No such file or directory: "
    "'fishtaco_out_stricter_FDR_filter_STAT_run_log_SCORE_wilcoxon_ASSESSMENT_single_taxa.tab'\n"
    "1 failed in 0.05s\n"
)  # borenstein-lab/fishtaco#13's test error on an output file, in pytest's failure summary


@pytest.mark.parametrize(
    ("output", "line"),
    [
        (PYTEST_NO_TESTS, "ERROR: file or directory not found: tests/"),
        (PYTHON_NO_SCRIPT, PYTHON_NO_SCRIPT),
        ("E   FileNotFoundError: [Errno 2] No such file or directory: '/tests/expected.json'",
         "E   FileNotFoundError: [Errno 2] No such file or directory: '/tests/expected.json'"),
        (TEST_ON_MISSING_OUTPUT, None),
        ("collected 3 items\n3 passed in 0.20s\n", None),
    ],
    ids=["pytest-path-missing", "script-missing", "tests-file-missing", "output-missing", "pass"],
)  # fmt: skip
def test_the_verifier_line_that_says_no_test_ran(output: str, line: str | None) -> None:
    """A missing test path, test script or file of the tests directory means no test ran (the
    line is kept); a test failing on the agent's missing output file is a test that ran and
    failed, and a passing run says nothing (None) — the boundary between the environment's
    fault and the model's."""
    assert verifier_not_run(output) == line


def test_a_harbor_trials_verifier_output_is_read(tmp_path: Path) -> None:
    """`verifier/test-stdout.txt` beside a Harbor result gives the row its verifier_error and the
    file it came from; a trial without one has neither."""
    job = tmp_path / "job"
    for name, output in (("broken__0000001", PYTEST_NO_TESTS), ("fine__0000002", None)):
        trial = job / "trace_jobs" / name
        (trial / "verifier").mkdir(parents=True)
        (trial / "result.json").write_text(json.dumps({"trial_name": name, "task_name": name}))
        if output is not None:
            (trial / "verifier" / "test-stdout.txt").write_text(output)
    tables = read_trials(job)
    assert tables is not None and tables.unreadable == ()
    rows = {r["trial_name"]: r for r in tables.trials.iter_rows(named=True)}
    broken = rows["broken__0000001"]
    assert broken["verifier_error"] == "ERROR: file or directory not found: tests/"
    assert broken["verifier_source"] == "trace_jobs/broken__0000001/verifier/test-stdout.txt"
    assert rows["fine__0000002"]["verifier_error"] is None
    assert tables.trials.height == 2  # the verifier directory is no trial of its own
