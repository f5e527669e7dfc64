"""`rl-health check`: are the pipeline's dependencies there? The on-call engineer's first command.

One line per dependency on stdout — Redis (RLHEALTH_REDIS_URL), S3 (RLHEALTH_S3_ENDPOINT_URL and
RLHEALTH_S3_BUCKET, with the AWS credentials) and the verdict key (RLHEALTH_VERDICT_KEY or
RLHEALTH_VERDICT_KEY_FILE) — saying `ok` or what is wrong, each reached as every pipeline command
reaches it (`worker.cli.dependencies`). Exit 0 when all are usable, 2 otherwise. `--wait SECONDS`
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
    """Check that Redis, S3 and the verdict key are usable; one line each, exit 2 if one is not."""
    settings = load_settings()
    deadline = time.monotonic() + wait_s
    found = _round(settings)
    while not all(ok for ok, _line in found) and time.monotonic() + _AGAIN_S < deadline:
        time.sleep(_AGAIN_S)
        found = _round(settings)
    for _ok, line in found:
        click.echo(line)
    failed = sum(1 for ok, _line in found if not ok)
    if failed:
        raise UnusableError(f"{failed} dependency(ies) not usable (see above)")
