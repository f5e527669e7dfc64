"""Object storage for events, frozen evidence and reports: a protocol, S3, and an in-memory fake.

Everything the pipeline stores is written once. `put_once` sends `If-None-Match: *`, so S3 itself
refuses to overwrite (412 PreconditionFailed means the object is already there, which for a task
that runs twice is success). Three things delete: a capture taking over from a dead one removes the
partial objects of a freeze that never got its marker, the log cache
(`worker.pipeline.logcache`) removes a job's archives older than its newest two, and the evidence
sweep (`worker.pipeline.parts.sweep`) removes expired frozen evidence and the table parts no kept
evidence references. Transient faults
are retried inside the adapter with tenacity; what still fails is raised as `InfrastructureError`.

A few helpers spare round trips: `listing` gives every key under a prefix with its size and
write time in one paginated listing (no HEAD per object), and `in_parallel` / `put_all` send
requests whose order does not matter (content-addressed parts) from a small thread pool.

Keys are checked before any request: a key with an empty, `.` or `..` segment, or a control
character, is refused (`UnsafeKeyError`), so no value read from a bundle or an event can climb the
key path. `key_segment` turns such a value into a safe segment.
"""

from __future__ import annotations

import string
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, NamedTuple, Protocol, TypeVar, runtime_checkable

import boto3
import botocore.exceptions
from botocore.config import Config
from tenacity import (
    retry,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from shared.settings import Settings
from worker.pipeline.failures import InfrastructureError, describe, is_infrastructure

__all__ = [
    "PUT_THREADS",
    "Listed",
    "MemoryStore",
    "ObjectMissingError",
    "ObjectStore",
    "S3Store",
    "UnsafeKeyError",
    "check_key",
    "download_prefix",
    "in_parallel",
    "key_segment",
    "put_all",
    "store_from_settings",
    "upload_directory",
]

T = TypeVar("T")
BINARY = "application/octet-stream"
_SAFE: Final = frozenset(string.ascii_letters + string.digits + "-_.:@+=,")
PUT_THREADS: Final = 4
"""The requests `in_parallel` and `put_all` run at once (boto3's pool holds 16 connections)."""


class Listed(NamedTuple):
    """An object as a listing shows it: its size in bytes and when it was written."""

    size: int
    modified: float


class ObjectMissingError(KeyError):
    """No object under that key."""


class UnsafeKeyError(ValueError):
    """A key with an empty, `.` or `..` segment, or a control character."""


def check_key(key: str) -> str:
    """`key` unchanged when every segment is a plain name; raises `UnsafeKeyError`."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in key):
        raise UnsafeKeyError(f"key {key!r} holds a control character")
    if not key:
        return key  # the whole store, when listing
    segments = key.split("/")
    inner = segments[:-1] if key.endswith("/") else segments  # a prefix may end with '/'
    if any(segment in {"", ".", ".."} for segment in inner):
        raise UnsafeKeyError(f"key {key!r} has an empty, '.' or '..' segment")
    return key


def key_segment(value: str | None, fallback: str) -> str:
    """`value` as one safe key segment: anything but letters, digits and `-_.:@+=,` is
    percent-encoded, and a segment of dots only has them all encoded, so `..` stays a name."""
    text = (value or "").strip().strip("/").replace("/", "_")  # the report sink's convention
    if not text:
        return fallback
    raw = text.encode("utf-8", errors="surrogateescape")
    encoded = "".join(chr(b) if chr(b) in _SAFE else f"%{b:02X}" for b in raw)
    if set(encoded) == {"."}:
        return "%2E" * len(encoded)
    return encoded


@runtime_checkable
class ObjectStore(Protocol):
    """Write-once object storage under one bucket and prefix."""

    def put_once(self, key: str, body: bytes, content_type: str = ...) -> bool:
        """Store `body` unless `key` exists; True when this call wrote it."""
        ...

    def get(self, key: str) -> bytes:
        """The object's bytes; raises `ObjectMissingError`."""
        ...

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int:
        """The object's length in bytes, without reading it; raises `ObjectMissingError`."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object (no error when it is not there)."""
        ...

    def modified(self, key: str) -> float:
        """When the object was written (seconds since the epoch); raises `ObjectMissingError`."""
        ...

    def keys(self, prefix: str) -> list[str]:
        """Keys under `prefix` (relative to the store's own prefix), sorted."""
        ...

    def listing(self, prefix: str) -> dict[str, Listed]:
        """Every key under `prefix` with its size and write time, from one listing."""
        ...

    def uri(self, key: str) -> str:
        """The s3:// URI (or memory:// for the fake) of a key."""
        ...


class MemoryStore:
    """The in-memory fake: same semantics, one process."""

    def __init__(self, bucket: str = "rlhealth", prefix: str = "") -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.objects: dict[str, bytes] = {}
        self.written_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def check(self, client: Any | None = None, *, create: bool = False) -> None:
        """Always reachable."""

    def put_once(self, key: str, body: bytes, content_type: str = BINARY) -> bool:
        check_key(key)
        with self._lock:
            if key in self.objects:
                return False
            self.objects[key] = bytes(body)
            self.written_at[key] = time.time()
            return True

    def get(self, key: str) -> bytes:
        try:
            return self.objects[key]
        except KeyError:
            raise ObjectMissingError(key) from None

    def exists(self, key: str) -> bool:
        return key in self.objects

    def size(self, key: str) -> int:
        return len(self.get(key))

    def modified(self, key: str) -> float:
        self.get(key)
        return self.written_at.get(key, 0.0)  # 0: set in `objects` by hand, as old as can be

    def delete(self, key: str) -> None:
        with self._lock:
            self.objects.pop(check_key(key), None)
            self.written_at.pop(key, None)

    def keys(self, prefix: str) -> list[str]:
        return sorted(key for key in self.objects if key.startswith(prefix))

    def listing(self, prefix: str) -> dict[str, Listed]:
        with self._lock:
            found = [(k, v) for k, v in self.objects.items() if k.startswith(prefix)]
            return {k: Listed(len(v), self.written_at.get(k, 0.0)) for k, v in sorted(found)}

    def uri(self, key: str) -> str:
        full = f"{self.prefix}/{key}" if self.prefix else key
        return f"memory://{self.bucket}/{full}"


def _retrying(call: Callable[[], T]) -> T:
    """Run `call`, retrying infrastructure faults with jittered backoff (at most 5 tries, about
    20 s: the task above retries longer, outside its time limit)."""
    wrapped = retry(
        retry=retry_if_exception(is_infrastructure),
        stop=stop_after_attempt(5) | stop_after_delay(20),
        wait=wait_exponential_jitter(multiplier=0.2, max=4),
        reraise=True,
    )(call)
    try:
        return wrapped()
    except Exception as exc:
        if is_infrastructure(exc):
            raise InfrastructureError(describe(exc)) from exc
        raise


def _error_code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class S3Store:
    """S3 (or MinIO, or moto's server) through boto3."""

    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_once(self, key: str, body: bytes, content_type: str = BINARY) -> bool:
        def put() -> bool:
            try:
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=self._key(key),
                    Body=body,
                    ContentType=content_type,
                    IfNoneMatch="*",
                )
            except botocore.exceptions.ClientError as exc:
                # 412: already written (by us, on an earlier run); 409: a concurrent conditional
                # write of the same key is in progress, which S3 resolves in favour of the other.
                if _error_code(exc) in {"PreconditionFailed", "ConditionalRequestConflict"}:
                    return False
                raise
            return True

        return _retrying(put)

    def get(self, key: str) -> bytes:
        def get() -> bytes:
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            except botocore.exceptions.ClientError as exc:
                if _error_code(exc) in {"NoSuchKey", "404"}:
                    raise ObjectMissingError(key) from exc
                raise
            body: bytes = response["Body"].read()
            return body

        return _retrying(get)

    def exists(self, key: str) -> bool:
        def head() -> bool:
            try:
                self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            except botocore.exceptions.ClientError as exc:
                if _error_code(exc) in {"NoSuchKey", "404", "NotFound"}:
                    return False
                raise
            return True

        return _retrying(head)

    def size(self, key: str) -> int:
        return int(self._head(key)["ContentLength"])

    def modified(self, key: str) -> float:
        return float(self._head(key)["LastModified"].timestamp())

    def _head(self, key: str) -> dict[str, Any]:
        """The object's metadata (HEAD); raises `ObjectMissingError`."""

        def head() -> dict[str, Any]:
            try:
                return dict(self.client.head_object(Bucket=self.bucket, Key=self._key(key)))
            except botocore.exceptions.ClientError as exc:
                if _error_code(exc) in {"NoSuchKey", "404", "NotFound"}:
                    raise ObjectMissingError(key) from exc
                raise

        return _retrying(head)

    def delete(self, key: str) -> None:
        def delete() -> None:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

        _retrying(delete)

    def keys(self, prefix: str) -> list[str]:
        def list_keys() -> list[str]:
            paginator = self.client.get_paginator("list_objects_v2")
            strip = len(self._key(""))
            found: list[str] = []
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
                found.extend(item["Key"][strip:] for item in page.get("Contents", []))
            return sorted(found)

        return _retrying(list_keys)

    def listing(self, prefix: str) -> dict[str, Listed]:
        def list_objects() -> dict[str, Listed]:
            paginator = self.client.get_paginator("list_objects_v2")
            strip = len(self._key(""))
            found: dict[str, Listed] = {}
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
                for item in page.get("Contents", []):
                    written = float(item["LastModified"].timestamp())
                    found[item["Key"][strip:]] = Listed(int(item["Size"]), written)
            return dict(sorted(found.items()))

        return _retrying(list_objects)

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def ensure_bucket(self) -> None:
        """Create the bucket when it does not exist (local set-ups: moto, MinIO)."""

        def create() -> None:
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except botocore.exceptions.ClientError:
                self.client.create_bucket(Bucket=self.bucket)

        _retrying(create)

    def check(self, client: Any | None = None, *, create: bool = False) -> None:
        """One HEAD of the bucket, without retries (through `client`, e.g. one with short
        timeouts and a single attempt: `worker.cli.dependencies`); `create` makes a missing
        bucket (local set-ups). Raises botocore's exceptions as they come."""
        head = client or self.client
        try:
            head.head_bucket(Bucket=self.bucket)
        except botocore.exceptions.ClientError as exc:
            if not (create and _error_code(exc) in {"404", "NoSuchBucket", "NotFound"}):
                raise
            head.create_bucket(Bucket=self.bucket)


def store_from_settings(settings: Settings | None = None) -> S3Store:
    """The S3 store named by RLHEALTH_S3_ENDPOINT_URL, RLHEALTH_S3_BUCKET and RLHEALTH_S3_PREFIX."""
    settings = settings or Settings()
    config = Config(
        retries={"mode": "standard", "max_attempts": 3},
        connect_timeout=5,
        read_timeout=30,
        max_pool_connections=16,
    )
    client = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, config=config)
    return S3Store(client, settings.s3_bucket, settings.s3_prefix)


def in_parallel(calls: Sequence[Callable[[], T]], threads: int = PUT_THREADS) -> list[T]:
    """Run `calls` (requests whose order does not matter), up to `threads` at once; their
    results in order. Every call has ended when this returns; the first failure is raised then."""
    if len(calls) < 2:
        return [call() for call in calls]
    with ThreadPoolExecutor(max_workers=min(threads, len(calls))) as pool:
        futures = [pool.submit(call) for call in calls]
    return [future.result() for future in futures]


def put_all(
    store: ObjectStore, items: Sequence[tuple[str, bytes | Path]], content_type: str = BINARY
) -> list[bool]:
    """`put_once` each `(key, body or file)`, up to PUT_THREADS at once, for objects whose order
    does not matter (a file is read by the thread that sends it); returns what each call
    returned. Every upload has ended when this returns; the first failure is raised then."""

    def put(key: str, body: bytes | Path) -> Callable[[], bool]:
        def call() -> bool:
            data = body.read_bytes() if isinstance(body, Path) else body
            return store.put_once(key, data, content_type)

        return call

    return in_parallel([put(key, body) for key, body in items])


def download_prefix(store: ObjectStore, prefix: str, directory: Path) -> list[Path]:
    """Copy every object under `prefix` into `directory`, keeping the relative layout."""
    written: list[Path] = []
    for key in store.keys(prefix):
        target = directory / key[len(prefix) :].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(store.get(key))
        written.append(target)
    return written


def upload_directory(store: ObjectStore, directory: Path, prefix: str) -> list[str]:
    """put_once every file under `directory` at `prefix/<relative path>`; returns the keys."""
    keys: list[str] = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        key = f"{prefix.rstrip('/')}/{path.relative_to(directory).as_posix()}"
        store.put_once(key, path.read_bytes())
        keys.append(key)
    return keys
