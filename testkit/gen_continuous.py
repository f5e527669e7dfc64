"""A continuous finelog for the parser's tests and benchmark (deterministic, seeded).

Beside `gen_finelog.py` (restarts, tracebacks, pprint-ed console dicts, truncated records), this
is the steady state of a healthy run: one attempt, a clock that only moves forward, one-line
records only (no multi-line dict), and vLLM stat lines for about half of the bytes. Every line has
Iris's `[HH:MM:SS] task=... | ` prefix; trainer lines a coloured Ray prefix and a loguru header.
Each step prints its phase timers, a reward line, a one-line policy dict, a WANDB_MIRROR record
and a `Training Step Progress` line; every twentieth step an eval record.

`python bench/gen_continuous.py [--mb 200] [--seed 11] [--out FILE]` writes one for the benchmark.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

from testkit.gen_finelog import PHASES, _mirror, _Writer

__all__ = ["ENGINE_SHARE", "generate_continuous"]

ENGINE_SHARE = 0.5  # of the bytes


class _Share:
    """Bytes written so far, all lines and vLLM stat lines."""

    def __init__(self) -> None:
        self.total = 0
        self.engine = 0

    def add(self, line: str, *, engine: bool = False) -> str:
        size = len(line.encode()) + 1
        self.total += size
        self.engine += size if engine else 0
        return line


def _phase(w: _Writer, phase: str, share: _Share) -> Iterator[str]:
    yield share.add(w.trainer(f"Started: '{phase}'"))
    for _ in range(w.rng.randrange(30, 60)):
        w.clock.tick(w.rng.uniform(0.05, 0.6))
        # a stat line whenever they are below ENGINE_SHARE of the bytes so far
        if share.engine < ENGINE_SHARE * share.total:
            yield share.add(w.engine(), engine=True)
        else:
            yield share.add(w.noise())
    yield share.add(w.trainer(f"Finished: '{phase}', time cost: {w.rng.uniform(1, 300):.2f}s"))


def _step(w: _Writer, step: int, share: _Share) -> Iterator[str]:
    yield share.add(w.trainer("Started: 'step'"))
    for phase in PHASES:
        yield from _phase(w, phase, share)
    rng = w.rng
    lines = [
        w.trainer(f"reward/avg_pass_at_5: {rng.random():.4f}, reward/avg_raw_reward: 0.21"),
        w.trainer(f"Finished: 'step', time cost: {rng.uniform(100, 900):.2f}s"),
        w.trainer(f"{{'final_loss': {rng.random():.5f}, 'policy_loss': 0.1, 'grad_norm': 0.3}}"),
        _mirror(w, step),
        w.raw(f"Training Step Progress: {step} / 100000"),
    ]
    if step % 20 == 0:
        lines.append(_mirror(w, step, kind="eval"))
    for line in lines:
        yield share.add(line)


def _lines(seed: int) -> Iterator[str]:
    w = _Writer(random.Random(seed))
    share = _Share()
    yield share.add(w.raw("[iris setup] step 1/2"))
    yield share.add(w.trainer("No checkpoint found, starting training from scratch"))
    step = 0
    while True:
        step += 1
        yield from _step(w, step, share)


def generate_continuous(path: Path, megabytes: float, seed: int = 11) -> Path:
    """Write about `megabytes` MB of continuous finelog to `path` (same seed, same bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    target = int(megabytes * 1_000_000)
    written = 0
    batch: list[str] = []
    with path.open("w", encoding="utf-8") as handle:
        for line in _lines(seed):
            batch.append(line)
            written += len(line.encode()) + 1
            if len(batch) >= 20_000 or written >= target:
                handle.write("\n".join(batch) + "\n")
                batch.clear()
            if written >= target:
                break
    return path
