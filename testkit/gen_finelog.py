"""A realistic merged finelog for the parser's tests and benchmark (deterministic, seeded).

Every line carries Iris's `[HH:MM:SS] task=... | ` prefix; trainer lines carry a coloured Ray
prefix and a loguru header; vLLM engines print stat lines every few lines; each step has phase
timers, a WANDB_MIRROR record (some with NaN, a few truncated), a policy dict and reward
lines; every fifth step a pprint-ed console dict; occasional tracebacks, eval records, restarts
and noise.

`python bench/gen_finelog.py [--mb 200] [--seed 7] [--out FILE]` writes one for the benchmark.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

__all__ = ["generate"]

TASK = "/ops/rl-bench/0"
RAY = "\x1b[36m(skyrl_entrypoint pid=8455)\x1b[0m "
PHASES = ("generate", "convert_to_training_input", "fwd_logprobs_values_reward", "policy_train")
KEYS = [f"policy/k{i}" for i in range(24)] + [f"generate/g{i}" for i in range(12)]


class _Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 3, 26, 21, 0, 0)

    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def iris(self) -> str:
        return f"[{self.now:%H:%M:%S}] task={TASK} | "

    def loguru(self) -> str:
        return f"{self.now:%Y-%m-%d %H:%M:%S}.{self.now.microsecond // 1000:03d}"


class _Writer:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.clock = _Clock()

    def trainer(self, msg: str, level: str = "INFO") -> str:
        head = f"{self.clock.loguru()} | {level:<8} | skyrl.train.trainer:train:210 - "
        return f"{self.clock.iris()}{RAY}{head}{msg}"

    def raw(self, msg: str) -> str:
        return f"{self.clock.iris()}{msg}"

    def engine(self) -> str:
        rng, now = self.rng, self.clock.now
        i = rng.randrange(4)
        prefix = f"\x1b[36m(AsyncVLLMInferenceEngine pid=2872{i}, ip=10.0.0.{i})\x1b[0m "
        stats = (
            f"Engine 000: Avg prompt throughput: {rng.uniform(0, 900):.1f} tokens/s, "
            f"Avg generation throughput: {rng.uniform(0, 3000):.1f} tokens/s, "
            f"Running: {rng.randrange(64)} reqs, Waiting: {rng.randrange(8)} reqs, "
            f"GPU KV cache usage: {rng.uniform(0, 90):.1f}%, Prefix cache hit rate: "
            f"{rng.uniform(0, 60):.1f}%"
        )
        return f"{self.clock.iris()}{prefix}INFO {now:%m-%d %H:%M:%S} [loggers.py:248] {stats}"

    def noise(self) -> str:
        rng = self.rng
        choice = rng.randrange(4)
        if choice == 0:
            return self.raw(
                f"INFO:     10.0.0.{rng.randrange(9)}:5{rng.randrange(999)} - "
                '"POST /v1/chat/completions HTTP/1.1" 200 OK'
            )
        if choice == 1:
            pct = rng.randrange(100)
            return self.raw(
                f"Generating Trajectories: {pct}%|{'█' * (pct // 10):<10}| "
                f"{pct * 51}/5120 [00:{pct % 60:02d}<00:53, 57.86it/s]"
            )
        if choice == 2:
            return self.trainer(f"batch_num_seq: {rng.randrange(9000)}, padded: 1172")
        return self.raw(
            f"(AsyncVLLMInferenceEngine pid=28720) Added request chatcmpl-{rng.getrandbits(64):x}."
        )


def _mirror(w: _Writer, step: int, kind: str = "train", truncate: bool = False) -> str:
    rng = w.rng
    values = {k: f"{rng.gauss(0, 1):.6f}" for k in KEYS}
    values["reward/avg_raw_reward"] = f"{rng.random():.4f}"
    if rng.random() < 0.05:
        values["policy/k0"] = "NaN"
    for phase in PHASES:
        values[f"timing/{phase}"] = f"{rng.uniform(1, 300):.2f}"
    body = ", ".join(f'"{k}": {v}' for k, v in values.items())
    text = f"WANDB_MIRROR kind={kind} step={step} metrics={{{body}}}"
    return w.trainer(text[: len(text) // 2] if truncate else text)


def _console(w: _Writer, step: int) -> list[str]:
    rows = [f"'policy/k{i}': '{w.rng.random():.4f}'," for i in range(8)]
    first = w.trainer("{'async/staleness_max': 0,")
    body = [w.raw(f"{RAY} {row}") for row in rows]
    return [first, *body, w.raw(f"{RAY} 'trainer/global_step': {step}}}")]


def _traceback(w: _Writer) -> list[str]:
    frames = [w.raw(f'  File "/app/skyrl/train/trainer.py", line {n}, in train') for n in (10, 20)]
    end = w.raw("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    return [w.raw("Traceback (most recent call last):"), *frames, end]


def _phase(w: _Writer, phase: str) -> Iterator[str]:
    yield w.trainer(f"Started: '{phase}'")
    for _ in range(w.rng.randrange(30, 60)):
        w.clock.tick(w.rng.uniform(0.05, 0.6))
        yield w.engine() if w.rng.random() < 0.3 else w.noise()
    yield w.trainer(f"Finished: '{phase}', time cost: {w.rng.uniform(1, 300):.2f}s")


def _step(w: _Writer, step: int) -> Iterator[str]:
    yield w.trainer("Started: 'step'")
    for phase in PHASES:
        yield from _phase(w, phase)
    yield w.trainer(f"reward/avg_pass_at_5: {w.rng.random():.4f}, reward/avg_raw_reward: 0.21")
    yield w.trainer(f"Finished: 'step', time cost: {w.rng.uniform(100, 900):.2f}s")
    yield w.trainer(f"{{'final_loss': {w.rng.random():.5f}, 'policy_loss': 0.1, 'grad_norm': 0.3}}")
    yield _mirror(w, step, truncate=step % 97 == 0)
    yield w.raw(f"Training Step Progress: {step} / 100000")
    if step % 5 == 0:
        yield from _console(w, step)
    if step % 20 == 0:
        yield _mirror(w, step, kind="eval")
    if step % 50 == 0:
        yield from _traceback(w)


def _lines(seed: int) -> Iterator[str]:
    w = _Writer(random.Random(seed))
    yield w.raw("[iris setup] step 1/2")
    yield w.trainer("No checkpoint found, starting training from scratch")
    step = done = 0
    while True:
        step += 1
        done += 1
        yield from _step(w, step)
        if done % 400 == 0:  # a restart that resumes three steps back
            yield w.raw("[iris setup] step 1/2")
            yield w.trainer(f"Resuming from global_step: {step - 3}")
            step -= 3


def generate(path: Path, megabytes: float, seed: int = 7) -> Path:
    """Write about `megabytes` MB of finelog to `path` (same seed, same bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    target = int(megabytes * 1_000_000)
    written = 0
    batch: list[str] = []
    with path.open("w", encoding="utf-8") as handle:
        for line in _lines(seed):
            batch.append(line)
            written += len(line) + 1
            if len(batch) >= 20_000 or written >= target:
                handle.write("\n".join(batch) + "\n")
                batch.clear()
            if written >= target:
                break
    return path
