"""Bundles built from the verbatim failure lines of `tests/fixtures/real_failures/` (each with the
public URL it was found at): crash loops, deaths, configuration failures and benign noise.

A fixture line is written as it was found, behind the Iris prefix every finelog line carries; a
process prefix is added only where a test says whose line it is (an engine's Ray actor prefix), as
the job's own log would show it.
"""

from __future__ import annotations

import re
import tomllib
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from tests.scenarios.builder import JobBuilder
from tests.scenarios.catalog import (
    STANDARD_ARGV,
    T0,
    Built,
    attempts,
    controller,
    finish,
    run_steps,
    start_attempt,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "real_failures"
ENGINE_PREFIX = "(AsyncVLLMInferenceEngine pid={pid}, ip=10.128.26.194)"
ENGINE_PID = 287294  # the builder's first engine; engine i has pid ENGINE_PID + i


@dataclass(frozen=True)
class RealLine:
    """One `[[line]]` of the fixtures: the verbatim text, where it was found, what it means."""

    project: str
    url: str
    text: str
    entry: str | None
    kind: str
    failure_class: str | None
    specific: bool

    @property
    def id(self) -> str:
        tail = self.entry or self.kind
        return f"{self.project}:{tail}:{zlib.crc32(self.text.encode()) % 10_000:04d}"

    @property
    def ends_an_attempt(self) -> bool:
        """The gates may take it as an attempt's failure: hard or configuration class, or no
        entry and a final exception; and it is a signature on its own (no exit record)."""
        failure = self.failure_class in ("hard", "configuration") or (
            self.entry is None and self.kind in ("exception", "traceback")
        )
        return failure and self.specific


def _documents() -> list[tuple[str, dict[str, Any]]]:
    return [(p.stem, tomllib.loads(p.read_text("utf-8"))) for p in sorted(FIXTURES.glob("*.toml"))]


def real_lines() -> tuple[RealLine, ...]:
    """Every `[[line]]` of every fixture file, in file order."""
    return tuple(
        RealLine(
            project=name,
            url=case["url"],
            text=case["text"],
            entry=case["entry"] or None,
            kind=case["kind"],
            failure_class=case["class"] or None,
            specific=case.get("specific", True),
        )
        for name, doc in _documents()
        for case in doc.get("line", [])
    )


def line(url: str, contains: str) -> RealLine:
    """The fixture line found at `url` whose text holds `contains`."""
    found = [r for r in real_lines() if r.url == url and contains in r.text]
    assert len(found) == 1, (url, contains, found)
    return found[0]


def block(url: str, contains: str) -> list[str]:
    """The lines of the fixture `[[block]]` found at `url` whose text holds `contains`."""
    for _, doc in _documents():
        for case in doc.get("block", []):
            if case["url"] == url and contains in case["text"]:
                return [text for text in case["text"].split("\n") if text.strip()]
    raise AssertionError((url, contains))


# --- the lines the scenarios use, by their source ------------------------------------------------

NCCL_STARTUP_URL = "https://github.com/NovaSky-AI/SkyRL/issues/84"  # an NCCL start-up failure
ENGINE_FATAL = line("https://github.com/vllm-project/vllm/issues/17276", "fatal error")
ENGINE_DIED = line("https://github.com/vllm-project/vllm/issues/32468", "died unexpectedly")
ENGINE_DIED_DP1 = line("https://github.com/modelscope/ms-swift/issues/7933", "died unexpectedly")
KEY_NOT_IN_STRUCT = line("https://github.com/Sachini/niloc/issues/10", "is not in struct")
NO_KV_MEMORY = line(
    "https://github.com/vllm-project/vllm/issues/10439", "engine.py:366] ValueError"
)
HYDRA_APP_URL = "https://github.com/LeCAR-Lab/ASAP/issues/16"  # banner, then the config traceback
NCCL_UNHANDLED = line("https://github.com/NVIDIA/nccl/issues/1410", "DistBackendError")
NCCL_UNHANDLED_VERL = line("https://github.com/verl-project/verl/issues/2044", "DistBackendError")
NCCL_INVALID = line("https://github.com/SpursGoZmy/Table-LLaVA/issues/4", "invalid argument")
NCCL_REMOTE_EXITED = line("https://github.com/NVIDIA/nccl/issues/2076", "DistBackendError")
RAY_ACTOR_ERROR = line("https://github.com/ray-project/ray/issues/9293", "RayActorError")
ATTRIBUTE_ERROR = line("https://github.com/NovaSky-AI/SkyRL/pull/69", "AttributeError")
FATAL_ABORT = line("https://github.com/pytorch/pytorch/issues/12744", "terminate called")
CHILD_FAILED = line("https://github.com/lmzpai/roboMamba/issues/10", "ChildFailedError")
REWARD_FILE_MISSING = line("https://github.com/Human-Agent-Society/reef/issues/215", "No reward")

# Benign noise (the catalogue's benign class) and a per-rollout skip (transient): scary words, no
# failure by themselves.
NOISE: tuple[RealLine, ...] = (
    line("https://github.com/eugr/spark-vllm-docker/issues/348", "shared memory broadcast"),
    line("https://github.com/vllm-project/vllm/pull/6102", "is preempted by"),
    line("https://github.com/InternLM/lmdeploy/issues/3343", "A worker died or was killed"),
    line("https://github.com/hpcaitech/ColossalAI/issues/3514", "closing signal SIGTERM"),
    line("https://github.com/NovaSky-AI/SkyRL/issues/228", "[FATAL] No fallback"),
)


# --- bundles -------------------------------------------------------------------------------------


def loop(
    root: Path,
    name: str,
    failures: Sequence[Sequence[str]],
    *,
    state: str = "failed",
    history: bool = False,
    running_after: bool = False,
    argv: Sequence[str] = STANDARD_ARGV,
) -> Built:
    """One attempt per entry of `failures`, each dying at start-up (in `generate` of its first
    step) with those lines, three minutes apart; a relaunch runs new processes, so the pids of
    the lines' Ray prefixes change from attempt to attempt (`relaunched`). With `history`, the
    controller's attempt record of each says only `Exit code: 1` (Iris's usual error), and with
    `running_after` a newest attempt is running and still initialising when judged."""
    b = JobBuilder(root, name, T0)
    rows: list[tuple[str, int | None, str, datetime, datetime | None]] = []
    moment = T0
    for attempt, lines in enumerate(failures):
        start = moment
        moment = start_attempt(b, moment)
        b.log(moment, "Started: 'step'")
        b.log(moment, "Started: 'generate'")
        for text in lines:
            b.raw(moment + timedelta(seconds=40), relaunched(text, attempt))
        moment += timedelta(minutes=3)
        rows.append(("failed", 1, "Exit code: 1", start, moment))
    if running_after:
        rows.append(("running", None, "", moment, None))
        moment = start_attempt(b, moment)
        b.log(moment, "Started: 'step'")
        state = "running"
    if history:
        controller(b, state, failures=len(failures), error="" if running_after else "Exit code: 1")
        attempts(b, rows)
    now = moment + timedelta(minutes=2 if running_after else 5)
    return finish(b, root, now, probes=history, state=state, argv=list(argv))


_PREFIX_PID = re.compile(r"(\(\w+ pid=)(\d+)")


def relaunched(text: str, attempt: int) -> str:
    """`text` as attempt `attempt` prints it: every Ray process prefix `(Name pid=N` gets another
    pid (the text after the prefixes, pids a message names included, is unchanged)."""
    return _PREFIX_PID.sub(lambda m: f"{m[1]}{int(m[2]) + 1000 * attempt}", text)


def trained_past(root: Path, name: str, text: str, attempts_n: int = 3) -> Built:
    """`attempts_n` attempts of six steps each, every one logging `text` during its third step
    (a trial's failure the trainer goes on past) and then ending without a failure line (a
    relaunch, as after a preemption); the newest is running at step 4 of its resume."""
    b = JobBuilder(root, name, T0)
    moment = T0
    for attempt in range(attempts_n):
        resume = None if attempt == 0 else 3
        moment = start_attempt(b, moment, resume=resume)
        first = 1 if attempt == 0 else 4
        last = first + (5 if attempt < attempts_n - 1 else 0)
        moment = run_steps(b, moment, range(first, first + 2))
        b.raw(moment, relaunched(text, attempt))
        moment = run_steps(b, moment, range(first + 2, last + 1)) + timedelta(minutes=2)
    controller(b, "running")
    return finish(b, root, moment, probes=True)


def engines_argv(n: int) -> list[str]:
    return [*STANDARD_ARGV[:-2], f"generator.num_inference_engines={n}", STANDARD_ARGV[-1]]


def engine_death(
    root: Path,
    name: str,
    *,
    engines: int,
    dead: Sequence[tuple[int, str]],
    silent_min: float,
    death_after_min: float = 2.0,
) -> Built:
    """A standard run of 12 steps on `engines` engines, then the next step's `generate` opens and
    each `(engine, text)` of `dead` logs its death line `death_after_min` minutes later; then
    nothing for `silent_min` minutes while the controller says running. Engine -1 means a line
    written without a process prefix (a single engine's own log)."""
    b = JobBuilder(root, name, T0)

    def fleet(builder: JobBuilder, moment: datetime) -> None:
        for i in range(engines):
            builder.vllm(
                moment, engine=i, pid=ENGINE_PID + i, running=48, waiting=6, kv=46.0, gen=2450.0
            )

    end = run_steps(b, start_attempt(b, T0), range(1, 13), engines=fleet)
    b.log(end, "Started: 'step'")
    b.log(end, "Started: 'generate'")
    fleet(b, end + timedelta(seconds=30))
    death_at = end + timedelta(minutes=death_after_min)
    for engine, text in dead:
        prefix = "" if engine < 0 else ENGINE_PREFIX.format(pid=ENGINE_PID + engine) + " "
        b.raw(death_at, prefix + text)
    controller(b, "running")
    now = death_at + timedelta(minutes=silent_min)
    return finish(b, root, now, probes=True, argv=engines_argv(engines))


def trainer_death(root: Path, name: str, *, text: str, silent_min: float) -> Built:
    """A standard run of 12 steps, the next step's `generate` open, the trainer's death line two
    minutes later (as the trainer's own stderr: no Ray prefix), then `silent_min` of silence."""
    b = JobBuilder(root, name, T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 13))
    b.log(end, "Started: 'step'")
    b.log(end, "Started: 'generate'")
    death_at = end + timedelta(minutes=2)
    b.raw(death_at, text)
    controller(b, "running")
    return finish(b, root, death_at + timedelta(minutes=silent_min), probes=True)


def config_then(root: Path, name: str, *, silent_min: float, step_after: bool = False) -> Built:
    """A running job of 12 steps whose 13th logs a configuration failure (a key not in a struct
    config, read late); judged `silent_min` after it. With `step_after` the trainer caught it and
    finished step 13 three minutes later (and nothing since)."""
    b = JobBuilder(root, name, T0)
    end = run_steps(b, start_attempt(b, T0), range(1, 13))
    b.log(end, "Started: 'step'")
    b.log(end, "Started: 'generate'")
    failed_at = end + timedelta(seconds=30)
    b.raw(failed_at, KEY_NOT_IN_STRUCT.text)
    if step_after:
        run_steps(b, failed_at + timedelta(seconds=30), range(13, 14), seconds=150.0)
    controller(b, "running")
    return finish(b, root, failed_at + timedelta(minutes=silent_min), probes=True)


# --- noise ---------------------------------------------------------------------------------------


def _iris_prefix(text: str) -> str:
    """`[HH:MM:SS] task=/u/j/0 | ` of an Iris-prefixed line, else empty."""
    head, sep, _ = text.partition(" | ")
    return head + sep if sep and head.startswith("[") else ""


def inject_noise(built: Built, noise: Sequence[RealLine] = NOISE) -> int:
    """Write the noise lines into the bundle's finelog before every `Started: 'step'` line (with
    that line's Iris prefix) and after the last line: during training, and after the newest
    advancement (where death rules look). Returns how many lines were added."""
    path = built.job_dir / "finelog.log"
    lines = path.read_text("utf-8").splitlines()
    out: list[str] = []
    added = 0
    for text in lines:
        if "Started: 'step'" in text:
            out += [_iris_prefix(text) + n.text for n in noise]
            added += len(noise)
        out.append(text)
    tail = _iris_prefix(lines[-1]) if lines else ""
    out += [tail + n.text for n in noise]
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return added + len(noise)
