"""Build watcher-style job directories from the real line formats of the samples.

Every line shape here is copied from a real source (tests/fixtures/*/SOURCES.txt): loguru trainer
lines behind a Ray actor prefix (the SkyRL GSM8K tutorial log), `WANDB_MIRROR` records (MarinSkyRL
tests), vLLM stat-logger lines (MarinSkyRL's parser docstring, on one physical line), the agentic
batch lines (MarinSkyRL tests), the Iris `[HH:MM:SS] task=... | ` prefix and `[iris setup]`
boundary (marin-iris `job logs`), Harbor `result.json` fields and py-spy dumps (marin-iris
`task exec`). Values are chosen per scenario.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

TRAINER = "(skyrl_entrypoint pid=8455)"
PHASES = (
    ("generate", 0.55),
    ("postprocess_generator_output", 0.01),
    ("convert_to_training_input", 0.01),
    ("fwd_logprobs_values_reward", 0.13),
    ("compute_advantages_and_returns", 0.01),
    ("train_critic_and_policy", 0.25),
    ("sync_weights", 0.04),
)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def stat_line(
    moment: datetime,
    *,
    engine: int = 0,
    running: int,
    waiting: int,
    kv: float,
    gen: float,
    prompt: float = 1200.0,
) -> str:
    """vLLM's stat-logger line as the engine prints it (no Ray prefix)."""
    return (
        f"INFO {moment:%m-%d %H:%M:%S} [loggers.py:248] Engine {engine:03d}: Avg prompt "
        f"throughput: {prompt:.1f} tokens/s, Avg generation throughput: {gen:.1f} tokens/s, "
        f"Running: {running} reqs, Waiting: {waiting} reqs, GPU KV cache usage: {kv:.1f}%, "
        "Prefix cache hit rate: 41.2%"
    )


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(float(value))


@dataclass
class JobBuilder:
    """A job directory under `<root>/jobs/<cluster>/<user>/<name>/`, written by `write()`."""

    root: Path
    name: str
    start: datetime
    cluster: str = "cw-rno2a"
    user: str = "ops"
    iris_prefix: bool = True
    lines: list[str] = field(default_factory=list)
    trials: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    running_trials: list[str] = field(default_factory=list)
    verifier_outputs: dict[str, str] = field(default_factory=dict)
    manifest_fields: dict[str, Any] = field(default_factory=dict)
    probe_files: dict[str, str] = field(default_factory=dict)
    worker_logs: dict[str, list[str]] = field(default_factory=dict)
    task: int = 0
    trainer: str = TRAINER  # the driver's Ray prefix: a restarted driver has another pid

    @property
    def job_id(self) -> str:
        return f"/{self.user}/{self.name}"

    @property
    def job_dir(self) -> Path:
        return self.root / "jobs" / self.cluster / self.user / self.name

    # --- raw lines ------------------------------------------------------------------------------

    def raw(self, moment: datetime, text: str) -> None:
        """One log line, with the Iris prefix when the finelog comes from `iris job logs`."""
        if self.iris_prefix:
            text = f"[{moment:%H:%M:%S}] task={self.job_id}/{self.task} | {text}"
        self.lines.append(text)

    def log(
        self,
        moment: datetime,
        message: str,
        *,
        actor: str | None = None,
        level: str = "INFO",
        written: datetime | None = None,
    ) -> None:
        """A loguru line from the trainer behind its Ray actor prefix (default: the driver's),
        collected at `moment` and written at `written` (default: the same moment)."""
        own = written or moment
        stamp = f"{own:%Y-%m-%d %H:%M:%S}.{own.microsecond // 1000:03d}"
        self.raw(
            moment,
            f"{actor or self.trainer} {stamp} | {level:<8} | skyrl_train.trainer:train:210 - "
            f"{message}",
        )

    def boundary(self, moment: datetime) -> None:
        """An Iris attempt boundary: a new attempt of task 0 begins."""
        self.raw(moment, "[iris setup] step 1/2")

    def resume(self, moment: datetime, step: int | None) -> None:
        if step is None:
            self.log(moment, "No checkpoint found, starting training from scratch")
            return
        self.log(
            moment, f"Loading checkpoint from: s3://bucket/ckpt/{self.name}/global_step_{step}"
        )
        self.log(moment, f"Resuming from global_step: {step}")

    def mirror(self, moment: datetime, step: int, metrics: Mapping[str, float]) -> None:
        body = ", ".join(f'"{k}": {_fmt(v)}' for k, v in metrics.items())
        self.log(moment, f"WANDB_MIRROR kind=train step={step} metrics={{{body}}}")

    # --- composite ------------------------------------------------------------------------------

    def step(
        self,
        step: int,
        begin: datetime,
        seconds: float,
        metrics: Mapping[str, float],
        *,
        phase_seconds: Mapping[str, float] | None = None,
    ) -> datetime:
        """A full trainer step: phase timers, `Finished: 'step'`, the policy dict, the mirror
        record. Returns the moment the step ended."""
        self.log(begin, "Started: 'step'")
        moment = begin
        timings: dict[str, float] = {}
        for phase, share in PHASES:
            cost = (phase_seconds or {}).get(phase, seconds * share)
            self.log(moment, f"Started: '{phase}'")
            moment += timedelta(seconds=cost)
            self.log(moment, f"Finished: '{phase}', time cost: {cost:.2f}s")
            timings[f"timing/{phase}"] = round(cost, 2)
        total = (moment - begin).total_seconds()
        self.log(moment, f"Finished: 'step', time cost: {total:.2f}s")
        policy = {
            k.removeprefix("policy/"): v for k, v in metrics.items() if k.startswith("policy/")
        }
        if policy:
            self.log(moment, "{" + ", ".join(f"'{k}': {_fmt(v)}" for k, v in policy.items()) + "}")
        record = {**metrics, **timings, "timing/step": round(total, 2), "trainer/global_step": step}
        self.mirror(moment, step, record)
        return moment + timedelta(seconds=0.1)

    def vllm(
        self,
        moment: datetime,
        *,
        engine: int = 0,
        pid: int = 287294,
        running: int,
        waiting: int,
        kv: float,
        gen: float,
        prompt: float = 1200.0,
    ) -> None:
        """One vLLM stat-logger line of an `AsyncVLLMInferenceEngine` actor."""
        stat = stat_line(
            moment, engine=engine, running=running, waiting=waiting, kv=kv, gen=gen, prompt=prompt
        )
        self.raw(moment, f"(AsyncVLLMInferenceEngine pid={pid}, ip=10.128.26.194) {stat}")

    def worker_log(self, pid: int, text: str, *, pod: str = "") -> None:
        """One line of a Ray worker's own log, `ray_vllm_logs/<pod>/worker-<id>-<job>-<pid>.out`:
        no process prefix (the driver adds it only to the copy it forwards), and the two marker
        lines Ray writes first (`:job_id:`, `:actor_name:`)."""
        pod = pod or f"iris-{self.user}-{self.name}-0"
        name = f"ray_vllm_logs/{pod}/worker-{pid:x}c0ffee-01000000-{pid}.out"
        lines = self.worker_logs.setdefault(name, [":job_id:01000000"])
        if len(lines) == 1:
            lines.append(":actor_name:AsyncVLLMInferenceEngine")
        lines.append(text)

    def batch(self, moment: datetime, ok: int, total: int, exceptions: Mapping[str, int]) -> None:
        actor = "(TerminalBenchGenerator pid=48213, ip=10.0.5.12)"
        failed = total - ok
        breakdown = "{" + ", ".join(f"'{k}': {v}" for k, v in exceptions.items()) + "}"
        self.log(moment, f"Exception breakdown: {breakdown}", actor=actor)
        self.log(
            moment,
            f"Batch generation complete: {ok}/{total} successful, {failed} failed instances, "
            "0 masked",
            actor=actor,
            level="WARNING",
        )

    def traceback(self, moment: datetime, frames: Sequence[str], final: str) -> None:
        self.raw(moment, "Traceback (most recent call last):")
        for frame in frames:
            self.raw(moment, f'  File "{frame}", line 42, in train')
            self.raw(moment, "    self._step()")
        self.raw(moment, final)

    # --- trials ---------------------------------------------------------------------------------

    def trial(
        self,
        name: str,
        start: datetime,
        *,
        reward: float | None,
        exception: str | None = None,
        message: str = "",
        turns: int = 6,
        setup_s: float = 4.0,
        agent_s: float = 240.0,
        verifier_s: float = 20.0,
        llm_share: float = 0.6,
        verifier_output: str | None = None,
    ) -> None:
        """A finished Harbor trial directory with `result.json` (fields of
        docs/domain.md#harbor-trials) and, when given, the verifier's console in
        `verifier/test-stdout.txt`."""
        if verifier_output is not None:
            self.verifier_outputs[name] = verifier_output
        env_end = start + timedelta(seconds=setup_s)
        agent_setup_end = env_end + timedelta(seconds=3)
        agent_end = agent_setup_end + timedelta(seconds=agent_s)
        verifier_end = agent_end + timedelta(seconds=verifier_s)
        calls = max(turns, 1)
        per_call = agent_s * llm_share * 1000 / calls
        result: dict[str, Any] = {
            "task_name": f"terminal-bench/{name.split('__', maxsplit=1)[0]}",
            "trial_name": name,
            "started_at": iso(start),
            "finished_at": iso(verifier_end),
            "environment_setup": {"started_at": iso(start), "finished_at": iso(env_end)},
            "agent_setup": {"started_at": iso(env_end), "finished_at": iso(agent_setup_end)},
            "agent_execution": {"started_at": iso(agent_setup_end), "finished_at": iso(agent_end)},
            "verifier": {"started_at": iso(agent_end), "finished_at": iso(verifier_end)},
            "verifier_result": {"rewards": {"reward": reward}} if reward is not None else None,
            "agent_result": {
                "n_input_tokens": 9000 * turns,
                "n_output_tokens": 300 * turns,
                "metadata": {"n_episodes": turns, "api_request_times_msec": [per_call] * calls},
            },
            "exception_info": (
                {
                    "exception_type": exception,
                    "exception_message": message,
                    "occurred_at": iso(agent_end),
                }
                if exception
                else None
            ),
        }
        self.trials.append((name, result))

    # --- manifest and probes --------------------------------------------------------------------

    def manifest(
        self,
        *,
        state: str = "running",
        argv: Sequence[str] | None = None,
        synced_at: datetime,
        artifacts: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        """The newest watcher generation's manifest."""
        entrypoint = None if argv is None else json.dumps({"argv": list(argv)})
        self.manifest_fields = {
            "artifacts": {
                "errors": [],
                "finelog": f"{len(self.lines):,} lines",
                "pod_logs": "1 pod(s), 1 Running",
                "ray_logs": f"{len(self.worker_logs):,} files"
                if self.worker_logs
                else "not requested",
                "slurm_logs": "not applicable",
                "trace_completed": len(self.trials),
                "trace_selected": len(self.trials),
                "trace_started": len(self.trials) + len(self.running_trials),
                "traces": f"fleet newest {len(self.trials)}/{len(self.trials)} selected; "
                f"{len(self.trials)} copied, 0 skipped"
                if self.trials
                else "not requested",
                **(artifacts or {}),
            },
            "bundle_directory": str(self.job_dir),
            "bundle_format": 1,
            "cluster": self.cluster,
            "job": {
                "cluster": {
                    "context": f"{self.cluster}-ctx",
                    "kubeconfig": "/home/ops/.kube/cw",
                    "name": self.cluster,
                },
                "dataset": "s3://bucket/data/train.parquet",
                "entrypoint": entrypoint,
                "finished_at_ms": None,
                "job_id": self.job_id,
                "state": state,
                "submitted_at_ms": int(self.start.timestamp() * 1000),
                "task_state": state,
            },
            "job_directory": str(self.job_dir),
            "job_id": self.job_id,
            "kind": "rl",
            "max_non_log_bytes": 104857600,
            "synced_at": iso(synced_at),
            "trace_sync_limit": 500,
            "trials_uri": f"s3://bucket/tmp/ttl=14d/{self.name}/trace_jobs"
            if self.trials
            else None,
            **extra,
        }

    def probe(self, relative: str, content: str | Mapping[str, Any] | Sequence[Any]) -> None:
        """A file of the recorded probe layout (docs/probes.md#probe-directory), e.g.
        `controller.json`."""
        text = content if isinstance(content, str) else json.dumps(content, indent=2)
        self.probe_files[relative] = text

    # --- write ----------------------------------------------------------------------------------

    def write(self, mtime: datetime | None = None) -> Path:
        """Write the job directory; file mtimes are set to `mtime` (default: the last line)."""
        job = self.job_dir
        job.mkdir(parents=True, exist_ok=True)
        (job / "finelog.log").write_text("\n".join(self.lines) + "\n", encoding="utf-8")
        pods = job / "pod_logs"
        pods.mkdir(exist_ok=True)
        pod_tail = [line.split(" | ", 1)[-1] for line in self.lines[-20:]]
        (pods / f"iris-{self.user}-{self.name}-0.log").write_text("\n".join(pod_tail) + "\n")
        for relative, lines in self.worker_logs.items():
            (job / relative).parent.mkdir(parents=True, exist_ok=True)
            (job / relative).write_text("\n".join(lines) + "\n", encoding="utf-8")
        for name, result in self.trials:
            trial = job / "trace_jobs" / name
            trial.mkdir(parents=True, exist_ok=True)
            (trial / "config.json").write_text(json.dumps({"trial_name": name}), encoding="utf-8")
            (trial / "result.json").write_text(json.dumps(result), encoding="utf-8")
            if name in self.verifier_outputs:
                (trial / "verifier").mkdir(exist_ok=True)
                stdout = trial / "verifier" / "test-stdout.txt"
                stdout.write_text(self.verifier_outputs[name], encoding="utf-8")
        for name in self.running_trials:
            trial = job / "trace_jobs" / name
            trial.mkdir(parents=True, exist_ok=True)
            (trial / "config.json").write_text(json.dumps({"trial_name": name}), encoding="utf-8")
        if self.manifest_fields:
            (job / "manifest.json").write_text(
                json.dumps(self.manifest_fields, indent=2, sort_keys=True), encoding="utf-8"
            )
        if mtime is not None:
            stamp = mtime.timestamp()
            for path in job.rglob("*"):
                os.utime(path, (stamp, stamp))
        return job

    def write_probes(self, directory: Path) -> Path | None:
        """Write the probe files, or None when the scenario has none."""
        if not self.probe_files:
            return None
        for relative, text in self.probe_files.items():
            path = directory / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        return directory
