"""Redis and S3 as the commands reach them: at once, or one line on stderr and exit 2.

A command that needs Redis or S3 reaches it before anything else (`reach_redis`, `reach_s3`): a
PING, a HEAD of the bucket, each with a short timeout and no retry, so a dependency that is down,
credentials that are missing or refused, or a bucket that does not exist stop the command within
seconds with one line naming the setting and the address (never a password), exit 2. A
dependency that fails later, mid-command, is named the same way by `dependency_failure`, which
`worker.cli.main` applies to whatever escapes a command. `--debug` (or RLHEALTH_DEBUG=1) adds the
traceback to that line.

The timeouts add up to well under the 15 s an operator waits for the line: a connection attempt
of `CONNECT_TIMEOUT_S`, an answer within `READ_TIMEOUT_S`, once. A service that *refuses* the
connection is asked again for up to `STARTING_S`: it may be starting beside the command; a
time-out, a refused credential or an unknown host is not asked again. A script that has just
started Redis or S3 waits for them with `rl-health check --wait SECONDS`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from shared.redact import escape_controls, redact_text
from shared.settings import Settings
from worker.cli.options import UnusableError

if TYPE_CHECKING:
    from worker.pipeline.store import S3Store

__all__ = [
    "CONNECT_TIMEOUT_S",
    "READ_TIMEOUT_S",
    "STARTING_S",
    "DependencyError",
    "dependency_failure",
    "reach_redis",
    "reach_s3",
    "redis_address",
    "redis_client",
    "s3_address",
]

CONNECT_TIMEOUT_S: Final = 3.0
READ_TIMEOUT_S: Final = 5.0
STARTING_S: Final = 2.0  # how long a service refusing connections may be starting
_AGAIN_S: Final = 0.25
_REDIS_SETTING: Final = "RLHEALTH_REDIS_URL"
_CREDENTIAL_WORDS: Final = ("NOAUTH", "WRONGPASS", "NOPERM", "invalid password", "invalid username")
_REFUSED_S3: Final = frozenset(
    {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "InvalidToken"}
)
_NO_BUCKET: Final = frozenset({"NoSuchBucket", "404", "NotFound"})
_CHAIN_DEPTH: Final = 10


class DependencyError(UnusableError):
    """Redis, S3 or their credentials cannot be used: one line on stderr, exit 2."""


def _reason(exc: BaseException) -> str:
    """The first line of an exception's message, redacted and escaped (a URL in it may carry a
    password; a line of it must not forge another)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return escape_controls(redact_text(text)).rstrip(".")


def redis_address(url: str) -> str:
    """Where a Redis URL points, without its credentials: `host:port/db` or the socket path."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    try:
        port = parts.port or 6379
    except ValueError:
        port = 6379
    db = parts.path.strip("/") or "0"
    return f"{parts.hostname}:{port}/{db}"


def s3_address(settings: Settings) -> str:
    """The S3 endpoint and bucket, as an operator finds them in the settings."""
    where = settings.s3_endpoint_url or "AWS's default endpoint"
    return f"bucket {settings.s3_bucket} at {where}"


def redis_client(settings: Settings) -> Any:
    """The command's Redis client: connection attempts and answers bounded in time."""
    import redis

    return redis.Redis.from_url(
        settings.redis_url,
        health_check_interval=30,
        socket_connect_timeout=CONNECT_TIMEOUT_S + 2,
        socket_timeout=READ_TIMEOUT_S + 5,  # above the 1 s blocking reads of the stream readers
    )


def reach_redis(settings: Settings) -> Any:
    """`redis_client(settings)` once a PING answered (one try, short timeouts); otherwise
    `DependencyError` naming RLHEALTH_REDIS_URL and the address."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    probe = redis.Redis.from_url(
        settings.redis_url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=READ_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        _while_starting(probe.ping)
    except redis.RedisError as exc:
        raise DependencyError(_redis_message(exc, settings)) from exc
    finally:
        probe.close()
    return redis_client(settings)


def _refused(exc: BaseException) -> bool:
    """A connection refused: nothing listens there (yet)."""
    return any(isinstance(e, ConnectionRefusedError) for e in _chain(exc)) or (
        "connection refused" in str(exc).lower()
    )


def _while_starting(call: Callable[[], object]) -> None:
    """`call()`, asked again while the service refuses connections, for up to STARTING_S."""
    deadline = time.monotonic() + STARTING_S
    while True:
        try:
            call()
            return
        except Exception as exc:
            if not _refused(exc) or time.monotonic() + _AGAIN_S > deadline:
                raise
        time.sleep(_AGAIN_S)


def _redis_message(exc: BaseException, settings: Settings) -> str:
    where = f"Redis at {redis_address(settings.redis_url)} ({_REDIS_SETTING})"
    if _refused_credentials(exc):
        return f"{where} refused the credentials: {_reason(exc)}"
    return f"{where} cannot be reached: {_reason(exc)}"


def _refused_credentials(exc: BaseException) -> bool:
    import redis

    if isinstance(exc, redis.AuthenticationError):
        return True
    return any(word.lower() in str(exc).lower() for word in _CREDENTIAL_WORDS)


def _quick_s3_client(settings: Settings) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"mode": "standard", "max_attempts": 1},
    )
    return boto3.client("s3", endpoint_url=settings.s3_endpoint_url, config=config)


def reach_s3(settings: Settings) -> S3Store:
    """The pipeline's S3 store once a HEAD of its bucket answered (one try, short timeouts); a
    local S3 (RLHEALTH_S3_ENDPOINT_URL set: MinIO, moto) gets its bucket made on first use.
    Otherwise `DependencyError` naming the setting, the endpoint and the bucket."""
    import botocore.exceptions

    from worker.pipeline.store import store_from_settings

    store = store_from_settings(settings)
    client, create = _quick_s3_client(settings), bool(settings.s3_endpoint_url)
    try:
        _while_starting(lambda: store.check(client, create=create))
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise DependencyError(_s3_message(exc, settings)) from exc
    return store


def _s3_code(exc: Any) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _s3_message(exc: BaseException, settings: Settings) -> str:
    import botocore.exceptions as errors

    where = s3_address(settings)
    if isinstance(exc, errors.NoCredentialsError | errors.PartialCredentialsError):
        return (
            f"no usable AWS credentials for S3 ({where}): set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, an AWS profile or an instance role"
        )
    if isinstance(exc, errors.ClientError):
        code = _s3_code(exc)
        if code in _NO_BUCKET:
            return f"S3 {where}: the bucket does not exist (RLHEALTH_S3_BUCKET)"
        if code in _REFUSED_S3:
            return f"S3 {where} refused the credentials (AWS_ACCESS_KEY_ID): {code}"
        return f"S3 {where} answered {code or 'an error'}: {_reason(exc)}"
    return f"S3 {where} (RLHEALTH_S3_ENDPOINT_URL) cannot be reached: {_reason(exc)}"


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and the exceptions it was raised from or while handling, nearest first."""
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in found and len(found) < _CHAIN_DEPTH:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _redis_failed(cause: BaseException) -> bool:
    import kombu.exceptions
    import redis

    if isinstance(cause, redis.ConnectionError | redis.TimeoutError):
        return True
    if isinstance(cause, kombu.exceptions.OperationalError):  # the broker (Redis) away
        return True
    return isinstance(cause, redis.ResponseError) and _refused_credentials(cause)


def _s3_failed(cause: BaseException) -> bool:
    import botocore.exceptions as errors

    if isinstance(cause, errors.NoCredentialsError | errors.PartialCredentialsError):
        return True
    if isinstance(cause, errors.ConnectionError | errors.HTTPClientError):
        return True
    if not isinstance(cause, errors.ClientError):
        return False
    status = int(cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return status >= 500 or _s3_code(cause) in _REFUSED_S3 | _NO_BUCKET


def dependency_failure(exc: BaseException, settings: Settings | None) -> str | None:
    """One line naming the dependency that `exc` (or what it was raised from) says failed: Redis,
    the Celery broker on it, S3 or the AWS credentials; None for anything else (a bug keeps its
    traceback)."""
    for cause in _chain(exc):
        if _redis_failed(cause):
            if settings is None:
                return f"Redis ({_REDIS_SETTING}) cannot be used: {_reason(cause)}"
            return _redis_message(cause, settings)
        if _s3_failed(cause):
            if settings is None:
                return f"S3 cannot be used: {_reason(cause)}"
            return _s3_message(cause, settings)
    return None
