"""The probe directory: Iris helpers, reading the docs/probes.md layout, writing it back."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from worker.evidence.model import ProbeCommand, ProbeEvidence, StackDump
from worker.evidence.probes import (
    attempts_from_iris_query_csv,
    controller_from_iris_summary,
    iris_state_name,
    parse_gpu_csv,
    read_probes,
    render_gpu_csv,
    write_probes,
)

IRIS = Path(__file__).parents[1] / "fixtures" / "iris"
CAPTURED = datetime(2026, 12, 2, 10, 13, 40, tzinfo=UTC)
STACK = "stacks/ops-hung-0-pid24491-1.txt"
PYSPY = ["iris", "task", "exec", "/ops/hung/0", "--", "py-spy", "dump", "--pid", "24491"]
GPU_CSV = (
    "index, utilization.gpu [%], memory.used [MiB], memory.total [MiB], power.draw [W], "
    "power.limit [W]\n"
    "0, 87 %, 40536 MiB, 81559 MiB, 412.35 W, 700.00 W\n"
    "1, 0 %, 3 MiB, 81559 MiB, [N/A], 700.00 W\n"
)


def iris_probe_dir(root: Path) -> Path:
    """A probe directory built from the Iris samples of the hung job."""
    probes = root / "probes"
    (probes / "stacks").mkdir(parents=True)
    (probes / "controller.json").write_text((IRIS / "job_summary_hung.json").read_text())
    attempts = attempts_from_iris_query_csv((IRIS / "query_task_attempts.csv").read_text())
    rows = [a.model_dump(mode="json") for a in attempts]
    (probes / "attempts.json").write_text(json.dumps(rows))
    (probes / STACK).write_text((IRIS / "task_exec_pyspy_hung.txt").read_text())
    header = {
        "captured_at": "2026-12-02T10:13:40Z",
        "backend": "iris",
        "job_id": "/ops/hung",
        "commands": [
            {
                "argv": PYSPY,
                "started_at": "2026-12-02T10:13:38.250Z",
                "exit_code": 0,
                "output": STACK,
            }
        ],
    }
    (probes / "probes.json").write_text(json.dumps(header))
    return probes


# --- Iris helpers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "name"),
    [(3, "running"), ("5", "failed"), (10, "preempted"), ("RUNNING", "running"),
     ("JOB_STATE_KILLED", "killed"), (None, "unknown"), (99, "state_99")],
)  # fmt: skip
def test_state_names(value: object, name: str) -> None:
    """Numeric Iris states map to docs/domain.md's names; text is lower-cased."""
    assert iris_state_name(value) == name


def test_attempts_from_the_iris_query_csv() -> None:
    """The task_attempts query gives one record per row, numeric states named, blanks None."""
    attempts = attempts_from_iris_query_csv((IRIS / "query_task_attempts.csv").read_text())
    assert len(attempts) == 5
    crash = attempts[0]
    assert (crash.task_id, crash.attempt_id, crash.state, crash.exit_code) == (
        "/ops/crashloop/0",
        0,
        "failed",
        3,
    )
    assert crash.error is not None and "CUDA out of memory" in crash.error
    assert [a.attempt_id for a in attempts[:3]] == [0, 1, 2]
    hung = attempts[4]
    assert (hung.state, hung.exit_code, hung.error, hung.finished_at_ms) == (
        "running",
        None,
        None,
        None,
    )
    assert hung.started_at_ms == 1796206345293
    assert attempts[3].state == "succeeded"


def test_controller_from_the_iris_summary() -> None:
    """`iris job summary --json` of the crash loop gives state, counts and tasks."""
    view = controller_from_iris_summary((IRIS / "job_summary_crashloop.json").read_text())
    assert (view.job_id, view.state, view.failure_count, view.task_count) == (
        "/ops/crashloop",
        "failed",
        3,
        1,
    )
    assert view.task_state_counts == {"failed": 1}
    assert view.tasks[0]["exit_code"] == 3
    assert view.max_retries_failure is None


def test_controller_numeric_states_are_named() -> None:
    """A summary with numeric states (job, tasks, counts) is normalised to names."""
    text = json.dumps(
        {"job_id": "/u/j", "state": 3, "task_state_counts": {"3": 2}, "tasks": [{"state": 10}]}
    )
    view = controller_from_iris_summary(text)
    assert (view.state, view.task_state_counts, view.tasks[0]["state"]) == (
        "running",
        {"running": 2},
        "preempted",
    )


# --- nvidia-smi -------------------------------------------------------------------------------


def test_gpu_csv_is_parsed_with_units_and_na() -> None:
    """Units are stripped, `[N/A]` is None, columns get short names."""
    rows = parse_gpu_csv(GPU_CSV)
    assert rows[0] == {
        "index": 0.0,
        "utilization_gpu_pct": 87.0,
        "memory_used_mib": 40536.0,
        "memory_total_mib": 81559.0,
        "power_draw_w": 412.35,
        "power_limit_w": 700.0,
    }
    assert rows[1]["power_draw_w"] is None


def test_gpu_csv_round_trips_through_render() -> None:
    """Rendering parsed rows and parsing them again gives the same rows."""
    rows = parse_gpu_csv(GPU_CSV)
    assert parse_gpu_csv(render_gpu_csv(rows)) == rows


def test_gpu_csv_without_header_uses_the_query_order() -> None:
    """`--format=csv,noheader` output is read in the documented column order."""
    assert parse_gpu_csv("3, 50 %, 1 MiB, 2 MiB, 3 W, 4 W\n")[0]["utilization_gpu_pct"] == 50.0


def test_empty_gpu_csv_has_no_rows() -> None:
    """Empty output gives no rows rather than an error."""
    assert parse_gpu_csv("\n") == ()


# --- reading ----------------------------------------------------------------------------------


def test_read_the_iris_probe_directory(tmp_path: Path) -> None:
    """A probe directory made of the Iris samples reads back controller, attempts and stack."""
    evidence = read_probes(iris_probe_dir(tmp_path))
    assert (evidence.backend, evidence.job_id, evidence.captured_at) == (
        "iris",
        "/ops/hung",
        CAPTURED,
    )
    assert evidence.controller is not None
    assert (evidence.controller.job_id, evidence.controller.state) == ("/ops/hung", "running")
    assert evidence.attempts is not None and len(evidence.attempts) == 5
    (stack,) = evidence.stacks
    assert (stack.target, stack.pid, stack.n) == ("ops-hung-0", 24491, 1)
    assert stack.source == "probes/stacks/ops-hung-0-pid24491-1.txt"
    assert stack.captured_at == datetime(2026, 12, 2, 10, 13, 38, 250000, tzinfo=UTC)
    assert "all_reduce_wait (<string>:3)" in stack.text
    assert evidence.failures == ()


def test_stack_without_a_command_is_dated_by_mtime(tmp_path: Path) -> None:
    """A stack no command names gets the file's modification time."""
    probes = iris_probe_dir(tmp_path)
    extra = probes / "stacks" / "ops-hung-0-pid24491-2.txt"
    extra.write_text("Thread 1 (idle)\n")
    os.utime(extra, (CAPTURED.timestamp(), CAPTURED.timestamp()))
    stacks = read_probes(probes, source_prefix="").stacks
    assert [s.n for s in stacks] == [1, 2]
    assert stacks[1].captured_at == CAPTURED
    assert stacks[1].source == "stacks/ops-hung-0-pid24491-2.txt"


def test_failed_timed_out_and_missing_outputs_are_failures(tmp_path: Path) -> None:
    """probes.json commands that timed out, exited non-zero or lost their output are listed."""
    probes = tmp_path / "probes"
    probes.mkdir()
    header = {
        "commands": [
            {"argv": ["nvidia-smi", "-q"], "exit_code": None, "output": "gpus/p0.csv"},
            {"argv": ["py-spy", "dump", "--pid", "7"], "exit_code": 1},
            {"argv": ["true"], "exit_code": 0, "output": "stacks/p0-pid1-1.txt"},
        ]
    }
    (probes / "probes.json").write_text(json.dumps(header))
    failures = read_probes(probes).failures
    assert failures == (
        "`nvidia-smi -q`: timed out (exit_code null); its output gpus/p0.csv is missing",
        "`py-spy dump --pid 7`: exited 1",
        "`true`: its output stacks/p0-pid1-1.txt is missing",
    )


def test_missing_files_without_commands_are_silent(tmp_path: Path) -> None:
    """An empty probe directory gives empty fields and no failures (nothing was run)."""
    (tmp_path / "probes").mkdir()
    evidence = read_probes(tmp_path / "probes")
    assert evidence.controller is None
    assert evidence.attempts is None
    assert (evidence.stacks, evidence.gpus, evidence.failures) == ((), {}, ())


def test_unparseable_files_become_failures(tmp_path: Path) -> None:
    """A corrupt controller.json or attempts.json is a failure line, not an exception."""
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "controller.json").write_text("{")
    (probes / "attempts.json").write_text('{"not": "a list"}')
    (probes / "stacks").mkdir()
    (probes / "stacks" / "badname.txt").write_text("x")
    evidence = read_probes(probes)
    assert evidence.controller is None and evidence.attempts is None
    assert len(evidence.failures) == 3
    assert evidence.failures[0].startswith("controller.json does not parse")
    assert "attempts.json is not a JSON list" in evidence.failures
    assert "stacks/badname.txt: name is not <task-or-pod>-pid<pid>-<n>.txt" in evidence.failures


def test_stack_symlink_leaving_the_probe_dir_is_refused(tmp_path: Path) -> None:
    """A stack file linking outside the probe directory is not read and is listed."""
    probes = tmp_path / "probes"
    (probes / "stacks").mkdir(parents=True)
    (tmp_path / "secret.txt").write_text("secret")
    (probes / "stacks" / "p-pid1-1.txt").symlink_to(tmp_path / "secret.txt")
    evidence = read_probes(probes)
    assert evidence.stacks == ()
    assert len(evidence.failures) == 1
    # the refusal names the file as the probe directory gives it, never where it points
    assert "stacks/p-pid1-1.txt" in evidence.failures[0]
    assert "secret.txt" not in evidence.failures[0]


# --- writing ----------------------------------------------------------------------------------


def sample_evidence() -> ProbeEvidence:
    controller = controller_from_iris_summary((IRIS / "job_summary_hung.json").read_text())
    attempts = attempts_from_iris_query_csv((IRIS / "query_task_attempts.csv").read_text())
    stacks = tuple(
        StackDump(
            target="ops-hung-0",
            pid=24491,
            n=n,
            source=f"probes/stacks/ops-hung-0-pid24491-{n}.txt",
            captured_at=datetime(2026, 12, 2, 10, 13, 30 + 5 * n, 123456, tzinfo=UTC),
            text=(IRIS / "task_exec_pyspy_hung.txt").read_text(),
        )
        for n in (1, 2)
    )
    command = ProbeCommand(
        argv=tuple(PYSPY),
        started_at=stacks[0].captured_at,
        exit_code=0,
        output="stacks/ops-hung-0-pid24491-1.txt",
    )
    return ProbeEvidence(
        directory="probes",
        captured_at=CAPTURED,
        backend="iris",
        job_id="/ops/hung",
        commands=(command,),
        controller=controller,
        attempts=attempts,
        stacks=stacks,
        gpus={"iris-ops-hung-0": parse_gpu_csv(GPU_CSV)},
    )


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    """What write_probes writes, read_probes reads back equal."""
    evidence = sample_evidence()
    write_probes(evidence, {}, tmp_path / "probes")
    assert read_probes(tmp_path / "probes") == evidence


def test_raw_outputs_are_written_verbatim_and_win(tmp_path: Path) -> None:
    """A raw output for a gpus/ file is kept byte for byte instead of a rendering."""
    evidence = sample_evidence()
    write_probes(evidence, {"gpus/iris-ops-hung-0.csv": GPU_CSV}, tmp_path / "probes")
    assert (tmp_path / "probes" / "gpus" / "iris-ops-hung-0.csv").read_text() == GPU_CSV
    assert read_probes(tmp_path / "probes").gpus == evidence.gpus


def test_write_refuses_an_output_leaving_the_directory(tmp_path: Path) -> None:
    """An output path with `..` that leaves the probe directory is refused."""
    with pytest.raises(ValueError, match="outside"):
        write_probes(sample_evidence(), {"../escape.txt": "x"}, tmp_path / "probes")
    assert not (tmp_path / "escape.txt").exists()
