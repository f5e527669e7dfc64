"""Generate the record-dense and the noisy benchmark logs (deterministic, seeded).

Two shapes beside `gen_continuous.py` (half the bytes stat lines, the rest mostly noise no rule
reads):

- `dense`: nearly every byte a record. vLLM stat lines ~52% of the bytes, phase timer lines
  (`Started: '...'` / `Finished: '...', time cost: ...`) ~28%, `WANDB_MIRROR` records ~12% at
  ~840 bytes each, reward lines ~7%, one `Training Step Progress` line a step.
- `noisy`: the same records with ~45% of the bytes in what a busy vLLM/Ray job prints besides
  them: vLLM request logs (`Received request ...: prompt: '...', params: SamplingParams(...)`),
  `Added request` lines, tqdm bars, raylet warnings and NCCL rank warnings.

Every line carries Iris's `[HH:MM:SS] task=... | ` prefix; trainer lines a coloured Ray prefix
and a loguru header (`gen_finelog._Writer`). Each kind is written whenever it is furthest below
its share of the bytes so far, so the shares hold at any size.

`bench/gen_records.py` writes them from the command line.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

from testkit.gen_finelog import _Writer

__all__ = ["DENSE", "NOISY", "generate_dense", "generate_noisy"]

# Shares of the bytes, by kind of line; `record` is the lines each step prints, whose bytes are
# ~58% phase timers, ~25% a WANDB_MIRROR record, ~15% reward lines, ~2% a progress line.
DENSE = {"stat": 0.52, "record": 0.48}
NOISY = {
    "stat": 0.52 * 0.55,
    "record": 0.48 * 0.55,
    "request": 0.26,
    "added": 0.07,
    "tqdm": 0.06,
    "raylet": 0.03,
    "nccl": 0.03,
}
PHASES = ("generate", "convert_to_training_input", "fwd_logprobs_values_reward", "policy_train")
_MIRROR_KEYS = [f"policy/{name}" for name in ("loss", "entropy", "clip_ratio", "grad_norm")] + [
    f"generate/{name}_{i}" for name in ("len", "reward") for i in range(6)
]
_TEXT = (
    "the function returns a list of integers sorted by value write a program that reads the "
    "input file and prints the number of lines containing the word given a string s find the "
    "longest substring without repeating characters solve step by step and put the final "
    "answer in a box the tests check the output format carefully"
)
_WORDS = _TEXT.split()
_SAMPLING = (
    "SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, "
    "temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, seed=None, stop=[], stop_token_ids=[], "
    "bad_words=[], include_stop_str_in_output=False, ignore_eos=False, max_tokens={max_tokens}, "
    "min_tokens=0, logprobs=None, prompt_logprobs=None, skip_special_tokens=True, "
    "spaces_between_special_tokens=True, truncate_prompt_tokens=None, guided_decoding=None, "
    "extra_args=None)"
)


class _Records:
    """The record lines of a run, in the order each step prints them: phase timers, rewards, a
    mirror record, a progress line (`next`), endlessly."""

    def __init__(self, w: _Writer) -> None:
        self.w = w
        self.step = 0
        self.queue: list[str] = []

    def next(self) -> str:
        """The next record line."""
        if not self.queue:
            self.step += 1
            self.queue = self._step(self.step)
        self.w.clock.tick(self.w.rng.uniform(0.01, 0.2))
        return self.queue.pop(0)

    def _step(self, step: int) -> list[str]:
        w, rng = self.w, self.w.rng
        lines = [w.trainer("Started: 'step'")]
        for phase in PHASES:
            lines += [
                w.trainer(f"Started: '{phase}'"),
                w.trainer(f"Finished: '{phase}', time cost: {rng.uniform(1, 300):.2f}s"),
            ]
        rewards = [f"reward/avg_pass_at_{k}: {rng.random():.4f}" for k in (1, 5, 8)]
        score, length = rng.random(), rng.uniform(200, 4000)
        average = f"avg_final_rewards: {score:.4f}, avg_response_length: {length:.1f}"
        return [
            *lines,
            w.trainer(", ".join(rewards) + f", reward/avg_raw_reward: {rng.random():.4f}"),
            w.trainer(average),
            w.trainer(f"Finished: 'step', time cost: {rng.uniform(100, 900):.2f}s"),
            _mirror(w, step),
            w.raw(f"Training Step Progress: {step} / 100000"),
        ]  # fmt: skip


def _mirror(w: _Writer, step: int) -> str:
    rng = w.rng
    values = {key: f"{rng.gauss(0, 1):.6f}" for key in _MIRROR_KEYS}
    values["reward/avg_raw_reward"] = f"{rng.random():.4f}"
    for phase in PHASES:
        values[f"timing/{phase}"] = f"{rng.uniform(1, 300):.2f}"
    body = ", ".join(f'"{key}": {value}' for key, value in values.items())
    return w.trainer(f"WANDB_MIRROR kind=train step={step} metrics={{{body}}}")


def _engine_prefix(w: _Writer) -> tuple[int, str]:
    i = w.rng.randrange(4)
    return i, f"(AsyncVLLMInferenceEngine pid=2872{i}, ip=10.0.0.{i}) "


def _vllm(w: _Writer, where: str, msg: str) -> str:
    _, prefix = _engine_prefix(w)
    return w.raw(f"{prefix}INFO {w.clock.now:%m-%d %H:%M:%S} [{where}] {msg}")


def _request(w: _Writer) -> str:
    rng = w.rng
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(40, 260)))
    prompt = (
        "<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n"
        f"{words}<|im_end|>\\n<|im_start|>assistant\\n"
    )
    params = _SAMPLING.format(max_tokens=rng.choice((1024, 2048, 4096)))
    msg = (
        f"Received request chatcmpl-{rng.getrandbits(64):016x}: prompt: '{prompt}', params: "
        f"{params}, prompt_token_ids: None, prompt_embeds shape: None, lora_request: None."
    )
    return _vllm(w, "logger.py:43", msg)


def _added(w: _Writer) -> str:
    return _vllm(w, "async_llm.py:270", f"Added request chatcmpl-{w.rng.getrandbits(64):016x}.")


def _tqdm(w: _Writer) -> str:
    rng = w.rng
    done = rng.randrange(129)
    bar = "█" * (done * 10 // 128) + ("▌" if done % 13 > 6 else "")
    speed = (
        f"est. speed input: {rng.uniform(500, 4000):.2f} toks/s, "
        f"output: {rng.uniform(100, 900):.2f} toks/s"
    )
    _, prefix = _engine_prefix(w)
    return w.raw(
        f"{prefix}Processed prompts: {done * 100 // 128:3d}%|{bar:<10}| {done}/128 "
        f"[00:{done % 60:02d}<00:{(128 - done) % 60:02d}, {rng.uniform(1, 9):.2f}it/s, {speed}]"
    )  # fmt: skip


def _raylet(w: _Writer) -> str:
    rng, now = w.rng, w.clock.now
    node = rng.randrange(8)
    if rng.random() < 0.5:
        stamp = f"{now:%Y-%m-%d %H:%M:%S},{now.microsecond // 1000:03d}"
        return w.raw(
            f"(raylet, ip=10.0.1.{node}) [{stamp} W 3{node}12 3{node}12] (raylet) "
            f"file_system_monitor.cc:116: /tmp/ray/session_2026-03-26_21-00-00_000000_1 is over "
            f"95% full, available space: {rng.uniform(1, 9):.1f} GB; capacity: 1000 GB. Object "
            "creation will fail if spilling is required."
        )
    return w.raw(
        f"(raylet, ip=10.0.1.{node}) WARNING: {rng.randrange(8, 64)} PYTHON worker processes "
        f"have been started on node: {rng.getrandbits(128):032x} with address: 10.0.1.{node}. "
        "This could be a result of using a large number of actors, or due to tasks blocked in "
        "ray.get() calls (see https://github.com/ray-project/ray/issues/3644 for some "
        "discussion of workarounds)."
    )


def _nccl(w: _Writer) -> str:
    rng, now = w.rng, w.clock.now
    rank = rng.randrange(8)
    return w.raw(
        f"(RayWorkerWrapper pid=40{rank:02d}, ip=10.0.0.{rank // 4}) [rank{rank}]:[W{now:%m%d} "
        f"{now:%H:%M:%S}.{rng.randrange(10**9):09d} ProcessGroupNCCL.cpp:4561] [PG ID 0 PG GUID 0 "
        f"Rank {rank}]  using GPU {rank} to perform barrier as devices used by this process are "
        "currently unknown. This can potentially cause a hang if this rank to GPU mapping is "
        "incorrect. Specify device_ids in barrier() to force use of a particular device, or call "
        "init_process_group() with a device_id."
    )


_NOISE: dict[str, Callable[[_Writer], str]] = {
    "request": _request,
    "added": _added,
    "tqdm": _tqdm,
    "raylet": _raylet,
    "nccl": _nccl,
}


def _lines(shares: dict[str, float], seed: int) -> Iterator[str]:
    """Lines whose kinds keep to `shares` of the bytes: each line is of the kind furthest below
    its share so far (`record`: the next line a step prints)."""
    w = _Writer(random.Random(seed))
    records = _Records(w)
    makers: dict[str, Callable[[_Writer], str]] = {
        **_NOISE,
        "stat": lambda w: w.engine(),
        "record": lambda _w: records.next(),
    }
    written = dict.fromkeys(shares, 0)
    total = 0
    yield w.raw("[iris setup] step 1/2")
    yield w.trainer("No checkpoint found, starting training from scratch")
    while True:
        kind = min(shares, key=lambda k: written[k] - shares[k] * total)
        line = makers[kind](w)
        size = len(line.encode()) + 1
        written[kind] += size
        total += size
        yield line


def _generate(path: Path, megabytes: float, shares: dict[str, float], seed: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    target = int(megabytes * 1_000_000)
    written = 0
    batch: list[str] = []
    with path.open("w", encoding="utf-8") as handle:
        for line in _lines(shares, seed):
            batch.append(line)
            written += len(line.encode()) + 1
            if len(batch) >= 20_000 or written >= target:
                handle.write("\n".join(batch) + "\n")
                batch.clear()
            if written >= target:
                break
    return path


def generate_dense(path: Path, megabytes: float, seed: int = 13) -> Path:
    """Write about `megabytes` MB of the record-dense log to `path` (same seed, same bytes)."""
    return _generate(path, megabytes, DENSE, seed)


def generate_noisy(path: Path, megabytes: float, seed: int = 17) -> Path:
    """Write about `megabytes` MB of the noisy log to `path` (same seed, same bytes)."""
    return _generate(path, megabytes, NOISY, seed)
