"""The pipeline probing a real marin-iris LocalCluster: real redis-server, moto's S3 server, a
prefork `rl-health worker` with RLHEALTH_BACKEND=iris, and `rl-health ingest`.

A hung toy trainer is KILL on the live stacks its capture took; a crash loop is KILL on the
attempt history its capture asked of the controller; each replayed offline (`rl-health replay`)
gets the same verdict without a probe, and `replay --fresh` probes again. The second look before
a stall KILL is off here (RLHEALTH_REOBSERVE_S=0): another part of the pipeline owns it.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from shared.alerts import new_event_id, publish_event
from shared.models import Event, Verdict, VerdictEntry
from testkit.bundles import write_job_bundle
from testkit.iris_cluster import (
    REPO,
    SHIM_COMMAND,
    IrisTestCluster,
    build_job_dir,
    toy_argv,
)
from testkit.services import (
    RL_HEALTH,
    free_port,
    service_env,
    settings_from,
    spawn,
    start_moto,
    start_redis,
    stop,
    wait_for,
)
from tests.integration.conftest import Services
from tests.integration.test_iris_backend import iris_cluster  # noqa: F401  (module fixture)
from tests.integration.test_pipeline import _key, _verdicts_for
from worker.pipeline.app import make_app
from worker.pipeline.store import store_from_settings

pytestmark = pytest.mark.integration

PY = sys.executable
CLUSTER = "iris-local"
PROBES_RUN = "rlhealth_probes_run_total"


def _probes_run(url: str) -> float:
    """The worker's count of live probe commands run through iris (all pool processes)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == PROBES_RUN and sample.labels.get("backend") == "iris"
    )


@dataclass
class Live:
    """The pipeline services probing the LocalCluster, and the cluster."""

    services: Services
    cluster: IrisTestCluster

    def bundle(self, job_id: str, entrypoint: list[str]) -> str:
        """The watcher's job directory of `job_id`, relative to the bundle root."""
        root = self.services.bundle_root
        job_dir = build_job_dir(
            self.cluster, job_id, root, entrypoint=entrypoint, cluster_name=CLUSTER
        )
        return job_dir.relative_to(root).as_posix()

    def alert(self, job: str) -> str:
        result = self.services.run("alert", job, "--reason", "suspect job")
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    def verdict(self, event_id: str, timeout: float = 180) -> tuple[VerdictEntry, dict[str, Any]]:
        """The verdict entry of `event_id` and its JSON report from S3."""
        entries = _verdicts_for(self.services, {event_id}, timeout)
        entry = next(e for e in entries if event_id in e.event_ids)
        report = json.loads(self.services.store.get(_key(self.services, entry.report_uri)))
        return entry, report

    def replay(self, event_id: str, *args: str) -> VerdictEntry:
        result = self.services.run("replay", event_id, "--json", *args, timeout=240)
        assert result.returncode == 0, result.stderr + self._worker_log()
        return VerdictEntry.model_validate_json(result.stdout)

    def probes_run(self) -> float:
        return _probes_run(self.services.metrics["worker"])

    def _worker_log(self) -> str:
        return (self.services.logs / "worker.log").read_text(errors="replace")[-3000:]


def _live_env(base: dict[str, str], cluster: IrisTestCluster) -> dict[str, str]:
    """The operator's settings of a worker probing the LocalCluster through the iris CLI."""
    clusters = {CLUSTER: {"iris_controller_url": cluster.url}}
    return {
        **base,
        "RLHEALTH_STREAM_PREFIX": "rlhlive",
        "RLHEALTH_S3_PREFIX": "live",
        "RLHEALTH_BACKEND": "iris",
        "RLHEALTH_CLUSTERS": json.dumps(clusters),
        "RLHEALTH_IRIS_COMMAND": shlex.join(SHIM_COMMAND),
        "RLHEALTH_CAPTURE_BUDGET_S": "120",
        "RLHEALTH_REOBSERVE_S": "0",
        # the toys' steps last a fraction of a second: a few seconds of quiet is a stall here
        "RLHEALTH_STALL_FLOOR_S": "2",
        "RLHEALTH_PROBE_INTERVAL_S": "2",
        "RLHEALTH_PROBE_PROCESS_MATCH": "hung_trainer",
        "PYTHONPATH": str(REPO),  # the iris CLI shim runs as `python -m tests.integration...`
        "PYTHONWARNINGS": "ignore",
    }


@contextmanager
def _live_services(cluster: IrisTestCluster, base: Path, **overrides: str) -> Iterator[Live]:
    """redis-server, moto, a prefork worker probing through iris, and ingest."""
    redis_process, redis_url = start_redis(base)
    moto, endpoint = start_moto(base / "moto.log")
    env = _live_env(service_env(redis_url, endpoint, base / "bundles", base / "cache"), cluster)
    env.update(overrides)
    (base / "bundles").mkdir()
    logs = base / "logs"
    logs.mkdir()
    settings = settings_from(env).model_copy(
        update={"stream_prefix": env["RLHEALTH_STREAM_PREFIX"]}
    )
    with pytest.MonkeyPatch.context() as patch:  # boto3 reads credentials from the environment
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
            patch.setenv(name, env[name])
        store = store_from_settings(settings)
        store.ensure_bucket()
    port = free_port()
    worker = spawn(
        [RL_HEALTH, "worker", "--concurrency", "2", "--loglevel", "WARNING",
         "--metrics-port", str(port), "--metrics-dir", str(base / "worker-metrics")],
        env, logs / "worker.log",
    )  # fmt: skip
    ingest = spawn([RL_HEALTH, "ingest"], env, logs / "ingest.log")
    try:
        app = make_app(settings)
        wait_for(lambda: bool(app.control.ping(timeout=0.5)), 90, "the celery worker")
        client = redis.Redis.from_url(redis_url)
        metrics = {"worker": f"http://127.0.0.1:{port}/metrics"}
        services = Services(env, settings, client, store, base / "bundles", logs, metrics)
        yield Live(services, cluster)
    finally:
        for process in (ingest, worker, moto, redis_process):
            stop(process, timeout=20)


@pytest.fixture(scope="module")
def live(
    iris_cluster: IrisTestCluster,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Live]:
    """The pipeline probing the LocalCluster, second look off (this module's first tests)."""
    with _live_services(iris_cluster, tmp_path_factory.mktemp("live-pipeline")) as started:
        yield started


def _wait_for_log(cluster: IrisTestCluster, job_id: str, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (result := cluster.cli("job", "logs", job_id)).stdout:
        shown = f"{result.why()}\n{result.stdout[-1000:]}"
        assert time.monotonic() < deadline, f"{job_id} never logged {text!r}: {shown}"
        time.sleep(1)


def _pairs(quotes: list[dict[str, Any]]) -> dict[str, list[int]]:
    """The dumps quoted for each process: `stacks/<task>-pid<pid>-<n>.txt` -> {pid: [n, ...]}."""
    found: dict[str, list[int]] = {}
    for quote in quotes:
        matched = re.search(r"-pid(\d+)-(\d+)\.txt$", quote["source"])
        assert matched, quote
        found.setdefault(matched[1], []).append(int(matched[2]))
    return found


def _assert_replayed_offline(live: Live, event_id: str, original: VerdictEntry) -> None:
    """`rl-health replay` judges the frozen evidence: same verdict, no probe, no new freeze."""
    before = live.probes_run()
    replay = live.replay(event_id)
    assert (replay.verdict, replay.confidence) == (original.verdict, original.confidence)
    assert replay.job_id == original.job_id
    replay_report = json.loads(live.services.store.get(_key(live.services, replay.report_uri)))
    assert f"/evidence/{event_id}/" in replay_report["evidence_dir"]
    assert not live.services.store.exists(f"evidence/{replay.event_id}/evidence.json")
    assert live.probes_run() == before


def test_hung_trainer_is_killed_on_live_stacks_and_replays_offline(live: Live) -> None:
    """An alert for a trainer whose two ranks are parked in all_reduce: the capture task dumps
    each rank's stack twice through `iris task exec ... py-spy dump`, freezes them under
    probes/stacks/, and the verdict is KILL quoting the two pairs of dumps; the offline replay
    agrees without probing."""
    job_id = live.cluster.submit("pipeline-hung", toy_argv("hung_trainer", "2"))
    live.cluster.wait_for(job_id, ["running"])
    # the LocalCluster may hold the toy's last lines back: a finished step is enough
    _wait_for_log(live.cluster, job_id, "Finished: 'step'", 120)
    job = live.bundle(job_id, [PY])
    time.sleep(3)  # quiet past the lowered STALL_FLOOR_S before the alert
    event_id = live.alert(job)
    entry, report = live.verdict(event_id)
    liveness = report["gates"]["liveness"]
    assert entry.verdict is Verdict.KILL, json.dumps(report, indent=1)
    assert liveness["status"] == "FAIL"
    stacks = [q for q in liveness["evidence"] if q["source"].startswith("probes/stacks/")]
    parked = [q for q in stacks if "all_reduce" in q["text"]]
    pairs = _pairs(parked)
    assert len(pairs) == 2 and all(sorted(p) == [1, 2] for p in pairs.values()), liveness
    # one round's dumps run side by side (they may share a millisecond); each rank's two are apart
    times: dict[str, set[str]] = {}
    for q in parked:
        pid = q["source"].rsplit("-pid", 1)[1].split("-")[0]
        times.setdefault(pid, set()).add(q["timestamp"])
    assert all(len(t) == 2 for t in times.values()), liveness
    assert report["kill_proof"]["rule"] == "stall_stacks"
    frozen = set(live.services.store.keys(f"evidence/{event_id}/probes/"))
    for quote in parked:  # each quoted dump is frozen where the report says
        assert f"evidence/{event_id}/{quote['source']}" in frozen, sorted(frozen)
    assert f"evidence/{event_id}/probes/probes.json" in frozen
    _assert_replayed_offline(live, event_id, entry)


def test_crash_loop_is_killed_on_the_attempt_history_and_replays(live: Live) -> None:
    """An alert for a job that failed the same way three times: the capture asks the controller
    for the attempts (the bundle never holds them), and the verdict is KILL with the same
    failure; the offline replay agrees without probing, `--fresh` probes again."""
    job_id = live.cluster.submit("pipeline-crash", toy_argv("crash_loop"), max_retries_failure=2)
    live.cluster.wait_for(job_id, ["failed"], timeout_s=120)
    job = live.bundle(job_id, [PY, "crash_loop.py"])
    event_id = live.alert(job)
    entry, report = live.verdict(event_id)
    assert entry.verdict is Verdict.KILL, json.dumps(report, indent=1)
    assert report["restarts"]["same_failure"] is True
    assert report["restarts"]["count"] == 3
    assert live.services.store.exists(f"evidence/{event_id}/probes/attempts.json")
    _assert_replayed_offline(live, event_id, entry)
    before = live.probes_run()
    fresh = live.replay(event_id, "--fresh")
    assert fresh.verdict is Verdict.KILL
    assert live.services.store.exists(f"evidence/{fresh.event_id}/probes/attempts.json")
    assert live.probes_run() > before


def test_a_backend_the_operator_did_not_enable_is_answered_error(live: Live) -> None:
    """An event asking for kubernetes on a worker that enabled only iris: ERROR saying so,
    and nothing probed."""
    root = live.services.bundle_root
    job = write_job_bundle(root, "refused", cluster=CLUSTER).relative_to(root).as_posix()
    before = live.probes_run()
    event = Event(
        event_id=new_event_id(),
        job_dir=job,
        published_at=datetime.now(UTC) - timedelta(seconds=1),
        backend="kubernetes",
    )
    publish_event(live.services.redis, event, live.services.settings)
    entry, report = live.verdict(event.event_id)
    assert entry.verdict is Verdict.ERROR
    assert any("live capture refused" in line for line in report["discrepancies"]), report
    assert live.probes_run() == before


# --- the second look on the LocalCluster ----------------------------------------------------------

LOOK_WAIT_S = 10


@pytest.fixture(scope="module")
def looking(
    iris_cluster: IrisTestCluster,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Live]:
    """The same pipeline with the second look on (RLHEALTH_REOBSERVE_S=10), its own services."""
    base = tmp_path_factory.mktemp("looking-pipeline")
    overrides = {
        "RLHEALTH_REOBSERVE_S": str(LOOK_WAIT_S),
        "RLHEALTH_STREAM_PREFIX": "rlhlook",
        "RLHEALTH_S3_PREFIX": "look",
        # the toy Ray node's helpers run scripts under its `ray_node_trainer-*` scratch directory
        "RLHEALTH_PROBE_PROCESS_MATCH": "hung_trainer|resuming_trainer|ray_node_trainer",
        # each look runs one `iris task exec` per dump: a toy node's three processes take time
        "RLHEALTH_CAPTURE_BUDGET_S": "200",
    }
    with _live_services(iris_cluster, base, **overrides) as started:
        yield started


def _first_look_frozen(live: Live, event_id: str, timeout: float = 120) -> None:
    """Wait until the capture froze the first look (evidence.json is written last)."""
    store = live.services.store
    frozen = f"evidence/{event_id}/evidence.json"
    wait_for(lambda: store.exists(frozen), timeout, "the first look")


def _at(quote: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(quote["timestamp"].replace("Z", "+00:00"))


def _parked_job(live: Live, name: str, toy: list[str]) -> tuple[str, str]:
    """A toy job parked in all_reduce, its bundle synced by the 'watcher'; (job id, job dir)."""
    job_id = live.cluster.submit(name, toy)
    live.cluster.wait_for(job_id, ["running"])
    # the LocalCluster may hold the toy's last lines back: a finished step is enough
    _wait_for_log(live.cluster, job_id, "Finished: 'step'", 120)
    job = live.bundle(job_id, [PY])
    time.sleep(3)  # quiet past the lowered STALL_FLOOR_S before the alert
    return job_id, job


def test_still_hung_after_the_second_look_is_kill_quoting_both_looks(looking: Live) -> None:
    """The hung trainer, with the second look on: the verdict waits RLHEALTH_REOBSERVE_S, the
    worker dumps the stacks again through iris, nothing moved, and the KILL stands with both
    looks quoted; the replay reads the frozen look and agrees without probing."""
    _job_id, job = _parked_job(looking, "look-hung", toy_argv("hung_trainer", "2"))
    event_id = looking.alert(job)
    entry, report = looking.verdict(event_id)
    assert entry.verdict is Verdict.KILL, json.dumps(report, indent=1)
    look = report["second_look"]
    assert look is not None and look["outcome"] == "confirmed", look
    # the wait counts from the first look's newest dump the proof quotes, to the second's dumps
    assert look["waited_s"] >= LOOK_WAIT_S, look
    dumps = [q for q in report["kill_proof"]["evidence"] if "/stacks/" in q["source"]]
    firsts = [_at(q) for q in dumps if q["source"].startswith("probes/")]
    seconds = [_at(q) for q in dumps if q["source"].startswith("second_look/")]
    assert firsts and seconds and min(seconds) - max(firsts) >= timedelta(seconds=LOOK_WAIT_S)
    sources = {q["source"] for q in report["kill_proof"]["evidence"]}
    assert any(s.startswith("probes/stacks/") for s in sources), sources
    assert any(s.startswith("second_look/probes/stacks/") for s in sources), sources
    assert looking.services.store.exists(f"evidence/{event_id}/second_look/look.json")
    _assert_replayed_offline(looking, event_id, entry)


def _terminate(live: Live, job_id: str) -> None:
    """Stop a toy job, so that its processes never join a later test's probes (the LocalCluster's
    process table is the machine's); its helpers exit with it."""
    from iris.cluster.types import JobName

    live.cluster.client.terminate(JobName.from_wire(job_id))


def test_a_trainer_that_resumes_during_the_second_look_is_no_kill(looking: Live) -> None:
    """A trainer parked in all_reduce at the first look resumes stepping during the wait (its
    collective comes back); the watcher syncs its bundle again. The second look sees the log and
    the stacks move: NO-KILL, with the flip signal; the replay agrees."""
    # the LocalCluster rewrites argv elements starting with /tmp (and a clone may live there)
    trigger = Path("/var/tmp") / f"rlhealth-resume-{new_event_id()}"
    trigger.parent.mkdir(exist_ok=True)
    try:
        toy = toy_argv("resuming_trainer", str(trigger))
        job_id, job = _parked_job(looking, "look-resumes", toy)
        event_id = looking.alert(job)
        _first_look_frozen(looking, event_id)
        trigger.touch()  # the collective returns: the toy steps again
        _wait_for_log(looking.cluster, job_id, "Finished: 'policy_train'", 60)
        looking.bundle(job_id, [PY])  # the watcher syncs the bundle again
        entry, report = looking.verdict(event_id)
    finally:
        trigger.unlink(missing_ok=True)
    assert entry.verdict is Verdict.NO_KILL, json.dumps(report, indent=1)
    assert report["kill_proof"] is None
    look = report["second_look"]
    assert look is not None and look["outcome"] == "moved", look
    assert report["flip_signal"], report
    _assert_replayed_offline(looking, event_id, entry)
    _terminate(looking, job_id)  # it steps forever: a later test must not see it move


# --- a toy Ray node: the trainer beside helpers that never stop moving ----------------------------

NODE_VERDICT_S = 420  # two looks of three processes, one `iris task exec` each, on a shared host


def _roles(live: Live, event_id: str, prefix: str = "") -> dict[int, str]:
    """The roles the capture recorded for each probed process (frozen processes.json)."""
    key = f"evidence/{event_id}/{prefix}probes/processes.json"
    return {p["pid"]: p["role"] for p in json.loads(live.services.store.get(key))}


def _helpers(live: Live, event_id: str) -> set[int]:
    key = f"evidence/{event_id}/probes/processes.json"
    records = json.loads(live.services.store.get(key))
    scripts = ("/ray/_private/log_monitor.py", "/ray/dashboard/agent.py")
    return {p["pid"] for p in records if any(script in p["args"] for script in scripts)}


def test_a_trainer_hung_beside_busy_helpers_is_kill_after_both_looks(looking: Live) -> None:
    """The toy trainer waits in all_reduce while its log monitor changes frames every second and
    its dashboard agent runs a select loop: both looks dump all three, the helpers are recorded
    as helpers and ignored (said in the summaries), and the KILL stands; the replay agrees."""
    job_id, job = _parked_job(looking, "look-node-hung", toy_argv("ray_node_trainer"))
    try:
        event_id = looking.alert(job)
        entry, report = looking.verdict(event_id, NODE_VERDICT_S)
    finally:
        _terminate(looking, job_id)
    assert entry.verdict is Verdict.KILL, json.dumps(report, indent=1)
    helpers = _helpers(looking, event_id)
    assert len(helpers) == 2, helpers
    roles = _roles(looking, event_id)
    assert {roles[pid] for pid in helpers} == {"helper"}, roles
    assert "rank" in roles.values(), roles
    liveness = report["gates"]["liveness"]["summary"]
    assert "(helper): moving, ignored" in liveness, liveness  # the log monitor moved
    look = report["second_look"]
    assert look is not None and look["outcome"] == "confirmed", look
    assert "ignored, not progress" in look["summary"], look
    assert {_roles(looking, event_id, "second_look/")[pid] for pid in helpers} == {"helper"}
    quoted = {q["source"] for q in report["kill_proof"]["evidence"]}
    assert not any(f"-pid{pid}-" in source for pid in helpers for source in quoted), quoted
    _assert_replayed_offline(looking, event_id, entry)


def test_a_trainer_beside_busy_helpers_that_resumes_during_the_wait_is_no_kill(
    looking: Live,
) -> None:
    """The same toy node resumes stepping during the second look's wait: NO-KILL, and what moved
    is the trainer (its stack, or its log when the re-synced bundle is read in time), never a
    helper."""
    trigger = Path("/var/tmp") / f"rlhealth-node-resume-{new_event_id()}"
    trigger.parent.mkdir(exist_ok=True)
    toy = toy_argv("ray_node_trainer", str(trigger))
    job_id, job = _parked_job(looking, "look-node-resumes", toy)
    try:
        event_id = looking.alert(job)
        _first_look_frozen(looking, event_id, NODE_VERDICT_S)
        trigger.touch()  # the collective returns: the toy steps again
        _wait_for_log(looking.cluster, job_id, "Finished: 'policy_train'", 60)
        looking.bundle(job_id, [PY])  # the watcher syncs the bundle again
        entry, report = looking.verdict(event_id, NODE_VERDICT_S)
    finally:
        trigger.unlink(missing_ok=True)
        _terminate(looking, job_id)
    assert entry.verdict is Verdict.NO_KILL, json.dumps(report, indent=1)
    look = report["second_look"]
    assert look is not None and look["outcome"] == "moved", look
    helpers = _helpers(looking, event_id)
    assert len(helpers) == 2, helpers
    moved = look["moved"]
    assert not any(re.search(rf"pid {pid}\b", m) for pid in helpers for m in moved), moved
    ranks = [pid for pid, role in _roles(looking, event_id).items() if role == "rank"]
    trainer = [m for m in moved for pid in ranks if re.search(rf"pid {pid}\b", m)]
    assert trainer or any(m.startswith("the log advanced") for m in moved), moved
    _assert_replayed_offline(looking, event_id, entry)
