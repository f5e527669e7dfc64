"""Issue 27's findings 5 and 8 on bundles judged by `diagnose` as a user runs it: trainer–trial
agreement by evidence, and a concrete handoff for every death that needs a change (a Hydra
override, a missing module or file, a verifier that cannot run, a sandbox provider's quota)."""

from __future__ import annotations

from pathlib import Path

from shared.models import GateName, Report
from tests.scenarios import issue27
from tests.scenarios import real_lines as real
from tests.scenarios.catalog import Built
from worker.diagnosis import diagnose


def judge(built: Built) -> Report:
    return diagnose(built.job_dir, now=built.now, probes_dir=built.probes)


def statuses(report: Report) -> dict[str, str]:
    return {name.value: gate.status.value for name, gate in report.gates.items()}


# --- finding 8: deaths that need a change ---------------------------------------------------------


def test_a_hydra_override_crash_loop_hands_off_the_key(tmp_path: Path) -> None:
    """BiomedGPT#75's `Could not override 'common.no_progress_bar'` on three attempts: KILL, and
    the handoff names the override to change and how to prove the fix."""
    report = judge(real.loop(tmp_path, "rl-override", [issue27.HYDRA_OVERRIDE] * 3))
    assert report.verdict.value == "KILL", report.reasoning
    handoff = report.handoff
    assert handoff is not None
    assert "common.no_progress_bar" in handoff.component
    assert "Hydra override" in handoff.component
    assert "hydra.compose" in handoff.test and "Finished: 'step'" in handoff.test
    assert any("Could not override" in q.text for q in handoff.evidence)


def test_a_module_not_found_loop_hands_off_an_image_rebuild(tmp_path: Path) -> None:
    """Ray#44264's replica dying on `ModuleNotFoundError: No module named 'kaiko.llm_serve'` (Ray's
    actor-death line first) on three attempts: a crash loop on the import error itself, the
    `config_failure` proof, and a handoff to rebuild the image with the module."""
    report = judge(real.loop(tmp_path, "rl-module", [issue27.MODULE_MISSING] * 3))
    assert report.verdict.value == "KILL", report.reasoning
    assert report.restarts.same_failure is True
    assert report.restarts.signatures[0].startswith("ModuleNotFoundError")
    liveness = report.gates[GateName.LIVENESS]
    assert liveness.proof is not None and liveness.proof.rule == "config_failure"
    handoff = report.handoff
    assert handoff is not None
    assert "kaiko.llm_serve" in handoff.component and "container image" in handoff.component
    assert "import kaiko.llm_serve" in handoff.test


def test_a_first_attempt_dead_on_a_missing_file_is_not_initialising(tmp_path: Path) -> None:
    """XrayGLM#89's `FileNotFoundError` of a model config ending the only attempt before its first
    step, twelve minutes of silence, the controller still running: the `config_failure` KILL with
    a handoff naming the path (it was the initialisation NO-KILL)."""
    built = issue27.died_at_start(
        tmp_path, "rl-file", lines=[issue27.MODEL_FILE_MISSING.text], silent_min=12
    )
    report = judge(built)
    assert report.verdict.value == "KILL", report.reasoning
    assert report.kill_proof is not None and report.kill_proof.rule == "config_failure"
    handoff = report.handoff
    assert handoff is not None
    assert "THUDM/visualglm-6b/model_config.json" in handoff.component
    assert "test -e THUDM/visualglm-6b/model_config.json" in handoff.test


def test_a_fresh_death_at_start_is_error_with_the_handoff_not_initialising(tmp_path: Path) -> None:
    """The same death three minutes ago (within the stall limit; the job may be pending a retry):
    not yet established, so ERROR — never the initialisation PASS — and the owner already gets
    the handoff and the moment the KILL would be established."""
    for state in ("running", "pending"):
        built = issue27.died_at_start(
            tmp_path / state, "rl-file-fresh", lines=[issue27.MODEL_FILE_MISSING.text],
            silent_min=3, state=state,
        )  # fmt: skip
        report = judge(built)
        assert report.verdict.value == "ERROR", (state, report.reasoning)
        liveness = report.gates[GateName.LIVENESS]
        assert liveness.status.value == "ERROR" and not liveness.initializing
        assert "not initialising" in liveness.summary
        assert report.handoff is not None
        assert "THUDM/visualglm-6b/model_config.json" in report.handoff.component
        assert "then KILL (config_failure)" in report.flip_signal


def test_a_job_initialising_without_a_death_line_stays_initialising(tmp_path: Path) -> None:
    """The pair's other side: the same attempt without the death line is initialising (NO-KILL,
    low confidence), whatever the silence within the grace."""
    report = judge(issue27.died_at_start(tmp_path, "rl-init", lines=[], silent_min=12))
    assert report.verdict.value == "NO-KILL", report.reasoning
    assert report.gates[GateName.LIVENESS].initializing


def test_a_verifier_whose_test_file_is_missing_hands_off_to_the_environment(
    tmp_path: Path,
) -> None:
    """Every trial scores 0 because pytest found no test file (`ERROR: file or directory not
    found: /tests/test_outputs.py`): KILL whose proof quotes that verifier output, with the
    mechanism `reward signal invalid: the verifier could not run` and a handoff to the task
    owner naming the test path — not "the model collapsed"."""
    report = judge(
        issue27.verifier_cannot_run(tmp_path, "rl-verifier", output=issue27.TESTS_NOT_FOUND)
    )
    assert report.verdict.value == "KILL", report.reasoning
    proof = report.kill_proof
    assert proof is not None and proof.rule == "systemic_trials"
    assert "reward signal invalid: the verifier could not run" in proof.mechanism
    quoted = [q for q in proof.evidence if q.source.endswith("verifier/test-stdout.txt")]
    assert quoted and "file or directory not found: /tests/test_outputs.py" in quoted[0].text
    handoff = report.handoff
    assert handoff is not None
    assert "/tests/test_outputs.py" in handoff.component
    assert "owner: the environment" in handoff.component
    assert "oracle" in handoff.test


def test_a_test_failing_on_a_missing_output_is_the_models_failure(tmp_path: Path) -> None:
    """The pair's other side: every test ran and failed on the agent's missing output file
    (`No such file or directory: '/app/output.txt'`): no verifier failure, no environment
    handoff naming a test path; the all-zero reward stands on its own rule."""
    report = judge(
        issue27.verifier_cannot_run(tmp_path, "rl-model-fails", output=issue27.OUTPUT_NOT_FOUND)
    )
    rollouts = report.gates[GateName.ROLLOUTS]
    assert rollouts.kind == "zero_reward", rollouts.summary
    assert report.kill_proof is None or report.kill_proof.rule != "systemic_trials"
    assert report.handoff is None or "/tests/" not in report.handoff.component


def test_a_sandbox_quota_on_most_trials_hands_off_to_the_environment(tmp_path: Path) -> None:
    """56 of 60 trials refused with `DaytonaValidationError: Total disk limit exceeded` while the
    trainer's reward stays positive and its batch lines name the exception every step: KILL, the
    reward signal invalid, a handoff to the environment owner naming the provider's quota."""
    report = judge(issue27.provider_on_most_trials(tmp_path, "rl-provider"))
    assert report.verdict.value == "KILL", report.reasoning
    proof = report.kill_proof
    assert proof is not None and proof.rule == "systemic_trials"
    assert "reward signal invalid: the sandbox provider refuses sandboxes" in proof.mechanism
    assert "reward signal invalid" in report.reasoning
    handoff = report.handoff
    assert handoff is not None
    assert (
        "organisation quota" in handoff.component and "owner: the environment" in handoff.component
    )
    assert "Total disk limit exceeded" in handoff.likely_cause
    assert handoff.test and handoff.proposed_behavior
    assert any("Exception breakdown" in q.text for q in proof.evidence)


def test_the_all_refused_quota_scenario_reads_as_an_invalid_reward(tmp_path: Path) -> None:
    """The corpus's Daytona snapshot-quota run (every trial refused, the trainer on zeros) names
    the same mechanism and hands off to the environment owner."""
    from tests.scenarios.catalog import daytona_quota

    report = judge(daytona_quota(tmp_path))
    assert report.verdict.value == "KILL"
    rollouts = report.gates[GateName.ROLLOUTS]
    assert rollouts.mechanism is not None
    assert rollouts.mechanism.startswith("reward signal invalid: the sandbox provider")
    assert report.handoff is not None and "owner: the environment" in report.handoff.component


# --- finding 5: trainer–trial agreement by evidence ----------------------------------------------


def test_trials_collapsing_with_the_trainer_agree_without_any_exception(tmp_path: Path) -> None:
    """The trainer's reward collapses and the trials finished over its newest ten steps score 0,
    none raising, the rollouts gate passing: the learning-quality KILL stands (it was ERROR)."""
    report = judge(issue27.collapse_with_trials(tmp_path, "rl-agree", window_reward=0.0))
    assert report.verdict.value == "KILL", report.reasoning
    assert statuses(report)["rollouts"] == "PASS"
    assert report.kill_proof is not None and report.kill_proof.rule == "reward_collapse"
    assert "The trials agree over the same window" in report.reasoning


def test_trials_healthy_while_the_trainer_collapses_disagree(tmp_path: Path) -> None:
    """The same trainer collapse with the trials over the window earning as before: the sources
    disagree, ERROR."""
    report = judge(issue27.collapse_with_trials(tmp_path, "rl-disagree", window_reward=1.0))
    assert report.verdict.value == "ERROR", report.reasoning
    assert "do not show it" in report.reasoning
