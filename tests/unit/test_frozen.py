"""Freezing the evidence of a diagnosis and thawing it back gives the same evidence."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from shared.settings import Thresholds
from tests import factories
from tests.integration.bundles import write_job_bundle
from worker.diagnosis import collect_evidence, judge
from worker.evidence.frozen import MARKER, FrozenEvidenceError, freeze, thaw
from worker.evidence.model import (
    AttemptRecord,
    ControllerView,
    Evidence,
    LogTables,
    ProbeCommand,
    ProbeEvidence,
    StackDump,
    TrialTables,
)
from worker.evidence.probes import read_probes

NOW = datetime(2026, 7, 30, 21, 13, 0, 123456, tzinfo=UTC)


def assert_same(left: Any, right: Any, where: str = "evidence") -> None:
    """Field-by-field equality, with frames compared by schema and content."""
    if isinstance(left, pl.DataFrame):
        assert isinstance(right, pl.DataFrame), where
        assert left.schema == right.schema, where
        assert left.equals(right), where
    elif dataclasses.is_dataclass(left) and not isinstance(left, type):
        assert type(left) is type(right), where
        for item in dataclasses.fields(left):
            name = item.name
            assert_same(getattr(left, name), getattr(right, name), f"{where}.{name}")
    else:
        assert left == right, where


def _probes() -> ProbeEvidence:
    stack = StackDump(
        target="task-0",
        pid=4242,
        n=1,
        source="probes/stacks/task-0-pid4242-1.txt",
        captured_at=NOW,
        text='Thread 4242 (idle): "MainThread"\n    wait (threading.py:320)\n',
    )
    return ProbeEvidence(
        directory="probes",
        captured_at=NOW,
        backend="iris",
        job_id="/ops/rl-job",
        commands=(ProbeCommand(argv=("iris", "job", "summary"), started_at=NOW, exit_code=0),),
        controller=ControllerView(job_id="/ops/rl-job", state="running", failure_count=2),
        attempts=(AttemptRecord(task_id="t0", attempt_id=0, state="failed", exit_code=1),),
        stacks=(stack,),
        gpus={"pod-0": ({"index": 0.0, "utilization_gpu_pct": 97.0, "power_draw_w": None},)},
        failures=("py-spy timed out on pod-1",),
    )


def _handmade() -> Evidence:
    logs = factories.logs(metrics=factories.metric_rows({"reward/avg_raw_reward": [0.1, 0.2]}))
    trials = factories.trials(
        [{"trial_name": "t1", "reward": 1.0, "n_turns": 3, "started_at": NOW}]
    )
    evidence = factories.evidence(log_tables=logs, trial_tables=trials, probes=_probes())
    return dataclasses.replace(
        evidence,
        now=NOW,
        thresholds=Thresholds(stall_floor_s=123),
        discrepancies=("refused path: trace_jobs/x -> /etc",),
        trials=dataclasses.replace(trials, sync_selection={"selected": 1}, unreadable=("a: b",)),
    )


def test_handmade_evidence_round_trips(tmp_path: Path) -> None:
    """Tables, probes, thresholds, mode, bundle and `now` (to the microsecond) come back equal."""
    evidence = _handmade()
    freeze(evidence, tmp_path)
    assert_same(thaw(tmp_path), evidence)


def test_collected_evidence_round_trips(tmp_path: Path) -> None:
    """Evidence the core read from a job directory thaws to an equal Evidence."""
    job_dir = write_job_bundle(tmp_path / "bundles")
    evidence = collect_evidence(job_dir, now=NOW)
    freeze(evidence, tmp_path / "frozen")
    thawed = thaw(tmp_path / "frozen")
    assert_same(thawed, evidence)
    assert thawed.logs is not None and thawed.logs.metrics.height > 0


def test_thawed_evidence_gets_the_same_verdict(tmp_path: Path) -> None:
    """Judging the thawed evidence gives the report the original evidence gets."""
    evidence = collect_evidence(write_job_bundle(tmp_path / "bundles"), now=NOW)
    freeze(evidence, tmp_path / "frozen")
    again = judge(thaw(tmp_path / "frozen"), event_id="e1")
    assert again.contract_dict() == judge(evidence, event_id="e1").contract_dict()


def test_absent_parts_stay_absent(tmp_path: Path) -> None:
    """Evidence without logs, trials or probes thaws without them."""
    evidence = factories.evidence()
    written = freeze(evidence, tmp_path)
    assert [path.name for path in written] == [MARKER]
    thawed = thaw(tmp_path)
    assert (thawed.logs, thawed.trials, thawed.probes) == (None, None, None)


def test_empty_tables_keep_their_schema(tmp_path: Path) -> None:
    """An empty table thaws with the columns and types it was frozen with."""
    evidence = factories.evidence(log_tables=LogTables(), trial_tables=TrialTables())
    freeze(evidence, tmp_path)
    assert_same(thaw(tmp_path), evidence)


def test_probe_files_follow_the_contract_layout(tmp_path: Path) -> None:
    """The frozen probes are readable as a recorded probe directory."""
    freeze(_handmade(), tmp_path)
    names = sorted(
        p.relative_to(tmp_path / "probes").as_posix()
        for p in (tmp_path / "probes").rglob("*")
        if p.is_file()
    )
    assert {"probes.json", "controller.json", "attempts.json"} <= set(names)
    assert "stacks/task-0-pid4242-1.txt" in names and "gpus/pod-0.csv" in names
    recorded = read_probes(tmp_path / "probes")
    assert recorded.controller is not None and recorded.controller.failure_count == 2
    assert recorded.stacks[0].pid == 4242


def test_marker_is_written_last(tmp_path: Path) -> None:
    """`evidence.json`, whose presence marks a whole freeze, is the last file written."""
    assert freeze(_handmade(), tmp_path)[-1].name == MARKER


def test_thaw_refuses_an_incomplete_directory(tmp_path: Path) -> None:
    """A directory without the marker is not frozen evidence."""
    with pytest.raises(FrozenEvidenceError):
        thaw(tmp_path)
