"""The rules that read the failure rows (issue 10): the failure of each attempt
(`Facts.attempt_failures`), the logged death of the trainer or of every engine
(`worker.gates.deaths`), the configuration failure of every attempt and its handoff
(`worker.gates.configuration`), and the decide-time checks of their proofs."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shared.models import GateName, GateResult, GateStatus, KillProof, Quote, RestartsResult
from tests import factories as f
from worker.evidence.case import Evidence
from worker.evidence.facts import attempt_failures
from worker.evidence.logs import parse_job_logs
from worker.evidence.model import AttemptRecord, LogTables, ProbeEvidence
from worker.gates import configuration, deaths
from worker.gates.proofs import validate
from worker.gates.restarts import check as restarts_check
from worker.verdict import decide

NCCL = "DistBackendError: NCCL error in: <path>:<n>, unhandled cuda error"


def err(line: int, kind: str, **row: Any) -> dict[str, Any]:
    """One ERRORS row of finelog.log, attempt 0, dated `minutes` (default 30) before NOW."""
    minutes = row.pop("minutes", 30.0)
    base = {
        "source": "finelog.log",
        "line": line,
        "last_line": line,
        "timestamp": f.at(minutes),
        "kind": kind,
        "text": row.get("signature") or kind,
        "attempt": 0,
        "specific": True,
        "failure_class": "hard",
        "component": "driver",
        "entry": "some.entry",
        "signature": f"{kind} at {line}",
    }
    return base | row


def tables(*errors: dict[str, Any], **others: Any) -> LogTables:
    return f.logs(errors=list(errors), **others)


# --- the failure of each attempt ---------------------------------------------------------------


def test_benign_and_transient_rows_are_never_an_attempts_failure() -> None:
    """vLLM's shm notice (benign) and NCCL's remote-exited error (transient) come first, yet the
    attempt's failure is the hard row after them."""
    found = attempt_failures(
        tables(
            err(1, "shm_broadcast", failure_class="benign"),
            err(2, "nccl_error", failure_class="transient"),
            err(3, "nccl_error", signature=NCCL),
        )
    )
    assert found["line"].to_list() == [3]


def test_a_generic_banner_first_does_not_hide_the_specific_failure() -> None:
    """Hydra's banner (generic, hard) before the config traceback: the traceback is the failure;
    an attempt with only a generic exit record keeps it, not specific."""
    found = attempt_failures(
        tables(
            err(1, "job_error", specific=False),
            err(2, "traceback", failure_class="configuration", signature="ConfigAttributeError"),
            err(9, "exit", specific=False, attempt=1),
        )
    )
    assert found.select("attempt", "line", "specific").rows() == [(0, 2, True), (1, 9, False)]


def test_a_configuration_failure_goes_before_the_death_it_caused() -> None:
    """Ray's "actor died because of an error raised in its creation task" (hard) is logged before
    the ModuleNotFoundError (configuration) that raised it: the import error is the attempt's
    failure. Two hard rows keep their line order."""
    found = attempt_failures(
        tables(err(1, "actor_died"), err(8, "import_error", failure_class="configuration"))
    )
    assert found["line"].to_list() == [8]
    assert attempt_failures(tables(err(1, "actor_died"), err(8, "traceback")))[
        "line"
    ].to_list() == [1]


def test_uncatalogued_tracebacks_count_and_other_uncatalogued_rows_do_not() -> None:
    """A row no entry knows counts when it is a traceback or a final exception line only."""
    found = attempt_failures(
        tables(
            err(1, "verifier_error", entry=None, failure_class=None),
            err(2, "exception", entry=None, failure_class=None),
        )
    )
    assert found["line"].to_list() == [2]


def test_rows_the_parser_did_not_sign_fall_back_to_the_older_hard_kinds() -> None:
    """An older freeze (no class, no signature) still has failures: the older hard kinds."""
    legacy = {"failure_class": None, "entry": None, "signature": None, "specific": None}
    found = attempt_failures(
        tables(err(1, "shm_broadcast", **legacy), err(2, "cuda_oom", **legacy))
    )
    assert found["line"].to_list() == [2]


# --- restarts on the row's signature ----------------------------------------------------------


def record(attempt: int, error: str) -> AttemptRecord:
    return AttemptRecord(
        task_id="/ops/rl-job/0",
        attempt_id=attempt,
        state="failed",
        exit_code=1,
        error=error,
        started_at_ms=int((f.NOW - timedelta(hours=3 - attempt)).timestamp() * 1000),
        finished_at_ms=int((f.NOW - timedelta(hours=3 - attempt, minutes=-5)).timestamp() * 1000),
    )


def test_a_specific_log_row_beats_a_generic_controller_error() -> None:
    """Iris records `Exit code: 1` for each attempt; the log's NCCL row of each is the
    signature, so the attempts repeat one failure."""
    rows = [err(10 * i, "nccl_error", signature=NCCL, attempt=i) for i in range(3)]
    probes = ProbeEvidence(
        directory="probes", attempts=tuple(record(i, "Exit code: 1") for i in range(3))
    )
    result = restarts_check(f.evidence(log_tables=tables(*rows), probes=probes, state="failed"))
    assert result.same_failure is True and result.doomed
    assert result.signatures[0] == NCCL


def test_generic_rows_on_every_attempt_are_no_loop() -> None:
    """Three attempts whose only failure row is a generic record (torchrun's ChildFailedError,
    which names an exception type) repeat nothing: same_failure is unknown."""
    child = {"kind": "exit", "signature": "ChildFailedError", "specific": False}
    rows = [err(10 * i, attempt=i, **child) for i in range(3)]
    boundaries = [
        {"kind": "attempt_boundary", "source": "finelog.log", "line": 10 * i - 1, "attempt": i}
        for i in range(3)
    ]
    result = restarts_check(
        f.evidence(log_tables=tables(*rows, resumes=boundaries), state="failed")
    )
    assert result.same_failure is None and not result.doomed


# --- logged deaths --------------------------------------------------------------------------------


def stat(engine: str, minutes: float, line: int, running: int = 10) -> dict[str, Any]:
    return {
        "engine": engine,
        "running": running,
        "waiting": 0,
        "kv_cache_pct": 20.0,
        "generation_tokens_per_s": 100.0 * running,
        "source": "finelog.log",
        "line": line,
        "timestamp": f.at(minutes),
        "attempt": 0,
    }


ENGINES = [stat("11@10.0.0.1/000", 40, 1), stat("22@10.0.0.1/001", 40, 2)]
STEP = {
    "event": "finished",
    "phase": "step",
    "seconds": 60.0,
    "step": 5,
    "source": "finelog.log",
    "line": 5,
    "timestamp": f.at(35),
    "attempt": 0,
}


def engine_dead(line: int, prefix: str | None, message: str = "EngineCore died") -> dict[str, Any]:
    return err(line, "engine_dead", component="engine", prefix=prefix, message=message)


def judge_death(*errors: dict[str, Any], engines: list[dict[str, Any]] = ENGINES) -> str | None:
    ev = f.evidence(log_tables=tables(*errors, engines=engines, timers=[STEP]))
    found = deaths.find_death(ev, STEP["timestamp"])
    return found.whose if found else None


def test_every_engine_needs_a_death_line_of_each_engine() -> None:
    """Both engines' prefixes carry a death line: every engine; one of them: no proof."""
    one = engine_dead(10, "(AsyncVLLMInferenceEngine pid=11, ip=10.0.0.1)")
    two = engine_dead(11, "(AsyncVLLMInferenceEngine pid=22, ip=10.0.0.1) (EngineCore_DP0 pid=5)")
    assert judge_death(one, two) == "every inference engine (2 of 2)"
    assert judge_death(one) is None
    assert judge_death(one, one | {"line": 12}) is None


def test_a_driver_quoting_a_dead_engine_actor_names_it_by_its_pid() -> None:
    """A driver-side ActorDiedError names the engine actor (`ray::Cls.m() (pid=N, ip=X`); with
    no stat line yet (a creation failure), the launched engine count decides."""
    message = "The actor died ... ray::AsyncVLLMInferenceEngine.__init__() (pid={}, ip=10.0.0.9, a)"
    rows = [
        err(10 + i, "actor_died", component="engine", prefix="(skyrl_entrypoint pid=1)",
            message=message.format(pid))
        for i, pid in enumerate((31, 32))
    ]  # fmt: skip
    ev = f.evidence(
        log_tables=tables(*rows, timers=[STEP]),
        entrypoint='{"argv": ["x", "generator.num_inference_engines=2"]}',
    )
    found = deaths.find_death(ev, STEP["timestamp"])
    assert found is not None and found.whose == "every inference engine (2 of 2)"
    ev3 = f.evidence(
        log_tables=tables(*rows, timers=[STEP]),
        entrypoint='{"argv": ["x", "generator.num_inference_engines=3"]}',
    )
    assert deaths.find_death(ev3, STEP["timestamp"]) is None


def test_an_engine_that_generates_after_its_death_line_is_alive() -> None:
    """A stat line with requests running after an engine's death line contradicts it."""
    one = engine_dead(10, "(AsyncVLLMInferenceEngine pid=11, ip=10.0.0.1)")
    two = engine_dead(11, "(AsyncVLLMInferenceEngine pid=22, ip=10.0.0.1)")
    later = [*ENGINES, stat("22@10.0.0.1/001", 5, 30)]
    assert judge_death(one, two, engines=later) is None


def test_a_worker_process_death_is_not_an_engines_death() -> None:
    """A tensor-parallel worker's death line (another pid than any engine's) does not stand for
    the engine that logged no death."""
    one = engine_dead(10, "(AsyncVLLMInferenceEngine pid=11, ip=10.0.0.1)")
    worker = engine_dead(11, "(RayWorkerWrapper pid=77, ip=10.0.0.1)")
    assert judge_death(one, worker) is None


def test_a_single_engines_unprefixed_death_line_is_its_death() -> None:
    """With one engine, a death line no prefix attributes is that engine's."""
    only = [stat("11@10.0.0.1/000", 40, 1)]
    assert judge_death(engine_dead(10, None), engines=only) == "every inference engine (1 of 1)"
    assert judge_death(engine_dead(10, None)) is None


@pytest.mark.parametrize(
    ("row", "whose"),
    [
        (err(10, "fatal_abort"), "the trainer"),
        (err(10, "actor_died", component="policy"), "the trainer"),
        (err(10, "fatal_abort", component="controller"), None),
        (err(10, "worker_died", failure_class="benign", component="controller"), None),
        (err(10, "train_loop_failed", minutes=40), None),  # before the newest step
    ],
    ids=["abort", "policy-actor", "raylet-abort", "ray-notice", "before-the-step"],
)
def test_trainer_deaths(row: dict[str, Any], whose: str | None) -> None:
    """A death kind of the driver or a policy rank after the newest step is the trainer's death;
    a system process's, a benign notice or one before the step is not."""
    assert judge_death(row) == whose


def test_logged_death_needs_silence_past_the_limit_since_the_death_line() -> None:
    """The gate fails hard only when the silence since the death line exceeds the limit."""
    row = err(10, "fatal_abort", minutes=11)
    ev = f.evidence(log_tables=tables(row, timers=[STEP]))
    assert deaths.logged_death(ev, 600.0, "10 min", ()) is not None
    assert deaths.logged_death(ev, 700.0, "11.7 min", ()) is None


# --- proofs checked in decide ------------------------------------------------------------------


LINE = Quote(source="finelog.log", line=10, timestamp=f.at(30), text="EngineCore died")


def proof(rule: str, minutes: float, quotes: tuple[Quote, ...] = (LINE,)) -> KillProof:
    return KillProof(rule=rule, mechanism="m", established_at=f.at(minutes), evidence=quotes)


def test_logged_death_proof_checks() -> None:
    """Refused: no log line quoted, silence under STALL_FLOOR_S, a step after the death."""
    ev = f.evidence(log_tables=tables(timers=[STEP]))
    assert validate(proof("logged_death", 30), ev) is None
    controller = (Quote(source="probes/controller.json", text="state=running"),)
    assert "no death line" in str(validate(proof("logged_death", 30, controller), ev))
    assert "silence" in str(validate(proof("logged_death", 9), ev))
    assert "advanced after" in str(validate(proof("logged_death", 36), ev))


@pytest.mark.parametrize(
    ("state", "minutes", "refused"),
    [
        ("failed", 2, None),
        ("running", 11, None),
        ("running", 9, "may still run"),
        ("succeeded", 30, "succeeded"),
    ],
)
def test_config_failure_proof_checks(state: str, minutes: float, refused: str | None) -> None:
    """A failed job, or a silent running one, may be killed for its configuration; a succeeded
    one, or a running one whose failure is younger than STALL_FLOOR_S, may not."""
    ev = f.evidence(log_tables=tables(), state=state)
    why = validate(proof("config_failure", minutes), ev)
    assert (why is None) if refused is None else (refused in str(why))


def test_a_refused_logged_death_is_an_error_of_liveness() -> None:
    """decide demotes a logged-death FAIL whose silence is too short to an ERROR, saying why."""
    gate = GateResult(
        status=GateStatus.FAIL,
        summary="dead",
        evidence=(LINE,),
        hard_failure=True,
        mechanism="m",
        proof=proof("logged_death", 5),
    )
    gates = {name: GateResult(status=GateStatus.PASS, summary="ok") for name in GateName}
    gates[GateName.LIVENESS] = gate
    restarts = RestartsResult(count=0, same_failure=None, interpretation="none")
    report = decide(f.evidence(log_tables=tables()), restarts, gates)
    assert report.verdict.value == "ERROR"
    assert "liveness proof refused: logged_death" in report.reasoning


# --- the configuration handoff ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "component", "where"),
    [
        ("omegaconf.key_not_in_struct", "configuration", "struct-mode config"),
        ("vllm.max_seq_len_exceeds_kv", "engine", "max_model_len"),
        ("daytona.quota_exceeded", "sandbox", "organisation quota"),
        ("cuda.no_kernel_image", "policy", "GPU architectures"),
    ],
)
def test_the_handoff_comes_from_the_catalogue_entry(entry: str, component: str, where: str) -> None:
    """The thing to change is the entry's own (`change`), tagged with the entry's component (or,
    for `auto`, the row's); the cause quotes the entry's note and the line, and the test names
    the signature that must not recur."""
    row = {"entry": entry, "component": component, "text": "the line", "signature": "Sig: x"}
    handoff = configuration.config_handoff(row, (LINE,))
    assert handoff is not None
    assert where in handoff.component and handoff.component.endswith(f"[{component}]")
    assert f"catalogue `{entry}`" in handoff.likely_cause and "the line" in handoff.likely_cause
    assert "Sig: x" in handoff.test


@pytest.mark.parametrize(
    ("component", "where"),
    [
        ("configuration", "launch configuration"),
        ("engine", "inference engine settings"),
        ("sandbox", "sandbox configuration"),
        ("policy", "policy training configuration"),
    ],
)
def test_an_entry_without_its_own_handoff_gets_its_components(
    component: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A configuration entry that carries no change, behaviour or test (one added without them)
    still gets a handoff: its component's text, with the subject it reads from the line."""
    import dataclasses

    from worker.evidence.failures import catalogue

    bare = dataclasses.replace(
        catalogue().by_id("omegaconf.key_not_in_struct"),
        component=None,
        change=None,
        behaviour=None,
        test=None,
    )
    monkeypatch.setattr(configuration, "_entry", lambda row: bare)
    row = {"component": component, "text": "Key 'io' is not in struct", "signature": "Sig: x"}
    handoff = configuration.config_handoff(row, (LINE,))
    assert handoff is not None
    assert where in handoff.component and "`io`" in handoff.component
    assert handoff.proposed_behavior and "Sig: x" in handoff.test


def test_no_handoff_for_a_hard_entry_or_an_unknown_one() -> None:
    """Only a configuration-class entry gives a configuration handoff."""
    assert configuration.config_handoff({"entry": "cuda.out_of_memory"}, ()) is None
    assert configuration.config_handoff({"entry": None}, ()) is None


def test_a_configuration_failure_caught_mid_run_ends_nothing() -> None:
    """A configuration row followed by a finished step in its attempt is no config failure."""
    row = err(3, "config_error", failure_class="configuration", minutes=40)
    ev = f.evidence(log_tables=tables(row, timers=[STEP]), state="failed")
    assert configuration.config_failure(ev, 600.0, ()) is None
    later = row | {"line": 9, "timestamp": f.at(30)}
    ended = f.evidence(log_tables=tables(later, timers=[STEP]), state="failed")
    result = configuration.config_failure(ended, 600.0, ())
    assert result is not None and result.proof is not None
    assert result.proof.rule == "config_failure" and result.handoff is None  # unknown entry


def test_a_failure_the_attempt_trained_past_did_not_end_it() -> None:
    """A verifier traceback logged before the attempt's last step (a trial failed, training went
    on) is not the attempt's failure; the row after the last step is."""
    found = attempt_failures(
        tables(
            err(3, "traceback", entry=None, failure_class=None, signature="VerifierError: x"),
            err(9, "nccl_error", signature=NCCL),
            timers=[STEP],
        )
    )
    assert found["line"].to_list() == [9]


def _two_attempts(tmp_path: Path, ray_clock: str) -> Evidence:
    """A finelog whose second attempt (from 12:00:20) has engine 11@10.0.0.1, which logs its
    death at 12:00:30, and a Ray worker log of another engine's stat lines at `ray_clock`."""

    def line(second: int, msg: str, prefix: str = "(skyrl_entrypoint pid=1)") -> str:
        stamp = f"2026-05-01 12:00:{second:02d}.000"
        return f"[12:00:{second:02d}] task=/u/job/0 | {prefix} {stamp} | INFO | x:y:1 - {msg}"

    def stat(clock: str) -> str:
        return (
            f"INFO 05-01 {clock} [loggers.py:248] Engine 000: Avg prompt throughput: 1.0 "
            "tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: 0 "
            "reqs, GPU KV cache usage: 5.0%, Prefix cache hit rate: 6.0%"
        )

    engine = "(AsyncVLLMInferenceEngine pid=11, ip=10.0.0.1)"
    finelog = [
        "[12:00:00] task=/u/job/0 | [iris setup] step 1/2",
        line(10, "Started: 'step'"),
        "[12:00:20] task=/u/job/0 | [iris setup] step 1/2",
        line(21, "Started: 'step'"),
        f"[12:00:22] task=/u/job/0 | {engine} {stat('12:00:22')}",
        f"[12:00:30] task=/u/job/0 | {engine} ERROR 05-01 12:00:30 [core.py:1] EngineCore "
        "encountered a fatal error.",
    ]
    (tmp_path / "finelog.log").write_text("\n".join(finelog) + "\n")
    ray = tmp_path / "ray_vllm_logs" / "pod0" / "worker-abc-01-123.out"
    ray.parent.mkdir(parents=True)
    ray.write_text(stat(ray_clock) + "\n")
    tables = parse_job_logs(tmp_path, reference_date=date(2026, 5, 1))
    assert tables is not None
    return f.evidence(log_tables=tables, now=datetime(2026, 5, 1, 13, tzinfo=UTC))


@pytest.mark.parametrize(("ray_clock", "whose"), [
    ("12:00:25", None),  # an engine of this attempt that logged no death: no proof
    ("12:00:19", "every inference engine (1 of 1)"),  # a second before: the first attempt's
])  # fmt: skip
def test_an_engine_seen_only_in_a_ray_worker_log_counts_for_every_engine(
    tmp_path: Path, ray_clock: str, whose: str | None
) -> None:
    """The engines every one of which must have died include those a Ray worker log shows in
    the newest attempt (it marks no attempt of its own: its rows join the finelog's by time)."""
    ev = _two_attempts(tmp_path, ray_clock)
    assert ev.facts.newest_attempt == 1
    found = deaths.find_death(ev, None)
    assert (found.whose if found else None) == whose
