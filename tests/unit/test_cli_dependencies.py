"""A dependency that cannot be used is one line and exit 2, naming the setting and the address
(never a password); `--debug` shows the traceback. `alert --wait` prints that event's verdict,
read from before the alert; `verdicts --event ID` prints one event's verdict. Only verified
verdicts are printed."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import fakeredis
import pytest
import redis
from click.testing import CliRunner, Result

from shared.streams import ALERT_FIELD, StreamNames
from testkit.keys import OTHER_KEYS, signed_fields
from worker.cli import main, pipeline_cmd
from worker.cli.dependencies import dependency_failure, redis_address
from worker.pipeline.failures import InfrastructureError

ROOT = Path(__file__).resolve().parents[2]
JOB = "jobs/cw-rno2a/ops/rl-gsm8k-stalled"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens on it once the socket is closed


def _run(*args: str, **env: str) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def _one_line_exit_2(result: Result, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("rl-health: ")
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "args",
    [
        ("alert", JOB),
        ("verdicts",),
        ("verdicts", "--event", "evt-1"),
        ("replay", "evt-1"),
        ("ingest", "--once"),
        ("board",),
        ("worker",),
    ],
)
def test_redis_down_is_one_line_naming_the_setting_and_address(args: tuple[str, ...]) -> None:
    """Redis refusing connections: one line naming RLHEALTH_REDIS_URL and host:port/db, exit 2,
    and the password in the URL never printed."""
    port = _closed_port()
    url = f"redis://:s3cr3t-pw@127.0.0.1:{port}/0"
    line = _one_line_exit_2(
        _run(*args, RLHEALTH_REDIS_URL=url, RLHEALTH_BUNDLE_ROOT=str(ROOT / "examples")),
        "RLHEALTH_REDIS_URL",
        f"127.0.0.1:{port}/0",
        "cannot be reached",
    )
    assert "s3cr3t" not in line


@pytest.mark.parametrize(
    "args", [("alert", JOB), ("verdicts",), ("ingest",), ("replay", "e"), ("board",)]
)
@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("localhost:6379", "the scheme must be one of"),
        ("redis://:pw@host:notaport/0", "the port is not a number"),
        ("redis://:pw@host:6379/zero", "must be a number"),
    ],
)
def test_a_malformed_redis_url_is_one_line(args: tuple[str, ...], url: str, why: str) -> None:
    """Every pipeline command refuses a malformed RLHEALTH_REDIS_URL with one line saying what
    is wrong with it, without quoting it."""
    line = _one_line_exit_2(_run(*args, RLHEALTH_REDIS_URL=url), "RLHEALTH_REDIS_URL", why)
    assert "pw@" not in line


def test_a_well_formed_redis_url_just_past_the_malformed_ones_is_accepted() -> None:
    """`rediss://` with a password and a numbered database passes the check (the command then
    fails on reaching it, not on its form)."""
    port = _closed_port()
    line = _one_line_exit_2(
        _run("verdicts", RLHEALTH_REDIS_URL=f"rediss://:pw@127.0.0.1:{port}/3"), "cannot be reached"
    )
    assert "unusable setting" not in line


def test_s3_unreachable_and_no_credentials_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sweep` with S3 refusing connections names the endpoint and bucket; without any AWS
    credentials it says so and how to give them; both exit 2."""
    port = _closed_port()
    env = {"RLHEALTH_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}", "RLHEALTH_S3_BUCKET": "b1"}
    creds = {
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    _one_line_exit_2(
        _run("sweep", "--keep", "30d", **env, **creds),
        f"bucket b1 at http://127.0.0.1:{port}",
        "RLHEALTH_S3_ENDPOINT_URL",
        "cannot be reached",
    )
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # no credentials cached by the first run
    _one_line_exit_2(
        _run("sweep", "--keep", "30d", **env, AWS_DEFAULT_REGION="us-east-1"),
        "no usable AWS credentials",
        "AWS_ACCESS_KEY_ID",
    )


def test_debug_shows_the_traceback_above_the_line() -> None:
    """`--debug` (or RLHEALTH_DEBUG=1) prints the traceback, then the same one line."""
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    for args, env in (
        (("--debug", "verdicts"), {}),
        (("verdicts",), {"RLHEALTH_DEBUG": "1"}),
    ):
        result = CliRunner().invoke(main, list(args), env={"RLHEALTH_REDIS_URL": url, **env})
        assert result.exit_code == 2
        assert "Traceback (most recent call last)" in result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith("rl-health: Redis at")


def test_a_failure_mid_command_is_named_through_its_causes() -> None:
    """A Redis error wrapped by the pipeline (InfrastructureError from it) names Redis; a bug
    (ValueError) is not a dependency failure and keeps its traceback."""
    try:
        try:
            raise redis.ConnectionError(
                "Error 111 connecting to 10.0.0.9:6379. Connection refused."
            )
        except redis.ConnectionError as inner:
            raise InfrastructureError("Redis away") from inner
    except InfrastructureError as outer:
        wrapped = outer
    from shared.settings import Settings

    settings = Settings(redis_url="redis://10.0.0.9:6379/2")
    said = dependency_failure(wrapped, settings)
    assert said is not None and said.startswith("Redis at 10.0.0.9:6379/2 (RLHEALTH_REDIS_URL)")
    assert dependency_failure(ValueError("a bug"), settings) is None


def test_redis_addresses_never_carry_credentials() -> None:
    """user:password@host:port/db is `host:port/db`; a unix socket is its path."""
    assert redis_address("redis://u:pw@h:7000/4") == "h:7000/4"
    assert redis_address("redis://h") == "h:6379/0"
    assert redis_address("unix:///run/redis.sock") == "/run/redis.sock"


# --- waiting for one event's verdict ------------------------------------------------------------


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The commands' Redis, in memory."""
    fake = fakeredis.FakeRedis()
    monkeypatch.setattr(pipeline_cmd, "reach_redis", lambda _settings: fake)
    monkeypatch.setenv("RLHEALTH_BUNDLE_ROOT", str(ROOT / "examples"))
    yield fake


NAMES = StreamNames()


def _verdict(event_ids: list[str], ring: Any = None, verdict: str = "KILL") -> dict[str, str]:
    fields = {
        "event_id": event_ids[0],
        "event_ids": event_ids,
        "job_id": "/ops/rl-gsm8k-stalled",
        "verdict": verdict,
        "confidence": "high",
        "report_uri": "s3://rlhealth/reports/x.json",
        "captured_at": "2026-07-30T19:17:00Z",
    }
    return signed_fields(fields) if ring is None else signed_fields(fields, ring)


def _answer(client: Any, answer: Any) -> threading.Thread:
    """A worker stand-in: once the alert is on the stream, `answer(client, event_id)`."""

    def run() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            items = client.xrange(NAMES.alerts)
            if items:
                answer(client, json.loads(items[-1][1][ALERT_FIELD.encode()])["event_id"])
                return
            time.sleep(0.02)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_alert_wait_prints_the_verdict_even_when_it_comes_at_once(client: Any) -> None:
    """The verdict lands right after the alert (before any follower could start): `--wait`
    still prints it, after the event id, exit 0; an earlier verdict of another event is not
    taken for it."""
    client.xadd(NAMES.verdicts, _verdict(["evt-older"], verdict="NO-KILL"))
    _answer(client, lambda c, e: c.xadd(NAMES.verdicts, _verdict([e])))
    result = _run("alert", JOB, "--wait", "20")
    assert result.exit_code == 0, result.output
    event_id, line = result.stdout.strip().splitlines()
    assert event_id.startswith("evt-") and "KILL" in line and event_id in line
    assert "NO-KILL" not in line


def test_alert_wait_answered_by_a_coalesced_verdict(client: Any) -> None:
    """The alert is answered by another diagnosis's verdict that lists it in `event_ids`."""
    _answer(client, lambda c, e: c.xadd(NAMES.verdicts, _verdict(["evt-lead", e])))
    result = _run("alert", JOB, "--wait", "20", "--json")
    assert result.exit_code == 0, result.output
    entry = json.loads(result.stdout.strip().splitlines()[1])
    assert entry["event_id"] == "evt-lead" and len(entry["event_ids"]) == 2


def test_alert_wait_shows_no_forged_verdict_and_times_out(client: Any) -> None:
    """A verdict for the event signed with another key is REFUSED on stderr, never printed;
    with no real verdict the wait ends with one line and exit 1."""
    _answer(client, lambda c, e: c.xadd(NAMES.verdicts, _verdict([e], ring=OTHER_KEYS)))
    result = _run("alert", JOB, "--wait", "3")
    assert result.exit_code == 1
    assert len(result.stdout.strip().splitlines()) == 1  # the event id only
    assert "REFUSED" in result.stderr and "no verdict for evt-" in result.stderr


def test_alert_wait_says_at_once_when_the_alert_was_dead_lettered(client: Any) -> None:
    """Ingest refused the alert: `--wait` says so with the reason and exits 1, not waiting for
    its time-out."""

    def refuse(c: Any, event_id: str) -> None:
        raw = json.dumps({ALERT_FIELD: json.dumps({"event_id": event_id})})
        c.xadd(NAMES.dead_letter, {"reason": "job_dir escapes the bundle root", "raw": raw})

    _answer(client, refuse)
    result = _run("alert", JOB, "--wait", "60")  # a time-out would say "no verdict for ..."
    assert result.exit_code == 1
    assert "was refused (dead-letter stream): job_dir escapes" in result.stderr


def test_verdicts_event_prints_that_events_verdict_or_says_none(client: Any) -> None:
    """`--event` finds the newest verified verdict answering the id among others; an id no
    verdict answers is one line and exit 1; a forged entry for the id is refused."""
    client.xadd(NAMES.verdicts, _verdict(["evt-a"]))
    client.xadd(NAMES.verdicts, _verdict(["evt-b"], verdict="NO-KILL"))
    client.xadd(NAMES.verdicts, _verdict(["evt-b", "evt-c"], verdict="NO-KILL"))
    client.xadd(NAMES.verdicts, _verdict(["evt-d"], ring=OTHER_KEYS))
    found = _run("verdicts", "--event", "evt-c", "--json")
    assert found.exit_code == 0 and json.loads(found.stdout)["event_ids"] == ["evt-b", "evt-c"]
    assert "evt-a" in _run("verdicts", "--event", "evt-a").stdout
    missing = _run("verdicts", "--event", "evt-zzz")
    assert missing.exit_code == 1 and "no verdict for evt-zzz yet" in missing.stderr
    forged = _run("verdicts", "--event", "evt-d")
    assert forged.exit_code == 1 and "REFUSED" in forged.stderr and forged.stdout == ""
