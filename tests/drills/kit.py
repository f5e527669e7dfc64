"""The drills' kit: the real services of rl-health as local processes, a watch on what they publish,
and a ledger that counts what came back for every alert sent.

A `Stack` runs redis-server (AOF on, fsync every second), moto's S3 server behind a TCP forwarder
(so an S3 outage can keep or lose the stored objects), one `rl-health worker` (prefork, two
children) and one `rl-health ingest`. Only processes it started are ever signalled, by PID.

`Product` is the code under test: this checkout by default, or another checkout of the project
(`DRILL_PRODUCT`, e.g. an export of `main`) run with this checkout's virtual environment, which is
how docs/reliability.md shows the losses before the fixes with the same drills.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import redis

from shared.alerts import publish_alert
from shared.models import Event
from shared.settings import Settings
from shared.streams import ALERT_FIELD, INGEST_GROUP, StreamNames
from testkit.bundles import write_job_bundle
from testkit.keys import TEST_KEY

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(Path(sys.executable))
BUCKET = "rlhealth-drill"
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
PREFIX = "drill"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(check: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    """`check()`'s first truthy value within `timeout` seconds (exceptions count as not yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception:
            pass
        time.sleep(every)
    raise TimeoutError(f"{what} not within {timeout:g} s")


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def signal_pid(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Product:
    """The checkout whose `rl-health` the drill runs."""

    root: Path = ROOT

    @staticmethod
    def chosen() -> Product:
        named = os.environ.get("DRILL_PRODUCT")
        return Product(Path(named).resolve()) if named else Product()

    @property
    def label(self) -> str:
        return "this checkout" if self.root == ROOT else str(self.root)

    def argv(self, *args: str) -> list[str]:
        run = "import sys; from worker.cli import main; sys.exit(main(prog_name='rl-health'))"
        return [PYTHON, "-c", run, *args]


class Procs:
    """Every process started here; stopped by PID, never by name."""

    def __init__(self) -> None:
        self.items: list[subprocess.Popen[bytes]] = []
        self.orphans: set[int] = set()

    def spawn(
        self, argv: list[str], env: dict[str, str], logfile: Path, **kwargs: Any
    ) -> subprocess.Popen[bytes]:
        handle = logfile.open("ab")
        handle.write(f"\n===== {time.strftime('%H:%M:%S')} {argv[:4]}\n".encode())
        handle.flush()
        proc = subprocess.Popen(argv, env=env, stdout=handle, stderr=subprocess.STDOUT, **kwargs)
        self.items.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.items):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.items):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for pid in self.orphans:
            signal_pid(pid, signal.SIGKILL)
        self.items.clear()


@dataclass
class Ports:
    redis: int = field(default_factory=free_port)
    moto: int = field(default_factory=free_port)
    s3: int = field(default_factory=free_port)


class Stack:
    """redis-server, moto behind a forwarder, one worker and one ingest, in `workdir`."""

    def __init__(
        self,
        workdir: Path,
        product: Product | None = None,
        *,
        env: dict[str, str] | None = None,
        worker_memory_limit_mb: int | None = None,
    ) -> None:
        self.product = product or Product.chosen()
        self.dir = workdir
        shutil.rmtree(workdir, ignore_errors=True)
        (workdir / "redis").mkdir(parents=True)
        self.bundle_root = workdir / "bundles"
        self.bundle_root.mkdir()
        self.ports = Ports()
        self.names = StreamNames(PREFIX)
        self.worker_memory_limit_mb = worker_memory_limit_mb
        self.env = {
            **os.environ,
            "PYTHONPATH": str(self.product.root),
            "PYTHONUNBUFFERED": "1",
            "RLHEALTH_REDIS_URL": f"redis://127.0.0.1:{self.ports.redis}/0",
            "RLHEALTH_S3_ENDPOINT_URL": f"http://127.0.0.1:{self.ports.s3}",
            "RLHEALTH_S3_BUCKET": BUCKET,
            "RLHEALTH_S3_PREFIX": "",
            "RLHEALTH_BUNDLE_ROOT": str(self.bundle_root),
            "RLHEALTH_STREAM_PREFIX": PREFIX,
            "RLHEALTH_COALESCE_S": "300",
            "RLHEALTH_CACHE_DIR": str(workdir / "cache"),
            "RLHEALTH_VERDICT_KEY": TEST_KEY,  # every pipeline role signs or verifies with it
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            **(env or {}),
        }
        self.settings = Settings(
            redis_url=self.env["RLHEALTH_REDIS_URL"],
            bundle_root=self.bundle_root,
            stream_prefix=PREFIX,
        )
        self.redis = redis.Redis(port=self.ports.redis, socket_timeout=10, socket_connect_timeout=2)
        config = botocore.config.Config(
            retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10
        )
        self.s3 = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{self.ports.moto}",
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
            config=config,
        )
        self.procs = Procs()
        self.redis_proc: subprocess.Popen[bytes] | None = None
        self.moto_proc: subprocess.Popen[bytes] | None = None
        self.proxy_proc: subprocess.Popen[bytes] | None = None
        self.worker_proc: subprocess.Popen[bytes] | None = None
        self.ingest_proc: subprocess.Popen[bytes] | None = None
        self._app: Any = None
        self.cgroups: list[Path] = []
        # every key S3 held when the drill restarted it empty: what was written before the loss
        self.lost_keys: set[str] = set()

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.procs.stop_all()
        for group in self.cgroups:
            with contextlib.suppress(OSError):
                group.rmdir()

    def start(self) -> None:
        self.start_redis()
        self.start_moto()
        self.start_proxy()
        self.start_worker()
        self.start_ingest()
        wait_for(self._grouped, 60, "the ingest group")

    def _grouped(self) -> bool:
        groups = self.redis.xinfo_groups(self.names.alerts)
        return any(g["name"] in (INGEST_GROUP, INGEST_GROUP.encode()) for g in groups)

    # --- redis -------------------------------------------------------------------------------

    def start_redis(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (make system-deps installs it)")
        argv = [binary, "--port", str(self.ports.redis), "--bind", "127.0.0.1",
                "--dir", str(self.dir / "redis"), "--appendonly", "yes",
                "--appendfsync", "everysec", "--save", ""]  # fmt: skip
        self.redis_proc = self.procs.spawn(argv, dict(os.environ), self.dir / "redis.log")
        wait_for(self.redis.ping, 30, "redis-server")

    def stop_redis(self, sig: int = signal.SIGTERM) -> None:
        assert self.redis_proc is not None
        self.redis_proc.send_signal(sig)
        self.redis_proc.wait(30)

    # --- S3 ----------------------------------------------------------------------------------

    def start_moto(self) -> None:
        moto = str(Path(PYTHON).with_name("moto_server"))
        argv = [moto, "-H", "127.0.0.1", "-p", str(self.ports.moto)]
        self.moto_proc = self.procs.spawn(argv, dict(os.environ), self.dir / "moto.log")
        wait_for(self._bucket, 60, "moto's S3 server")

    def _bucket(self) -> bool:
        try:
            self.s3.head_bucket(Bucket=BUCKET)
        except Exception:
            self.s3.create_bucket(Bucket=BUCKET)
        return True

    def start_proxy(self) -> None:
        argv = [PYTHON, "-m", "tests.drills.proxy", str(self.ports.s3), str(self.ports.moto)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proxy_proc = self.procs.spawn(argv, env, self.dir / "proxy.log", cwd=ROOT)
        wait_for(lambda: socket.create_connection(("127.0.0.1", self.ports.s3), 0.3), 20, "proxy")

    def cut_s3(self, *, lose_objects: bool = False) -> None:
        """S3 unreachable (connections cut and refused); `lose_objects` also empties it, after
        noting every key it held (`lost_keys`): the pipeline cannot write once the forwarder is
        gone, so the objects written before the loss are counted (reports per diagnosis) even
        though the drill itself destroyed them."""
        assert self.proxy_proc is not None
        self.proxy_proc.kill()
        self.proxy_proc.wait(10)
        if lose_objects:
            self.lost_keys.update(self._settled_keys())
            assert self.moto_proc is not None
            self.moto_proc.kill()
            self.moto_proc.wait(10)
            self.start_moto()  # empty, but the bucket is there again

    def _settled_keys(self) -> list[str]:
        """The keys moto holds once a request it was still serving when the forwarder died has
        landed: two listings in a row that agree (moto is read directly, not through it)."""
        before = self.s3_keys()
        for _ in range(20):
            time.sleep(0.25)
            now = self.s3_keys()
            if now == before:
                return now
            before = now
        return before

    def restore_s3(self) -> None:
        self.start_proxy()

    # --- pipeline processes ------------------------------------------------------------------

    @property
    def app(self) -> Any:
        if self._app is None:
            from celery import Celery

            self._app = Celery("drill", broker=self.env["RLHEALTH_REDIS_URL"])
        return self._app

    @property
    def hostname(self) -> str:
        return f"{PREFIX}@{socket.gethostname()}"

    def start_worker(self, wait: bool = True) -> None:
        argv = self.product.argv("worker", "--concurrency", "2", "--pool", "prefork",
                                 "--loglevel", "INFO", "--hostname", f"{PREFIX}@%h")  # fmt: skip
        if self.worker_memory_limit_mb:
            argv = self._memory_limited(argv, self.worker_memory_limit_mb * 2**20)
        self.worker_proc = self.procs.spawn(
            argv, self.env, self.dir / "worker.log", cwd=self.product.root
        )
        if wait:
            wait_for(self._worker_ready, 300, "the celery worker", every=0.5)

    def _memory_limited(self, argv: list[str], limit: int) -> list[str]:
        """`argv` run in a memory cgroup of its own (the kernel's OOM killer SIGKILLs the child
        that needs more, as on a real host); RLIMIT_AS where cgroups cannot be made."""
        group = CGROUP_ROOT / f"rlhealth-drill-{self.ports.redis}"
        try:
            group.mkdir(exist_ok=True)
            (group / "memory.limit_in_bytes").write_text(str(limit))
        except OSError:
            return ["prlimit", f"--as={limit}", "--", *argv]
        self.cgroups.append(group)
        enter = f'echo $$ > {group / "cgroup.procs"} && exec "$@"'
        return ["sh", "-c", enter, "sh", *argv]

    def oom_kills(self) -> int:
        """How often the kernel's OOM killer struck in this stack's memory cgroups."""
        total = 0
        for group in self.cgroups:
            with contextlib.suppress(OSError, ValueError):
                for line in (group / "memory.oom_control").read_text().splitlines():
                    if line.startswith("oom_kill "):
                        total += int(line.split()[1])
        return total

    def _worker_ready(self) -> bool:
        proc = self.worker_proc
        assert proc is not None
        if proc.poll() is not None:
            raise RuntimeError("the worker exited; see worker.log")
        replies = self.app.control.ping(destination=[self.hostname], timeout=0.5)
        return bool(replies) and len(children(proc.pid)) >= 2

    def kill_worker_main(self) -> list[int]:
        """SIGKILL the worker's main process (its children are left, as a crash leaves them);
        returns the children's PIDs."""
        assert self.worker_proc is not None
        kids = children(self.worker_proc.pid)
        self.worker_proc.kill()
        self.worker_proc.wait(10)
        self.procs.orphans.update(kids)
        return kids

    def start_ingest(self) -> None:
        argv = self.product.argv("ingest", "--consumer", f"{PREFIX}-ingest")
        self.ingest_proc = self.procs.spawn(
            argv, self.env, self.dir / "ingest.log", cwd=self.product.root
        )

    def kill_ingest(self) -> None:
        assert self.ingest_proc is not None
        self.ingest_proc.kill()
        self.ingest_proc.wait(10)

    def freeze_running(self, lead: str, task: str) -> int | None:
        """Stop (SIGSTOP) the child running `task` of `lead` and return its PID, None if no
        child runs it any more. Both children are stopped while the main process is asked which
        one runs it (a task event names only the main process), then the other one goes on."""
        assert self.worker_proc is not None
        kids = children(self.worker_proc.pid)
        for kid in kids:
            signal_pid(kid, signal.SIGSTOP)
        try:
            running = [pid for pid in self.active(lead, task) if pid in kids]
        finally:
            target = running[0] if running else None
            for kid in kids:
                if kid != target:
                    signal_pid(kid, signal.SIGCONT)
        return target

    def active(self, lead: str, task: str) -> list[int]:
        """PIDs of the children running a `task` (e.g. rlhealth.gate) of the diagnosis `lead`."""
        replies = self.app.control.inspect(destination=[self.hostname], timeout=0.5).active()
        return [
            int(item["worker_pid"])
            for items in (replies or {}).values()
            for item in items
            if item.get("name") == task and lead in f"{item.get('args')}{item.get('kwargs')}"
        ]

    # --- jobs and alerts ---------------------------------------------------------------------

    def job(self, name: str, *, size_bytes: int = 200_000, **manifest: Any) -> str:
        """A job bundle (its finelog padded to `size_bytes`); `manifest` overrides fields."""
        job_dir = write_job_bundle(self.bundle_root, name, size_bytes=size_bytes)
        if manifest:
            path = job_dir / "manifest.json"
            data = json.loads(path.read_text())
            data.update(manifest)
            path.write_text(json.dumps(data))  # ensure_ascii: a lone surrogate stays \\udcff
        return job_dir.relative_to(self.bundle_root).as_posix()

    def alert(self, job: str, reason: str = "drill") -> str:
        """Publish one alert, retrying while Redis is away (as a watcher would)."""
        while True:
            try:
                return publish_alert(self.redis, job, reason=reason, settings=self.settings)
            except redis.exceptions.ConnectionError:
                time.sleep(0.2)

    def raw_alert(self, payload: dict[str, Any] | str) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        self.redis.xadd(self.names.alerts, {ALERT_FIELD: text})

    def burst(self, jobs: Iterable[str]) -> list[str]:
        """One alert per job in one transaction; returns the event ids."""
        from shared.alerts import new_event_id

        pipe, ids = self.redis.pipeline(transaction=True), []
        for job in jobs:
            event = Event(event_id=new_event_id(), job_dir=job, published_at=_utcnow())
            pipe.xadd(self.names.alerts, {ALERT_FIELD: event.model_dump_json(exclude_none=True)})
            ids.append(event.event_id)
        pipe.execute()
        return ids

    def s3_keys(self) -> list[str]:
        keys: list[str] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            keys.extend(item["Key"] for item in page.get("Contents", []))
        return keys

    def dead_letters(self) -> list[dict[str, str]]:
        return [
            {k.decode(): v.decode(errors="replace") for k, v in fields.items()}
            for _id, fields in self.redis.xrange(self.names.dead_letter)
        ]


class TaskEvents(threading.Thread):
    """Celery's task events (the app sends them): which task started in which child, at once."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(daemon=True)
        self.stack = stack
        self.tasks: dict[str, dict[str, Any]] = {}
        self.started: list[tuple[str, int]] = []  # (task id, child pid), in order
        self.lock = threading.Condition()
        self.receiver: Any = None

    def on_event(self, event: dict[str, Any]) -> None:
        kind, uuid = event.get("type", ""), event.get("uuid", "")
        with self.lock:
            info = self.tasks.setdefault(uuid, {"name": "", "refs": ""})
            if kind in ("task-sent", "task-received"):
                info["name"] = event.get("name") or info["name"]
                info["refs"] += f"{event.get('args')}{event.get('kwargs')}"
            elif kind == "task-started":
                self.started.append((uuid, int(event.get("pid") or 0)))
                self.lock.notify_all()

    def run(self) -> None:
        while True:
            try:
                with self.stack.app.connection_for_read() as conn:
                    self.receiver = self.stack.app.events.Receiver(
                        conn, handlers={"*": self.on_event}
                    )
                    self.receiver.capture(limit=None, timeout=None, wakeup=False)
            except Exception:
                time.sleep(0.5)

    def wait_started(self, lead: str, task: str, timeout: float, after: int = 0) -> int | None:
        """The PID in the start event of the first `task` of `lead` (after the `after`-th start):
        the worker's main process, not the child that runs it."""
        return self.wait_any_started([lead], task, timeout, after)

    def wait_any_started(
        self, leads: Iterable[str], task: str, timeout: float, after: int = 0
    ) -> int | None:
        """`wait_started` for the first `task` of any of `leads`."""
        wanted = list(leads)
        deadline = time.monotonic() + timeout
        with self.lock:
            while time.monotonic() < deadline:
                for uuid, pid in self.started[after:]:
                    info = self.tasks.get(uuid, {})
                    refs = info.get("refs", "")
                    if info.get("name") == task and any(lead in refs for lead in wanted):
                        return pid
                self.lock.wait(0.2)
        return None

    def mark(self) -> int:
        with self.lock:
            return len(self.started)


def _utcnow() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


# --- the watch and the ledger -------------------------------------------------------------------


@dataclass
class Seen:
    """One verdict entry as it appeared on the stream."""

    t: float
    lead: str
    event_ids: tuple[str, ...]
    verdict: str
    report_uri: str
    report_there: bool | None  # the JSON report was in S3 when the entry appeared (None: S3 down)


class Watch(threading.Thread):
    """Reads the verdict stream from its start; checks each entry's report at once."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(daemon=True)
        self.stack = stack
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def run(self) -> None:
        client = redis.Redis(port=self.stack.ports.redis, socket_timeout=5)
        last = "0-0"
        while not self.stopping.is_set():
            try:
                reply = client.xread({self.stack.names.verdicts: last}, count=100, block=300)
            except redis.exceptions.RedisError:
                time.sleep(0.3)
                continue
            for _stream, items in reply or ():
                for entry_id, raw in items:
                    last = entry_id.decode()
                    self._record({k.decode(): v.decode() for k, v in raw.items()})

    def _record(self, fields: dict[str, str]) -> None:
        uri = fields["report_uri"]
        seen = Seen(time.time(), fields["event_id"], tuple(json.loads(fields["event_ids"])),
                    fields["verdict"], uri, self._report_there(uri))  # fmt: skip
        with self.lock:
            self.seen.append(seen)

    def _report_there(self, uri: str) -> bool | None:
        try:
            self.stack.s3.head_object(Bucket=BUCKET, Key=_key(uri))
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
            return False if code in ("404", "NoSuchKey", "NotFound") else None
        return True

    def entries(self) -> list[Seen]:
        with self.lock:
            return list(self.seen)

    def answered(self) -> dict[str, float]:
        """Event id → when it was first listed by a verdict entry."""
        first: dict[str, float] = {}
        for seen in self.entries():
            for event_id in seen.event_ids:
                first.setdefault(event_id, seen.t)
        return first

    def wait(self, ids: Iterable[str], timeout: float) -> bool:
        wanted = set(ids)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if wanted <= self.answered().keys():
                return True
            time.sleep(0.2)
        return wanted <= self.answered().keys()


@dataclass
class Sent:
    event_id: str
    job: str
    t: float


class Ledger:
    """What was sent and what came back, as the figures of docs/reliability.md."""

    def __init__(self, stack: Stack, watch: Watch) -> None:
        self.stack = stack
        self.watch = watch
        self.sent: list[Sent] = []

    def send(self, job: str, reason: str = "drill") -> str:
        event_id = self.stack.alert(job, reason)
        self.sent.append(Sent(event_id, job, time.time()))
        return event_id

    def note(self, ids: Iterable[str], jobs: Iterable[str]) -> list[str]:
        out = list(ids)
        self.sent.extend(Sent(i, j, time.time()) for i, j in zip(out, jobs, strict=True))
        return out

    def report_keys(self) -> set[str] | None:
        """Every JSON report key written: in S3 now, or there when the drill emptied it (None
        when S3 cannot be listed)."""
        try:
            keys = self.stack.s3_keys()
        except Exception:
            return None
        return _reports(set(keys) | self.stack.lost_keys)

    def reports_by_lead(self) -> dict[str, int] | None:
        """JSON report objects written per lead event id (None when S3 cannot be listed)."""
        keys = self.report_keys()
        if keys is None:
            return None
        counts: dict[str, int] = defaultdict(int)
        for key in keys:
            counts[_lead_of(key)] += 1
        return dict(counts)

    def figures(self, ids: Iterable[str] | None = None) -> dict[str, Any]:
        """Alerts answered, verdicts exactly once, reports per diagnosis, duplicates, latency."""
        wanted = {s.event_id for s in self.sent} if ids is None else set(ids)
        entries = self.watch.entries()
        leads_of: dict[str, set[str]] = defaultdict(set)
        lists: dict[str, list[tuple[str, ...]]] = defaultdict(list)
        for seen in entries:
            lists[seen.lead].append(seen.event_ids)
            for event_id in seen.event_ids:
                leads_of[event_id].add(seen.lead)
        leads = {lead for i in wanted for lead in leads_of.get(i, ())}
        reports = self.reports_by_lead()
        written = self.report_keys()
        answered = self.watch.answered()
        sent_at = {s.event_id: s.t for s in self.sent}
        latency = sorted(answered[i] - sent_at[i] for i in wanted if i in answered and i in sent_at)
        repeats = sum(len(v) - len(set(v)) for lead, v in lists.items() if lead in leads)
        letters = [d for d in self.stack.dead_letters() if d.get("event_id")]
        failed = {d["event_id"] for d in letters}
        return {
            "alerts": len(wanted),
            "answered": sum(1 for i in wanted if i in answered),
            "lost": sorted(i for i in wanted if i not in answered)[:10],
            "answered_by_two_diagnoses": sum(1 for i in wanted if len(leads_of.get(i, ())) > 1),
            "diagnoses": len(leads),
            "repeated_verdict_entries": repeats,
            "reports_per_diagnosis": None
            if reports is None
            else sorted({reports.get(lead, 0) for lead in leads}),
            "verdict_before_report": sum(
                1 for s in entries if s.lead in leads and s.report_there is False
            ),
            "entries_pointing_at_no_report": None
            if written is None
            else sum(1 for s in entries if s.lead in leads and _key(s.report_uri) not in written),
            "reports_lost_with_s3": len(
                {_lead_of(k) for k in _reports(self.stack.lost_keys)} & leads
            ),  # diagnoses whose report the drill destroyed
            "verdicts": dict(_count(s.verdict for s in entries if s.lead in leads)),
            "diagnoses_failed_and_dead_lettered": len(leads & failed),
            "failure_reasons": sorted(
                {d["reason"][:160] for d in letters if d["event_id"] in leads}
            )[:4],
            "latency_s": _spread(latency),
        }


def _reports(keys: Iterable[str]) -> set[str]:
    """The JSON report keys among `keys`."""
    return {key for key in keys if key.startswith("reports/") and key.endswith(".json")}


def _key(uri: str) -> str:
    """The S3 key of a report URI."""
    return uri.split(f"s3://{BUCKET}/", 1)[-1]


def _lead_of(report_key: str) -> str:
    """The lead event id a report key names (`.../<captured_at>-evt-...json`)."""
    return "evt-" + report_key.rsplit("-evt-", 1)[-1].removesuffix(".json")


def _count(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for value in values:
        out[value] += 1
    return dict(out)


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "min": round(values[0], 1),
        "p50": round(values[len(values) // 2], 1),
        "max": round(values[-1], 1),
    }


def jitter(low: float, high: float) -> float:
    return random.uniform(low, high)
