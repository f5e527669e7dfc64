"""Which engine a line belongs to, across the finelog and the engines' own Ray worker logs
(`worker-<id>-<job>-<pid>.out`), and when every engine has logged its death
(worker.evidence.logs.job, worker.gates.engine_owners, worker.gates.deaths)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests import factories as f
from worker.evidence.logs.job import parse_job_logs
from worker.evidence.model import LogTables
from worker.gates import deaths

DAY = date(2026, 5, 1)
NOW = datetime(2026, 5, 1, 13, tzinfo=UTC)
ENGINE = "(AsyncVLLMInferenceEngine pid={pid}, ip=10.0.0.{pid})"
# vllm-project/vllm#17276 (tests/fixtures/real_failures/vllm.toml), its clock the test's
FATAL = "ERROR 05-01 12:{minute:02d}:30 [core.py:398] EngineCore encountered a fatal error."


def stat(minute: int) -> str:
    """vLLM's stat line as the engine prints it at 12:MM:05."""
    return (
        f"INFO 05-01 12:{minute:02d}:05 [loggers.py:248] Engine 000: Avg prompt throughput: 1200.0 "
        "tokens/s, Avg generation throughput: 2450.0 tokens/s, Running: 48 reqs, Waiting: 6 reqs, "
        "GPU KV cache usage: 46.0%, Prefix cache hit rate: 41.2%"
    )


def trainer(minute: int, message: str) -> str:
    stamp = f"2026-05-01 12:{minute:02d}:00.000"
    return f"(skyrl_entrypoint pid=1) {stamp} | INFO | skyrl_train.trainer:train:210 - {message}"


def write(root: Path, relative: str, lines: list[str]) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def worker(pid: int) -> str:
    return f"ray_vllm_logs/pod-0/worker-ab{pid}-01000000-{pid}.out"


def parsed(root: Path) -> LogTables:
    tables = parse_job_logs(root, reference_date=DAY)
    assert tables is not None
    return tables


# --- one engine, two logs -------------------------------------------------------------------------


@pytest.mark.parametrize(("pid", "engines"), [
    (7, ["7@10.0.0.7/000"]),  # the worker log of the forwarding engine: one engine
    (8, ["7@10.0.0.7/000", f"{worker(8)}/000"]),  # another process's own log: two engines
])  # fmt: skip
def test_a_ray_worker_log_is_the_engine_its_name_names(
    tmp_path: Path, pid: int, engines: list[str]
) -> None:
    """A Ray worker log's stat lines take the id of the engine whose pid its name carries, so
    the lines the driver forwarded and the worker's own copy are one engine (the copies merge,
    a line only the worker log has is kept); a worker log of another pid is another engine."""
    write(tmp_path, "finelog.log", [f"{ENGINE.format(pid=7)} {stat(m)}" for m in range(3)])
    write(tmp_path, worker(pid), [stat(m) for m in range(4)])
    table = parsed(tmp_path).engines
    assert sorted(table["engine"].unique().to_list()) == engines
    assert table.height == (4 if len(engines) == 1 else 7)


@pytest.mark.parametrize(("pids", "rows"), [
    ((7, 8), 2),  # two engines dying at the same second in their own logs: two deaths
    ((7, 7), 1),  # the forwarded copy and the worker's own line of one engine: one death
])  # fmt: skip
def test_the_same_death_line_of_two_processes_is_two_deaths(
    tmp_path: Path, pids: tuple[int, int], rows: int
) -> None:
    """Error rows of the logs are merged without their copies, but a copy is the same line of
    the same process: two worker logs with the same fatal line are two engines' deaths."""
    first, second = pids
    write(tmp_path, "finelog.log", [trainer(0, "Started: 'step'")])
    write(tmp_path, worker(first), [stat(0), FATAL.format(minute=1)])
    if second == first:
        forwarded = f"{ENGINE.format(pid=first)} {FATAL.format(minute=1)}"
        write(tmp_path, "finelog.log", [trainer(0, "Started: 'step'"), forwarded])
    else:
        write(tmp_path, worker(second), [stat(0), FATAL.format(minute=1)])
    errors = parsed(tmp_path).errors.filter(pl.col("kind") == "engine_dead")
    assert errors.height == rows


# --- every engine dead: engines seen only in their own logs ---------------------------------------


@pytest.mark.parametrize(("dead", "whose"), [
    (2, "every inference engine (2 of 2)"),
    (1, None),  # one of two engines dead is no proof
])  # fmt: skip
def test_engines_seen_only_in_their_worker_logs_count_for_every_engine(
    tmp_path: Path, dead: int, whose: str | None
) -> None:
    """The every-engine death rule sees engines that appear only under `ray_vllm_logs/`: each
    fatal line in an engine's own log (no process prefix) is attributed to that engine by the
    pid in the file's name."""
    write(
        tmp_path, "finelog.log", [trainer(0, "Started: 'step'"), trainer(0, "Started: 'generate'")]
    )
    for i, pid in enumerate((7, 8)):
        lines = [stat(0)] + ([FATAL.format(minute=2)] if i < dead else [])
        write(tmp_path, worker(pid), lines)
    found = deaths.find_death(f.evidence(log_tables=parsed(tmp_path), now=NOW), None)
    assert (found.whose if found else None) == whose
    if found is not None:
        assert {q.source for q in found.quotes} == {worker(7), worker(8)}


# --- a death line, and what the engine logs after it ----------------------------------------------


def _engine_rows(after_s: float, tokens: float, running: int = 48) -> list[dict[str, Any]]:
    """One engine busy up to its death at 12:02:30, then one stat line `after_s` later."""
    base = {"engine": "7@10.0.0.7/000", "source": "finelog.log", "attempt": 0, "waiting": 6}
    died = datetime(2026, 5, 1, 12, 2, 30, tzinfo=UTC)
    busy = {"running": 48, "kv_cache_pct": 46.0}
    busy |= {"generation_tokens_per_s": 2450.0, "prompt_tokens_per_s": 1200.0}
    after = {"running": running, "kv_cache_pct": 46.0}
    after |= {"generation_tokens_per_s": tokens, "prompt_tokens_per_s": 0.0}
    return [
        {**base, **busy, "timestamp": died - timedelta(minutes=1), "line": 1},
        {**base, **after, "timestamp": died + timedelta(seconds=after_s), "line": 3},
    ]


def _death_row() -> dict[str, Any]:
    return {
        "source": "finelog.log",
        "line": 2,
        "timestamp": datetime(2026, 5, 1, 12, 2, 30, tzinfo=UTC),
        "kind": "engine_dead",
        "text": FATAL.format(minute=2),
        "attempt": 0,
        "component": "engine",
        "prefix": ENGINE.format(pid=7),
        "failure_class": "hard",
    }


@pytest.mark.parametrize(("after_s", "tokens", "running", "dead"), [
    (20.0, 2450.0, 48, True),  # the interval that straddled the death, logged after it
    (40.0, 2450.0, 48, False),  # tokens past DEATH_STAT_GRACE_S: the engine works
    (300.0, 0.0, 48, True),  # a stale Running count at 0 tok/s is no sign of life
])  # fmt: skip
def test_only_tokens_past_the_grace_revive_a_dead_engine(
    after_s: float, tokens: float, running: int, dead: bool
) -> None:
    """DEATH_STAT_GRACE_S (30 s): a stat line with tokens 20 s after the death line counts the
    tokens of the interval the engine died in; 40 s after, the engine still works; a line at
    0 tok/s repeating the last Running count is no life at all."""
    tables = f.logs(engines=_engine_rows(after_s, tokens, running), errors=[_death_row()])
    found = deaths.find_death(f.evidence(log_tables=tables, now=NOW), None)
    assert (found is not None) is dead
