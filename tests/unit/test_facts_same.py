"""The newest-row search of `worker.evidence.facts` without whole-table sorts gives what the
sort-based search gave: on crafted ties (same time, lines out of order, null lines, rows after
`now`) and on every bundle of the boundary corpus and the demo."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests import factories
from tests.scenarios.boundary import PAIRS
from worker.diagnosis import collect_evidence
from worker.evidence import facts
from worker.evidence.case import Evidence
from worker.evidence.model import LogTables

DEMO = Path(__file__).resolve().parents[2] / "examples/jobs/cw-rno2a/ops/rl-gsm8k-stalled"
DEMO_PROBES = DEMO.parents[3] / "probes/rl-gsm8k-stalled"
NOW = factories.NOW


def _sorted_newest_row(frame: pl.DataFrame, keep: pl.Expr) -> dict[str, Any] | None:
    """The search before: filter, sort the whole table, take the last row."""
    rows = frame.filter(pl.col("timestamp").is_not_null() & keep)
    if rows.is_empty():
        return None
    return rows.sort(["timestamp", "line"]).row(-1, named=True)


def _sorted_log_moments(
    logs: LogTables, now: datetime, limit: datetime
) -> tuple[list[facts.Moment], list[facts.Moment]]:
    """`_log_moments` before: every frame searched for both directions with the sort."""
    past: list[facts.Moment] = []
    future: list[facts.Moment] = []
    for kind, name, frame in facts._log_frames(logs):
        row = _sorted_newest_row(frame, pl.col("timestamp") <= now)
        if row is not None:
            past.append(facts._moment(kind, name, row))
        ahead = _sorted_newest_row(frame, pl.col("timestamp") > limit)
        if ahead is not None and kind == facts.LOG_LINE:
            future.append(facts._moment(kind, name, ahead))
    return past, future


def _assert_same_moments(evidence: Evidence) -> None:
    logs = evidence.logs
    assert logs is not None
    limit = evidence.now + timedelta(seconds=facts.CLOCK_TOLERANCE_S)
    assert facts._log_moments(logs, evidence.now, limit) == _sorted_log_moments(
        logs, evidence.now, limit
    )


def _row(minutes: float, line: int | None, step: int = 1, source: str = "finelog.log") -> dict:
    return {
        "step": step, "key": "reward/avg_raw_reward", "value": float(step), "origin": "mirror",
        "source": source, "line": line, "timestamp": factories.at(minutes), "attempt": 0,
    }  # fmt: skip


TIES = {
    "lines out of order at the newest time": [_row(1, 30), _row(0, 12), _row(0, 40), _row(0, 7)],
    "null lines beside numbered ones": [_row(0, None), _row(0, 5), _row(2, 99)],
    "only null lines at the newest time": [_row(0, None, 1), _row(0, None, 1), _row(3, 2)],
    "rows after now and after the tolerance": [_row(-0.5, 1), _row(-5, 2), _row(-9, 3), _row(1, 4)],
    "a null time": [{**_row(0, 50), "timestamp": None}, _row(1, 3)],
    "every row after now": [_row(-3, 1), _row(-4, 2)],
}


@pytest.mark.parametrize("rows", list(TIES.values()), ids=list(TIES))
def test_the_newest_row_is_the_one_the_sort_found(rows: list[dict[str, Any]]) -> None:
    """For each way rows can tie or fall outside `now`, both searches pick the same row."""
    frame = factories.frame(factories.schema.METRICS, rows)
    for keep in (pl.col("timestamp") <= NOW, pl.col("timestamp") > NOW + timedelta(minutes=1)):
        assert facts._newest_row(frame, keep) == _sorted_newest_row(frame, keep)
    _assert_same_moments(factories.evidence(log_tables=factories.logs(metrics=rows)))


SIDES = [(pair, which) for pair in PAIRS for which in ("past", "short")]


@pytest.mark.slow  # a parse of each of the corpus's 120 bundles; the crafted ties above stay fast
@pytest.mark.parametrize(
    ("pair", "which"), SIDES, ids=[f"{pair.name}-{which}" for pair, which in SIDES]
)
def test_the_boundary_corpus_has_the_same_moments(pair: Any, which: str, tmp_path: Path) -> None:
    """Every bundle of the boundary corpus: the same progress and future moments."""
    built = getattr(pair, which).build(tmp_path)
    evidence = collect_evidence(built.job_dir, now=built.now, probes_dir=built.probes)
    if evidence.logs is not None:
        _assert_same_moments(evidence)


def test_the_demo_bundle_has_the_same_moments() -> None:
    evidence = collect_evidence(DEMO, now=datetime.fromisoformat("2026-07-30T19:17:00+00:00"))
    _assert_same_moments(evidence)
