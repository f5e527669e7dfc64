"""The files one event's walk touches, from intake to publish, counted as it runs.

    python -m bench.event_walk [--list]

One job bundle (`testkit.bundles`), fakeredis and the in-memory store: an alert published, ingest
takes it, then the pipeline's steps run in this process as the tasks would call them: capture,
every gate, the verdict, publish. Every module is imported first, so what is counted is the
project's files (`shared/`, `worker/`, `reports/`) whose functions ran, for the whole walk and for
the capture step alone, and the caller → callee pairs of files where a lower room called a higher
one (a callback handed down, or a subclass a lower room calls into).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ROOMS = (
    "worker/cli",
    "worker/pipeline",
    "worker/backends",
    "reports",
    "worker/diagnosis",
    "worker/capture_policy",
    "worker/verdict",
    "worker/second_look",
    "worker/mode",
    "worker/retention",
    "worker/gates",
    "worker/evidence",
    "shared",
)


def _room(path: str) -> int:
    return next((i for i, room in enumerate(ROOMS) if path.startswith(room)), len(ROOMS))


def _project_file(filename: str) -> str | None:
    try:
        relative = Path(filename).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    return relative if relative.split("/")[0] in {"worker", "shared", "reports"} else None


class Trace:
    """The project files whose functions ran, and the calls that climbed back up the rooms."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.climbs: set[tuple[str, str]] = set()

    def __call__(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or frame.f_code.co_name == "<module>":
            return
        callee = _project_file(frame.f_code.co_filename)
        if callee is None:
            return
        self.files.add(callee)
        back = frame.f_back
        while back is not None and _project_file(back.f_code.co_filename) is None:
            back = back.f_back
        caller = _project_file(back.f_code.co_filename) if back is not None else None
        if caller is not None and caller != callee and _room(callee) < _room(caller):
            self.climbs.add((caller, callee))

    def __enter__(self) -> Trace:
        sys.setprofile(self)
        threading.setprofile(self)  # type: ignore[arg-type]
        return self

    def __exit__(self, *_: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def walk() -> tuple[Trace, Trace]:
    """(the whole walk, the capture alone)."""
    from testkit.keys import TEST_KEY

    os.environ["RLHEALTH_VERDICT_KEY"] = TEST_KEY
    import fakeredis

    import worker.pipeline.tasks  # noqa: F401  (every module imported before the walk)
    from shared.alerts import publish_alert
    from shared.settings import Settings
    from testkit.bundles import write_job_bundle
    from worker.pipeline import steps
    from worker.pipeline.ingest import Ingest
    from worker.pipeline.store import MemoryStore

    tmp = Path(tempfile.mkdtemp(prefix="rlhealth-walk-"))
    write_job_bundle(tmp / "bundles", "rl-job")
    settings = Settings(bundle_root=tmp / "bundles", stream_prefix="t", cache_dir=tmp / "cache")
    client = fakeredis.FakeRedis()
    pipeline = steps.Pipeline(settings, MemoryStore(), client)
    started: list[tuple[str, str]] = []
    ingest = Ingest(pipeline, lambda lead, job: started.append((lead, job)), consumer="c1")
    ingest.ensure_group()
    publish_alert(client, "jobs/cw/ops/rl-job", reason="walk", settings=settings)
    whole, capture = Trace(), Trace()
    with whole:
        ingest.step()
    lead, job = started[0]
    with capture:
        pipeline.capture(lead, lead, claim="walk")
    with whole:
        results = [pipeline.gate(lead, name) for name in steps.GATE_NAMES]
        plan = pipeline.plan_verdict(results, lead, lead)
        pipeline.publisher.publish(plan["entry"], job)
    whole.files |= capture.files
    whole.climbs |= capture.climbs
    return whole, capture


def _show(name: str, trace: Trace, listed: bool) -> None:
    pipeline = sorted(f for f in trace.files if f.startswith("worker/pipeline/"))
    print(
        f"{name}: {len(trace.files)} files, {len(pipeline)} of them in worker/pipeline; "
        f"{len(trace.climbs)} calls back up the rooms"
    )
    print("  worker/pipeline:", " ".join(f.removeprefix("worker/pipeline/") for f in pipeline))
    for caller, callee in sorted(trace.climbs):
        print(f"  up: {caller} -> {callee}")
    if listed:
        print("\n".join(f"    {f}" for f in sorted(trace.files)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list every file touched")
    args = parser.parse_args()
    whole, capture = walk()
    _show("walk (ingest → capture → gates → verdict → publish)", whole, args.list)
    _show("capture alone", capture, args.list)


if __name__ == "__main__":
    main()
