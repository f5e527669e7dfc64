"""The facts the verdict and the gates share, derived once from the evidence: job states, time
checks, the log's clock against the Iris prefix, failed probes, identity; and the shape that keeps
the rules honest (every registered rule states its hypothesis; tables render in `reports/`)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import worker.gates.dynamics
import worker.gates.liveness
import worker.gates.resources
import worker.gates.rollouts  # noqa: F401  (registers the rules)
from reports.json_report import render_json
from reports.tables import format_cell, format_table
from shared.models import GateName, GateResult, GateStatus, RestartsResult, Table
from tests import factories as f
from worker.evidence.facts import CLOCK_TOLERANCE_S, LOG_LINE, PHASE, STEP, TRIAL
from worker.evidence.jobstate import JobState
from worker.evidence.logs import parse_job_logs
from worker.evidence.model import ClockSkew, ParseSummary, ProbeCommand, ProbeEvidence
from worker.gates.proofs import PROOF_RULES
from worker.gates.rules import REGISTRY
from worker.verdict import decide


def timer(minutes_ago: float, line: int, phase: str = "step") -> dict[str, object]:
    return {
        "event": "finished",
        "phase": phase,
        "seconds": 60.0,
        "step": line,
        "source": "finelog.log",
        "line": line,
        "timestamp": f.NOW - timedelta(minutes=minutes_ago),
        "attempt": 0,
    }


# --- job states ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "state"),
    [
        ("running", JobState.RUNNING),
        ("JOB_STATE_FAILED", JobState.FAILED),
        ("task_state_preempted", JobState.PREEMPTED),
        ("8", JobState.UNSCHEDULABLE),
        (5, JobState.FAILED),
        ("no-such-state", None),
        (None, None),
    ],
)
def test_job_state_reads_every_form(raw: str | int | None, state: JobState | None) -> None:
    """Names, prefixed names and Iris numbers all read as one enum; unknown is None."""
    assert JobState.parse(raw) is state


def test_job_state_groups_agree_on_terminal() -> None:
    """Terminal, waiting, failure, transient and alive are the one definition every gate uses."""
    terminal = {s for s in JobState if s.terminal}
    assert terminal == {"succeeded", "failed", "killed", "worker_failed", "unschedulable"}
    assert {s for s in JobState if s.waiting} == {"pending", "building", "assigned"}
    assert {s for s in JobState if s.failure} == {"failed", "worker_failed", "cosched_failed"}
    assert {s for s in JobState if s.transient} == {"worker_failed", "preempted"}
    assert not any(s.waiting and s.terminal for s in JobState)


# --- time ----------------------------------------------------------------------------------------


def test_rows_after_now_are_never_progress() -> None:
    """A step dated after `now` is not the newest progress; beyond the tolerance it is stated."""
    rows = [timer(5, 1), timer(-0.5, 2), timer(-30, 3)]
    facts = f.evidence(log_tables=f.logs(timers=rows)).facts
    newest = facts.newest(STEP)
    assert newest is not None and newest.at == f.NOW - timedelta(minutes=5)
    assert [m.kind for m in facts.future] == [LOG_LINE]
    assert facts.future[0].at == f.NOW + timedelta(minutes=30)
    assert any("evidence dated after now" in d for d in facts.discrepancies())


def test_a_row_within_the_clock_tolerance_is_no_discrepancy() -> None:
    """A row dated less than CLOCK_TOLERANCE_S after `now` is not stated, and not progress."""
    ahead = -(CLOCK_TOLERANCE_S - 10) / 60
    facts = f.evidence(log_tables=f.logs(timers=[timer(3, 1), timer(ahead, 2)])).facts
    assert facts.future == ()
    newest = facts.newest(PHASE)
    assert newest is not None and newest.at == f.NOW - timedelta(minutes=3)


def test_finished_trials_are_progress_and_future_ones_are_stated() -> None:
    """A finished trial dates progress; one finished after `now` is evidence from the future."""
    trials = f.trials(
        [
            {"trial_name": "a", "status": "finished", "finished_at": f.at(4), "source": "a/r"},
            {"trial_name": "b", "status": "finished", "finished_at": f.at(-20), "source": "b/r"},
        ]
    )
    facts = f.evidence(trial_tables=trials).facts
    trial = facts.newest(TRIAL)
    assert trial is not None and trial.at == f.at(4)
    assert [m.kind for m in facts.future] == [TRIAL]


@pytest.mark.parametrize(
    ("clock", "expected"),
    [
        (ClockSkew(lines=40, min_s=7190, max_s=7210, off_lines=40, source="finelog.log"),
         "constant 2 h ahead of the Iris prefix"),
        (ClockSkew(lines=40, min_s=-25230, max_s=-25170, off_lines=40, source="finelog.log"),
         "constant 7 h behind the Iris prefix"),
        (ClockSkew(lines=40, min_s=0, max_s=7200, off_lines=1, first_line=77,
                   source="finelog.log"), "1 of 40 lines"),
        (ClockSkew(lines=40, min_s=-2, max_s=3, off_lines=0), None),
    ],
)  # fmt: skip
def test_clock_offsets_are_stated(clock: ClockSkew, expected: str | None) -> None:
    """A constant own-time offset is a clock fact; a varying one a disagreement; none is silent."""
    facts = f.evidence(log_tables=f.logs(summary=ParseSummary(clock=clock))).facts
    if expected is None:
        assert facts.clock_note is None
    else:
        assert facts.clock_note is not None and expected in facts.clock_note


def test_replayed_lines_are_stated_with_the_newest_consistent_progress() -> None:
    """The facts state the replay and what the gates judged instead."""
    clock = ClockSkew(
        replayed=2, replayed_examples=("finelog.log:40: own time 2026-07-30 20:01:00, ...",)
    )
    timers = [
        {"event": "finished", "phase": "step", "step": 3, "seconds": 60.0,
         "source": "finelog.log", "line": 30, "timestamp": f.at(50), "attempt": 0},
    ]  # fmt: skip
    logs = f.logs(timers=timers, summary=ParseSummary(clock=clock))
    note = f.evidence(log_tables=logs).facts.replay_note
    assert note is not None
    assert note.startswith("2 line(s) re-sent by the log shipper")
    assert "(first: finelog.log:40: own time 2026-07-30 20:01:00" in note
    assert "newest consistent progress: step at 2026-07-30T20:25:00Z" in note
    assert note in f.evidence(log_tables=logs).facts.discrepancies()


def test_the_parser_judges_a_line_by_its_prefix_when_its_own_time_disagrees(
    tmp_path: Path,
) -> None:
    """Loguru times two hours ahead of the Iris prefix: rows carry the prefix time, and the
    summary counts the constant offset (the parser change made for this issue)."""
    start = datetime(2026, 7, 30, 18, 0, tzinfo=UTC)
    lines = []
    for i in range(4):
        moment = start + timedelta(minutes=i)
        own = moment + timedelta(hours=2)
        lines.append(
            f"[{moment:%H:%M:%S}] task=/ops/x/0 | (skyrl_entrypoint pid=1) "
            f"{own:%Y-%m-%d %H:%M:%S}.000 | INFO     | skyrl_train.trainer:train:210 - "
            "Finished: 'step', time cost: 60.00s"
        )
    (tmp_path / "finelog.log").write_text("\n".join(lines) + "\n")
    logs = parse_job_logs(tmp_path, reference_date=start.date())
    assert logs is not None
    assert logs.timers["timestamp"].to_list() == [start + timedelta(minutes=i) for i in range(4)]
    clock = logs.summary.clock
    assert (clock.lines, clock.off_lines, clock.min_s, clock.max_s) == (4, 4, 7200.0, 7200.0)
    assert logs.summary.last_timestamp == start + timedelta(minutes=3)


# --- probes and identity -------------------------------------------------------------------------


def test_failed_probes_are_classified_by_what_they_were_for() -> None:
    """Each failed command is classified (stacks, gpus, controller, attempts, logs) and quoted."""
    commands = (
        ProbeCommand(argv=("iris", "task", "exec", "t", "--", "py-spy", "dump", "--pid", "7"),
                     exit_code=1, output="stacks/t-pid7-1.txt"),
        ProbeCommand(argv=("kubectl", "exec", "p", "--", "nvidia-smi"), exit_code=None),
        ProbeCommand(argv=("iris", "job", "summary", "/ops/x", "--json"), exit_code=2),
        ProbeCommand(argv=("iris", "job", "logs", "/ops/x"), exit_code=0),
    )  # fmt: skip
    probes = ProbeEvidence(directory="probes", commands=commands)
    failures = f.evidence(probes=probes).facts.probe_failures
    assert [x.kind for x in failures] == ["stacks", "gpus", "controller"]
    assert failures[0].text.endswith("exited 1") and "timed out" in failures[1].text
    assert failures[0].quote.source == "probes/probes.json"


def test_identity_disagreement_is_a_fact() -> None:
    """Probes of another job than the manifest's is an identity disagreement."""
    probes = ProbeEvidence(directory="probes", job_id="/ops/another-job")
    identity = f.evidence(probes=probes).facts.identity
    assert identity is not None and "/ops/another-job" in identity
    assert f.evidence().facts.identity is None


def test_attempt_start_prefers_the_controller_record() -> None:
    """The current attempt began when the controller's newest attempt record says."""
    from worker.evidence.model import AttemptRecord

    start = f.at(30)
    record = AttemptRecord(task_id="t", attempt_id=1, state="running",
                           started_at_ms=int(start.timestamp() * 1000))  # fmt: skip
    probes = ProbeEvidence(directory="probes", attempts=(record,))
    assert f.evidence(probes=probes).facts.attempt_started_at == start


# --- the shape -----------------------------------------------------------------------------------


def test_every_rule_states_its_hypothesis_in_each_named_package() -> None:
    """Every registered rule has a hypothesis, and the packages the issue names all register."""
    gates = {rule.gate for rule in REGISTRY.values()}
    for expected in (
        "dynamics.hard", "dynamics.trend", "dynamics.tis", "dynamics.phases",
        "rollouts.agentic", "rollouts.standard", "resources.cuda", "resources.saturation",
        "liveness",
    ):  # fmt: skip
        assert expected in gates
    for rule in REGISTRY.values():
        assert len(rule.hypothesis.split()) >= 8, rule


def test_every_proof_rule_names_its_gate_and_meaning() -> None:
    """Each proof rule belongs to a gate (or restarts) and says what establishes it."""
    gates = {g.value for g in GateName} | {"restarts"}
    for rule in PROOF_RULES.values():
        assert rule.gate in gates and rule.meaning


def test_tables_render_in_reports() -> None:
    """A table laid out by reports/: header, numbers right-aligned with units, NaN spelled."""
    table = Table(
        title="phases", columns=("phase", "ratio"), rows=(("sync", 3.3), ("gen", math.nan)),
        units=("", "×"),
    )  # fmt: skip
    assert format_table(table) == ["phases", "phase | ratio", "sync  |  3.3×", "gen   |   NaN"]
    assert format_cell(None) == "-" and format_cell(12) == "12" and format_cell(math.inf) == "inf"


def test_json_report_stays_strict_json_with_non_finite_cells() -> None:
    """NaN in a table cell is written as a string, so the JSON report parses strictly."""
    table = Table(title="w", columns=("step", "loss"), rows=((1, math.nan),))
    gates = {n: GateResult(status=GateStatus.PASS, summary="ok") for n in GateName}
    gates[GateName.DYNAMICS] = GateResult(status=GateStatus.PASS, summary="ok", tables=(table,))
    none = RestartsResult(count=0, same_failure=None, interpretation="none")
    text = render_json(decide(f.evidence(), none, gates))

    def refuse(token: str) -> float:
        raise ValueError(token)

    body = json.loads(text, parse_constant=refuse)
    assert body["gates"]["dynamics"]["tables"][0]["rows"] == [[1, "NaN"]]
