"""Issue 10's rules on bundles built from verbatim failure lines of public issue trackers
(`tests/fixtures/real_failures/`, each with its URL), judged by `diagnose` as a user runs it.

- Each real failure signature in three attempts is a crash loop: KILL with same_failure true.
- The three consequences the issue names: an NCCL start-up failure on three attempts (KILL, was
  NO-KILL), an engine's fatal error then hours of silence (the logged-death KILL, was ERROR), a
  configuration error on every attempt (KILL with a handoff, was KILL without one).
- Different signatures across attempts are no crash loop; generic records never are.
- Benign noise injected into healthy and failing scenarios leaves every verdict unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.models import GateName, Report
from tests.scenarios import real_lines as real
from tests.scenarios.catalog import SCENARIOS, Built, Scenario
from worker.diagnosis import diagnose
from worker.evidence.failures import signature


def judge(built: Built) -> Report:
    return diagnose(built.job_dir, now=built.now, probes_dir=built.probes)


def statuses(report: Report) -> dict[str, str]:
    return {name.value: gate.status.value for name, gate in report.gates.items()}


LOOPING = [line for line in real.real_lines() if line.ends_an_attempt]


def test_the_fixtures_hold_enough_signatures_to_loop_on() -> None:
    """Most fixture lines can end an attempt; benign, transient and exit records cannot."""
    assert len(LOOPING) >= 50
    assert not [line for line in LOOPING if line.failure_class in ("benign", "transient")]
    assert not [line for line in LOOPING if not line.specific]


# --- each signature in three attempts -------------------------------------------------------------


@pytest.mark.parametrize("line", LOOPING, ids=lambda line: line.id)
def test_each_real_signature_in_three_attempts_is_a_crash_loop(
    line: real.RealLine, tmp_path: Path
) -> None:
    """Three attempts dying on the same verbatim failure line are a deterministic crash loop:
    KILL, same_failure true, the proof `crash_loop` on that line's signature."""
    report = judge(real.loop(tmp_path, "rl-loop", [[line.text]] * 3))
    assert report.verdict.value == "KILL", (line.url, report.reasoning)
    assert report.restarts.same_failure is True, (line.url, report.restarts.interpretation)
    assert report.restarts.doomed
    assert report.kill_proof is not None and report.kill_proof.rule == "crash_loop"
    assert report.restarts.signatures[0] in report.kill_proof.mechanism


# --- the three consequences the issue names -----------------------------------------------------


NCCL_STARTUP = real.block(real.NCCL_STARTUP_URL, "DistBackendError")
NCCL_SIGNATURE = (
    "DistBackendError: NCCL error in: <path>:<n>, unhandled cuda error (run with "
    "NCCL_DEBUG=INFO for details), NCCL version <n>"
)


@pytest.mark.parametrize(
    ("history", "running_after"),
    [(False, False), (True, False), (True, True)],
    ids=["logs-only", "attempt-history", "history-then-a-fourth-attempt-initialising"],
)
def test_three_attempts_on_one_nccl_startup_failure_are_kill(
    history: bool, running_after: bool, tmp_path: Path
) -> None:
    """SkyRL#84's NCCL start-up failure (DistBackendError, ncclUnhandledCudaError, Cuda failure,
    Ray's unhandled-error report) on three attempts is KILL with same_failure — not three
    transients and a NO-KILL, even while a fourth attempt is initialising and the controller's
    records say only `Exit code: 1`."""
    built = real.loop(
        tmp_path, "rl-nccl", [NCCL_STARTUP] * 3, history=history, running_after=running_after
    )
    report = judge(built)
    assert report.verdict.value == "KILL", report.reasoning
    assert report.restarts.same_failure is True and report.restarts.doomed
    assert report.restarts.signatures[0] == NCCL_SIGNATURE
    assert report.kill_proof is not None and report.kill_proof.rule == "crash_loop"


def test_the_nccl_signature_is_the_parsers_of_each_report() -> None:
    """The loop's signature is the parser's normalised one: two reports of the failure (other
    path, line number, NCCL version) sign alike."""
    for line in (real.NCCL_UNHANDLED, real.NCCL_UNHANDLED_VERL):
        message = line.text.split("DistBackendError: ", 1)[1]
        assert signature("DistBackendError", message) == NCCL_SIGNATURE


@pytest.mark.parametrize(
    ("engines", "dead"),
    [
        (1, [(-1, real.ENGINE_FATAL.text)]),
        (2, [(0, real.ENGINE_DIED.text), (1, real.ENGINE_DIED_DP1.text)]),
    ],
    ids=["one-engine-fatal-error", "two-engines-core-died"],
)
def test_engine_death_then_hours_of_silence_is_the_logged_death_kill(
    engines: int, dead: list[tuple[int, str]], tmp_path: Path
) -> None:
    """vLLM's `EngineCore encountered a fatal error` (vllm#17276) of the only engine, or `Engine
    core proc ... died unexpectedly` of both engines (vllm#32468, ms-swift#7933), then three
    hours of silence while the controller says running: KILL, proven by the death line."""
    report = judge(
        real.engine_death(tmp_path, "rl-engine", engines=engines, dead=dead, silent_min=180)
    )
    assert report.verdict.value == "KILL", report.reasoning
    assert statuses(report)["liveness"] == "FAIL"
    proof = report.kill_proof
    assert proof is not None and proof.rule == "logged_death"
    texts = [q.text for q in proof.evidence]
    assert all(any(text in quoted for quoted in texts) for _, text in dead)
    assert f"every inference engine ({engines} of {engines})" in proof.mechanism


def test_one_engine_of_two_dead_is_no_proof(tmp_path: Path) -> None:
    """One engine's death line of two, then hours of silence, is no logged death: the other may
    be idle because the trainer waits. ERROR (stacks needed), not KILL."""
    report = judge(
        real.engine_death(
            tmp_path, "rl-engine-half", engines=2, dead=[(0, real.ENGINE_DIED.text)], silent_min=180
        )
    )
    assert report.verdict.value == "ERROR"
    assert statuses(report)["liveness"] == "ERROR"


@pytest.mark.parametrize(
    ("failures", "component"),
    [
        ([[real.KEY_NOT_IN_STRUCT.text]] * 3, "the config key `io`"),
        ([real.block(real.HYDRA_APP_URL, "checkpoint")] * 3, "the config key `checkpoint`"),
        ([[real.NO_KV_MEMORY.text]] * 3, "gpu_memory_utilization"),
    ],
    ids=["key-not-in-struct", "hydra-app-banner-then-traceback", "vllm-no-kv-cache-memory"],
)
def test_configuration_error_on_every_attempt_is_kill_with_handoff(
    failures: list[list[str]], component: str, tmp_path: Path
) -> None:
    """A configuration-class failure (niloc#10, ASAP#16's Hydra app, vllm#10439) ending every
    attempt is KILL with a handoff fed from the catalogue entry: the component to change, the
    entry's note, a behaviour to propose and a test that proves the fix."""
    report = judge(real.loop(tmp_path, "rl-config", failures))
    assert report.verdict.value == "KILL", report.reasoning
    liveness = report.gates[GateName.LIVENESS]
    assert liveness.proof is not None and liveness.proof.rule == "config_failure"
    handoff = report.handoff
    assert handoff is not None
    assert component in handoff.component
    assert "catalogue `" in handoff.likely_cause
    assert handoff.proposed_behavior and "Finished: 'step'" in handoff.test


def test_one_attempt_ended_by_its_configuration_is_kill_with_handoff(tmp_path: Path) -> None:
    """A single failed attempt ended by a key its config lacks needs no repeat: the proof is
    `config_failure` and the handoff names the configuration."""
    report = judge(real.loop(tmp_path, "rl-config-once", [[real.KEY_NOT_IN_STRUCT.text]]))
    assert report.verdict.value == "KILL"
    assert report.kill_proof is not None and report.kill_proof.rule == "config_failure"
    assert report.handoff is not None and "Key 'io'" in report.handoff.likely_cause


# --- no crash loop --------------------------------------------------------------------------------


def test_different_signatures_across_attempts_are_no_crash_loop(tmp_path: Path) -> None:
    """Three attempts dying of three different real failures (NCCL invalid argument, a dead Ray
    actor, an AttributeError) are not one failure: same_failure false, no crash-loop KILL."""
    failures = [[real.NCCL_INVALID.text], [real.RAY_ACTOR_ERROR.text], [real.ATTRIBUTE_ERROR.text]]
    report = judge(real.loop(tmp_path, "rl-different", failures))
    assert report.restarts.same_failure is False
    assert not report.restarts.doomed
    assert len(report.restarts.signatures) == 3
    assert report.verdict.value != "KILL"


@pytest.mark.parametrize("line", [real.CHILD_FAILED, real.NCCL_REMOTE_EXITED], ids=lambda r: r.id)
def test_generic_and_transient_lines_never_loop(line: real.RealLine, tmp_path: Path) -> None:
    """torchrun's ChildFailedError (a generic wrapper) or NCCL's remote-exited error (transient)
    on every attempt is no crash loop: the first says nothing of the cause, the second may not
    recur."""
    report = judge(real.loop(tmp_path, "rl-no-loop", [[line.text]] * 3))
    assert report.restarts.same_failure is not True
    assert report.verdict.value != "KILL"


def test_a_failure_every_attempt_trained_past_is_no_crash_loop(tmp_path: Path) -> None:
    """Harbor's `No reward file found` (reef#215, hard class) logged by a trial during each of
    three attempts, each of which went on stepping and was then relaunched: the attempts did not
    die of it, so it is no loop and no KILL."""
    report = judge(real.trained_past(tmp_path, "rl-trained-past", real.REWARD_FILE_MISSING.text))
    assert report.restarts.same_failure is not True
    assert not report.restarts.doomed
    assert report.verdict.value != "KILL", report.reasoning


def test_a_credential_in_the_failure_line_never_reaches_the_report(tmp_path: Path) -> None:
    """The signature shown in the report is normalised after redaction: a bearer token in the
    line that kills every attempt is `<redacted:bearer>`, not digits replaced inside the token
    (which no redaction rule would recognise), and the loop is still one signature."""
    from reports.json_report import render_json
    from reports.text import render_text
    from tests.security.corpus import SECRETS, leaks

    jwt = next(secret for secret in SECRETS if secret.startswith("eyJ"))
    report = judge(real.loop(tmp_path, "rl-token", [[f"RuntimeError: Bearer {jwt}"]] * 3))
    assert report.restarts.doomed
    assert report.restarts.signatures[0] == "RuntimeError: Bearer <redacted:bearer>"
    assert leaks(render_text(report) + render_json(report)) == []


# --- benign noise ---------------------------------------------------------------------------------


def _verdict(report: Report) -> tuple[object, ...]:
    proof = report.kill_proof.rule if report.kill_proof else None
    restarts = (report.restarts.same_failure, report.restarts.doomed, report.restarts.signatures)
    return report.verdict.value, statuses(report), proof, restarts


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_benign_noise_never_changes_a_verdict(scenario: Scenario, tmp_path: Path) -> None:
    """Real benign lines (vLLM's shared-memory broadcast wait and preemption, Ray's worker-died
    notice, torchrun's SIGTERM to the peers, SkyRL's skipped instance) before every step and
    after the newest line leave the verdict, every gate status, the proof rule and the restarts
    judgement of every healthy and failing scenario as they were."""
    clean = judge(scenario.build(tmp_path / "clean"))
    noisy_bundle = scenario.build(tmp_path / "noisy")
    assert real.inject_noise(noisy_bundle) >= len(real.NOISE)
    noisy = judge(noisy_bundle)
    assert _verdict(noisy) == _verdict(clean)
    assert (noisy.verdict.value, statuses(noisy)) == (scenario.verdict, scenario.gates)


def test_noise_after_the_newest_step_is_no_death(tmp_path: Path) -> None:
    """Ray's worker-died notice and torchrun's SIGTERM after the newest step, then an hour of
    silence, are no logged death: ERROR (stacks needed), not KILL."""
    from tests.scenarios.catalog import stall_without_stacks

    built = stall_without_stacks(tmp_path)
    real.inject_noise(built)
    report = judge(built)
    assert report.verdict.value == "ERROR"
    assert statuses(report)["liveness"] == "ERROR"
