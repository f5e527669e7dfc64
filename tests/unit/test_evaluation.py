"""`rl-health eval`: labelled cases scored into a confusion matrix, precision, recall and misses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from shared.models import GateName, GateStatus, Verdict
from tests.corpus.kit import Labelled, write_case
from tests.scenarios.catalog import crash_loop, healthy_standard
from worker.cli import main
from worker.evaluation import CaseError, CaseOutcome, Expected, load_case, render_score, score


def _outcome(name: str, want: Verdict, got: Verdict | None, **gates: GateStatus) -> CaseOutcome:
    return CaseOutcome(
        name, Expected(verdict=want), got, {GateName(k): v for k, v in gates.items()}
    )


def test_the_matrix_counts_each_expected_and_given_verdict() -> None:
    """Each outcome lands in the cell of its label's verdict and the verdict it got."""
    result = score(
        [
            _outcome("a", Verdict.KILL, Verdict.KILL),
            _outcome("b", Verdict.KILL, Verdict.ERROR),
            _outcome("c", Verdict.NO_KILL, Verdict.KILL),
            _outcome("d", Verdict.ERROR, Verdict.NO_KILL),
        ]
    )
    assert result.count_cell(Verdict.KILL, Verdict.KILL) == 1
    assert result.count_cell(Verdict.KILL, Verdict.ERROR) == 1
    assert result.count_cell(Verdict.NO_KILL, Verdict.KILL) == 1
    assert result.count_cell(Verdict.ERROR, Verdict.NO_KILL) == 1


def test_precision_recall_false_kill_and_false_no_kill() -> None:
    """KILL precision is right KILLs over KILLs given, recall over KILLs wanted; a false NO-KILL
    is a NO-KILL where the label wanted KILL or ERROR."""
    result = score(
        [
            _outcome("a", Verdict.KILL, Verdict.KILL),
            _outcome("b", Verdict.KILL, Verdict.NO_KILL),
            _outcome("c", Verdict.ERROR, Verdict.KILL),
            _outcome("d", Verdict.ERROR, Verdict.NO_KILL),
            _outcome("e", Verdict.NO_KILL, Verdict.NO_KILL),
        ]
    )
    assert result.kill_precision == 0.5
    assert result.kill_recall == 0.5
    assert result.false_kill == 1
    assert result.false_no_kill == 2


def test_a_gate_status_that_differs_is_a_miss_even_with_the_right_verdict() -> None:
    """A label's gate statuses are checked too: the right verdict for the wrong reason misses."""
    outcome = CaseOutcome(
        "a",
        Expected(verdict=Verdict.KILL, gates={GateName.LIVENESS: GateStatus.FAIL}),
        Verdict.KILL,
        {GateName.LIVENESS: GateStatus.ERROR},
    )
    assert not outcome.hit
    assert "liveness ERROR (expected FAIL)" in outcome.miss_line()


def test_render_lists_one_line_per_miss() -> None:
    """The rendered score ends with one MISS line per missed case, naming what was expected."""
    text = render_score(
        score(
            [_outcome("a", Verdict.KILL, Verdict.KILL), _outcome("b", Verdict.KILL, Verdict.ERROR)]
        )
    )
    misses = [line for line in text.splitlines() if line.startswith("MISS")]
    assert misses == ["MISS b: expected KILL, got ERROR"]
    assert "score 1/2" in text


def _case(folder: Path, body: dict[str, object]) -> Path:
    (folder / "job").mkdir(parents=True)
    (folder / "case.json").write_text(json.dumps(body), encoding="utf-8")
    return folder


def test_unknown_keys_in_case_json_are_refused(tmp_path: Path) -> None:
    """A typo in a label is an error, never an expectation silently dropped."""
    body = {"job_dir": "job", "now": "2026-07-30T19:00:00Z", "expected": {"verdict": "KILL"}}
    _case(tmp_path / "c", {**body, "expect": {"verdict": "NO-KILL"}})
    with pytest.raises(CaseError, match="expect"):
        load_case(tmp_path / "c")


def test_a_job_dir_that_leaves_the_case_folder_is_refused(tmp_path: Path) -> None:
    """Case paths are relative to the case folder and may not leave it."""
    (tmp_path / "outside").mkdir()
    body = {"job_dir": "../outside", "now": "2026-07-30T19:00:00Z", "expected": {"verdict": "KILL"}}
    _case(tmp_path / "c", body)
    with pytest.raises(CaseError, match="leaves the case folder"):
        load_case(tmp_path / "c")


def _corpus(root: Path) -> Path:
    write_case(Labelled("crash_loop", crash_loop, "KILL", "three OOMs"), root)
    write_case(Labelled("healthy", healthy_standard, "NO-KILL", "trains"), root)
    return root


def test_eval_exits_zero_when_every_case_matches(tmp_path: Path) -> None:
    """Every label met: exit 0, the matrix printed, 100% recall."""
    result = CliRunner().invoke(main, ["eval", str(_corpus(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "recall 100.0% (1/1)" in result.output
    assert "score 2/2" in result.output


def test_eval_exits_one_and_names_the_miss(tmp_path: Path) -> None:
    """A label the rules do not meet: exit 1 and a MISS line naming the case and the verdicts."""
    root = _corpus(tmp_path)
    label = root / "healthy" / "case.json"
    body = json.loads(label.read_text())
    body["expected"] = {"verdict": "KILL"}
    label.write_text(json.dumps(body))
    result = CliRunner().invoke(main, ["eval", str(root)])
    assert result.exit_code == 1
    assert "MISS healthy: expected KILL, got NO-KILL" in result.output
    assert "false NO-KILL 1" in result.output


def test_an_unusable_case_is_a_miss_and_the_others_still_run(tmp_path: Path) -> None:
    """A malformed case.json is reported with its reason; the other cases are still scored."""
    root = _corpus(tmp_path)
    (root / "healthy" / "case.json").write_text("{not json", encoding="utf-8")
    result = CliRunner().invoke(main, ["eval", str(root)])
    assert result.exit_code == 1
    assert "MISS healthy: case unusable" in result.output
    assert "ok   crash_loop" in result.output


def test_a_folder_without_cases_is_unusable(tmp_path: Path) -> None:
    """No case.json anywhere: exit 2 with one line, not an empty 100%."""
    result = CliRunner().invoke(main, ["eval", str(tmp_path)])
    assert result.exit_code == 2
    assert "no case.json" in result.output
