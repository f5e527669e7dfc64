"""Bundles for issue 27's findings 5 and 8 (trainer–trial agreement by evidence; deaths that need a
change), built from the real line formats of `builder.py` and the verbatim failure text of
`tests/fixtures/real_failures/` (each with its public URL).

Trial exception messages and verifier outputs are text a result file or a verifier console holds,
not log lines, so they are kept here with their sources:
- `DaytonaValidationError: Total disk limit exceeded` — kortix-ai/suna#4072 (every sandbox create
  of an organisation over its disk quota failed with it);
- `Failed to create sandbox: Total CPU limit exceeded. Maximum allowed: 4500.` — daytona#3304;
- pytest's console when its test path is missing (`collected 0 items`, `no tests ran in 0.00s`,
  `ERROR: file or directory not found: <path>`) — NVlabs/RoboLab#17, with the test path of a
  Harbor task (`/tests/test_outputs.py`);
- a test that fails on a missing output file (`FileNotFoundError: [Errno 2] No such file or
  directory: '<output>'` inside a failing test) — borenstein-lab/fishtaco#13's shape.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from tests.scenarios import real_lines as real
from tests.scenarios.builder import JobBuilder
from tests.scenarios.catalog import (
    AGENTIC_ARGV,
    T0,
    Built,
    controller,
    finish,
    healthy_metrics,
    run_steps,
    start_attempt,
    with_metrics,
)

DISK_QUOTA = "Total disk limit exceeded"  # kortix-ai/suna#4072
CPU_QUOTA = "Failed to create sandbox: Total CPU limit exceeded. Maximum allowed: 4500."  # #3304
MISSING_OUTPUT = "FileNotFoundError: [Errno 2] No such file or directory: '/app/output.txt'"
SESSION = "============================= test session starts =============================="
TESTS_NOT_FOUND = f"""{SESSION}
platform linux -- Python 3.11.15, pytest-9.1.1, pluggy-1.6.0
rootdir: /tests
collected 0 items

============================ no tests ran in 0.00s =============================
ERROR: file or directory not found: /tests/test_outputs.py
"""
OUTPUT_NOT_FOUND = f"""{SESSION}
platform linux -- Python 3.11.15, pytest-9.1.1, pluggy-1.6.0
rootdir: /tests
collected 1 item

../tests/test_outputs.py F                                                [100%]

=================================== FAILURES ===================================
_______________________________ test_output_file _______________________________
E       {MISSING_OUTPUT}
=========================== short test summary info ============================
FAILED ../tests/test_outputs.py::test_output_file - {MISSING_OUTPUT}
============================== 1 failed in 0.05s ===============================
"""
STILL_STARTING = "Exporting wandb api key to ray runtime env"  # SkyRL's start-up, SkyRL#542
HYDRA_OVERRIDE = real.block("https://github.com/taokz/BiomedGPT/issues/75", "common.no_progress")
MODULE_MISSING = real.block("https://github.com/ray-project/ray/issues/44264", "kaiko.llm_serve")
MODEL_FILE_MISSING = real.line("https://github.com/WangRongsheng/XrayGLM/issues/89", "No such")


# --- deaths that need a change -------------------------------------------------------------------


def died_at_start(
    root: Path,
    name: str,
    *,
    lines: list[str],
    silent_min: float,
    state: str = "running",
    logs_on_min: int = 0,
) -> Built:
    """One attempt that opens its first step's `generate` and logs `lines` 40 s later (none: it
    is still initialising); with `logs_on_min` the driver goes on starting up, logging once a
    minute for that long (the process alive after a caught error); then nothing for
    `silent_min` while the controller says `state`."""
    b = JobBuilder(root, name, T0)
    moment = start_attempt(b, T0)
    b.log(moment, "Started: 'step'")
    b.log(moment, "Started: 'generate'")
    died = moment + timedelta(seconds=40)
    for text in lines:
        b.raw(died, text)
    quiet = died
    for minute in range(1, logs_on_min + 1):
        quiet = died + timedelta(minutes=minute)
        b.log(quiet, STILL_STARTING)
    controller(b, state)
    return finish(b, root, quiet + timedelta(minutes=silent_min), probes=True, state=state)


# --- the reward signal invalid ---------------------------------------------------------------


def verifier_cannot_run(root: Path, name: str, *, output: str) -> Built:
    """An agentic run of 12 steps training on zero rewards; every one of 60 trials ran its agent,
    raised nothing, scored 0, and its verifier printed `output`."""
    b = JobBuilder(root, name, T0)
    zero = with_metrics(**{"reward/avg_raw_reward": 0.0, "reward/avg_pass_at_5": 0.0})
    moment = start_attempt(b, T0)
    for step in range(1, 13):
        b.batch(moment, 32, 32, {})
        moment = run_steps(b, moment, range(step, step + 1), zero, seconds=300)
    for i in range(60):
        b.trial(
            f"fix-git-history__{i:07x}",
            T0 + timedelta(minutes=2, seconds=50 * i),
            reward=0.0,
            verifier_output=output,
        )
    return finish(b, root, moment + timedelta(seconds=60), argv=AGENTIC_ARGV)


def provider_on_most_trials(root: Path, name: str, *, named_steps: int = 12) -> Built:
    """An agentic run of 12 steps whose reward stays low but positive: 56 of 60 trials refused
    by the sandbox provider (`DaytonaValidationError: Total disk limit exceeded`), 4 earning a
    reward. The trainer's batch lines name DaytonaValidationError on its newest `named_steps`
    steps (an older or another breakdown before them)."""
    b = JobBuilder(root, name, T0)
    low = with_metrics(**{"reward/avg_raw_reward": 0.06, "reward/avg_pass_at_5": 0.1})
    moment = start_attempt(b, T0)
    for step in range(1, 13):
        if step > 12 - named_steps:
            b.batch(moment, 3, 32, {"DaytonaValidationError": 29})
        else:
            b.batch(moment, 31, 32, {"AgentTimeoutError": 1})
        moment = run_steps(b, moment, range(step, step + 1), low, seconds=90)
    for i in range(60):
        refused = i % 15 != 0
        b.trial(
            f"fix-git-history__{i:07x}",
            T0 + timedelta(minutes=2, seconds=15 * i),
            reward=None if refused else 1.0,
            exception="DaytonaValidationError" if refused else None,
            message=DISK_QUOTA if refused else "",
            turns=0 if refused else 6,
            setup_s=1.0 if refused else 4.0,
            agent_s=0.5 if refused else 240.0,
            verifier_s=0.1 if refused else 20.0,
        )
    return finish(b, root, moment + timedelta(seconds=60), argv=AGENTIC_ARGV)


# --- trainer–trial agreement -------------------------------------------------------------------


def collapse_with_trials(root: Path, name: str, *, window_reward: float) -> Built:
    """An agentic run of 30 steps of two minutes whose trainer reward collapses at step 19 (0.5
    to 0.02) and stays there; a trial finishes every 80 s, earning 1 and 0 in turn before the
    trainer's newest 10 steps and `window_reward` within them (15 of them: too few for the
    rollouts gate's own rolling collapse rule to see every newest window under its line). No
    trial raises."""
    b = JobBuilder(root, name, T0)

    def metrics(step: int) -> dict[str, float]:
        return healthy_metrics(step) | {"reward/avg_raw_reward": 0.5 if step <= 18 else 0.02}

    end = run_steps(b, start_attempt(b, T0), range(1, 31), metrics)
    window_opens = end - timedelta(minutes=20)
    started, i = T0 + timedelta(minutes=2), 0
    while started + timedelta(seconds=267) < end:
        inside = started + timedelta(seconds=267) > window_opens + timedelta(seconds=30)
        reward = window_reward if inside else float(i % 2)
        b.trial(f"fix-git-history__{i:07x}", started, reward=reward)
        started, i = started + timedelta(seconds=80), i + 1
    return finish(b, root, end + timedelta(seconds=60), argv=AGENTIC_ARGV)
