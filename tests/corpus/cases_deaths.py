"""Deaths that need a change (configuration, image, task files) and environment failures that make
the reward signal invalid. Each is a KILL whose next action is a handoff to an owner.

Error lines are those users pasted in public trackers: Hydra/OmegaConf (Sachini/niloc#10 "Key 'io'
is not in struct", taokz/BiomedGPT#75 "Could not override ..."), a missing module under SkyRL's
entrypoint (PeterGriffinJin/Search-R1#154: `RayTaskError(ImportError): ray::skyrl_entrypoint()`;
VisuLogic-Train#1: "ModuleNotFoundError: No module named 'flash_attn'"), Daytona's quota errors
(daytonaio/daytona#3304 "Total CPU limit exceeded"), Harbor's missing reward file
(Human-Agent-Society/reef#215).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from tests.corpus.cases_stalls import ARGV
from tests.corpus.kit import T0, Labelled, RayJob, standard_finish
from tests.scenarios.builder import JobBuilder
from tests.scenarios.catalog import (
    AGENTIC_ARGV,
    Built,
    attempts,
    controller,
    run_steps,
    start_attempt,
    with_metrics,
)

HYDRA = (
    "Error executing job with overrides: ['trainer.epochs=20', 'trainer.algorithm.io=fp32']",
    "omegaconf.errors.ConfigAttributeError: Key 'io' is not in struct",
    "    full_key: trainer.algorithm.io",
    "    object_type=dict",
    "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
)
IMPORT_ERROR = (
    "ray.exceptions.RayTaskError(ImportError): ray::skyrl_entrypoint() (pid={pid}, ip=10.190.168.34)",
    '  File "/opt/skyrl/skyrl_train/entrypoints/main_base.py", line 251, in _setup_trainer',
    "    from skyrl_train.workers.fsdp.fsdp_worker import PolicyWorker",
    '  File "/opt/skyrl/skyrl_train/workers/fsdp/fsdp_worker.py", line 12, in <module>',
    "    from flash_attn.bert_padding import pad_input, unpad_input",
    "ModuleNotFoundError: No module named 'flash_attn'",
)
MISSING_FILE = (
    "FileNotFoundError: [Errno 2] No such file or directory: '/opt/skyrl/data/gsm8k/train.parquet'"
)


def _attempt_death(b: JobBuilder, moment: datetime, lines: tuple[str, ...], pid: int) -> datetime:
    start_attempt(b, moment)
    at = moment + timedelta(seconds=55)
    b.raw(at, "Traceback (most recent call last):")
    for line in lines:
        b.raw(at, line.format(pid=pid))
    return at + timedelta(seconds=5)


def _failed_loop(root: Path, name: str, lines: tuple[str, ...], error: str) -> Built:
    b = JobBuilder(root, name, T0)
    rows = []
    moment = T0
    for n in range(3):
        start = moment
        end = _attempt_death(b, moment, lines, 841440 + n)
        rows.append(("failed", 1, f"Exit code: 1. stderr: {error}", start, end))
        moment = end + timedelta(minutes=1)
    controller(b, "failed", failures=3, error=f"Exit code: 1. stderr: {error}")
    attempts(b, rows)
    return standard_finish(
        b, root, moment + timedelta(minutes=4), probes=True, state="failed", argv=ARGV
    )


def hydra_loop(root: Path) -> Built:
    return _failed_loop(root, "rl-qwen-hydra-struct", HYDRA, HYDRA[1])


def module_not_found_loop(root: Path) -> Built:
    return _failed_loop(root, "rl-qwen-no-flash-attn", IMPORT_ERROR, IMPORT_ERROR[-1])


def missing_file_first_attempt(root: Path) -> Built:
    b = RayJob(root, "rl-qwen-missing-data", T0)
    moment = b.restart(T0, 8455, None)
    b.log(moment, "Loading dataset from /opt/skyrl/data/gsm8k/train.parquet")
    b.traceback(moment + timedelta(seconds=4), ["skyrl_train/dataset/dataset.py"], MISSING_FILE)
    return standard_finish(b, root, T0 + timedelta(minutes=25), argv=ARGV)


def yaml_parse_loop(root: Path) -> Built:
    lines = (
        '  File "/opt/skyrl/skyrl_train/entrypoints/main_base.py", line 318, in main',
        "yaml.scanner.ScannerError: mapping values are not allowed here",
        '  in "/opt/skyrl/configs/rl_qwen.yaml", line 41, column 17',
    )
    return _failed_loop(root, "rl-qwen-bad-yaml", lines, lines[1])


# --- agentic: the reward signal itself is invalid -------------------------------------------------


def _agentic_zero(b: JobBuilder, steps: int, exceptions: dict[str, int] | None) -> datetime:
    zero = with_metrics(**{"reward/avg_raw_reward": 0.0, "reward/avg_pass_at_5": 0.0})
    moment = start_attempt(b, T0)
    for step in range(1, steps + 1):
        if exceptions:
            b.batch(moment, 32 - sum(exceptions.values()), 32, exceptions)
        moment = run_steps(b, moment, range(step, step + 1), zero, seconds=240)
    return moment


def verifier_tests_missing(root: Path) -> Built:
    b = JobBuilder(root, "rl-tasktrove-verifier-missing", T0)
    end = _agentic_zero(b, 12, None)
    for i in range(64):
        b.trial(f"fix-git-history__{i:07x}", T0 + timedelta(minutes=2 + i * 0.7), reward=0.0)
    built = standard_finish(b, root, end + timedelta(minutes=1), argv=AGENTIC_ARGV)
    for i in range(64):
        verifier = built.job_dir / "trace_jobs" / f"fix-git-history__{i:07x}" / "verifier"
        verifier.mkdir(parents=True, exist_ok=True)
        (verifier / "test-stdout.txt").write_text(
            "============================= test session starts ==============================\n"
            "platform linux -- Python 3.11.7, pytest-8.3.4, pluggy-1.5.0\n"
            "rootdir: /app\n"
            "collected 0 items\n\n"
            "============================ no tests ran in 0.01s =============================\n"
            "ERROR: file or directory not found: /tests/test_outputs.py\n",
            encoding="utf-8",
        )
        (verifier / "reward.txt").write_text("0\n", encoding="utf-8")
    return built


def daytona_cpu_quota(root: Path) -> Built:
    b = JobBuilder(root, "rl-tasktrove-cpu-quota", T0)
    end = _agentic_zero(b, 12, {"DaytonaError": 31})
    message = "Failed to create sandbox: Total CPU limit exceeded. Maximum allowed: 4500."
    for i in range(80):
        failed = i % 20 != 0
        b.trial(
            f"sanitize-git-repo__{i:07x}",
            T0 + timedelta(minutes=2 + i * 0.5),
            reward=0.0,
            exception="DaytonaError" if failed else None,
            message=message if failed else "",
            turns=0 if failed else 4,
            setup_s=2.0,
            agent_s=0.5 if failed else 120.0,
        )
    return standard_finish(b, root, end + timedelta(minutes=1), argv=AGENTIC_ARGV)


def sandbox_errors_minority(root: Path) -> Built:
    b = JobBuilder(root, "rl-tasktrove-some-sandbox-errors", T0)
    moment = start_attempt(b, T0)
    end = run_steps(b, moment, range(1, 15), seconds=600)
    for i in range(90):
        failed = i % 7 == 0
        b.trial(
            f"conda-env-setup__{i:07x}",
            T0 + timedelta(minutes=15 + i),
            reward=0.0 if failed else float(i % 3 == 0),
            exception="DaytonaError" if failed else None,
            message="Sandbox resource limit reached (16), please try again later."
            if failed
            else "",
            turns=0 if failed else 6,
        )
    return standard_finish(b, root, end + timedelta(minutes=1), argv=AGENTIC_ARGV)


CASES: tuple[Labelled, ...] = (
    Labelled(
        "hydra_key_not_in_struct_every_attempt",
        hydra_loop,
        "KILL",
        "three attempts die seconds after start on `ConfigAttributeError: Key 'io' is not in "
        "struct`: a launch override that cannot apply; handoff to the config owner",
    ),
    Labelled(
        "module_not_found_every_attempt",
        module_not_found_loop,
        "KILL",
        "three attempts die importing flash_attn (`ModuleNotFoundError`): the image lacks it",
    ),
    Labelled(
        "missing_dataset_file_first_attempt",
        missing_file_first_attempt,
        "KILL",
        "the first attempt died 25 min ago on FileNotFoundError for the training parquet and "
        "nothing ran since; the controller still says running: not initialisation",
    ),
    Labelled(
        "yaml_config_parse_error_every_attempt",
        yaml_parse_loop,
        "KILL",
        "three attempts die on a YAML ScannerError in the launch config",
    ),
    Labelled(
        "verifier_tests_missing_all_rewards_zero",
        verifier_tests_missing,
        "KILL",
        "every trial reward 0 from step 1; each verifier's output says "
        "`file or directory not found: /tests/test_outputs.py`: the task image lacks its tests",
        mode="agentic",
    ),
    Labelled(
        "daytona_cpu_quota_most_trials",
        daytona_cpu_quota,
        "KILL",
        "95% of trials fail `Failed to create sandbox: Total CPU limit exceeded`, rewards 0: the "
        "reward signal is invalid; handoff to the environment owner",
        mode="agentic",
    ),
    Labelled(
        "daytona_resource_limit_minority",
        sandbox_errors_minority,
        "NO-KILL",
        "one trial in seven hits Daytona's `Sandbox resource limit reached`; the rest score",
        mode="agentic",
    ),
)
