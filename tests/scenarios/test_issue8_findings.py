"""Every reproduction of issue 8's "What was found" (items 1-10), each on a bundle crafted for it
and judged by `diagnose` as a user runs it. Each of these gave the wrong answer before the issue was
fixed: a false KILL (1-7), a blind NO-KILL (8-9), or an ERROR where the stall was proven (10)."""

from __future__ import annotations

from pathlib import Path

from shared.models import GateName, Report
from tests import factories as f
from tests.scenarios import crafted
from tests.scenarios.catalog import Built
from worker.diagnosis import diagnose
from worker.evidence.model import ProbeEvidence
from worker.gates import dynamics, resources, restarts


def judge(built: Built) -> Report:
    return diagnose(built.job_dir, now=built.now, probes_dir=built.probes)


def statuses(report: Report) -> dict[str, str]:
    return {name.value: gate.status.value for name, gate in report.gates.items()}


def liveness(report: Report) -> str:
    return statuses(report)["liveness"]


def summary(report: Report, name: GateName) -> str:
    return report.gates[name].summary


# --- item 1: stale stacks prove a stall -----------------------------------------------------------


def test_item1_dumps_taken_days_earlier_prove_nothing(tmp_path: Path) -> None:
    """Dumps three days older than the capture are no live evidence: ERROR, not KILL."""
    report = judge(crafted.stacks_days_old(tmp_path))
    assert (report.verdict.value, liveness(report)) == ("ERROR", "ERROR")
    assert "stale (dump taken" in summary(report, GateName.LIVENESS)


def test_item1_dumps_before_the_next_logged_step_prove_nothing(tmp_path: Path) -> None:
    """Dumps taken minutes before the job logged its next step are not after the newest
    progress: ERROR, not KILL."""
    report = judge(crafted.stacks_before_next_step(tmp_path))
    assert (report.verdict.value, liveness(report)) == ("ERROR", "ERROR")


def test_item1_dumps_of_the_previous_attempts_pod_prove_nothing(tmp_path: Path) -> None:
    """Dumps of a pod that belonged to an earlier attempt say nothing about the current one."""
    report = judge(crafted.stacks_of_previous_attempt(tmp_path))
    assert report.verdict.value != "KILL"
    assert liveness(report) == "ERROR"


# --- item 2: generic signatures make a crash loop -------------------------------------------------


def test_item2_exit_code_alone_is_no_crash_loop(tmp_path: Path) -> None:
    """Three attempts dying at different steps with only `exit code 1` are no crash loop."""
    report = judge(crafted.generic_exit_codes(tmp_path))
    assert report.verdict.value != "KILL"
    assert report.restarts.same_failure is not True
    assert not report.restarts.doomed


def test_item2_slurm_bare_failed_is_no_crash_loop(tmp_path: Path) -> None:
    """Slurm's bare `FAILED` on every attempt is no signature either."""
    report = judge(crafted.slurm_bare_failed(tmp_path))
    assert report.verdict.value != "KILL"
    assert report.restarts.same_failure is not True


def test_item2_generic_signatures_are_refused_wherever_they_come_from() -> None:
    """The one specificity test refuses exit codes and bare states, accepts exception types."""
    assert not restarts.is_specific_signature(restarts.failure_signature(None, 1))
    assert not restarts.is_specific_signature(restarts.failure_signature("FAILED"))
    assert not restarts.is_specific_signature(restarts.failure_signature("Exit code: 137"))
    assert restarts.is_specific_signature(
        restarts.failure_signature("Exit code: 1. stderr: torch.OutOfMemoryError: CUDA oom")
    )


# --- item 3: one non-finite value is divergence ---------------------------------------------------


def test_item3_one_inf_spike_followed_by_finite_steps_is_not_divergence(tmp_path: Path) -> None:
    """A single inf grad norm followed by finite steps is noted, and the run is NO-KILL."""
    report = judge(crafted.one_inf_spike(tmp_path))
    assert (report.verdict.value, statuses(report)["dynamics"]) == ("NO-KILL", "PASS")
    notes = report.gates[GateName.DYNAMICS].details
    assert any("non-finite policy/raw_grad_norm last at step 20" in d for d in notes)


# --- item 4: a collapse shorter than the window ---------------------------------------------------


def test_item4_entropy_collapse_over_six_steps_is_no_kill(tmp_path: Path) -> None:
    """Entropy collapsed on 6 of the 10 window steps drags the median but is no KILL."""
    report = judge(crafted.short_entropy_collapse(tmp_path))
    assert (report.verdict.value, statuses(report)["dynamics"]) == ("NO-KILL", "PASS")


# --- item 5: "not recovering" for each mechanism --------------------------------------------------


def test_item5_entropy_recovering_is_no_kill(tmp_path: Path) -> None:
    """Entropy under the line on every window step but trending back: no KILL."""
    report = judge(crafted.entropy_recovering(tmp_path))
    assert report.verdict.value == "NO-KILL"


def test_item5_tis_recovering_is_no_kill(tmp_path: Path) -> None:
    """An importance ratio out of range but climbing back into range: no KILL."""
    report = judge(crafted.tis_recovering(tmp_path))
    assert report.verdict.value == "NO-KILL"


def test_item5_response_length_recovering_is_no_kill(tmp_path: Path) -> None:
    """A response-length collapse whose newest steps climb back: no KILL."""
    report = judge(crafted.length_recovering(tmp_path))
    assert report.verdict.value == "NO-KILL"


# --- item 6: OOM ----------------------------------------------------------------------------------


def test_item6_fresh_oom_is_not_hard_yet(tmp_path: Path) -> None:
    """An OOM logged 30 s before the capture, nothing after it yet, is no KILL."""
    report = judge(crafted.fresh_oom(tmp_path))
    assert report.verdict.value != "KILL"
    assert statuses(report)["resources"] == "ERROR"


def test_item6_vllm_oom_is_named_on_an_inference_rank(tmp_path: Path) -> None:
    """A vLLM engine's OOM during the policy phase is reported on an inference rank."""
    report = judge(crafted.vllm_oom_in_policy_phase(tmp_path))
    text = summary(report, GateName.RESOURCES)
    assert "inference rank" in text and "policy rank" not in text


# --- item 7: timestamps after now -----------------------------------------------------------------


def test_item7_one_future_dated_line_is_not_fresh_progress(tmp_path: Path) -> None:
    """A future-dated line with its Iris prefix time in the quiet period leaves the stall
    proven: KILL, the disagreement stated."""
    report = judge(crafted.future_dated_line(tmp_path))
    assert (report.verdict.value, liveness(report)) == ("KILL", "FAIL")
    assert any("clock disagreement" in d for d in report.discrepancies)


def test_item7_future_dated_line_without_prefix_is_error(tmp_path: Path) -> None:
    """Without an Iris prefix to reconcile it, a future-dated line makes liveness ERROR."""
    report = judge(crafted.future_dated_line(tmp_path, iris_prefix=False))
    assert (report.verdict.value, liveness(report)) == ("ERROR", "ERROR")
    assert any("evidence dated after now" in d for d in report.discrepancies)


def test_item7_trainer_logging_local_time_is_judged_by_the_prefix(tmp_path: Path) -> None:
    """A trainer clock two hours ahead of UTC is a stated offset: the stall stays proven."""
    report = judge(crafted.trainer_local_time(tmp_path))
    assert (report.verdict.value, liveness(report)) == ("KILL", "FAIL")
    assert any("constant 2 h ahead" in d for d in report.discrepancies)


def test_item7_now_earlier_than_the_evidence_is_error(tmp_path: Path) -> None:
    """`--now` seventy minutes before the newest lines: no PASS with a negative age."""
    report = judge(crafted.now_before_evidence(tmp_path))
    assert liveness(report) == "ERROR"
    assert "evidence dated after now" in summary(report, GateName.LIVENESS)


# --- item 8: a PASS ignores its own missing inputs ------------------------------------------------


def test_item8_dynamics_without_a_reward_series_is_error() -> None:
    """Thirty steps of entropy and loss but no reward: dynamics cannot PASS."""
    rows = f.metric_rows({"policy/policy_entropy": [1.0] * 30, "policy/policy_loss": [0.01] * 30})
    result = dynamics.check(f.evidence(log_tables=f.logs(metrics=rows)))
    assert result.status.value == "ERROR"
    assert "reward series" in result.missing


def test_item8_a_single_vllm_key_does_not_pass_resources() -> None:
    """One `vllm/*` metric key is not the engine tuple over a window: ERROR."""
    rows = f.metric_rows(
        {"vllm/num_requests_running": [4.0] * 12, "reward/avg_raw_reward": [0.3] * 12}
    )
    result = resources.check(f.evidence(log_tables=f.logs(metrics=rows)))
    assert result.status.value == "ERROR"


def test_item8_a_five_step_run_past_its_grace_does_not_pass_dynamics() -> None:
    """Five steps, an hour after the attempt began: no window, so dynamics is ERROR."""
    rows = f.metric_rows({"reward/avg_raw_reward": [0.2, 0.25, 0.3, 0.3, 0.35]})
    rows[0]["timestamp"] = f.at(60)
    result = dynamics.check(f.evidence(log_tables=f.logs(metrics=rows)))
    assert result.status.value == "ERROR"


# --- item 9: failed probes and unresolved disagreements -------------------------------------------


def test_item9_a_failed_pyspy_probe_makes_liveness_error(tmp_path: Path) -> None:
    """The capture needed a dump of every rank; one py-spy command failed: ERROR quoting it."""
    report = judge(crafted.stall_with_failed_probe(tmp_path))
    assert (report.verdict.value, liveness(report)) == ("ERROR", "ERROR")
    text = summary(report, GateName.LIVENESS)
    assert "py-spy dump --pid 8457" in text and "exited 1" in text


def test_item9_manifest_naming_another_job_is_error(tmp_path: Path) -> None:
    """A manifest that names another job than its directory is an unresolved disagreement."""
    report = judge(crafted.manifest_names_another_job(tmp_path))
    assert report.verdict.value == "ERROR"


def test_item9_unneeded_failed_probe_only_lowers_confidence() -> None:
    """A failed probe the judgement did not need is listed and lowers confidence only."""
    from shared.models import GateResult, GateStatus, RestartsResult
    from worker.evidence.model import ProbeCommand
    from worker.verdict import decide

    probes = ProbeEvidence(
        directory="probes",
        commands=(ProbeCommand(argv=("iris", "job", "logs", "x"), exit_code=None),),
    )
    gates = {n: GateResult(status=GateStatus.PASS, summary="ok") for n in GateName}
    none = RestartsResult(count=0, same_failure=None, interpretation="none")
    report = decide(f.evidence(probes=probes), none, gates)
    assert (report.verdict.value, report.confidence.value) == ("NO-KILL", "medium")


# --- item 10: a wedge outside collectives ---------------------------------------------------------


def test_item10_stall_outside_collectives_is_proven_with_corroboration(tmp_path: Path) -> None:
    """Identical trainer stacks outside any collective, the log silent far past the limit,
    engines at 0 tok/s with nothing running, no trial: KILL on live stacks."""
    report = judge(crafted.still_stall(tmp_path))
    assert (report.verdict.value, liveness(report)) == ("KILL", "FAIL")
    body = report.contract_dict()
    assert body["kill_proof"]["rule"] == "stall_still"
    sources = [q["source"] for q in body["kill_proof"]["evidence"]]
    assert sum("stacks/" in s for s in sources) == 4  # two ranks, two dumps each
