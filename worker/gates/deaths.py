"""Logged deaths: the trainer, or every inference engine, logged its own death and the job has been
silent past the stall limit since. docs/domain.md#what-established-means: such a death "is
established by the death line itself" (proof rule `logged_death`, checked again in `decide`).

Reads the ERRORS rows of the newest attempt dated after the newest advancement (a timer or train
metric row) and at or before `now`, the ENGINES stat lines of the newest attempt (from every log:
the finelog, pod logs and `ray_vllm_logs/`), and the launched `generator.num_inference_engines`:

- **Trainer death**: a hard row of a death kind (`actor_died`, `worker_crashed`,
  `train_loop_failed`, `fatal_abort`) whose component is the driver or a policy rank.
- **Engine death**: a hard `engine_dead` or `actor_died` row whose component is an inference engine
  (vLLM's `EngineCore encountered a fatal error`, `Engine core proc EngineCore_DP0 died
  unexpectedly`, `EngineDeadError`, ...). Each is attributed to the engine that logged it
  (`worker.gates.engine_owners`: the Ray actor a driver's error names, the row's process prefix,
  else the engine its file speaks for — a Ray worker log's by the pid in its name). The engines
  are those the newest attempt's stat lines name and at least `num_inference_engines`. **Every
  engine** is dead when each of them is attributed a death line and none of them logged a stat
  line with tokens (prompt or generation) more than DEATH_STAT_GRACE_S after it; with one engine,
  a death line nothing attributes is that engine's. Some engines dead is no proof: the others may
  be idle because the trainer waits, and only stacks can say.
- **Silence**: no phase or step advanced after the death line (the last engine's, for every
  engine) and `now` is more than the stall limit (the liveness threshold, at least STALL_FLOOR_S)
  after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

import polars as pl

from shared.models import GateResult, GateStatus, KillProof, Quote
from shared.times import duration_text
from worker.evidence.case import Evidence
from worker.evidence.facts import PHASE, STEP
from worker.evidence.logs.engines import engine_owner
from worker.evidence.model import LogTables
from worker.evidence.quotes import quote_rows
from worker.gates.engine_owners import owner_of_rows
from worker.gates.engines import engine_config
from worker.gates.progress import minute_utc
from worker.gates.rules import rule

__all__ = [
    "DEATH_STAT_GRACE_S",
    "ENGINE_DEATH_KINDS",
    "TRAINER_DEATH_KINDS",
    "Death",
    "engine_count",
    "find_death",
    "logged_death",
]

TRAINER_DEATH_KINDS: Final = ("actor_died", "worker_crashed", "train_loop_failed", "fatal_abort")
TRAINER_COMPONENTS: Final = ("driver", "policy")
ENGINE_DEATH_KINDS: Final = ("engine_dead", "actor_died")
DEATH_STAT_GRACE_S: Final = 30.0
"""vLLM logs each interval's stat line at its end, so the line of the interval in which an engine
died comes after the death line and counts the tokens generated before it; its front end may also
log its last scheduler counts (Running, Waiting) once more. Only tokens logged more than this after
the death line (three of vLLM's default 10 s intervals) show an engine that still works."""


@dataclass(frozen=True)
class Death:
    """A logged death that the silence since establishes: whose, the quoted rows, when."""

    whose: str  # "the trainer" | "every inference engine (N of N)"
    rows: pl.DataFrame
    at: datetime

    @property
    def quotes(self) -> tuple[Quote, ...]:
        return quote_rows(self.rows, limit=4)

    @property
    def kinds(self) -> str:
        return ", ".join(dict.fromkeys(self.rows["kind"].to_list()))


def _deaths_after(evidence: Evidence, logs: LogTables, since: datetime | None) -> pl.DataFrame:
    """Hard rows of the newest attempt dated after `since` (the newest advancement) and not after
    `now`, oldest first; rows with no time cannot be placed and are left out."""
    when = pl.col("timestamp").is_not_null() & (pl.col("timestamp") <= evidence.now)
    if since is not None:
        when &= pl.col("timestamp") > since
    hard = pl.col("failure_class").fill_null("hard") == "hard"
    rows = logs.errors.filter((pl.col("attempt") == evidence.facts.newest_attempt) & when & hard)
    return rows.sort("timestamp", "line")


def _trainer_death(rows: pl.DataFrame) -> Death | None:
    trainer = pl.col("component").fill_null("driver").is_in(TRAINER_COMPONENTS)
    found = rows.filter(pl.col("kind").is_in(TRAINER_DEATH_KINDS) & trainer)
    if found.is_empty():
        return None
    return Death("the trainer", found.head(1), found["timestamp"][0])


def _engines(evidence: Evidence, logs: LogTables) -> tuple[frozenset[str], int]:
    """The owners of the newest attempt's engines (ENGINES ids without their index) and how many
    engines there are: those seen, and at least the launched `num_inference_engines`."""
    rows = logs.engines.filter(pl.col("attempt") == evidence.facts.newest_attempt)
    seen = frozenset(rows.select(engine_owner(pl.col("engine")))["engine"].unique().to_list())
    configured = engine_config(evidence.bundle.entrypoint).num_inference_engines or 0
    return seen, max(len(seen), configured)


def _revived(logs: LogTables, first: pl.DataFrame) -> frozenset[str]:
    """Owners whose engine logged tokens more than DEATH_STAT_GRACE_S after its first death line:
    not dead after all (a stale Running count or the straddling interval's tokens are not life)."""
    tokens = (pl.col("generation_tokens_per_s") > 0) | (pl.col("prompt_tokens_per_s") > 0)
    stats = logs.engines.filter(tokens.fill_null(value=False)).select(
        _owner=engine_owner(pl.col("engine")), _at=pl.col("timestamp")
    )
    grace = pl.duration(seconds=DEATH_STAT_GRACE_S)
    later = stats.join(first.select("_owner", "timestamp"), on="_owner").filter(
        pl.col("_at") > pl.col("timestamp") + grace
    )
    return frozenset(later["_owner"].unique().to_list())


def _engine_death(evidence: Evidence, logs: LogTables, rows: pl.DataFrame) -> Death | None:
    engine = pl.col("component") == "engine"
    found = rows.filter(pl.col("kind").is_in(ENGINE_DEATH_KINDS) & engine)
    if found.is_empty():
        return None
    seen, total = _engines(evidence, logs)
    attempt = logs.engines.filter(pl.col("attempt") == evidence.facts.newest_attempt)
    found = owner_of_rows(found, attempt)
    if total == 1 and found["_owner"].null_count() == found.height:
        only = next(iter(seen), "the one engine")
        found = found.with_columns(_owner=pl.lit(only))
    first = found.filter(pl.col("_owner").is_not_null()).unique("_owner", keep="first")
    dead = frozenset(first["_owner"].to_list()) - _revived(logs, first)
    # Engines that logged stat lines are the ones to account for; a death line of another
    # process (a tensor-parallel worker) counts only when no engine was ever seen.
    engines = seen or dead
    if total == 0 or len(engines) < total or not engines <= dead:
        return None
    first = first.filter(pl.col("_owner").is_in(list(engines))).sort("timestamp", "line")
    whose = f"every inference engine ({len(engines)} of {total})"
    return Death(whose, first, first["timestamp"][-1])


def find_death(evidence: Evidence, since: datetime | None) -> Death | None:
    """The trainer's death, else every engine's, logged after `since` (None: any time)."""
    logs = evidence.logs
    if logs is None or logs.errors.is_empty():
        return None
    rows = _deaths_after(evidence, logs, since)
    if rows.is_empty():
        return None
    return _trainer_death(rows) or _engine_death(evidence, logs, rows)


def engine_count(evidence: Evidence) -> int:
    """How many inference engines the newest attempt has: those its stat lines name, and at least
    the launched `num_inference_engines` (0 without a log)."""
    return _engines(evidence, evidence.logs)[1] if evidence.logs is not None else 0


def _silence(evidence: Evidence, death: Death) -> float:
    return (evidence.now - death.at).total_seconds()


@rule("liveness")
def logged_death(
    evidence: Evidence, limit_s: float, limit_text: str, base: tuple[Quote, ...]
) -> GateResult | None:
    """A death line of the trainer, or of every inference engine, logged after the newest
    advancement and followed by silence past the stall limit establishes the death: the death
    line is the proof (docs/domain.md#what-established-means). One engine of several is no proof.

    `limit_s` is the liveness threshold (at least STALL_FLOOR_S); `base` the controller quote and
    the newest advancement."""
    advanced = evidence.facts.newest(PHASE, STEP)
    death = find_death(evidence, advanced.at if advanced else None)
    if death is None or _silence(evidence, death) <= limit_s:
        return None
    silent = _duration(_silence(evidence, death))
    mechanism = f"{death.whose} died ({death.kinds}), silent since"
    return GateResult(
        status=GateStatus.FAIL,
        summary=f"{death.whose} dead: {death.kinds} logged at {minute_utc(death.at)}, after the "
        f"newest advancement; silent {silent} since, beyond {limit_text}",
        evidence=death.quotes + base,
        hard_failure=True,
        proof=KillProof(
            rule="logged_death",
            mechanism=mechanism,
            established_at=death.at,
            evidence=death.quotes + base,
        ),
        mechanism=mechanism,
        next_action="Supervisor: kill the job; "
        + ("its trainer" if death.whose == "the trainer" else "every inference engine")
        + " died and it will not advance again. Relaunch after reading the quoted death line.",
        flip_signal=f"a `Started:` or `Finished:` line in finelog.log after {minute_utc(death.at)}",
    )


def _duration(seconds: float) -> str:
    return duration_text(seconds)
