"""The object store contract, run against the in-memory fake and against S3 (moto's server)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from worker.pipeline.failures import InfrastructureError
from worker.pipeline.store import (
    MemoryStore,
    ObjectMissingError,
    ObjectStore,
    S3Store,
    UnsafeKeyError,
    check_key,
    download_prefix,
    in_parallel,
    key_segment,
    put_all,
    upload_directory,
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


# the S3 side runs moto's server (in a thread): a service, so only in the full run (`make test`)
@pytest.fixture(params=["memory", pytest.param("s3", marks=pytest.mark.integration)])
def store(request: pytest.FixtureRequest) -> ObjectStore:
    if request.param == "memory":
        return MemoryStore("bucket", "pfx")
    bucket = f"bucket-{request.node.name.split('[')[0][-20:].replace('_', '-')}"
    s3 = S3Store(_client(request.getfixturevalue("moto_endpoint")), bucket, "pfx")
    s3.ensure_bucket()
    return s3


def test_put_once_writes_a_new_key(store: ObjectStore) -> None:
    """The first write stores the bytes and says so."""
    assert store.put_once("events/e1.json", b"one") is True
    assert store.get("events/e1.json") == b"one"
    assert store.exists("events/e1.json")


def test_put_once_never_overwrites(store: ObjectStore) -> None:
    """A second write of the same key changes nothing and reports it was already there."""
    store.put_once("events/e2.json", b"first")
    assert store.put_once("events/e2.json", b"second") is False
    assert store.get("events/e2.json") == b"first"


def test_missing_key(store: ObjectStore) -> None:
    """Reading a key that is not there raises ObjectMissingError; exists says no."""
    with pytest.raises(ObjectMissingError):
        store.get("events/none.json")
    assert not store.exists("events/none.json")


def test_keys_lists_under_a_prefix(store: ObjectStore) -> None:
    """keys() lists the keys under a prefix, relative to the store's own prefix, sorted."""
    for key in ("evidence/a/2", "evidence/a/1", "evidence/b/1"):
        store.put_once(key, b"x")
    assert store.keys("evidence/a/") == ["evidence/a/1", "evidence/a/2"]


def test_delete_removes_one_object(store: ObjectStore) -> None:
    """delete() removes the object (and is quiet about one that is not there)."""
    store.put_once("evidence/d/1", b"x")
    store.put_once("evidence/d/2", b"y")
    store.delete("evidence/d/1")
    store.delete("evidence/d/none")
    assert store.keys("evidence/d/") == ["evidence/d/2"]


@pytest.mark.parametrize(
    "key",
    [
        "events/...json/../x",
        "reports/../ops/a.json",
        "evidence/./x",
        "a//b",
        "events/e\r\n.json",
        "/abs",
        "evidence/\x00",
    ],
)
def test_unsafe_keys_are_refused(store: ObjectStore, key: str) -> None:
    """A key with an empty, `.` or `..` segment, or a control character, is never written."""
    with pytest.raises(UnsafeKeyError):
        store.put_once(key, b"x")


def test_keys_just_short_of_unsafe_are_fine() -> None:
    """Dots inside a name, a trailing slash on a prefix and `...` are plain names."""
    for key in ("events/e..1.json", "evidence/e1/", "reports/.../x", "a/.hidden"):
        assert check_key(key) == key


@pytest.mark.parametrize(
    ("value", "segment"),
    [
        ("..", "%2E%2E"),
        (".", "%2E"),
        ("cw", "cw"),
        ("a.b", "a.b"),
        ("evil\r\nx", "evil%0D%0Ax"),
        ("../../etc", ".._.._etc"),
        ("", "fallback"),
        (None, "fallback"),
    ],
)
def test_key_segment_makes_any_value_one_safe_segment(value: str | None, segment: str) -> None:
    """Values read from a bundle become one segment: dots-only and control characters encoded,
    slashes replaced as the report sink does."""
    assert key_segment(value, "fallback") == segment
    check_key(f"reports/{segment}/x")


def test_directories_round_trip(store: ObjectStore, tmp_path: Path) -> None:
    """A directory uploaded under a prefix downloads to the same tree."""
    (tmp_path / "up/logs").mkdir(parents=True)
    (tmp_path / "up/logs/metrics.parquet").write_bytes(b"PAR1")
    (tmp_path / "up/evidence.json").write_text("{}")
    upload_directory(store, tmp_path / "up", "evidence/x")
    download_prefix(store, "evidence/x/", tmp_path / "down")
    assert (tmp_path / "down/logs/metrics.parquet").read_bytes() == b"PAR1"
    assert (tmp_path / "down/evidence.json").read_text() == "{}"


def test_s3_uri_names_bucket_and_prefix(moto_endpoint: str) -> None:
    """The URI of a key is s3://<bucket>/<prefix>/<key>."""
    assert (
        S3Store(_client(moto_endpoint), "b", "p/").uri("reports/x.json")
        == "s3://b/p/reports/x.json"
    )


def test_unreachable_s3_is_an_infrastructure_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that cannot be reached raises InfrastructureError after its retries."""
    monkeypatch.setattr(
        "worker.pipeline.store.wait_exponential_jitter", lambda **_: lambda _state: 0
    )
    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{_free_port()}",
        region_name="us-east-1",
        aws_access_key_id="t",
        aws_secret_access_key="t",
        # one attempt per call: the retries under test are the store's own, not botocore's
        config=boto3.session.Config(retries={"total_max_attempts": 1}, connect_timeout=0.2),
    )
    with pytest.raises(InfrastructureError):
        S3Store(client, "bucket", "").get("x")


def test_modified_says_when_an_object_was_written(store: ObjectStore) -> None:
    """modified() is the time of the write (to the second S3 keeps), and ObjectMissingError for a
    key that is not there (the evidence sweep ages parts by it)."""
    before = time.time()
    store.put_once("evidence-parts/j/p", b"x")
    assert before - 2 <= store.modified("evidence-parts/j/p") <= time.time() + 2
    with pytest.raises(ObjectMissingError):
        store.modified("evidence-parts/j/none")


def test_listing_gives_each_key_its_size_and_write_time(store: ObjectStore) -> None:
    """listing() names every key under a prefix with its size and write time (what a HEAD of
    each would say), in one listing; keys just outside the prefix are not in it."""
    before = time.time()
    store.put_once("logcache/j/a", b"one")
    store.put_once("logcache/j/parts/b", b"three")
    store.put_once("logcache/k/c", b"x")
    listed = store.listing("logcache/j/")
    assert list(listed) == ["logcache/j/a", "logcache/j/parts/b"]
    assert [item.size for item in listed.values()] == [3, 5]
    for key, item in listed.items():
        assert before - 2 <= item.modified <= time.time() + 2
        assert item.modified == pytest.approx(store.modified(key), abs=1)
    assert store.listing("logcache/none/") == {}


def test_put_all_writes_every_object_once(store: ObjectStore, tmp_path: Path) -> None:
    """put_all() writes bodies and files (read by the thread that sends them), says for each
    whether it wrote it, and leaves an existing object as it was."""
    store.put_once("parts/x/0", b"there already")
    (tmp_path / "f").write_bytes(b"from a file")
    items: list[tuple[str, bytes | Path]] = [
        (f"parts/x/{n}", f"body {n}".encode()) for n in range(6)
    ]
    items.append(("parts/x/file", tmp_path / "f"))
    assert put_all(store, items) == [False, True, True, True, True, True, True]
    assert store.get("parts/x/0") == b"there already"
    assert store.get("parts/x/5") == b"body 5"
    assert store.get("parts/x/file") == b"from a file"


def test_in_parallel_raises_the_first_failure_once_every_call_ended() -> None:
    """A failing call is raised, but only after the others ran to their end (nothing is left
    writing behind the caller's back)."""
    ended: list[int] = []

    def call(n: int) -> Callable[[], int]:
        def run() -> int:
            if n == 0:
                raise ConnectionError("S3 is down")
            time.sleep(0.05)
            ended.append(n)
            return n

        return run

    with pytest.raises(ConnectionError, match="S3 is down"):
        in_parallel([call(n) for n in range(5)], threads=2)
    assert sorted(ended) == [1, 2, 3, 4]
    assert in_parallel([call(n) for n in range(1, 4)]) == [1, 2, 3]
