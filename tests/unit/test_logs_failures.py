"""The log parser's failure rows on crafted logs: prefixes, blocks, wrappers, chunks, the cache."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from tests import factories
from tests.unit.test_frozen import as_format_1
from worker.cli.tables import write_tables
from worker.evidence import schema
from worker.evidence.case import Evidence
from worker.evidence.frozen import freeze, thaw
from worker.evidence.log_cache import LogCache
from worker.evidence.logs import parse_job_logs, parse_log_file
from worker.evidence.logs.rules import WINDOW_LINES
from worker.evidence.model import LogTables

IRIS = "[10:00:00] task=/u/job/0 | "
RAY = "\x1b[36m(skyrl_entrypoint pid=8455, ip=10.0.0.1)\x1b[0m "


def _errors(tmp_path: Path, lines: list[str], **kwargs: int) -> pl.DataFrame:
    path = tmp_path / "finelog.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return parse_log_file(path, "finelog.log", **kwargs).errors.sort("line")


def _traceback(final: str, prefix: str = "", frames: int = 1) -> list[str]:
    body = [f'{prefix}  File "/app/x.py", line {n}, in f' for n in range(frames)]
    return [f"{prefix}Traceback (most recent call last):", *body, f"{prefix}{final}"]


@pytest.mark.parametrize(
    ("prefix", "component"),
    [
        ("[AsyncVLLMInferenceEngine pid=7] [EngineCore_DP0 pid=9] ", "engine"),
        ("(AsyncVLLMInferenceEngine pid=7, ip=10.1.2.3) (EngineCore_DP0 pid=9) ", "engine"),
        ("(FSDPPolicyWorker pid=5, ip=10.0.0.2) ", "policy"),
        ("[rank3]: ", "policy"),
        ("(raylet, ip=10.0.0.3) ", "controller"),
        (IRIS, "driver"),
        ("2026-05-01T12:00:00.123456789Z ", "driver"),
        ("trainer-1  | ", "driver"),
        ("node-7:812:900 [3] ", "driver"),
    ],
)
def test_process_prefixes_are_stripped(tmp_path: Path, prefix: str, component: str) -> None:
    """Behind any process prefix a final exception line is read, with the component it names."""
    errors = _errors(tmp_path, [f"{prefix}RuntimeError: something broke at step 9"])
    row = errors.row(0, named=True)
    assert (row["exc_type"], row["message"]) == ("RuntimeError", "something broke at step 9")
    assert row["component"] == component
    assert row["signature"] == "RuntimeError: something broke at step <n>"


def test_a_traceback_is_one_row_from_header_to_exception(tmp_path: Path) -> None:
    """A traceback gives one row spanning header to final line; its final line is no other row."""
    lines = ["noise", *_traceback("ValueError: bad value 3", frames=3), "after"]
    row = _errors(tmp_path, lines).row(0, named=True)
    assert (row["line"], row["last_line"], row["kind"]) == (2, 6, "traceback")
    assert (row["exc_type"], row["text"]) == ("ValueError", "ValueError: bad value 3")
    assert _errors(tmp_path, lines).height == 1


def test_each_part_of_a_chained_traceback_is_a_row(tmp_path: Path) -> None:
    """`During handling ...` chains give one row per traceback, root cause first."""
    lines = [
        *_traceback("KeyError: 'a'"),
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        *_traceback("RuntimeError: lost a"),
    ]
    errors = _errors(tmp_path, lines)
    assert errors.select("line", "last_line", "exc_type").rows() == [
        (1, 3, "KeyError"),
        (7, 9, "RuntimeError"),
    ]


def _wrapped(gap: int) -> list[str]:
    wrapper = (
        "ray.exceptions.RayTaskError(DistBackendError): ray::PolicyWorker.init() "
        "(pid=42, ip=10.0.0.9, actor_id=abcdef0123456789abcdef01, repr=<X object at 0x7f00>)"
    )
    inner = "torch.distributed.DistBackendError: NCCL error in: a.hpp:1, unhandled cuda error"
    frames = [f'  File "/w/y.py", line {n}, in g' for n in range(gap)]
    return [*_traceback(wrapper), *frames, inner]


def test_a_ray_wrapper_is_followed_to_the_wrapped_exception(tmp_path: Path) -> None:
    """`RayTaskError(X): ray::Cls...` continues to X's own final line: type, entry, component."""
    errors = _errors(tmp_path, _wrapped(gap=2))
    row = errors.row(0, named=True)
    assert (row["line"], row["last_line"]) == (1, 6)
    assert (row["kind"], row["exc_type"], row["entry"]) == (
        "traceback",
        "DistBackendError",
        "torch.dist_backend_error",
    )
    assert row["component"] == "policy"
    assert row["text"].startswith("torch.distributed.DistBackendError")
    # the wrapper line keeps the row of the older RayTaskError literal rule
    assert errors.select("line", "kind").rows()[1:] == [(3, "ray_task_error")]


def test_a_wrapped_exception_beyond_the_window_is_not_joined(tmp_path: Path) -> None:
    """The wrapped exception must end within WINDOW_LINES of the header: just short and past."""
    inside = _errors(tmp_path, _wrapped(gap=WINDOW_LINES - 3))
    assert inside["last_line"][0] == WINDOW_LINES + 1
    assert inside.height == 2  # the block and the wrapper's literal-rule row
    beyond = _errors(tmp_path, _wrapped(gap=WINDOW_LINES - 2))
    assert beyond.select("line", "last_line").rows()[0] == (1, 3)
    assert beyond["exc_type"][0] == "DistBackendError"  # the wrapper's inner type
    assert beyond.height == 3  # the far final line is a row of its own


def test_ray_unhandled_error_is_a_block(tmp_path: Path) -> None:
    """Ray's unhandled-error report is one row ending on the exception it reports."""
    lines = [
        f"{RAY}Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): "
        "ray::FSDPRefRayActorBase.init_model() (pid=3, ip=10.0.0.5)",
        f'{RAY}  File "/x.py", line 1, in result',
        f"{RAY}    raise self._exception",
        f"{RAY}ValueError: boom",
    ]
    row = _errors(tmp_path, lines).row(0, named=True)
    assert (row["line"], row["last_line"], row["kind"]) == (1, 4, "ray_unhandled")
    assert (row["exc_type"], row["component"], row["entry"]) == (
        "ValueError",
        "policy",
        "ray.unhandled_error",
    )


def test_catalogue_text_inside_frames_is_not_a_row(tmp_path: Path) -> None:
    """A frame quoting catalogue words (`raise ValueError("No available memory...")`) is no row."""
    lines = _traceback("ValueError: No available memory for the cache blocks.", frames=0)
    lines.insert(1, '    raise ValueError("No available memory for the cache blocks. "')
    errors = _errors(tmp_path, lines)
    assert errors.height == 1
    assert errors["entry"][0] == "vllm.no_kv_cache_memory"


@pytest.mark.parametrize(
    "line",
    [
        "ValueError was raised and handled",
        "retrying after ConnectionError: reset by peer",
        "Error: something",
        "[ERROR:swift] Method execution failed: infer",
        "INFO: 0 errors, 0 warnings",
        "    raise RuntimeError('x')",
        "reward/avg_raw_reward: 0.21, policy/errors: 0",
    ],
)
def test_lines_that_only_mention_errors_are_not_rows(tmp_path: Path, line: str) -> None:
    """Scary words alone, an unanchored exception name or an indented raise make no row."""
    assert _errors(tmp_path, ["start", line]).is_empty()


@pytest.mark.parametrize("chunk_bytes", [64, 200, 1024, 1 << 20])
def test_failure_rows_do_not_depend_on_chunks(tmp_path: Path, chunk_bytes: int) -> None:
    """Blocks, wrappers and loose failure lines read the same whatever the chunk size."""
    lines = [
        "noise " * 5,
        *_wrapped(gap=3),
        f"{RAY}Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): ray::A.b()",
        f'{RAY}  File "/x.py", line 1',
        f"{RAY}KeyError: 'k'",
        "ERROR 04-28 02:37:03 [core.py:398] EngineCore encountered a fatal error.",
        *_traceback("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
        "      Exit Code:    137",
    ] * 3
    whole = _errors(tmp_path, lines)
    assert _errors(tmp_path, lines, chunk_bytes=chunk_bytes).equals(whole)
    # per copy: wrapper block + its RayTaskError row, unhandled block, engine line, OOM block +
    # its cuda_oom row, exit record
    assert whole.height == 3 * 7


def test_failure_rows_carry_attempt_and_timestamp(tmp_path: Path) -> None:
    """Rows get the attempt of their first line and the time the line's prefix gives."""
    lines = [
        "[10:00:00] task=/u/job/0 | [iris setup] step 1/2",
        "[10:00:05] task=/u/job/0 | ValueError: first",
        "[10:01:00] task=/u/job/0 | [iris setup] step 1/2",
        "[10:01:09] task=/u/job/0 | ERROR 05-01 10:01:09 [core.py:1] EngineDeadError: second",
    ]
    path = tmp_path / "finelog.log"
    path.write_text("\n".join(lines) + "\n")
    errors = parse_log_file(path, "finelog.log", reference_date=datetime(2026, 5, 1).date()).errors
    assert errors.select("attempt", "exc_type").rows() == [
        (0, "ValueError"),
        (1, "EngineDeadError"),
    ]
    assert errors["timestamp"].to_list() == [
        datetime(2026, 5, 1, 10, 0, 5, tzinfo=UTC),
        datetime(2026, 5, 1, 10, 1, 9, tzinfo=UTC),
    ]


def test_incremental_parse_equals_a_full_parse(tmp_path: Path) -> None:
    """Appending failure lines to a cached file gives the rows of a fresh parse."""
    path = tmp_path / "finelog.log"
    first = [*_traceback("ValueError: one"), "KeyError: 'two'"]
    path.write_text("\n".join(first) + "\n")
    cache = LogCache()
    parse_log_file(path, "finelog.log", cache=cache)
    with path.open("a") as handle:
        handle.write("\n".join([*_wrapped(gap=1), "ncclRemoteError: gone"]) + "\n")
    grown = parse_log_file(path, "finelog.log", cache=cache).errors
    assert grown.equals(parse_log_file(path, "finelog.log").errors)
    assert grown.height == 5


def test_pod_logs_add_new_failure_rows(tmp_path: Path) -> None:
    """A failure only a pod log shows is added to the finelog's rows, with its source."""
    (tmp_path / "pod_logs").mkdir()
    (tmp_path / "finelog.log").write_text(
        "Started: 'step'\nValueError: in both\n", encoding="utf-8"
    )
    (tmp_path / "pod_logs" / "engine.log").write_text(
        "ValueError: in both\nERROR 05-01 10:00:00 [core.py:1] EngineCore encountered a fatal "
        "error.\n",
        encoding="utf-8",
    )
    tables = parse_job_logs(tmp_path)
    assert tables is not None
    assert tables.errors.select("source", "entry").rows() == [
        ("finelog.log", None),
        ("pod_logs/engine.log", "vllm.engine_core_fatal"),
    ]


def test_the_errors_table_has_the_schema(tmp_path: Path) -> None:
    """ERRORS keeps the contract's columns and adds the failure columns, typed."""
    errors = _errors(tmp_path, ["ValueError: x"])
    assert errors.schema == pl.Schema(schema.ERRORS)
    assert errors.columns[:6] == ["source", "line", "timestamp", "kind", "text", "attempt"]


def test_csv_output_has_the_failure_columns(tmp_path: Path) -> None:
    """`write_tables` writes errors.csv with the new columns."""
    errors = _errors(tmp_path, ["ValueError: x"])
    written = write_tables(LogTables(errors=errors), tmp_path / "out")
    header = written[0].read_text().splitlines()[0]
    assert header.endswith("entry,failure_class,signature,specific")


def _evidence_with(errors: pl.DataFrame) -> Evidence:
    return factories.evidence(log_tables=LogTables(errors=errors))


def test_frozen_evidence_round_trips_the_failure_columns(tmp_path: Path) -> None:
    """Freezing and thawing keeps every failure column and value."""
    errors = _errors(tmp_path, [*_wrapped(gap=1), "      Exit Code:    137"])
    evidence = _evidence_with(errors)
    freeze(evidence, tmp_path / "frozen")
    thawed = thaw(tmp_path / "frozen")
    assert thawed.logs is not None
    assert thawed.logs.errors.equals(errors)
    assert thawed.logs.errors.schema == errors.schema


def test_an_older_freeze_thaws_with_null_failure_columns(tmp_path: Path) -> None:
    """A freeze written before the failure columns existed thaws with them as typed nulls."""
    errors = _errors(tmp_path, ["ValueError: x"])
    freeze(_evidence_with(errors), tmp_path / "frozen")
    as_format_1(tmp_path / "frozen")  # the layout of that time: one Parquet file a table
    old = errors.select("source", "line", "timestamp", "kind", "text", "attempt")
    old.write_parquet(tmp_path / "frozen" / "logs" / "errors.parquet")
    thawed = thaw(tmp_path / "frozen").logs
    assert thawed is not None
    assert thawed.errors.schema == pl.Schema(schema.ERRORS)
    assert thawed.errors["entry"].to_list() == [None]


def _attempt_rows(
    tmp_path: Path, lines: list[str], chunk_bytes: int | None = None
) -> list[tuple[object, ...]]:
    """(line, last_line, attempt, exc_type) of each error row of `lines` (a May 1st log)."""
    path = tmp_path / "finelog.log"
    path.write_text("\n".join(lines) + "\n")
    day = datetime(2026, 5, 1).date()
    errors = parse_log_file(path, "finelog.log", reference_date=day, chunk_bytes=chunk_bytes)
    return errors.errors.sort("line").select("line", "last_line", "attempt", "exc_type").rows()


@pytest.mark.parametrize("chunk_bytes", [120, 1 << 20])
def test_a_traceback_cut_by_a_restart_does_not_end_in_the_next_attempt(
    tmp_path: Path, chunk_bytes: int
) -> None:
    """A process killed while printing a traceback leaves it without its final line; the job's
    next attempt starts a process with the same pid. The block ends at the attempt's boundary:
    the next attempt's own failure line is its own row, in its own attempt, not the first one's
    final line."""
    actor = "(TaskRunner pid=77, ip=10.0.0.1) "
    lines = [
        "[10:00:00] task=/u/job/0 | [iris setup] step 1/2",
        f"[10:00:01] task=/u/job/0 | {actor}Traceback (most recent call last):",
        f'[10:00:01] task=/u/job/0 | {actor}  File "/app/x.py", line 1, in f',
        "[10:01:00] task=/u/job/0 | [iris setup] step 1/2",
        f"[10:01:02] task=/u/job/0 | {actor}ValueError: the second attempt's own failure",
    ]
    assert _attempt_rows(tmp_path, lines, chunk_bytes) == [
        (2, 2, 0, None),  # cut off: no final line
        (5, 5, 1, "ValueError"),
    ]


def test_a_traceback_ends_within_its_attempt(tmp_path: Path) -> None:
    """Just short of the boundary: a traceback whose final line comes before the restart keeps
    it (the boundary takes nothing from a block that ended)."""
    actor = "(TaskRunner pid=77, ip=10.0.0.1) "
    lines = [
        "[10:00:00] task=/u/job/0 | [iris setup] step 1/2",
        f"[10:00:01] task=/u/job/0 | {actor}Traceback (most recent call last):",
        f'[10:00:01] task=/u/job/0 | {actor}  File "/app/x.py", line 1, in f',
        f"[10:00:02] task=/u/job/0 | {actor}KeyError: 'first'",
        "[10:01:00] task=/u/job/0 | [iris setup] step 1/2",
        f"[10:01:02] task=/u/job/0 | {actor}ValueError: the second attempt's own failure",
    ]
    assert _attempt_rows(tmp_path, lines) == [
        (2, 4, 0, "KeyError"),
        (6, 6, 1, "ValueError"),
    ]


def test_another_tasks_setup_does_not_cut_a_traceback(tmp_path: Path) -> None:
    """Only a boundary of the attempt's task starts an attempt: another task's setup line in the
    middle of a traceback leaves the block whole."""
    actor = "(TaskRunner pid=77, ip=10.0.0.1) "
    lines = [
        "[10:00:00] task=/u/job/0 | [iris setup] step 1/2",
        f"[10:00:01] task=/u/job/0 | {actor}Traceback (most recent call last):",
        "[10:00:01] task=/u/job/1 | [iris setup] step 1/2",
        f'[10:00:01] task=/u/job/0 | {actor}  File "/app/x.py", line 1, in f',
        f"[10:00:02] task=/u/job/0 | {actor}KeyError: 'first'",
    ]
    assert _attempt_rows(tmp_path, lines) == [(2, 5, 0, "KeyError")]
