"""Engine saturation and starvation: inference ranks judged by the tuple over a window.

Engines (vLLM stat lines, through `worker.gates.engines`) are judged by a tuple over a window —
waiting queue depth, KV-cache use, running requests, generation throughput — never by one
point-in-time GPU reading, and the trainer's own account of what it waits for decides between
starvation and a colocated engine sleeping while the policy trains. Each rule states its
hypothesis in its docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import polars as pl

from shared.models import GateResult, GateStatus, Handoff, Quote, Table
from shared.times import age_text, duration_text
from worker.evidence.case import Evidence
from worker.evidence.model import LogTables, ProbeEvidence
from worker.evidence.quotes import log_head_quotes, quote, quote_rows
from worker.gates import engines as eng
from worker.gates.base import error, passed
from worker.gates.progress import initialization, minute_utc, newest_attempt
from worker.gates.rules import rule

__all__ = [
    "DOMINANT_SHARE",
    "ENGINE_TUPLE",
    "GENERATION_PHASES",
    "MISSING_TELEMETRY",
    "buffer_wait_share",
    "check",
    "fleet_states",
    "innermost_open",
    "trainer_wait",
]

DOMINANT_SHARE = 0.5
"""Generation phases over this share of the newest step mean the trainer mostly waits on engines."""

GENERATION_PHASES = ("generate", "wait_for_generation_buffer")
MISSING_TELEMETRY = "vLLM engine stats or GPU probes"


def check(evidence: Evidence, states: pl.DataFrame | None = None) -> GateResult:
    """Judge the inference engines (no CUDA fault in the newest attempt, no wedged engine);
    `states` as `fleet_states` gives them (computed when None)."""
    logs = evidence.logs
    states = fleet_states(evidence) if states is None else states
    if logs is not None and not states.is_empty():
        return _judge_engines(evidence, logs, states)
    return _without_engine_lines(evidence)


def innermost_open(timers: pl.DataFrame) -> str | None:
    """The newest `Started:` phase with no `Finished:` after it, ignoring `step`."""
    last = timers.sort("line").group_by("phase", maintain_order=True).last()
    open_rows = last.filter((pl.col("event") == "started") & (pl.col("phase") != "step"))
    if open_rows.is_empty():
        return None
    return str(open_rows.sort("line")["phase"][-1])


# --- engines -------------------------------------------------------------------------------------


def fleet_states(evidence: Evidence, horizon: pl.Expr | None = None) -> pl.DataFrame:
    """`engines.engine_states` of the logs as of `now`: wedged and held engines of the newest
    attempt, measured to `horizon` (how far each engine's log reaches)."""
    logs = evidence.logs
    if logs is None:
        return pl.DataFrame()
    return eng.engine_states(
        logs.engines,
        evidence.now,
        evidence.thresholds,
        attempt=evidence.facts.newest_attempt,
        horizon=horizon,
    )


@dataclass(frozen=True)
class TrainerWait:
    """What the trainer is doing about generation: waiting, training, or unknown."""

    state: str  # waiting | training | unknown
    reason: str
    quotes: tuple[Quote, ...] = ()


def _frozen_buffer(logs: LogTables, window_s: float) -> TrainerWait | None:
    """The newest `Generation Buffer Progress` N/M, unchanged for a window and not complete."""
    rows = logs.progress.filter(
        (pl.col("kind") == "generation_buffer") & (pl.col("attempt") == newest_attempt(logs))
    ).sort("line")
    if rows.is_empty():
        return None
    changed = (pl.col("done") != pl.col("done").shift()) | (
        pl.col("total") != pl.col("total").shift()
    )
    run = rows.with_columns(run=changed.fill_null(value=True).cum_sum())
    run = run.filter(pl.col("run") == pl.col("run").max())
    span = _span_s(run)
    last = run.row(-1, named=True)
    if last["done"] >= last["total"] or span < window_s:
        return None
    text = (
        f"Generation Buffer Progress {last['done']}/{last['total']} unchanged for "
        f"{duration_text(span)}"
    )
    return TrainerWait("waiting", text, _progress_quotes(run))


def _span_s(run: pl.DataFrame) -> float:
    """How long a run of progress rows lasted: tqdm elapsed or timestamps, whichever is longer."""
    spans = run.select(
        elapsed=pl.col("elapsed_s").max() - pl.col("elapsed_s").min(),
        stamps=(pl.col("timestamp").max() - pl.col("timestamp").min()).dt.total_seconds(
            fractional=True
        ),
    ).row(0)
    return max((float(v) for v in spans if v is not None), default=0.0)


def _progress_quotes(run: pl.DataFrame) -> tuple[Quote, ...]:
    texted = run.with_columns(
        _text=pl.format(
            "Generation Buffer Progress: {}/{} [elapsed {}s]",
            pl.col("done"),
            pl.col("total"),
            pl.col("elapsed_s").fill_null(float("nan")),
        )
    )
    ends = texted.head(1) if texted.height == 1 else pl.concat([texted.head(1), texted.tail(1)])
    return quote_rows(ends, text_column="_text", limit=2)


def _phase_seconds(logs: LogTables, phase: str, name: str) -> pl.DataFrame:
    """`step, <name>` seconds of one phase in the newest attempt (the last row per step)."""
    rows = logs.phases.filter(
        (pl.col("attempt") == newest_attempt(logs)) & (pl.col("phase") == phase)
    )
    return rows.sort("line").group_by("step").agg(pl.col("seconds").last().alias(name))


def _newest_step_wait(logs: LogTables) -> TrainerWait | None:
    """The newest step's generation share: over DOMINANT_SHARE means the trainer waits."""
    rows = logs.phases.filter(
        (pl.col("attempt") == newest_attempt(logs)) & pl.col("phase").is_in(GENERATION_PHASES)
    )
    steps = _phase_seconds(logs, "step", "step_s")
    joined = rows.join(steps, on="step").filter(pl.col("step_s") > 0)
    if joined.is_empty():
        return None
    newest = joined.filter(pl.col("step") == pl.col("step").max()).sort("seconds").tail(1)
    newest = newest.with_columns(
        share=pl.col("seconds") / pl.col("step_s"),
        _text=pl.format(
            "timing/{} {}s of timing/step {}s at step {}",
            "phase",
            pl.col("seconds").round(1),
            pl.col("step_s").round(1),
            "step",
        ),
    )
    row = newest.row(0, named=True)
    state = "waiting" if row["share"] > DOMINANT_SHARE else "training"
    reason = f"{row['_text']} ({row['share']:.0%})"
    return TrainerWait(state, reason, quote_rows(newest, text_column="_text"))


def _open_phase(logs: LogTables, now: datetime, window_s: float) -> TrainerWait | None:
    """The open phase; a generation phase opened less than a window ago does not cover it."""
    timers = logs.timers.filter(pl.col("attempt") == newest_attempt(logs))
    phase = innermost_open(timers)
    if phase is None:
        return None
    row = timers.filter((pl.col("phase") == phase) & (pl.col("event") == "started")).sort("line")
    opened = row["timestamp"][-1]
    quotes = quote_rows(
        row.tail(1).with_columns(_text=pl.format("Started: '{}'", pl.col("phase"))),
        text_column="_text",
    )
    if phase not in GENERATION_PHASES:
        return TrainerWait("training", f"the trainer's open phase is '{phase}'", quotes)
    if opened is not None and (now - opened).total_seconds() < window_s:
        age = (now - opened).total_seconds()
        reason = f"'{phase}' opened only {age_text(age)}: the quiet window covers the phase before"
        return TrainerWait("training", reason, quotes)
    return TrainerWait("waiting", f"the trainer's open phase is '{phase}'", quotes)


def trainer_wait(logs: LogTables, now: datetime, window_s: float) -> TrainerWait:
    """Whether the trainer is waiting for generation now, most direct signal first."""
    signals = (
        _frozen_buffer(logs, window_s),
        _open_phase(logs, now, window_s),
        _newest_step_wait(logs),
    )
    for signal in signals:
        if signal is not None:
            return signal
    return TrainerWait("unknown", "no buffer counter, phase timer or timing/* share to read")


def buffer_wait_share(logs: LogTables, steps: int) -> float | None:
    """Median share of `wait_for_generation_buffer` in the step over the newest steps."""
    wait = _phase_seconds(logs, "wait_for_generation_buffer", "wait_s")
    joined = wait.join(_phase_seconds(logs, "step", "step_s"), on="step")
    shares = joined.filter(pl.col("step_s") > 0).sort("step").tail(steps)
    if shares.is_empty():
        return None
    value = shares.select((pl.col("wait_s") / pl.col("step_s")).median()).item()
    return float(value) if value is not None else None


# --- judging the engine fleet -------------------------------------------------------------------


def _engine_quotes(states: pl.DataFrame, limit: int = 3) -> tuple[Quote, ...]:
    rows = states.with_columns(_text=eng.stat_text())
    return quote_rows(rows, text_column="_text", limit=limit)


def _details(evidence: Evidence, *extra: str) -> tuple[str, ...]:
    config = eng.engine_config(evidence.bundle.entrypoint)
    lines = [line for line in (config.describe(),) if line]
    if config.colocate_all is not None:
        lines.append(f"colocate_all={str(config.colocate_all).lower()}")
    return (*extra, *lines, *_gpu_lines(evidence.probes))


def _tables(states: pl.DataFrame) -> tuple[Table, ...]:
    return (eng.engine_table(states),) if not states.is_empty() else ()


def _judge_engines(evidence: Evidence, logs: LogTables, states: pl.DataFrame) -> GateResult:
    judged = states.filter(pl.col("state") != "sparse")
    if judged.is_empty():
        return _too_sparse(evidence, states)
    if (judged["state"] == "quiet").all():
        return _quiet_fleet(evidence, logs, judged, states)
    return _active_fleet(evidence, logs, judged, states)


def _too_sparse(evidence: Evidence, states: pl.DataFrame) -> GateResult:
    window_min = evidence.thresholds.starved_window_s / 60
    summary = (
        f"engine stat lines too sparse to judge: {states.height} engine(s), each with fewer than "
        f"{eng.MIN_ENGINE_SAMPLES} samples in the newest {window_min:.0f} min"
    )
    if initialization(evidence) is not None:
        return passed(f"initialising: no step finished yet; {summary}", initializing=True)
    return error(
        summary,
        missing=("vLLM engine stats over a window",),
        evidence=_engine_quotes(states),
        details=_details(evidence),
        tables=_tables(states),
    )


def _quiet_fleet(
    evidence: Evidence, logs: LogTables, judged: pl.DataFrame, states: pl.DataFrame
) -> GateResult:
    t = evidence.thresholds
    fleet = eng.fleet_line(states)
    if initialization(evidence) is not None:
        return passed(
            f"initialising: no step finished yet; engines quiet so far ({fleet})",
            initializing=True,
            details=_details(evidence),
            tables=_tables(states),
        )
    wait = trainer_wait(logs, evidence.now, t.starved_window_s)
    if wait.state == "waiting":
        return _starved(evidence, judged, states, wait)
    if wait.state == "training":
        return passed(
            f"engines quiet while the trainer trains ({wait.reason}): colocated or turn-taking "
            f"engines, not starvation; {fleet}",
            evidence=wait.quotes,
            details=_details(evidence),
            tables=_tables(states),
        )
    return error(
        f"engines quiet for {duration_text(t.starved_window_s)} and nothing says whether the "
        f"trainer waits for them ({wait.reason}); {fleet}",
        missing=("trainer phase timers, timing/* metrics or Generation Buffer Progress",),
        evidence=_engine_quotes(states),
        details=_details(evidence),
        tables=_tables(states),
    )


@rule("resources.saturation")
def _starved(
    evidence: Evidence, judged: pl.DataFrame, states: pl.DataFrame, wait: TrainerWait
) -> GateResult:
    """Every judged engine quiet (running ≤ 1, waiting 0, generation under STARVED_TOKENS_PER_S)
    over a covered STARVED_WINDOW_S while the trainer waits for generation: the engines are
    starved of requests (an inefficiency to attribute, not death)."""
    t = evidence.thresholds
    config = eng.engine_config(evidence.bundle.entrypoint)
    quotes = _engine_quotes(judged) + wait.quotes
    summary = (
        f"engines starved: all {judged.height} judged engine(s) ran ≤ 1 request with 0 waiting "
        f"under {t.starved_tokens_per_s:g} tok/s for {duration_text(t.starved_window_s)} while "
        f"{wait.reason}"
    )
    return GateResult(
        status=GateStatus.FAIL,
        summary=summary,
        evidence=quotes,
        details=_details(evidence),
        tables=_tables(states),
        mechanism="inference engines starved of requests while the trainer waits for generation",
        next_action="find what holds rollouts back before the engines (trial/sandbox creation, "
        "the generator's concurrency, a dead agent loop); rollouts and duty cycle say which",
        flip_signal=f"any engine reaching running > 1 or {t.starved_tokens_per_s:g} tok/s, or the "
        "generation buffer advancing",
        handoff=_supply_handoff(config, quotes, judged.height),
    )


def _supply_handoff(
    config: eng.EngineConfig, quotes: tuple[Quote, ...], n_engines: int
) -> Handoff | None:
    """A configuration handoff when the configured demand cannot feed one request per engine."""
    demand = config.n_concurrent_trials
    if demand is None or demand >= n_engines:
        return None
    return Handoff(
        evidence=quotes,
        likely_cause=f"n_concurrent_trials={demand} is below the {n_engines} inference engines, "
        "so most engines never receive a request",
        component="generator concurrency (n_concurrent_trials) vs num_inference_engines",
        proposed_behavior="size n_concurrent_trials to max_num_seqs x num_inference_engines",
        test="with the new setting every engine reports running > 1 during generate",
    )


def _staleness(evidence: Evidence, judged: pl.DataFrame) -> str:
    """A note when the newest stat line is older than the window: the judgement is of the past."""
    newest = judged["timestamp"].max()
    if not isinstance(newest, datetime):
        return ""
    age = (evidence.now - newest).total_seconds()
    if age <= evidence.thresholds.starved_window_s:
        return ""
    return (
        f"; as of the newest stat line, {duration_text(age)} before the capture "
        f"(engines silent since {minute_utc(newest)})"
    )


def _head(judged: pl.DataFrame, share: float | None, limit: float) -> str:
    """What the working engines are doing, from their states (held engines are said apart)."""
    working = judged.filter(pl.col("state") != "held")
    seen = set(working["state"])
    if not seen:
        return "every judged engine holds requests with none running at 0 tok/s"
    if "saturated" in seen:
        return "engines saturated (waiting > 0, KV off the floor): generation-bound, not broken"
    if "swinging" in seen and (share is None or share < limit):
        return "benign backpressure: running swings peak to trough with waiting 0"
    queued = working.filter(pl.col("waiting_max") > 0)
    if not queued.is_empty():
        return "engines working, requests queued with KV use under KV_BUSY_PCT"
    return "engines working without a queue"


def _held(evidence: Evidence, judged: pl.DataFrame) -> tuple[str, str | None]:
    """A note on engines that hold requests with none running, not (yet) wedged, and the flip
    signal that would make them wedged."""
    held = judged.filter(pl.col("state") == "held")
    if held.is_empty():
        return "", None
    floor = evidence.thresholds.stall_floor_s
    names = ", ".join(held["engine"].head(3).to_list())
    since = held["stuck_since"].min()
    assert isinstance(since, datetime)
    note = (
        f"; {held.height} engine(s) held ({names}): Waiting > 0, Running 0, 0 tok/s since "
        f"{minute_utc(since)}, under the wedge limit (STALL_FLOOR_S {floor:g}s and "
        f"{eng.WEDGE_MIN_INTERVALS} stat lines, or that long silent): a pause or a wedge forming"
    )
    deadline = minute_utc(since + timedelta(seconds=floor))
    return (
        note,
        f"engine {held['engine'][0]} still holding requests with none running at {deadline}",
    )


@rule("resources.saturation")
def _active_fleet(
    evidence: Evidence, logs: LogTables, judged: pl.DataFrame, states: pl.DataFrame
) -> GateResult:
    """Engines with requests in flight are working: saturated (waiting > 0, KV off the floor) is
    generation-bound, a running sawtooth with waiting 0 is benign backpressure when the trainer's
    buffer wait is near zero. An engine holding requests with none running at 0 tok/s is never
    "working": it is said apart (held), short of a wedge."""
    t = evidence.thresholds
    fleet = eng.fleet_line(states)
    share = buffer_wait_share(logs, t.min_window_steps)
    wait_text = (
        "no timing/wait_for_generation_buffer to compare"
        if share is None
        else f"wait_for_generation_buffer {share:.1%} of the step (limit {t.buffer_wait_share:.0%})"
    )
    head = _head(judged, share, t.buffer_wait_share)
    if share is not None and share >= t.buffer_wait_share:
        head += "; under-fed: the trainer waits on generation"
    held, flip = _held(evidence, judged)
    return passed(
        f"{head}; {wait_text}; {fleet}{held}{_staleness(evidence, judged)}",
        evidence=_engine_quotes(judged),
        details=_details(evidence),
        tables=_tables(states),
        flip_signal=flip,
    )


# --- no engine stat lines -----------------------------------------------------------------------


def _gpu_value(row: dict[str, float | None], needle: str) -> float | None:
    for key, value in row.items():
        if needle in key.lower():
            return value
    return None


def _gpu_lines(probes: ProbeEvidence | None) -> tuple[str, ...]:
    """One detail line per probed pod: GPUs, utilisation, memory and power (point-in-time)."""
    if probes is None:
        return ()
    lines = []
    for pod, rows in sorted(probes.gpus.items()):
        cells = [
            f"{_gpu_value(r, 'utilization')}% "
            f"{_gpu_value(r, 'memory.used')}/{_gpu_value(r, 'memory.total')} MiB "
            f"{_gpu_value(r, 'power.draw')}/{_gpu_value(r, 'power.limit')} W"
            for r in rows
        ]
        lines.append(f"gpus {pod} ({len(rows)} GPU(s), point-in-time): " + "; ".join(cells))
    return tuple(lines)


def _vllm_metric_keys(logs: LogTables | None) -> list[str]:
    if logs is None or logs.metrics.is_empty():
        return []
    keys = logs.metrics.filter(pl.col("key").str.starts_with("vllm/"))["key"].unique()
    return sorted(keys.to_list())


ENGINE_TUPLE: Final = (
    ("running requests", ("running",)),
    ("waiting requests", ("waiting",)),
    ("KV-cache use", ("cache_usage", "kv_cache", "cache_perc")),
    ("generation throughput", ("generation_tokens", "throughput", "tokens_per_s")),
)
"""The engine tuple docs/domain.md asks for; `vllm/*` metric keys must cover every member."""


def _vllm_steps(logs: LogTables | None) -> int:
    if logs is None or logs.metrics.is_empty():
        return 0
    rows = logs.metrics.filter(pl.col("key").str.starts_with("vllm/"))
    return rows["step"].n_unique()


def _uncovered(keys: list[str]) -> list[str]:
    """Members of the engine tuple no `vllm/*` key names."""
    lowered = [k.lower() for k in keys]
    return [
        member
        for member, needles in ENGINE_TUPLE
        if not any(n in key for key in lowered for n in needles)
    ]


@rule("resources.saturation")
def _vllm_metrics(evidence: Evidence) -> GateResult | None:
    """Without stat lines, `vllm/*` metric keys can stand in for the engines only when they cover
    the whole tuple (running, waiting, KV-cache use, generation throughput) over a window of steps;
    a single key or a few steps judge nothing."""
    keys = _vllm_metric_keys(evidence.logs)
    if not keys:
        return None
    missing, steps = _uncovered(keys), _vllm_steps(evidence.logs)
    window = evidence.thresholds.min_window_steps
    names = ", ".join(keys[:6])
    if not missing and steps >= window:
        return passed(
            f"no vLLM stat lines; the engine tuple is logged as vllm/* metrics over {steps} steps "
            f"({names}); no CUDA error in the newest attempt",
            details=_details(evidence),
        )
    lacks = "; ".join(
        [
            *(f"no key for {m}" for m in missing),
            *([f"{steps} < {window} steps"] if steps < window else []),
        ]
    )
    return error(
        f"no vLLM stat lines and the vllm/* metrics ({names}) do not cover the engine tuple "
        f"over a window: {lacks}",
        missing=(f"the vLLM engine tuple over a window ({lacks})",),
        evidence=_vllm_quotes(evidence.logs) or _log_head(evidence),
        details=_details(evidence),
    )


def _vllm_quotes(logs: LogTables | None) -> tuple[Quote, ...]:
    if logs is None:
        return ()
    rows = logs.metrics.filter(pl.col("key").str.starts_with("vllm/")).sort(["step", "line"])
    texted = rows.with_columns(_text=pl.format("step {} {}={}", "step", "key", "value"))
    return quote_rows(texted.tail(2), text_column="_text", limit=2)


def _without_engine_lines(evidence: Evidence) -> GateResult:
    from_metrics = _vllm_metrics(evidence)
    if from_metrics is not None:
        return from_metrics
    if initialization(evidence) is not None:
        return passed(
            "initialising: no step finished yet; no engine stat lines yet", initializing=True
        )
    gpus = _gpu_lines(evidence.probes)
    if gpus:
        return error(
            f"no vLLM engine stat lines and no vllm/* metric; {len(gpus)} GPU probe(s) are "
            "point-in-time readings and cannot judge saturation or starvation",
            missing=(MISSING_TELEMETRY.replace(" or GPU probes", " over a window"),),
            evidence=tuple(
                quote(f"probes/gpus/{pod}.csv", line) for pod, line in _gpu_pairs(evidence)
            ),
            details=_details(evidence),
        )
    failures = evidence.facts.failed("gpus")[:2]
    failed = "; the GPU probe failed: " + "; ".join(f.text for f in failures) if failures else ""
    return error(
        "no vLLM engine stat lines, no GPU probe and no vllm/* metric: engines cannot be judged"
        + failed,
        missing=(MISSING_TELEMETRY,),
        evidence=tuple(f.quote for f in failures) + _log_head(evidence),
        details=_details(evidence),
    )


def _gpu_pairs(evidence: Evidence) -> list[tuple[str, str]]:
    probes = evidence.probes
    pods = sorted(probes.gpus) if probes is not None else []
    return list(zip(pods, _gpu_lines(probes), strict=False))


def _log_head(evidence: Evidence) -> tuple[Quote, ...]:
    """What the log looks like (its first lines), or the manifest's word on the log."""
    head = log_head_quotes(evidence.logs)
    if head:
        return head
    status = evidence.bundle.statuses.get("finelog")
    raw = status.raw if status is not None else None
    return (quote("manifest.json", f"artifacts.finelog: {raw or 'missing'}"),)
