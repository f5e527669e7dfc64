"""`rl-health sweep`: the retention of the pipeline's frozen evidence in S3.

It runs `worker.pipeline.parts.sweep` (the rule is `worker.retention`'s): the frozen evidence of
a diagnosis (`evidence/<id>/`) whose `evidence.json` was written more than `--keep` ago is
deleted, then every shared table part (`evidence-parts/<job>/...`) that no kept evidence
references and that is older than `--grace` (a younger one may belong to a capture still under
way). `--dry-run` prints the same lines without deleting anything.

One line per deletion on stdout (`deleted evidence <uri>`, `deleted part <uri>`; `would delete`
with --dry-run), a summary and any note on stderr. Exit 0 when the sweep ran (whether or not it
deleted anything); 1 when S3 could not be reached or failed midway (run it again: a sweep
deletes each evidence's `evidence.json` first, so nothing is left half-kept); 2 for an unusable
argument or setting, or when S3 cannot be reached at all (checked first: one line naming the
endpoint and bucket, or the missing credentials). Connections come from settings
(RLHEALTH_S3_*), like every pipeline command.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Any, Final

import click

from worker.cli.options import load_settings

if TYPE_CHECKING:
    from worker.pipeline.parts import Swept
    from worker.pipeline.store import Listed, ObjectStore

__all__ = ["DURATION", "DryRunStore", "sweep_command"]

_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class Duration(click.ParamType[float]):
    """A positive duration with a unit: `90s`, `45m`, `6h`, `30d`, `2w`; in seconds."""

    name = "DURATION"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        match = _DURATION.match(str(value))
        seconds = float(match.group(1)) * _UNIT_S[match.group(2).lower()] if match else 0.0
        if seconds <= 0:
            self.fail(f"{value!r} is not a positive duration (e.g. 30d, 6h, 45m, 90s)", param, ctx)
        return seconds


DURATION = Duration()


class DryRunStore:
    """An object store that reads through to `store` and deletes nothing: the sweep run on it
    reports what it would delete."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def put_once(self, key: str, body: bytes, content_type: str = "") -> bool:
        raise RuntimeError("a dry run writes nothing")

    def get(self, key: str) -> bytes:
        return self.store.get(key)

    def exists(self, key: str) -> bool:
        return self.store.exists(key)

    def size(self, key: str) -> int:
        return self.store.size(key)

    def delete(self, key: str) -> None:
        """Nothing is deleted."""

    def modified(self, key: str) -> float:
        return self.store.modified(key)

    def keys(self, prefix: str) -> list[str]:
        return self.store.keys(prefix)

    def listing(self, prefix: str) -> dict[str, Listed]:
        return self.store.listing(prefix)

    def uri(self, key: str) -> str:
        return self.store.uri(key)


@click.command("sweep")
@click.option(
    "--keep",
    type=DURATION,
    required=True,
    help="Delete the frozen evidence of diagnoses judged longer ago than this (30d, 12h, ...).",
)
@click.option(
    "--grace",
    type=DURATION,
    default="6h",
    show_default=True,
    help="Delete an unreferenced table part only once it is this old (a capture under way may "
    "have written it).",
)
@click.option("--dry-run", is_flag=True, help="Print what would be deleted; delete nothing.")
def sweep_command(keep: float, grace: float, dry_run: bool) -> None:
    """Delete frozen evidence older than --keep, and table parts no kept evidence uses."""
    settings = load_settings()  # exit 2 with one line for an unusable setting
    from worker.cli.dependencies import reach_s3
    from worker.pipeline.failures import describe, is_infrastructure
    from worker.pipeline.parts import sweep

    store = reach_s3(settings)  # exit 2 with one line when S3 or its credentials are unusable
    verb = "would delete" if dry_run else "deleted"
    try:
        swept = sweep(DryRunStore(store) if dry_run else store, keep_s=keep, grace_s=grace)
    except Exception as exc:
        if not is_infrastructure(exc):
            raise
        click.echo(f"rl-health: sweep stopped, S3 failed: {describe(exc)}", err=True)
        sys.exit(1)
    _print(swept, store, verb)


def _print(swept: Swept, store: ObjectStore, verb: str) -> None:
    for evidence_id in swept.evidence:
        click.echo(f"{verb} evidence {store.uri(f'evidence/{evidence_id}/')}")
    for key in swept.parts:
        click.echo(f"{verb} part {store.uri(key)}")
    for note in swept.notes:
        click.echo(f"rl-health sweep: {note}", err=True)
    click.echo(
        f"sweep: {verb} {len(swept.evidence)} frozen evidence, {len(swept.parts)} table part(s)",
        err=True,
    )
