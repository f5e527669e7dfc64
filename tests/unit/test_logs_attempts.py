"""In-log restarts (`worker.evidence.logs.attempts`): a death line, then a start-up line of a new
driver pid or of the launcher, starts an attempt; a new pid alone, a start-up line of another
actor, of the same driver, or without a death before it does not. Every log is parsed every way
the parser reads a file (native and polars paths, chunked, grown: `tests.log_lines`)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.log_lines import actor_line, at, parse_every_way, raw, start_line
from worker.evidence.facts import attempt_failures
from worker.evidence.logs import attempts
from worker.evidence.model import LogTables

# pytorch/pytorch#16417 (tests/fixtures/real_failures/cuda.toml)
OOM = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a "
    "total capacity of 23.65 GiB of which 11.06 MiB is free."
)
OLD, NEW = "skyrl_entrypoint pid=100", "skyrl_entrypoint pid=200"


def first_attempt() -> list[str]:
    """Attempt 0: Ray starts, the driver starts from scratch and finishes step 1."""
    return [
        raw(at(0), start_line("ray_local")),
        actor_line(at(10), start_line("scratch"), actor=OLD),
        actor_line(at(60), "Started: 'step'", actor=OLD),
        actor_line(at(180), "Finished: 'step', time cost: 120.00s", actor=OLD),
        actor_line(at(181), "Started: 'step'", actor=OLD),
    ]


def death() -> list[str]:
    """The OOM traceback of step 2, then the driver's `Train loop failed`."""
    return [
        raw(at(200), "Traceback (most recent call last):"),
        raw(at(200), '  File "skyrl_train/workers/fsdp/fsdp_worker.py", line 612, in forward'),
        raw(at(200), OOM),
        actor_line(at(201), "Train loop failed", actor=OLD, level="ERROR"),
    ]


def resumed(actor: str = NEW, moment: float = 300) -> list[str]:
    """A driver resuming from step 1 and finishing step 2."""
    return [
        actor_line(at(moment), start_line("loading"), actor=actor),
        actor_line(at(moment), "Resuming from global_step: 1", actor=actor),
        actor_line(at(moment + 60), "Started: 'step'", actor=actor),
        actor_line(at(moment + 180), "Finished: 'step', time cost: 120.00s", actor=actor),
    ]


def boundaries(tables: LogTables) -> list[int]:
    rows = tables.resumes.filter(pl.col("kind") == "attempt_boundary")
    return rows.get_column("line").to_list()


def finished(tables: LogTables) -> list[tuple[int, int]]:
    """(step, attempt) of each `Finished: 'step'`."""
    rows = tables.timers.filter((pl.col("event") == "finished") & (pl.col("phase") == "step"))
    return list(zip(rows["step"].to_list(), rows["attempt"].to_list(), strict=True))


def test_a_death_then_a_new_driver_resuming_starts_an_attempt(tmp_path: Path) -> None:
    """The new driver's first start-up line is the boundary; its step is attempt 1's."""
    lines = first_attempt() + death() + resumed()
    tables = parse_every_way(lines, tmp_path)
    assert boundaries(tables) == [10]  # `Loading checkpoint from` of pid 200
    assert finished(tables) == [(1, 0), (2, 1)]
    kinds = tables.resumes.filter(pl.col("line") == 10)["kind"].to_list()
    assert kinds == ["attempt_boundary", "checkpoint_loaded"]


def test_the_previous_attempts_failure_is_that_attempts(tmp_path: Path) -> None:
    """The OOM ends attempt 0, and attempt 1's step is no progress after it in the same attempt."""
    tables = parse_every_way(first_attempt() + death() + resumed(), tmp_path)
    failures = attempt_failures(tables)
    assert failures["attempt"].to_list() == [0]
    assert failures["exc_type"].to_list() == ["OutOfMemoryError"]
    errors = tables.errors.filter(pl.col("kind") == "cuda_oom")
    assert errors["attempt"].to_list() == [0]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        # past: a death, then a new driver pid starting / short: the same without the death
        (first_attempt() + death() + resumed(), [10]),
        (first_attempt() + resumed(), []),
        # past: the new driver's pid / short: the driver that logged the death resuming
        (first_attempt() + death() + resumed(NEW), [10]),
        (first_attempt() + death() + resumed(OLD), []),
        # past: the driver's start-up line / short: another Ray actor's (a policy worker's)
        (first_attempt() + death() + resumed("skyrl_entrypoint pid=300"), [10]),
        (first_attempt() + death() + resumed("FSDPPolicyWorkerBase pid=300"), []),
    ],
    ids=["death-past", "death-short", "pid-past", "pid-short", "actor-past", "actor-short"],
)
def test_each_condition_of_an_in_log_restart_just_past_and_just_short(
    lines: list[str], expected: list[int], tmp_path: Path
) -> None:
    """Each condition of the rule, with one input just past it and one just short of it."""
    assert boundaries(parse_every_way(lines, tmp_path)) == expected


def test_the_launchers_ray_start_line_is_the_boundary(tmp_path: Path) -> None:
    """Ray's own start-up line (no process prefix) after a death starts the attempt there; the
    new driver's resume line after it is no second boundary."""
    launcher = [raw(at(290), start_line("ray_connect"))]
    tables = parse_every_way(first_attempt() + death() + launcher + resumed(), tmp_path)
    assert boundaries(tables) == [10]
    assert finished(tables) == [(1, 0), (2, 1)]


def test_a_resume_line_of_a_running_attempt_is_no_restart(tmp_path: Path) -> None:
    """`Resuming from global_step` with no death before it is no boundary, whoever logs it."""
    lines = first_attempt() + resumed(OLD) + resumed(NEW, moment=600)
    tables = parse_every_way(lines, tmp_path)
    assert boundaries(tables) == []
    assert {attempt for _, attempt in finished(tables)} == {0}


def test_an_iris_boundary_takes_the_death_so_the_resume_after_it_is_no_second_one(
    tmp_path: Path,
) -> None:
    """Iris's setup line after the death starts the attempt; the new driver's start-up lines
    after it belong to that attempt."""
    iris = [raw(at(280), "[iris setup] step 1/2")]
    tables = parse_every_way(first_attempt() + death() + iris + resumed(), tmp_path)
    assert boundaries(tables) == [10]
    assert tables.resumes.filter(pl.col("line") == 10)["text"].to_list() == [
        "[iris setup] step 1/2"
    ]
    assert finished(tables) == [(1, 0), (2, 1)]


def test_three_in_log_attempts_count_three(tmp_path: Path) -> None:
    """Each death followed by a new driver starts one more attempt."""
    lines = first_attempt() + death()
    for n, pid in enumerate((200, 300), start=1):
        lines += resumed(f"skyrl_entrypoint pid={pid}", moment=300 * n)
        lines += [raw(at(300 * n + 200), OOM)]
    tables = parse_every_way(lines, tmp_path)
    assert len(boundaries(tables)) == 2
    assert tables.errors.filter(pl.col("kind") == "cuda_oom")["attempt"].to_list() == [0, 1, 2]


def test_the_driver_actor_names_are_skyrl_entrypoints() -> None:
    """SkyRL's driver is the Ray remote task `skyrl_entrypoint` (`main_base` in older runs)."""
    assert attempts.DRIVER_ACTORS == ("skyrl_entrypoint", "main_base")
