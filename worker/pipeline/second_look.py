"""The second look's adapters: the job seen again (bundle re-read, live probes with stacks), frozen
under S3 `evidence/<id>/second_look/`, and read back, so a replay judges the same two looks.

The comparison itself is pure (`worker.second_look`); here are only I/O and the settings:

- `observe_again` reads the bundle again as of now, and probes the job through the capture
  policy's `capture_live` with the backend the event may choose (`choose_backend`), stacks forced.
  A refused backend, no live backend, or a bundle that cannot be read leaves the evidence without
  probes (or without logs): the comparison then answers "blind".
- `freeze_look` writes `look.json` (how long the look waited), then the frozen evidence, its
  marker `evidence.json` last; `thaw_look` reads both back.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from shared.models import Event
from shared.settings import Settings
from worker.backends import Toolbox
from worker.backends.base import Runner
from worker.capture_policy import BackendChoiceError, choose_backend
from worker.diagnosis import collect_evidence
from worker.evidence.case import Evidence
from worker.evidence.frozen import MARKER, freeze, thaw
from worker.evidence.log_cache import LogCache
from worker.evidence.probes import read_probes
from worker.pipeline.capture import CaptureBudget, capture_live
from worker.pipeline.logcache import collect_cached
from worker.pipeline.store import ObjectStore, download_prefix

__all__ = ["LOOK_DIR", "Live", "freeze_look", "look_prefix", "observe_again", "thaw_look"]

LOOK_DIR: Final = "second_look/"
META: Final = "look.json"
NO_BACKEND: Final = (
    "no live backend enabled (RLHEALTH_BACKEND=none): the second look cannot take stacks"
)


def look_prefix(evidence_prefix: str) -> str:
    """Where the second look of the evidence at `evidence_prefix` is frozen."""
    return evidence_prefix + LOOK_DIR


def _now() -> datetime:
    return datetime.now(UTC)


@dataclasses.dataclass(frozen=True)
class Live:
    """How the second look probes: the capture's clock, runner, tools, sleep (tests fake them)."""

    clock: Callable[[], datetime] = _now
    runner: Runner | None = None
    tools: Toolbox | None = None
    sleep: Callable[[float], None] = time.sleep
    budget_s: float | None = None  # RLHEALTH_CAPTURE_BUDGET_S, as the capture has


def can_probe(event: Event, settings: Settings) -> bool:
    """Whether a second look could take stacks at all (a backend the event may use)."""
    try:
        return choose_backend(event.backend, settings) is not None
    except BackendChoiceError:
        return False


def _probe(
    bundle: Evidence, event: Event, settings: Settings, out_dir: Path, live: Live
) -> tuple[Path | None, tuple[str, ...]]:
    """The live probes of the second look (stacks forced), or why there are none."""
    try:
        backend = choose_backend(event.backend, settings)
    except BackendChoiceError as exc:
        return None, (f"live probes refused: {exc}",)
    if backend is None:
        return None, (NO_BACKEND,)
    return capture_live(
        bundle,
        backend,
        out_dir,
        settings,
        clock=live.clock,
        runner=live.runner,
        tools=live.tools,
        sleep=live.sleep,
        budget=None if live.budget_s is None else CaptureBudget(live.budget_s),
        force_stacks=True,
    )


def observe_again(
    event: Event,
    first: Evidence,
    settings: Settings,
    live: Live = Live(),
    store: ObjectStore | None = None,
) -> Evidence:
    """The job as the second look sees it: the bundle read again as of now (never before the
    first look), with one more pair of live stacks; labelled as `first`'s `second_look/`. With
    `store`, the logs are read through the job's log cache (only what they gained since)."""
    live = live or Live()
    now = max(live.clock(), first.now)
    label = first.job_dir.rstrip("/") + "/" + LOOK_DIR

    def read(cache: LogCache | None) -> Evidence:
        return collect_evidence(
            settings.bundle_root / event.job_dir,
            now=now,
            mode=event.mode,
            thresholds=first.thresholds,
            evidence_label=label,
            log_cache=cache,
        )

    bundle = read(None) if store is None else collect_cached(settings, store, event.job_dir, read)
    with tempfile.TemporaryDirectory(prefix="rlhealth-look-") as tmp:
        directory, notes = _probe(bundle, event, settings, Path(tmp) / "probes", live)
        probes = read_probes(directory) if directory is not None else None
    failed = tuple(f"probe failed: {f}" for f in probes.failures) if probes else ()
    found = (*bundle.discrepancies, *notes, *failed)
    return dataclasses.replace(bundle, probes=probes, discrepancies=tuple(dict.fromkeys(found)))


def freeze_look(store: ObjectStore, prefix: str, second: Evidence, waited_s: float) -> None:
    """Freeze the second observation under `prefix` (`look.json` first, the marker last)."""
    meta = json.dumps({"waited_s": waited_s}).encode()
    store.put_once(prefix + META, meta, "application/json")
    with tempfile.TemporaryDirectory(prefix="rlhealth-look-") as tmp:
        directory = Path(tmp)
        for path in freeze(second, directory):
            store.put_once(prefix + path.relative_to(directory).as_posix(), path.read_bytes())


def thaw_look(store: ObjectStore, prefix: str) -> tuple[Evidence, float] | None:
    """The frozen second observation and how long it waited; None when none is frozen whole."""
    if not store.exists(prefix + MARKER):
        return None
    with tempfile.TemporaryDirectory(prefix="rlhealth-look-") as tmp:
        directory = Path(tmp)
        download_prefix(store, prefix, directory)
        meta = json.loads((directory / META).read_bytes())
        return thaw(directory), float(meta["waited_s"])
