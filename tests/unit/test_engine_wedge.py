"""Wedged and restarting vLLM engines (worker.gates.engines.engine_wedges, resources.wedge): an
engine that holds requests and runs none while its /health stays 200, and one that fails to start
again and again, judged by their effect on the job."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from shared.models import GateStatus
from shared.settings import Thresholds
from tests import factories as f
from worker.evidence.logs import parse_log_file
from worker.evidence.logs.job import parse_job_logs
from worker.gates import engines, resources

HEALTHY = "1000@10.0.0.1/000"
WEDGED = "1001@10.0.0.2/000"

# vllm-project/vllm#8378 (a comment on the PR): "requests just stack up in pending after a few get
# through. I get 3 completions then it just hangs" — vLLM's own stat lines, verbatim.
REAL_BEFORE = (
    "INFO 09-18 16:10:58 metrics.py:351] Avg prompt throughput: 70.6 tokens/s, Avg generation "
    "throughput: 5.6 tokens/s, Running: 0 reqs, Swapped: 0 reqs, Pending: 12 reqs, GPU KV cache "
    "usage: 0.0%, CPU KV cache usage: 0.0%."
)
REAL_WEDGED = (
    "INFO 09-18 16:11:03 metrics.py:351] Avg prompt throughput: 0.0 tokens/s, Avg generation "
    "throughput: 0.0 tokens/s, Running: 0 reqs, Swapped: 0 reqs, Pending: 22 reqs, GPU KV cache "
    "usage: 0.0%, CPU KV cache usage: 0.0%."
)
# tests/fixtures/real_failures/vllm.toml: vllm-project/vllm#17431 and NovaSky-AI/SkyRL#1673
FAILED_TO_START = "ERROR 04-30 10:{minute:02d}:36 [core.py:396] EngineCore failed to start."
INIT_FAILED = (
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
)


def stat(engine: str, minutes_ago: float, line: int, **values: float) -> dict[str, Any]:
    """One ENGINES row; busy (48 running, 6 waiting, KV 46 %, tokens) unless `values` say."""
    row = {"running": 48, "waiting": 6, "kv_cache_pct": 46.0, "generation_tokens_per_s": 2450.0}
    row |= {"prompt_tokens_per_s": 1200.0, **values}
    return {
        "timestamp": f.at(minutes_ago),
        "engine": engine,
        "source": "finelog.log",
        "line": line,
        "attempt": 0,
        **row,
    }


def wedge_line(engine: str, minutes_ago: float, line: int) -> dict[str, Any]:
    """A stat line of the wedge shape: 23 waiting, none running, no tokens, KV 97.5 %."""
    return stat(
        engine,
        minutes_ago,
        line,
        running=0,
        waiting=23,
        kv_cache_pct=97.5,
        generation_tokens_per_s=0.0,
        prompt_tokens_per_s=0.0,
    )


def healthy(minutes: int = 20, engine: str = HEALTHY) -> list[dict[str, Any]]:
    """A busy engine logging every minute for `minutes`, the newest a minute before NOW."""
    return [stat(engine, minutes - i, 100 + i) for i in range(minutes)]


def busy_then_wedged(wedged_at: list[float]) -> list[dict[str, Any]]:
    """The second engine busy until just before its first wedge line, then the wedge lines."""
    first = max(wedged_at)
    rows = [stat(WEDGED, 20 - i, 300 + i) for i in range(20) if 20 - i > first]
    return rows + [wedge_line(WEDGED, m, 400 + i) for i, m in enumerate(sorted(wedged_at)[::-1])]


def wedges(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """`engine_wedges` of `rows`, measured to the newest row, keyed by engine."""
    table = f.logs(engines=rows).engines
    newest = table["timestamp"].max()
    found = engines.engine_wedges(table, f.NOW, Thresholds(), horizon=pl.lit(newest))
    return {row["engine"]: row for row in found.iter_rows(named=True)}


def judge(rows: list[dict[str, Any]], **tables: Any) -> Any:
    """The resources gate on engine rows (and other tables), as of NOW."""
    return resources.check(f.evidence(log_tables=f.logs(engines=rows, **tables)))


# --- the shape ------------------------------------------------------------------------------------


def test_vllms_own_hung_engine_line_has_the_wedge_shape(tmp_path: Path) -> None:
    """vLLM's stat line of a hung engine (22 pending, none running, 0 tok/s) has the wedge shape;
    the line before it, still generating 5.6 tok/s, does not."""
    log = tmp_path / "engine.log"
    log.write_text(f"{REAL_BEFORE}\n{REAL_WEDGED}\n", encoding="utf-8")
    table = parse_log_file(log, "engine.log", reference_date=date(2024, 9, 18)).engines
    shaped = table.select(engines.wedge_shape())["waiting"].to_list()
    assert table["waiting"].to_list() == [12, 22]
    assert shaped == [False, True]


# --- wedged: logged over WEDGE_MIN_INTERVALS lines and STALL_FLOOR_S, or silent that long -------


@pytest.mark.parametrize(("times", "state"), [
    ([11.5, 6.0, 0.5], True),  # three lines over 11 min: a logged wedge
    ([11.5, 0.5], False),  # two lines over the same 11 min: held, not a state yet
])  # fmt: skip
def test_a_logged_wedge_needs_wedge_min_intervals_lines(times: list[float], state: bool) -> None:
    """WEDGE_MIN_INTERVALS (3): the wedge shape on three consecutive stat lines spanning the
    stall floor is a wedge; on two lines it is not."""
    found = wedges(healthy() + busy_then_wedged(times))
    assert found[WEDGED]["wedged"] is state
    assert found[WEDGED]["lines"] == len(times)


@pytest.mark.parametrize(("minutes", "state"), [(11, True), (9, False)])
def test_a_logged_wedge_needs_the_stall_floor(minutes: int, state: bool) -> None:
    """STALL_FLOOR_S (600 s): wedge lines every minute over 11 min are a wedge; over 9 min they
    are held (a weight sync can pause an engine that long)."""
    times = [minutes + 1 - i for i in range(minutes + 1)]
    found = wedges(healthy() + busy_then_wedged([float(t) for t in times]))
    assert found[WEDGED]["wedged"] is state
    assert found[WEDGED]["logged"] is state


@pytest.mark.parametrize(("minutes", "state"), [(11, True), (9, False)])
def test_a_silent_wedge_needs_the_stall_floor_of_silence(minutes: int, state: bool) -> None:
    """At INFO vLLM logs one line of a wedge and then nothing (an interval without tokens goes
    to DEBUG): one wedge line and then 11 min of the other engine's lines is a wedge; 9 min is
    not yet."""
    found = wedges(healthy() + busy_then_wedged([minutes + 1.0]))
    assert found[WEDGED]["silent"] is state
    assert found[WEDGED]["wedged"] is state


def test_an_engine_that_ran_requests_again_is_not_wedged() -> None:
    """A newest line with a request running ends the run: only the newest run of wedge-shaped
    lines counts, and an engine whose newest line is not one has none."""
    rows = healthy() + busy_then_wedged([15.0, 12.0, 9.0]) + [stat(WEDGED, 0.5, 500)]
    assert WEDGED not in wedges(rows)


# --- what a wedge means for the job ---------------------------------------------------------------


def test_one_wedged_engine_among_healthy_ones_fails_soft_naming_and_counting_it() -> None:
    """One wedged engine of two: resources FAIL, not hard, naming the engine and counting it
    in the fleet, with a restart handoff (its /health stays 200, nothing else restarts it)."""
    times = [float(12 - i) for i in range(12)]
    result = judge(healthy() + busy_then_wedged(times))
    assert result.status is GateStatus.FAIL
    assert not result.hard_failure and result.proof is None
    assert WEDGED in result.summary and "1 of 2 inference engine(s) wedged" in result.summary
    assert "2 engine(s): 1 wedged, 1 saturated" in result.summary
    assert result.handoff is not None and result.next_action and "Restart" in result.next_action
    assert any(q.line == 411 and "Waiting: 23" in q.text for q in result.evidence)


def _trainer(advanced_minutes_ago: float) -> list[dict[str, Any]]:
    """Finished steps every two minutes, the newest `advanced_minutes_ago` before NOW."""
    return [
        {
            "event": "finished",
            "phase": "step",
            "seconds": 120.0,
            "step": i + 1,
            "source": "finelog.log",
            "line": 10 + i,
            "timestamp": f.at(advanced_minutes_ago + 2 * (9 - i)),
            "attempt": 0,
        }
        for i in range(10)
    ]


@pytest.mark.parametrize(("advanced", "status"), [
    (13.0, GateStatus.ERROR),  # nothing advanced since the fleet wedged 12 min ago
    (1.0, GateStatus.FAIL),  # the trainer still steps: capacity lost, the job alive
])  # fmt: skip
def test_every_engine_wedged_while_nothing_advances_needs_live_stacks(
    advanced: float, status: GateStatus
) -> None:
    """Every engine wedged and no step since the wedge began (past STALL_FLOOR_S) is ERROR
    naming the stacks that would establish a stall; with the trainer still stepping it is the
    soft FAIL. Never a hard failure: a stat line cannot tell a wedge from a pause."""
    times = [float(12 - i) for i in range(12)]
    rows = busy_then_wedged(times)
    rows += [{**r, "engine": HEALTHY, "line": r["line"] + 1000} for r in rows]
    result = judge(rows, timers=_trainer(advanced))
    assert result.status is status, result.summary
    assert not result.hard_failure and result.proof is None
    if status is GateStatus.ERROR:
        assert "every inference engine wedged (2 of 2)" in result.summary
        assert any("py-spy" in m and "EngineCore" in m for m in result.missing)


def test_a_short_wedge_shape_is_held_never_working_or_saturated() -> None:
    """An engine holding requests with none running at 0 tok/s (KV 97.5 %) for five minutes is
    held: neither "working without a queue" nor "saturated", and a flip signal names when it
    would be a wedge."""
    result = judge([wedge_line(WEDGED, 5 - i, 10 + i) for i in range(5)])
    assert result.status is GateStatus.PASS, result.summary
    assert "holds requests with none running" in result.summary
    assert "without a queue" not in result.summary and "saturated" not in result.summary
    assert "1 held" in result.summary
    assert result.flip_signal is not None and WEDGED in result.flip_signal


def test_a_queue_with_kv_under_the_busy_mark_is_not_without_a_queue() -> None:
    """Engines generating with requests waiting and KV under KV_BUSY_PCT are working with a
    queue, not "without a queue"."""
    rows = [stat(HEALTHY, 12 - i, i, kv_cache_pct=5.0) for i in range(12)]
    result = judge(rows)
    assert result.status is GateStatus.PASS
    assert "requests queued" in result.summary
    assert "without a queue" not in result.summary


# --- engines that fail to start again and again ---------------------------------------------------


def _failed_starts(tmp_path: Path, tries: int) -> Any:
    """A finelog with one busy engine and a Ray worker log of another engine with `tries` failed
    starts (vLLM's core line and the client's RuntimeError each time)."""
    busy = (
        "(AsyncVLLMInferenceEngine pid=1000, ip=10.0.0.1) INFO 04-30 10:{minute:02d}:05 "
        "[loggers.py:248] Engine 000: Avg prompt throughput: 1200.0 tokens/s, Avg generation "
        "throughput: 2450.0 tokens/s, Running: 48 reqs, Waiting: 6 reqs, GPU KV cache usage: "
        "46.0%, Prefix cache hit rate: 41.2%"
    )
    (tmp_path / "finelog.log").write_text(
        "\n".join(busy.format(minute=m) for m in range(40)) + "\n", encoding="utf-8"
    )
    worker = tmp_path / "ray_vllm_logs" / "pod-0" / "worker-ab12-01000000-4242.out"
    worker.parent.mkdir(parents=True)
    lines = []
    for i in range(tries):
        lines += [FAILED_TO_START.format(minute=5 + 5 * i), INIT_FAILED]
    worker.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tables = parse_job_logs(tmp_path, reference_date=date(2026, 4, 30))
    assert tables is not None
    now = datetime(2026, 4, 30, 10, 40, tzinfo=UTC)
    return resources.check(f.evidence(log_tables=tables, now=now))


@pytest.mark.parametrize(("tries", "status"), [(3, GateStatus.FAIL), (2, GateStatus.PASS)])
def test_an_engine_failing_to_start_again_and_again_is_a_restart_loop(
    tmp_path: Path, tries: int, status: GateStatus
) -> None:
    """ENGINE_START_FAILURES (3): an engine whose own log shows three failed starts is a restart
    loop (soft FAIL naming it and the count); two are not, and the count is still stated. One
    start logs two lines (the core's and the client's): they count once."""
    result = _failed_starts(tmp_path, tries)
    assert result.status is status, result.summary
    assert f"failed engine starts in the newest attempt: {tries} (" in result.summary
    assert "worker-ab12-01000000-4242.out" in result.summary
    if status is GateStatus.FAIL:
        assert not result.hard_failure
        assert f"4242.out {tries} times" in result.summary
        assert any("EngineCore failed to start" in q.text for q in result.evidence)


def _failed_processes(tmp_path: Path, processes: int) -> Any:
    """One busy engine in the finelog; another engine that Ray starts again in a new process
    each time (a new worker log per pid), each start failing once."""
    busy = (
        "(AsyncVLLMInferenceEngine pid=1000, ip=10.0.0.1) INFO 04-30 10:{minute:02d}:05 "
        "[loggers.py:248] Engine 000: Avg prompt throughput: 1200.0 tokens/s, Avg generation "
        "throughput: 2450.0 tokens/s, Running: 48 reqs, Waiting: 6 reqs, GPU KV cache usage: "
        "46.0%, Prefix cache hit rate: 41.2%"
    )
    (tmp_path / "finelog.log").write_text(
        "\n".join(busy.format(minute=m) for m in range(40)) + "\n", encoding="utf-8"
    )
    for i in range(processes):
        worker = tmp_path / "ray_vllm_logs" / f"pod-{i}" / f"worker-ab12-01000000-{5000 + i}.out"
        worker.parent.mkdir(parents=True)
        lines = [FAILED_TO_START.format(minute=5 + 5 * i), INIT_FAILED]
        worker.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tables = parse_job_logs(tmp_path, reference_date=date(2026, 4, 30))
    assert tables is not None
    now = datetime(2026, 4, 30, 10, 40, tzinfo=UTC)
    return resources.check(f.evidence(log_tables=tables, now=now))


@pytest.mark.parametrize(("processes", "status"), [(3, GateStatus.FAIL), (2, GateStatus.PASS)])
def test_failed_starts_in_new_processes_count_as_one_engine(
    tmp_path: Path, processes: int, status: GateStatus
) -> None:
    """Ray starts a failed engine actor again in a new process: failed starts of processes that
    never logged a stat line count together (three is a restart loop, two is not)."""
    result = _failed_processes(tmp_path, processes)
    assert result.status is status, result.summary
    assert f"failed engine starts in the newest attempt: {processes} (" in result.summary
    assert f"an engine that never came up: {processes}" in result.summary
