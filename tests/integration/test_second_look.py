"""The second look before a stall KILL, end to end on real services: redis-server, moto's S3
server, a prefork Celery worker and ingest (own stream prefix and S3 prefix), the `local` backend
probing a real toy trainer process with py-spy.

The first pair of stacks is taken live by the capture task (RLHEALTH_BACKEND=local), the second
look is the worker's own: RLHEALTH_REOBSERVE_S later it re-reads the bundle, reads /proc for the
process state and takes two more py-spy dumps. (An event that names recorded probes, or a fixed
`now`, is judged as recorded: no second look; see the unit tests.)

(a) the hung toy stays in `all_reduce`: KILL, the report quoting both observations, the second look
    frozen under S3 `evidence/<id>/second_look/`, and `rl-health replay` agreeing without waiting;
(b) a toy that resumes stepping during the wait: NO-KILL, saying the log and the stacks moved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import SecretStr

from shared.alerts import publish_alert
from shared.models import VerdictEntry
from shared.settings import Settings
from shared.supervisor import VerdictReader
from testkit.iris_cluster import TOYS
from testkit.services import RL_HEALTH, free_port, service_env, spawn, stop, wait_for
from worker.pipeline.app import make_app
from worker.pipeline.store import S3Store, store_from_settings

pytestmark = pytest.mark.integration

PREFIX = "rlhlook"
REOBSERVE_S = 8
LEASE_S = 5  # shorter than the countdown: the lease must outlive the wait
VENV_BIN = str(Path(sys.executable).parent)


@dataclass
class Looking:
    env: dict[str, str]
    settings: Settings
    redis: Any
    store: S3Store
    bundle_root: Path
    logs: Path

    def run(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [RL_HEALTH, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
            check=False,
        )  # fmt: skip


def _env(redis_url: str, s3_endpoint: str, base: Path) -> dict[str, str]:
    env = service_env(redis_url, s3_endpoint, base / "bundles", base / "cache", 0)
    env.update(
        RLHEALTH_STREAM_PREFIX=PREFIX,
        RLHEALTH_S3_PREFIX="look",
        RLHEALTH_BACKEND="local",
        RLHEALTH_REOBSERVE_S=str(REOBSERVE_S),
        RLHEALTH_LEASE_S=str(LEASE_S),
        RLHEALTH_STALL_FLOOR_S="2",
        RLHEALTH_PROBE_INTERVAL_S="1",
        RLHEALTH_PROBE_TIMEOUT_S="20",
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    return env


@pytest.fixture(scope="module")
def looking(
    redis_url: str, s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Looking]:
    """A worker and an ingest (its watchdog) that probe through the local backend; the second
    look waits 8 s, longer than the 5 s lease."""
    base = tmp_path_factory.mktemp("second-look")
    (base / "bundles").mkdir()
    env = _env(redis_url, s3_endpoint, base)
    settings = Settings(
        redis_url=redis_url, s3_endpoint_url=s3_endpoint, s3_bucket=env["RLHEALTH_S3_BUCKET"],
        s3_prefix="look", bundle_root=base / "bundles", stream_prefix=PREFIX, coalesce_s=0,
        cache_dir=base / "cache", backend="local", reobserve_s=REOBSERVE_S, lease_s=LEASE_S,
        verdict_key=SecretStr(env["RLHEALTH_VERDICT_KEY"]),  # built before any test's own env
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
            patch.setenv(name, env[name])
        store = store_from_settings(settings)
    store.ensure_bucket()
    logs = base / "logs"
    logs.mkdir()
    worker = spawn(
        [RL_HEALTH, "worker", "--concurrency", "2", "--pool", "prefork", "--loglevel", "WARNING",
         "--metrics-port", str(free_port()), "--metrics-dir", str(base / "worker-metrics")],
        env, logs / "worker.log",
    )  # fmt: skip
    ingest = spawn(
        [RL_HEALTH, "ingest", "--metrics-port", str(free_port())], env, logs / "ingest.log"
    )
    app = make_app(settings)
    try:
        wait_for(lambda: bool(app.control.ping(timeout=0.5)), 60, "the celery worker")
        yield Looking(env, settings, redis.Redis.from_url(redis_url), store, base / "bundles", logs)
    finally:
        for process in (ingest, worker):
            stop(process, timeout=20)


# --- a toy job, its bundle and its first pair of stacks -------------------------------------------


@dataclass
class Toy:
    process: subprocess.Popen[bytes]
    job_dir: Path
    name: str

    @property
    def finelog(self) -> Path:
        return self.job_dir / "finelog.log"


def _start_toy(root: Path, name: str, script: str, *args: str) -> Toy:
    """The toy, its stdout the finelog of `jobs/local/local/<pid>/` (the local backend's job id is
    `/local/<pid>`, and the directory must name the same job)."""
    staging = root / f"{name}.log"
    with staging.open("wb") as out:
        process = subprocess.Popen([sys.executable, str(TOYS / script), *args], stdout=out)
    job_dir = root / "jobs" / "local" / "local" / str(process.pid)
    job_dir.mkdir(parents=True)
    staging.rename(job_dir / "finelog.log")  # the toy keeps writing to the same file
    toy = Toy(process, job_dir, name)
    wait_for(lambda: "Started: 'policy_train'" in toy.finelog.read_text(), 30, f"{name} hanging")
    return toy


def _write_manifest(toy: Toy) -> None:
    now = datetime.now(UTC)
    lines = len(toy.finelog.read_text().splitlines())
    manifest = {
        "bundle_format": 1, "cluster": "local", "job_id": f"/local/{toy.process.pid}",
        "kind": "rl", "synced_at": now.isoformat(),
        "job": {"job_id": f"/local/{toy.process.pid}", "state": "running",
                "task_state": "running", "entrypoint": json.dumps({"argv": ["python"]}),
                "submitted_at_ms": int(now.timestamp() * 1000) - 60_000, "finished_at_ms": None},
        "artifacts": {"finelog": f"{lines} lines", "pod_logs": "not requested"},
    }  # fmt: skip
    (toy.job_dir / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _alert(looking: Looking, toy: Toy, monkeypatch: pytest.MonkeyPatch) -> str:
    """Quiet past STALL_FLOOR_S (2 s), the alert published: the capture task takes the first
    stacks live through the local backend."""
    time.sleep(3)  # the toy is quiet: let the stall floor pass (the job's own time, not a timing)
    _write_manifest(toy)
    job = toy.job_dir.relative_to(looking.bundle_root).as_posix()
    return publish_alert(looking.redis, job, settings=looking.settings)


def _verdict(looking: Looking, event_id: str, timeout: float = 120) -> VerdictEntry:
    reader = VerdictReader(looking.redis, looking.settings)
    reader.last_id = "0-0"
    for entry in reader.follow(timeout_s=timeout):
        if event_id in entry.event_ids:
            return entry
    tail = (looking.logs / "worker.log").read_text()[-3000:]
    raise AssertionError(f"no verdict for {event_id}\nworker log tail:\n{tail}")


def _report(looking: Looking, entry: VerdictEntry) -> dict[str, Any]:
    prefix = f"s3://{looking.settings.s3_bucket}/look/"
    return dict(json.loads(looking.store.get(entry.report_uri.removeprefix(prefix))))


@pytest.fixture
def hung(looking: Looking) -> Iterator[Toy]:
    toy = _start_toy(looking.bundle_root, "hung", "hung_trainer.py")
    yield toy
    toy.process.kill()
    toy.process.wait()


@pytest.fixture
def resuming(looking: Looking, tmp_path: Path) -> Iterator[tuple[Toy, Path]]:
    trigger = tmp_path / "resume"
    toy = _start_toy(looking.bundle_root, "resuming", "resuming_trainer.py", str(trigger))
    yield toy, trigger
    toy.process.kill()
    toy.process.wait()


# --- the tests ----------------------------------------------------------------------------------


def test_still_hung_is_kill_quoting_both_looks_and_replay_agrees(
    looking: Looking, hung: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(a) KILL after a second look REOBSERVE_S later: the proof quotes the first dumps and the
    worker's own second pair (second_look/probes/stacks/), the look is frozen in S3, and a replay
    on the frozen evidence gives the same verdict and second look without waiting for one."""
    event_id = _alert(looking, hung, monkeypatch)
    entry = _verdict(looking, event_id)
    report = _report(looking, entry)
    assert entry.verdict.value == "KILL", (report["reasoning"], report["second_look"])
    look = report["second_look"]
    assert look["outcome"] == "confirmed" and look["waited_s"] >= REOBSERVE_S
    assert "still wedged" in look["summary"] and "all_reduce" in look["summary"]
    sources = [q["source"] for q in report["kill_proof"]["evidence"]]
    firsts = [s for s in sources if s.startswith("probes/stacks/")]
    seconds = [s for s in sources if s.startswith("second_look/probes/stacks/")]
    assert len(firsts) == 2 and len(seconds) == 2, sources
    assert looking.store.exists(f"evidence/{event_id}/second_look/evidence.json")
    probed = json.loads(looking.store.get(f"evidence/{event_id}/second_look/probes/probes.json"))
    tools = {Path(c["argv"][0]).name for c in probed["commands"]}
    assert tools <= {"cat", "py-spy", "nvidia-smi"}, tools  # read-only probes only
    assert sum(Path(c["argv"][0]).name == "py-spy" for c in probed["commands"]) == 2
    record = looking.redis.hgetall(f"{PREFIX}:lead:{event_id}")
    assert record and b"redispatches" not in record, record  # the watchdog never sent it again
    text_key = entry.report_uri.removeprefix(f"s3://{looking.settings.s3_bucket}/look/")
    text = looking.store.get(text_key[: -len("json")] + "txt").decode()
    assert "  second look — confirmed after" in text
    page = text_key[: -len("json")] + "html"  # drawn after publish, the verdict task replaced
    wait_for(lambda: looking.store.exists(page), 60, "the HTML page of the second look")
    assert "second look" in looking.store.get(page).decode()
    replay = looking.run("replay", event_id, "--json", "--timeout", "60")
    assert replay.returncode == 0, replay.stderr
    again = VerdictEntry.model_validate_json(replay.stdout)
    replayed = _report(looking, again)
    assert (again.verdict, replayed["second_look"]) == (entry.verdict, look)
    assert replayed["kill_proof"] == report["kill_proof"]
    replayed_key = again.report_uri.removeprefix(f"s3://{looking.settings.s3_bucket}/look/")
    replayed_page = replayed_key[: -len("json")] + "html"
    wait_for(lambda: looking.store.exists(replayed_page), 60, "the replay's HTML page")


def test_a_trainer_that_resumes_during_the_wait_is_no_kill(
    looking: Looking, resuming: tuple[Toy, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(b) The toy resumes once its evidence is frozen (the first look is taken), before the
    second look: NO-KILL, the look saying the log and the stacks moved."""
    toy, trigger = resuming
    event_id = _alert(looking, toy, monkeypatch)
    marker = f"evidence/{event_id}/evidence.json"
    wait_for(lambda: looking.store.exists(marker), 60, "the first look frozen")
    trigger.touch()
    wait_for(lambda: "Finished: 'policy_train'" in toy.finelog.read_text(), 10, "the toy resumed")
    entry = _verdict(looking, event_id)
    report = _report(looking, entry)
    assert entry.verdict.value == "NO-KILL", (report["reasoning"], report["second_look"])
    look = report["second_look"]
    assert look["outcome"] == "moved" and report["kill_proof"] is None
    assert any(m.startswith("the log advanced past") for m in look["moved"]), look
    assert "re-alert" in report["flip_signal"]
