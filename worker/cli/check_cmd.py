"""`rl-health check`: are the pipeline's dependencies there? The on-call engineer's first command.

One `ok` line on stdout per usable dependency — Redis (RLHEALTH_REDIS_URL), S3
(RLHEALTH_S3_ENDPOINT_URL and RLHEALTH_S3_BUCKET, with the AWS credentials), the verdict key
(RLHEALTH_VERDICT_KEY or RLHEALTH_VERDICT_KEY_FILE) — each reached as every pipeline command
reaches it (`worker.cli.dependencies`); those that are not usable are named in one line on stderr,
exit 2. `--wait SECONDS`
asks again until all are usable or the time is up: what a script runs after starting Redis and
S3, before the worker and ingest.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import click

from shared.settings import Settings
from worker.cli.dependencies import reach_redis, reach_s3, redis_address, s3_address
from worker.cli.options import UnusableError, load_settings, load_verdict_keys

__all__ = ["check_command"]

_AGAIN_S = 1.0


def _redis(settings: Settings) -> str:
    reach_redis(settings)
    return f"Redis at {redis_address(settings.redis_url)}: ok"


def _s3(settings: Settings) -> str:
    reach_s3(settings)
    return f"S3 {s3_address(settings)}: ok"


def _key(settings: Settings) -> str:
    ring = load_verdict_keys(settings)
    return f"verdict key: ok (signs with key id {ring.signing_id})"


CHECKS: tuple[Callable[[Settings], str], ...] = (_redis, _s3, _key)


def _round(settings: Settings) -> list[tuple[bool, str]]:
    """Each check once: (usable, its line)."""
    found = []
    for check in CHECKS:
        try:
            found.append((True, check(settings)))
        except UnusableError as exc:
            found.append((False, exc.format_message()))
    return found


@click.command("check")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=0,
    metavar="SECONDS",
    help="Ask again until every dependency is usable, up to SECONDS.",
)
def check_command(wait_s: float) -> None:
    """Check that Redis, S3 and the verdict key are usable: `ok` lines on stdout; one line on
    stderr naming what is not, exit 2."""
    settings = load_settings()
    deadline = time.monotonic() + wait_s
    found = _round(settings)
    while not all(ok for ok, _line in found) and time.monotonic() + _AGAIN_S < deadline:
        time.sleep(_AGAIN_S)
        found = _round(settings)
    for ok, line in found:
        if ok:
            click.echo(line)
    failed = [line for ok, line in found if not ok]
    if failed:  # one line on stderr, naming each dependency that is not usable
        raise UnusableError("; ".join(failed))
