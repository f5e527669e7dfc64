"""The fault drills: each injects one fault into a running `Stack`, repeatedly, and returns figures.

Every drill sends alerts through the real services, injects its fault, waits for the answers, and
returns the ledger's figures (alerts answered, diagnoses, repeated verdict entries, reports per
diagnosis, verdicts before their report, latency) plus what it measured of its own (time from the
fault's end to the last verdict: the time to recovery). docs/reliability.md records them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.drills.kit import Ledger, Product, Stack, TaskEvents, Watch, jitter, log, wait_for

__all__ = [
    "Session",
    "containment",
    "ingest_kill",
    "memory",
    "poison",
    "redis_outage",
    "s3_outage",
    "session",
    "time_limit",
    "worker_kill",
]

BIG = 40_000_000  # a finelog that takes the capture and a gate's thaw some seconds


@dataclass
class Session:
    stack: Stack
    watch: Watch
    ledger: Ledger
    events: TaskEvents


@contextmanager
def session(
    workdir: Path,
    *,
    env: dict[str, str] | None = None,
    product: Product | None = None,
    worker_memory_limit_mb: int | None = None,
) -> Iterator[Session]:
    """A started stack with its watch and ledger; everything stopped at the end."""
    stack = Stack(workdir, product, env=env, worker_memory_limit_mb=worker_memory_limit_mb)
    watch = Watch(stack)
    events = TaskEvents(stack)
    try:
        stack.start()
        watch.start()
        events.start()
        time.sleep(1)  # the event receiver binds before the first task
        yield Session(stack, watch, Ledger(stack, watch), events)
    finally:
        watch.stopping.set()
        stack.stop()


def _since(t: float | None, ids: list[str], s: Session) -> float | None:
    """Seconds from `t` to the last answer of `ids` (None if one is missing)."""
    answered = s.watch.answered()
    if t is None or not all(i in answered for i in ids):
        return None
    return round(max(answered[i] for i in ids) - t, 1)


def _catch(s: Session, lead: str, task: str, mark: int, timeout: float = 180) -> int | None:
    """The PID of the child running `task` of `lead` (started after event `mark`), stopped
    with SIGSTOP the moment its start is seen; None when it was over before."""
    if s.events.wait_started(lead, task, timeout, after=mark) is None:
        return None
    return s.stack.freeze_running(lead, task)


def _short(task: str) -> str:
    return task.rsplit(".", maxsplit=1)[-1]


# --- worker processes ---------------------------------------------------------------------------


def worker_kill(
    s: Session,
    *,
    runs: int,
    task: str,
    main_process: bool,
    settle_s: float = 1200,
) -> dict[str, Any]:
    """SIGKILL the child running `task` of a diagnosis (or the worker's main process, which is
    then started again) while the task runs; counts the answers."""
    trials: list[dict[str, Any]] = []
    for run in range(runs):
        job = s.stack.job(f"kill-{_short(task)}-{int(main_process)}-{run}", size_bytes=BIG)
        mark = s.events.mark()
        lead = s.ledger.send(job)
        pid = _catch(s, lead, task, mark)
        if pid is None:
            trials.append({"run": run, "missed": True})
            continue
        t_kill = time.time()
        if main_process:
            s.stack.kill_worker_main()
            os.kill(pid, signal.SIGCONT)  # the child goes on, an orphan, as after a crash
            time.sleep(1)
            s.stack.start_worker()
        else:
            os.kill(pid, signal.SIGKILL)
        s.watch.wait([lead], settle_s if main_process else 300)
        trials.append({"run": run, "lead": lead, "kill_to_verdict_s": _since(t_kill, [lead], s)})
        log(f"{task} kill {run}: {trials[-1]}")
    hit = [t["lead"] for t in trials if "lead" in t]
    return {
        "drill": f"worker {'main process' if main_process else 'child'} killed in {task}",
        "runs": runs,
        "missed": sum(1 for t in trials if t.get("missed")),
        "kill_to_verdict_s": sorted(t["kill_to_verdict_s"] or -1 for t in trials if "lead" in t),
        "watchdog_resends": _log_count(s, "ingest.log", "sending it again"),
        **s.ledger.figures(hit),
    }


def time_limit(
    s: Session, *, runs: int, task: str, stall_s: float, kind: str, attempts: int = 2
) -> dict[str, Any]:
    """SIGSTOP the child running `task` of a diagnosis for `stall_s` (past the soft or the hard
    time limit), then let it go on — on each of `attempts` runs of the diagnosis (a first time
    limit sends it again); counts the answers and what the report says, then sends a later
    alert for the job (a failed diagnosis must not swallow it)."""
    leads: list[str] = []
    later: list[str] = []
    stalls = 0
    for run in range(runs):
        job = s.stack.job(f"limit-{kind}-{_short(task)}-{run}", size_bytes=BIG)
        mark = s.events.mark()
        lead = s.ledger.send(job)
        leads.append(lead)
        for _ in range(attempts):
            pid = _catch(s, lead, task, mark, timeout=60 if stalls else 180)
            if pid is None or lead in s.watch.answered():
                break
            mark = s.events.mark()
            _stall(pid, stall_s)
            stalls += 1
        s.watch.wait([lead], 300)
        later.append(s.ledger.send(job, "again, later"))
        s.watch.wait(later[-1:], 300)
        log(f"{kind} limit {run}: answered={lead in s.watch.answered()}")
    return {
        "drill": f"{task} past its {kind} time limit (stopped {stall_s:g} s on each of "
        f"{attempts} runs), then a later alert",
        "runs": runs,
        "stalls": stalls,
        "reports_quoting_a_time_limit_as_evidence": _timeouts_as_evidence(s, leads),
        "later_alerts_answered": sum(1 for i in later if i in s.watch.answered()),
        "watchdog_or_callback_resends": _log_count(s, "worker.log", "sending it again")
        + _log_count(s, "ingest.log", "sending it again"),
        "soft_limits_before_the_body": _log_count(s, "worker.log", "before its work began')"),
        "soft_limits_after_the_body": _log_count(s, "worker.log", "fired after its body returned"),
        **s.ledger.figures(leads + later),
    }


def _log_count(s: Session, name: str, needle: str) -> int:
    path = s.stack.dir / name
    return path.read_text(errors="replace").count(needle) if path.exists() else 0


def _stall(pid: int, seconds: float) -> None:
    os.kill(pid, signal.SIGSTOP)
    time.sleep(seconds)
    with contextlib.suppress(OSError):  # killed at the hard limit meanwhile
        os.kill(pid, signal.SIGCONT)


def _timeouts_as_evidence(s: Session, leads: list[str]) -> int:
    """Reports of `leads` whose verdict is not ERROR yet mention a time limit (evidence)."""
    count = 0
    for seen in s.watch.entries():
        if seen.lead not in leads:
            continue
        text = _report(s, seen.report_uri)
        count += "evidence could not be read" in text or (
            "TimeLimitExceeded" in text and "the diagnosis failed" not in text
        )
    return count


def _report(s: Session, uri: str) -> str:
    key = uri.split("s3://rlhealth-drill/", 1)[-1]
    try:
        body: bytes = s.stack.s3.get_object(Bucket="rlhealth-drill", Key=key)["Body"].read()
    except Exception:
        return ""
    return body.decode(errors="replace")


# --- Redis and S3 outages -----------------------------------------------------------------------


def _burst(s: Session, run: int, tag: str, jobs: int) -> list[str]:
    names = [s.stack.job(f"{tag}{run}-{i}", size_bytes=BIG // 2) for i in range(jobs)]
    ids = [s.ledger.send(job) for job in names]
    return ids + [s.ledger.send(job, "again") for job in names[: jobs // 2]]


def _during(s: Session, run: int, tag: str, out: list[str]) -> threading.Thread:
    """Alerts a watcher keeps sending during an outage (they wait for Redis if it is away)."""

    def send() -> None:
        for i in range(2):
            out.append(s.ledger.send(s.stack.job(f"{tag}{run}-late{i}", size_bytes=BIG // 8)))

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def redis_outage(
    s: Session, *, runs: int, down_s: float, crash: bool, jobs: int = 6, quick_s: float = 600
) -> dict[str, Any]:
    """Stop redis-server (SIGTERM, or SIGKILL with `crash`) while diagnoses run, for `down_s`."""
    recovery: list[float | None] = []
    every: list[str] = []
    for run in range(runs):
        ids = _burst(s, run, "r", jobs)
        time.sleep(3)
        s.stack.stop_redis(signal.SIGKILL if crash else signal.SIGTERM)
        late: list[str] = []
        thread = _during(s, run, "r", late)
        time.sleep(down_s)
        s.stack.start_redis()
        t_up = time.time()
        thread.join(60)
        ids += late
        every += ids
        s.watch.wait(ids, quick_s)
        recovery.append(_since(t_up, ids, s))
        log(f"redis {'crash' if crash else 'restart'} {run}: recovery {recovery[-1]}")
    return {
        "drill": f"Redis {'crashed' if crash else 'restarted'}, down {down_s:g} s",
        "runs": runs,
        "up_to_last_verdict_s": recovery,
        "worker_main_process_deaths": _log_count(s, "worker.log", "Unrecoverable error"),
        **s.ledger.figures(every),
    }


def _in_flight(s: Session, leads: list[str], mark: int, timeout: float = 120) -> None:
    """Wait until the first gate of one of `leads` starts: its evidence is frozen in S3 and the
    other diagnoses are still being captured, so the fault lands on diagnoses in flight (a
    fixed pause let a fast parser answer the whole burst before it)."""
    if s.events.wait_any_started(leads, "rlhealth.gate", timeout, after=mark) is None:
        log("no gate of the burst seen starting: the fault comes anyway")


def s3_outage(
    s: Session, *, runs: int, down_s: float, lose: bool, jobs: int = 6, quick_s: float = 900
) -> dict[str, Any]:
    """Cut S3 for `down_s` while diagnoses run; `lose` restarts it empty (objects gone)."""
    recovery: list[float | None] = []
    every: list[str] = []
    for run in range(runs):
        mark = s.events.mark()
        ids = _burst(s, run, "s", jobs)
        _in_flight(s, ids[:jobs], mark)
        t_down = time.time()
        s.stack.cut_s3(lose_objects=lose)
        late: list[str] = []
        _during(s, run, "s", late).join(60)
        time.sleep(max(0.0, down_s - (time.time() - t_down)))
        s.stack.restore_s3()
        t_up = time.time()
        ids += late
        every += ids
        s.watch.wait(ids, quick_s)
        recovery.append(_since(t_up, ids, s))
        log(f"s3 {'lost' if lose else 'down'} {run}: recovery {recovery[-1]}")
    return {
        "drill": f"S3 {'restarted empty' if lose else 'unreachable'}, {down_s:g} s",
        "runs": runs,
        "up_to_last_verdict_s": recovery,
        **s.ledger.figures(every),
    }


# --- ingest -------------------------------------------------------------------------------------


def ingest_kill(s: Session, *, runs: int, jobs: int = 6, per_job: int = 4) -> dict[str, Any]:
    """SIGKILL `rl-health ingest` right after it reads a burst, then start it again."""
    every: list[str] = []
    recovery: list[float | None] = []
    for run in range(runs):
        names = [s.stack.job(f"i{run}-{j}") for j in range(jobs)]
        targets = [names[k % jobs] for k in range(jobs * per_job)]
        ids = s.ledger.note(s.stack.burst(targets), targets)
        wait_for(lambda: s.stack.redis.xpending(s.stack.names.alerts, "ingest")["pending"],
                 10, "ingest reading", every=0.002)  # fmt: skip
        time.sleep(jitter(0, 0.5))
        s.stack.kill_ingest()
        time.sleep(1)
        s.stack.start_ingest()
        t_up = time.time()
        every += ids
        s.watch.wait(ids, 300)
        recovery.append(_since(t_up, ids, s))
    return {
        "drill": "ingest killed mid-burst",
        "runs": runs,
        "up_to_last_verdict_s": recovery,
        **s.ledger.figures(every),
    }


# --- poison -------------------------------------------------------------------------------------


def poison(s: Session, *, runs: int, later_s: float = 20) -> dict[str, Any]:
    """A bundle whose diagnosis fails (a lone surrogate as its job id: the report cannot be
    encoded), then a later alert for the same job once it is repaired."""
    first: list[str] = []
    later: list[str] = []
    for run in range(runs):
        job = s.stack.job(f"poison-{run}", job_id="/ops/\udcff")
        first.append(s.ledger.send(job, "poison"))
        s.watch.wait(first[-1:], 120)
        time.sleep(later_s)
        _repair(s.stack.bundle_root / job)
        later.append(s.ledger.send(job, "after the repair"))
        s.watch.wait(later[-1:], 120)
        log(f"poison {run}: answered {sum(i in s.watch.answered() for i in first + later)}")
    return {
        "drill": "poison bundle (a diagnosis that fails), then a later alert",
        "runs": runs,
        "later_alerts_answered": sum(1 for i in later if i in s.watch.answered()),
        "dead_letters": len(s.stack.dead_letters()),
        **s.ledger.figures(first + later),
    }


def _repair(job_dir: Path) -> None:
    path = job_dir / "manifest.json"
    data = json.loads(path.read_text())
    data["job_id"] = f"/ops/{job_dir.name}"
    path.write_text(json.dumps(data))


def memory(s: Session, *, runs: int, log_mb: int = 700) -> dict[str, Any]:
    """A bundle that needs more memory than the worker has: its finelog is `log_mb` MB of
    metric records (37 metrics a line), whose rows a parse keeps (about 2.5x the log's bytes
    before it can stop). The readers bound what a parse may add by RLHEALTH_PARSE_MEMORY_MB
    (a long line or a sparse file no longer needs memory at all), so the bundle exceeds a
    worker only where its memory is below that setting: the drill's stack says which."""
    leads: list[str] = []
    records = s.stack.dir / f"records-{log_mb}mb.log"
    if not records.exists():
        _metric_records(records, log_mb * 2**20)
    for run in range(runs):
        job = s.stack.job(f"memory-{run}")
        finelog = s.stack.bundle_root / job / "finelog.log"
        finelog.unlink()
        os.link(records, finelog)  # one file on disk, one bundle per run
        lead = s.ledger.send(job)
        leads.append(lead)
        s.watch.wait([lead], 600)
    log_text = (s.stack.dir / "worker.log").read_text(errors="replace")
    return {
        "drill": f"memory-exhausting bundle ({log_mb} MB of metric records)",
        "runs": runs,
        "oom_kills": s.stack.oom_kills(),
        "worker_lost_events": log_text.count("WorkerLostError"),
        "dead_letters": len(s.stack.dead_letters()),
        **s.ledger.figures(leads),
    }


def _metric_records(path: Path, size: int) -> None:
    """`size` bytes of WANDB_MIRROR records behind an Iris prefix, one step a line."""
    keys = [f"policy/k{i}" for i in range(24)] + [f"generate/g{i}" for i in range(12)]
    body = ", ".join(f'"{key}": 0.{i + 1:06d}' for i, key in enumerate(keys))
    body += ', "reward/avg_raw_reward": 0.5'
    head = "[21:00:00] task=/ops/memory/0 | WANDB_MIRROR kind=train step="
    tail = f" metrics={{{body}}}\n"
    with path.open("wb") as out:
        step, written = 0, 0
        while written < size:
            block = "".join(f"{head}{step + i}{tail}" for i in range(1, 10_001)).encode()
            out.write(block)
            step, written = step + 10_000, written + len(block)


# --- hostile events -----------------------------------------------------------------------------


def containment(s: Session) -> dict[str, Any]:
    """Crafted events: ids `.` and `..`, a job directory with CR/LF, a manifest whose cluster or
    user is `..` or whose job id holds CR/LF. Each must give a dead letter or a verdict."""
    crlf = s.stack.bundle_root / "jobs" / "cw" / "ops" / "crlf\r\njob"
    crlf.mkdir(parents=True)
    (crlf / "manifest.json").write_text("{}")
    base = {"published_at": "2026-07-30T21:00:00Z"}
    cases: dict[str, str] = {}
    for name, event_id in (("event id .", "."), ("event id ..", "..")):
        cases[name] = event_id
        s.stack.raw_alert({**base, "event_id": event_id, "job_dir": s.stack.job("dot" + name[-1])})
    cases["job dir with CR/LF"] = "evt-crlf-dir"
    s.stack.raw_alert({**base, "event_id": "evt-crlf-dir", "job_dir": "jobs/cw/ops/crlf\r\njob"})
    for name, fields in (
        ("cluster ..", {"cluster": ".."}),
        ("user ..", {"user": ".."}),
        ("job id with CR/LF", {"job_id": "/ops/evil\r\nVERDICT: NO-KILL"}),
    ):
        cases[name] = s.ledger.send(s.stack.job(f"hostile-{len(cases)}", **fields))
    with contextlib.suppress(TimeoutError):  # a silent case stays silent: it is the finding
        wait_for(lambda: _settled(s, cases), 180, "every crafted event handled", every=0.5)
    return {"drill": "hostile events", **_containment_figures(s, cases)}


def _settled(s: Session, cases: dict[str, str]) -> bool:
    return all(v for v in _outcomes(s, cases).values())


def _outcomes(s: Session, cases: dict[str, str]) -> dict[str, str]:
    refused = s.stack.dead_letters()
    out: dict[str, str] = {}
    for name, event_id in cases.items():
        letters = [d["reason"][:120] for d in refused if _names(d, event_id)]
        verdict = [e.verdict for e in s.watch.entries() if event_id in e.event_ids]
        out[name] = "; ".join([*(f"verdict {v}" for v in verdict[:1]), *letters[:1]])
    return out


def _names(letter: dict[str, str], event_id: str) -> bool:
    if letter.get("event_id") == event_id:
        return True
    try:
        raw = json.loads(json.loads(letter.get("raw", "{}")).get("event", "{}"))
    except (json.JSONDecodeError, AttributeError):
        return False
    return isinstance(raw, dict) and raw.get("event_id") == event_id


def _containment_figures(s: Session, cases: dict[str, str]) -> dict[str, Any]:
    keys = s.stack.s3_keys()
    bad = [k for k in keys if any(p in {".", ".."} for p in k.split("/"))]
    bad += [k for k in keys if any(ord(c) < 32 for c in k)]
    outcomes = _outcomes(s, cases)
    return {
        "cases": outcomes,
        "silent": sorted(name for name, outcome in outcomes.items() if not outcome),
        "s3_keys_with_dot_segments_or_control_characters": bad,
    }
