"""The resources gate: policy and inference ranks judged apart, engines by a tuple over a window."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.models import GateResult, GateStatus, Mode
from tests import factories as f
from worker.evidence import schema
from worker.evidence.model import ParseSummary, ProbeEvidence
from worker.gates import engines, resources

Sample = tuple[int, int, float, float]  # running, waiting, KV %, generation tok/s

REWARD_STEPS = f.metric_rows({"reward/avg_raw_reward": [0.2, 0.3]})


def engine_rows(
    engine: str, samples: Sequence[Sample], every_min: float = 1.0
) -> list[dict[str, Any]]:
    """One vLLM stat row per sample, `every_min` apart, the newest one a minute before NOW."""
    n = len(samples)
    return [
        {
            "timestamp": f.at(1 + every_min * (n - 1 - i)),
            "engine": engine,
            "running": running,
            "waiting": waiting,
            "kv_cache_pct": kv,
            "generation_tokens_per_s": gen,
            "source": f"ray_vllm_logs/pod-0/worker-{engine[:3]}.out",
            "line": 100 + i,
            "attempt": 0,
        }
        for i, (running, waiting, kv, gen) in enumerate(samples)
    ]


def fleet(samples: Sequence[Sample], n_engines: int = 2) -> list[dict[str, Any]]:
    """The same samples on `n_engines` engines."""
    rows: list[dict[str, Any]] = []
    for k in range(n_engines):
        rows += engine_rows(f"{1000 + k}@10.0.0.{k}/000", samples)
    return rows


def timer(
    phase: str, event: str, line: int, minutes_ago: float, seconds: float | None = None
) -> dict[str, Any]:
    """One phase timer row of attempt 0 in finelog.log."""
    return {
        "event": event,
        "phase": phase,
        "seconds": seconds,
        "step": 3,
        "source": "finelog.log",
        "line": line,
        "timestamp": f.at(minutes_ago),
        "attempt": 0,
    }


def phase_rows(step_s: float, wait_s: float, steps: int = 10) -> list[dict[str, Any]]:
    """`step` and `wait_for_generation_buffer` seconds for `steps` steps."""
    rows = []
    for step in range(1, steps + 1):
        for phase, seconds in (("step", step_s), ("wait_for_generation_buffer", wait_s)):
            rows.append(
                {
                    "step": step,
                    "phase": phase,
                    "seconds": seconds,
                    "source": "finelog.log",
                    "line": 500 + 10 * step,
                    "timestamp": f.at(steps + 1 - step),
                    "attempt": 0,
                }
            )
    return rows


def frozen_buffer(done: int = 24, total: int = 32) -> list[dict[str, Any]]:
    """`Generation Buffer Progress` stuck at done/total for 13 minutes while elapsed grows."""
    return [
        {
            "kind": "generation_buffer",
            "done": done,
            "total": total,
            "elapsed_s": 2400.0 + 60 * i,
            "source": "finelog.log",
            "line": 2000 + i,
            "timestamp": f.at(13 - i),
            "attempt": 0,
        }
        for i in range(14)
    ]


def cuda_error(kind: str, text: str, line: int, minutes_ago: float) -> dict[str, Any]:
    return {
        "source": "finelog.log",
        "line": line,
        "timestamp": f.at(minutes_ago),
        "kind": kind,
        "text": text,
        "attempt": 0,
    }


SATURATED: list[Sample] = [(64, 12 + i % 3, 85.0, 950.0) for i in range(12)]
QUIET: list[Sample] = [(i % 2, 0, 0.1, 0.0) for i in range(12)]
SAWTOOTH: list[Sample] = [
    (r, 0, 35.0, 600.0) for r in (64, 40, 12, 3, 64, 50, 20, 4, 64, 30, 8, 60)
]
ENTRYPOINT = (
    '{"argv": ["python", "-m", "main_harbor", "generator.n_concurrent_trials=2", '
    '"generator.inference_engine.max_num_seqs=64", '
    '"generator.inference_engine.num_inference_engines=4"]}'
)


def assert_quoted(result: GateResult) -> None:
    """FAIL and ERROR results carry at least one quote with a source, and log quotes a line."""
    assert result.evidence, result.summary
    for q in result.evidence:
        assert q.source and q.text
    assert any(q.line is not None for q in result.evidence) or result.evidence[0].source


CASES: list[tuple[str, dict[str, Any], GateStatus, dict[str, Any]]] = [
    (
        "saturated engines",
        {"engines": fleet(SATURATED), "metrics": REWARD_STEPS},
        GateStatus.PASS,
        {"hard_failure": False, "initializing": False},
    ),
    (
        "starved engines with a frozen generation buffer",
        {"engines": fleet(QUIET), "progress": frozen_buffer(), "metrics": REWARD_STEPS},
        GateStatus.FAIL,
        {"hard_failure": False, "learning_quality": False},
    ),
    (
        "backpressure sawtooth with a near-zero buffer wait",
        {"engines": fleet(SAWTOOTH), "phases": phase_rows(100.0, 1.5), "metrics": REWARD_STEPS},
        GateStatus.PASS,
        {"hard_failure": False},
    ),
    (
        "colocated idle engines while the trainer sits in generate",
        {
            "engines": fleet(QUIET),
            "timers": [
                timer("step", "finished", 10, 30, 400.0),
                timer("step", "started", 11, 29),
                timer("generate", "started", 12, 29),
            ],
        },
        GateStatus.FAIL,
        {"hard_failure": False},
    ),
    (
        "colocated idle engines while the policy trains",
        {
            "engines": fleet(QUIET),
            "timers": [
                timer("step", "finished", 10, 30, 400.0),
                timer("step", "started", 11, 29),
                timer("generate", "started", 12, 29),
                timer("generate", "finished", 13, 15, 840.0),
                timer("policy_train", "started", 14, 14),
            ],
        },
        GateStatus.PASS,
        {"hard_failure": False},
    ),
    (
        "quiet engines with nothing saying what the trainer does",
        {"engines": fleet(QUIET), "metrics": REWARD_STEPS},
        GateStatus.ERROR,
        {},
    ),
]


@pytest.mark.parametrize(("name", "tables", "status", "flags"), CASES, ids=[c[0] for c in CASES])
def test_engine_tuples(
    name: str, tables: dict[str, Any], status: GateStatus, flags: dict[str, Any]
) -> None:
    """Each engine tuple over the window gives the expected status and flags."""
    result = resources.check(f.evidence(log_tables=f.logs(**tables)))
    assert result.status is status, result.summary
    for flag, value in flags.items():
        assert getattr(result, flag) == value, flag
    if status is not GateStatus.PASS:
        assert_quoted(result)


def test_starvation_quotes_engine_and_buffer() -> None:
    """A starvation FAIL quotes the engine stat line and the frozen buffer counter with lines."""
    tables = f.logs(engines=fleet(QUIET), progress=frozen_buffer(), metrics=REWARD_STEPS)
    result = resources.check(f.evidence(log_tables=tables))
    sources = {q.source for q in result.evidence}
    assert "finelog.log" in sources
    assert any(s.startswith("ray_vllm_logs/") for s in sources)
    assert all(q.line is not None and q.timestamp is not None for q in result.evidence)
    assert "24/32" in result.summary
    assert result.mechanism and result.flip_signal


def test_starvation_handoff_when_demand_cannot_feed_engines() -> None:
    """Demand below the engine count becomes a configuration handoff with demand vs supply."""
    engine_rows_4 = fleet(QUIET, n_engines=4)
    tables = f.logs(engines=engine_rows_4, progress=frozen_buffer(), metrics=REWARD_STEPS)
    result = resources.check(f.evidence(log_tables=tables, entrypoint=ENTRYPOINT))
    assert result.status is GateStatus.FAIL
    assert result.handoff is not None
    assert "n_concurrent_trials" in result.handoff.component
    assert any("demand n_concurrent_trials=2" in d and "= 256" in d for d in result.details)


def test_short_quiet_spell_is_not_starvation() -> None:
    """Engines quiet for less than the starvation window are not starved (window not covered)."""
    short = engine_rows("1000@10.0.0.1/000", QUIET[:5])
    tables = f.logs(engines=short, progress=frozen_buffer(), metrics=REWARD_STEPS)
    result = resources.check(f.evidence(log_tables=tables))
    assert result.status is GateStatus.PASS, result.summary


def test_under_fed_engines_name_the_buffer_wait() -> None:
    """Swinging engines while the buffer wait is a large share of the step are called under-fed."""
    tables = f.logs(engines=fleet(SAWTOOTH), phases=phase_rows(100.0, 40.0), metrics=REWARD_STEPS)
    result = resources.check(f.evidence(log_tables=tables))
    assert result.status is GateStatus.PASS
    assert "under-fed" in result.summary
    assert "40.0%" in result.summary


def test_policy_rank_oom_that_killed_the_attempt_is_hard() -> None:
    """A CUDA OOM during policy_train followed by an actor death, and no step since, is a hard FAIL
    on a policy rank."""
    before = [r | {"timestamp": f.at(9 - r["step"])} for r in REWARD_STEPS]
    tables = f.logs(
        engines=fleet(SATURATED),
        metrics=before,
        timers=[timer("policy_train", "started", 4990, 6)],
        errors=[
            cuda_error(
                "cuda_oom",
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                5000,
                5,
            ),
            cuda_error(
                "actor_died", "ray.exceptions.ActorDiedError: The actor died unexpectedly", 5040, 4
            ),
        ],
    )
    result = resources.check(f.evidence(log_tables=tables))
    assert result.status is GateStatus.FAIL
    assert result.hard_failure
    assert "policy rank" in result.summary
    assert "policy_train" in result.summary
    assert result.handoff is not None
    assert result.proof is not None and result.proof.rule == "cuda_fatal"
    assert_quoted(result)
    assert [q.line for q in result.evidence] == [5000, 5040]


def test_inference_rank_oom_with_progress_after_is_not_hard() -> None:
    """A vLLM OOM the attempt survived is a FAIL on an inference rank, not a hard failure."""
    metrics = f.metric_rows({"reward/avg_raw_reward": [0.2, 0.3, 0.3, 0.4]})
    oom = cuda_error(
        "cuda_oom",
        "(AsyncVLLMInferenceEngine pid=77) torch.OutOfMemoryError: CUDA out of memory",
        900,
        30,
    )
    result = resources.check(f.evidence(log_tables=f.logs(metrics=metrics, errors=[oom])))
    assert result.status is GateStatus.FAIL
    assert not result.hard_failure
    assert "inference rank" in result.summary
    assert_quoted(result)


def test_oom_that_ended_the_previous_attempt_then_progress_is_recovered_not_hard() -> None:
    """A CUDA OOM that ended attempt 0, then attempt 1 stepping: the restart recovered. Not the
    newest attempt's fault (no `cuda_fatal`), and not a PASS either: the gate names the attempt
    that hit it and the one that progressed (it was a PASS that said nothing before issue 27)."""
    old = cuda_error("cuda_oom", "CUDA out of memory", 10, 90) | {"attempt": 0}
    new_metrics = [r | {"attempt": 1} for r in REWARD_STEPS]
    engine = [r | {"attempt": 1} for r in fleet(SATURATED)]
    tables = f.logs(errors=[old], metrics=new_metrics, engines=engine)
    result = resources.check(f.evidence(log_tables=tables))
    assert (result.status, result.kind, result.hard_failure) == (
        GateStatus.FAIL,
        "cuda_recovered",
        False,
    )
    assert "ended attempt 0; attempt 1 resumed from" in result.summary
    assert result.handoff is not None


def finished_step(step: int, line: int, minutes_ago: float, attempt: int) -> dict[str, Any]:
    return timer("step", "finished", line, minutes_ago, 120.0) | {"step": step, "attempt": attempt}


@pytest.mark.parametrize(("reached", "recovered"), [(5, True), (4, False)], ids=["past", "short"])
def test_a_restart_recovers_an_oom_only_past_its_resume_point(
    reached: int, recovered: bool
) -> None:
    """Attempt 0 finished steps 1-4 and died of an OOM; attempt 1 resumed from step 4: a step 5
    is recovery, a step 4 (the resume point) is not yet, and engines alone judge resources."""
    first = [finished_step(s, 10 * s, 60 - s, 0) for s in range(1, 5)]
    oom = cuda_error("cuda_oom", "torch.OutOfMemoryError: CUDA out of memory", 45, 55)
    resume = {"kind": "resumed", "step": 4, "text": "Resuming from global_step: 4",
              "source": "finelog.log", "line": 60, "timestamp": f.at(30), "attempt": 1}  # fmt: skip
    later = [finished_step(reached, 70, 5, 1)]
    engine = [r | {"attempt": 1} for r in fleet(SATURATED)]
    tables = f.logs(timers=first + later, errors=[oom], resumes=[resume], engines=engine)
    result = resources.check(f.evidence(log_tables=tables))
    assert (result.kind == "cuda_recovered") is recovered
    if recovered:
        assert result.summary.endswith(
            "ended attempt 0; attempt 1 resumed from step 4 and reached step 5: recovered by "
            "the restart"
        )
    else:
        assert result.status is GateStatus.PASS


def test_an_oom_the_previous_attempt_trained_past_did_not_end_it() -> None:
    """An OOM logged before the previous attempt's last step is no fault that ended it."""
    first = [finished_step(s, 10 * s, 60 - s, 0) for s in range(1, 5)]
    oom = cuda_error("cuda_oom", "CUDA out of memory", 15, 58)
    later = [finished_step(6, 70, 5, 1)]
    engine = [r | {"attempt": 1} for r in fleet(SATURATED)]
    tables = f.logs(timers=first + later, errors=[oom], engines=engine)
    assert resources.check(f.evidence(log_tables=tables)).status is GateStatus.PASS


def test_no_engine_evidence_is_an_error_quoting_the_log_head() -> None:
    """No stat lines, no GPU probe and no vllm/* metric is ERROR quoting what the log looks like."""
    summary = ParseSummary(files=("finelog.log",), head=("Starting Ray head...", "Loading model"))
    tables = f.logs(metrics=REWARD_STEPS, summary=summary)
    result = resources.check(f.evidence(log_tables=tables))
    assert result.status is GateStatus.ERROR
    assert result.missing == (resources.MISSING_TELEMETRY,)
    assert [q.text for q in result.evidence] == ["Starting Ray head...", "Loading model"]
    assert all(q.source == "finelog.log" for q in result.evidence)


def test_no_log_at_all_quotes_the_manifest() -> None:
    """Without any log the ERROR still quotes where the log should have been."""
    result = resources.check(f.evidence(log_tables=None))
    assert result.status is GateStatus.ERROR
    assert result.evidence[0].source == "manifest.json"


def test_gpu_probes_alone_are_an_error() -> None:
    """GPU probes without stat lines are point-in-time readings: ERROR, not a reduced PASS."""
    gpu = {"utilization.gpu [%]": 97.0, "memory.used [MiB]": 70000.0, "memory.total [MiB]": 81559.0}
    probes = ProbeEvidence(directory="probes", gpus={"pod-0": (gpu, gpu)})
    result = resources.check(f.evidence(log_tables=f.logs(metrics=REWARD_STEPS), probes=probes))
    assert result.status is GateStatus.ERROR
    assert "point-in-time" in result.summary
    assert result.evidence[0].source == "probes/gpus/pod-0.csv"
    assert any(d.startswith("gpus pod-0 (2 GPU(s)") for d in result.details)


def test_initialising_job_without_engines_passes_as_initialising() -> None:
    """Before the first step, a job without stat lines passes and says it is initialising."""
    tables = f.logs(timers=[timer("step", "started", 5, 10)])
    result = resources.check(f.evidence(log_tables=tables, mode=Mode.AGENTIC))
    assert result.status is GateStatus.PASS
    assert result.initializing
    assert result.summary.startswith("initialising")


def test_sparse_engines_are_an_error() -> None:
    """Two stat lines per engine are too few to judge the tuple."""
    tables = f.logs(engines=fleet(SATURATED[:2]), metrics=REWARD_STEPS)
    result = resources.check(f.evidence(log_tables=tables))
    assert result.status is GateStatus.ERROR
    assert_quoted(result)


def test_dead_engines_of_an_earlier_attempt_are_ignored() -> None:
    """Engines whose newest sample is older than a window are gone and not judged."""
    stale = [r | {"timestamp": f.at(120 + i)} for i, r in enumerate(fleet(QUIET, n_engines=1))]
    live = engine_rows("2000@10.0.0.9/000", SATURATED)
    states = engines.engine_states(
        f.frame(schema.ENGINES, stale + live), f.NOW, f.evidence().thresholds
    )
    assert states["engine"].to_list() == ["2000@10.0.0.9/000"]
    assert states["state"].to_list() == ["saturated"]


@pytest.mark.parametrize(
    ("entrypoint", "expected"),
    [
        (ENTRYPOINT, engines.EngineConfig(2, 64, 4, None)),
        (
            '{"argv": ["python", "--max_num_seqs", "8", "trainer.placement.colocate_all=true"]}',
            engines.EngineConfig(None, 8, None, True),
        ),
        (None, engines.EngineConfig()),
        ("not json", engines.EngineConfig()),
    ],
)
def test_engine_config_reads_demand_and_supply(
    entrypoint: str | None, expected: engines.EngineConfig
) -> None:
    """The entrypoint's overrides give demand, supply and colocation when they are present."""
    assert engines.engine_config(entrypoint) == expected


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 300),
            st.integers(0, 50),
            st.floats(0, 100, allow_nan=False),
            st.floats(0, 5000, allow_nan=False),
        ),
        max_size=20,
    ),
    st.floats(0.25, 3.0),
)
def test_any_engine_samples_give_a_result(samples: list[Sample], every_min: float) -> None:
    """Whatever the stat lines say, the gate returns a result, and every FAIL or ERROR quotes."""
    rows = engine_rows("1@10.0.0.1/000", samples, every_min=every_min)
    result = resources.check(f.evidence(log_tables=f.logs(engines=rows, metrics=REWARD_STEPS)))
    assert result.status in {GateStatus.PASS, GateStatus.FAIL, GateStatus.ERROR}
    if result.status is not GateStatus.PASS:
        assert result.evidence


# --- issue 8: an OOM is hard only when its component made no progress after it ------------------


def test_a_fresh_oom_with_nothing_after_it_is_too_recent() -> None:
    """An OOM logged a minute ago, nothing after it: ERROR (too recent), never a hard failure."""
    before = [r | {"timestamp": f.at(9 - r["step"])} for r in REWARD_STEPS]
    oom = cuda_error("cuda_oom", "torch.OutOfMemoryError: CUDA out of memory", 5000, 1)
    result = resources.check(f.evidence(log_tables=f.logs(metrics=before, errors=[oom])))
    assert result.status is GateStatus.ERROR
    assert "too recent" in result.summary and not result.hard_failure


def test_an_oom_followed_by_silence_past_the_floor_is_hard() -> None:
    """An OOM eleven minutes ago with no step since (no death line) is hard, with its proof."""
    before = [r | {"timestamp": f.at(20 - r["step"])} for r in REWARD_STEPS]
    oom = cuda_error("cuda_oom", "torch.OutOfMemoryError: CUDA out of memory", 5000, 11)
    result = resources.check(f.evidence(log_tables=f.logs(metrics=before, errors=[oom])))
    assert result.status is GateStatus.FAIL and result.hard_failure
    assert result.proof is not None and result.proof.rule == "cuda_fatal"
    assert result.proof.established_at == f.at(1)  # the OOM plus STALL_FLOOR_S


def test_a_vllm_logger_line_names_an_inference_rank_even_in_a_policy_phase() -> None:
    """A vLLM logger header (`ERROR MM-DD HH:MM:SS [core.py:N]`) is an engine's line, whatever
    trainer phase is open; a step after it means it survived."""
    text = "ERROR 07-30 21:05:00 [core.py:586] torch.OutOfMemoryError: CUDA out of memory"
    tables = f.logs(
        metrics=REWARD_STEPS,
        timers=[timer("policy_train", "started", 4990, 12)],
        errors=[cuda_error("cuda_oom", text, 5000, 10)],
    )
    result = resources.check(f.evidence(log_tables=tables))
    assert result.status is GateStatus.FAIL and not result.hard_failure
    assert "inference rank (vLLM engine)" in result.summary
    assert "policy rank" not in result.summary
    assert "survived" in result.summary


def test_the_open_phase_is_only_an_inferred_component() -> None:
    """A bare OOM line during policy_train is attributed to a policy rank, labelled inferred."""
    tables = f.logs(
        timers=[timer("policy_train", "started", 4990, 12)],
        errors=[cuda_error("cuda_oom", "CUDA out of memory", 5000, 11)],
    )
    result = resources.check(f.evidence(log_tables=tables))
    assert "a policy rank (inferred from the open phase policy_train)" in result.summary


VLLM_TUPLE = ("num_requests_running", "num_requests_waiting", "gpu_cache_usage_perc",
              "generation_tokens_per_s")  # fmt: skip


@pytest.mark.parametrize(
    ("keys", "steps", "status"),
    [
        (VLLM_TUPLE, 10, GateStatus.PASS),
        (VLLM_TUPLE, 9, GateStatus.ERROR),
        (VLLM_TUPLE[:3], 12, GateStatus.ERROR),
        (VLLM_TUPLE[:1], 12, GateStatus.ERROR),
    ],
)
def test_vllm_metrics_stand_in_only_for_the_whole_tuple_over_a_window(
    keys: tuple[str, ...], steps: int, status: GateStatus
) -> None:
    """Without stat lines, `vllm/*` keys pass only when they cover running, waiting, KV use and
    throughput over MIN_WINDOW_STEPS steps; otherwise ERROR naming what is missing."""
    rows = f.metric_rows({f"vllm/{k}": [1.0] * steps for k in keys})
    result = resources.check(f.evidence(log_tables=f.logs(metrics=rows)))
    assert result.status is status
    if status is GateStatus.ERROR:
        assert result.missing and "engine tuple" in result.missing[0]


def test_a_failed_gpu_probe_is_quoted_when_the_engines_cannot_be_judged() -> None:
    """No engine telemetry and an nvidia-smi probe that failed: ERROR quoting command and exit."""
    from worker.evidence.model import ProbeCommand

    command = ProbeCommand(argv=("kubectl", "exec", "p", "--", "nvidia-smi"), exit_code=127)
    probes = ProbeEvidence(directory="probes", commands=(command,))
    result = resources.check(f.evidence(log_tables=f.logs(metrics=REWARD_STEPS), probes=probes))
    assert result.status is GateStatus.ERROR
    assert "the GPU probe failed: `kubectl exec p -- nvidia-smi` exited 127" in result.summary
    assert result.evidence[0].source == "probes/probes.json"


def test_the_parsers_component_names_the_rank_kind_and_others_fall_back_to_the_phase() -> None:
    """`engine` and `policy` from the parser decide the rank; `driver` defers to the open phase."""
    from worker.gates.resources.cuda import INFERENCE, POLICY, component_of

    plain = {"text": "torch.OutOfMemoryError: CUDA out of memory.", "source": "finelog.log"}
    assert component_of({**plain, "component": "engine"}, "policy_train").kind == INFERENCE
    assert component_of({**plain, "component": "policy"}, "generate").kind == POLICY
    assert component_of({**plain, "component": "driver"}, "generate").kind == INFERENCE
    assert component_of({**plain, "component": "driver"}, "policy_train").kind == POLICY


# Real CUDA OOM lines of vLLM engine cores and of a verl driver (verbatim, with their URLs).
REAL_OOMS = (
    (  # https://github.com/noonghunna/club-3090/issues/16
        "(EngineCore pid=112) ERROR 05-01 14:39:06 [core.py:1131] torch.OutOfMemoryError: CUDA out "
        "of memory. Tried to allocate 50.00 MiB. GPU 0 has a total capacity of 23.56 GiB of which "
        "21.75 MiB is free. Including non-PyTorch memory, this process has 23.50 GiB memory in "
        "use. Of the allocated memory 22.88 GiB is allocated by PyTorch, with 24.00 MiB "
        "allocated in private pools (e.g., CUDA Graphs), and 275.38 MiB is reserved by PyTorch "
        "but unallocated. "
        "If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/"
        "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
        "engine",
    ),
    (  # https://github.com/Sandermage/genesis-vllm-patches/issues/1
        "(EngineCore pid=229) ERROR 04-19 12:21:04 [core.py:1134] torch.OutOfMemoryError: CUDA out "
        "of memory. Tried to allocate 72.00 MiB. GPU 0 has a total capacity of 31.33 GiB of which "
        "2.56 MiB is free. Including non-PyTorch memory, this process has 31.28 GiB memory in use. "
        "Of the allocated memory 29.83 GiB is allocated by PyTorch, with 18.00 MiB allocated in "
        "private pools (e.g., CUDA Graphs), and 711.09 MiB is reserved by PyTorch but unallocated. "
        "If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/"
        "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
        "engine",
    ),
    (  # https://github.com/qiancheng0/ToolRL/issues/39 (verl's driver prints a worker's OOM)
        "(main_task pid=2396241) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "5.22 GiB. GPU 0 has a total capacity of 23.69 GiB of which 1.18 GiB is free. Including "
        "non-PyTorch memory, this process has 22.48 GiB memory in use. Of the allocated memory "
        "21.54 GiB is allocated by PyTorch, and 517.58 MiB is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  (https://pytorch.org/docs/stable/notes/"
        "cuda.html#environment-variables)",
        "driver",
    ),
)


@pytest.mark.parametrize(("text", "component"), REAL_OOMS, ids=["club-3090", "genesis", "verl"])
def test_real_vllm_ooms_are_engine_ooms_whatever_phase_is_open(
    text: str, component: str, tmp_path: Path
) -> None:
    """A real vLLM engine-core OOM line is an inference rank's OOM even during a policy phase
    (its `component` column, not the phase, decides); a driver's line defers to the phase."""
    from worker.evidence.logs import parse_log_file
    from worker.gates.resources.cuda import INFERENCE, POLICY, component_of

    path = tmp_path / "finelog.log"
    path.write_text(text + "\n", encoding="utf-8")
    rows = parse_log_file(path, "finelog.log").errors
    assert rows["kind"].to_list() == ["cuda_oom"]
    row = rows.row(0, named=True)
    assert row["component"] == component
    during_training = component_of(row, "policy_train").kind
    assert during_training == (INFERENCE if component == "engine" else POLICY)
    assert component_of(row, "generate").kind == INFERENCE
