"""`rl-health sweep` against moto's S3 server, under a prefix of its own (the session's other
objects are never in reach): nothing goes just short of --keep and --grace, the dry run deletes
nothing, the sweep deletes the expired evidence and its unreferenced part, and an unreachable S3
exits 1."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from testkit.services import RL_HEALTH, free_port
from tests.integration.conftest import Services
from tests.unit.test_evidence_sweep import PLACE, _evidence
from worker.evidence.frozen import PARTS, freeze
from worker.pipeline.parts import stored_parts
from worker.pipeline.store import S3Store

pytestmark = pytest.mark.integration

PREFIX = "sweep-test"
WINDOW_S = 3.0  # --keep and --grace; objects are judged by S3's LastModified (whole seconds)


def _freeze(store: S3Store, tmp: Path, evidence_id: str) -> None:
    """Freeze as the pipeline's capture does: new parts to the job's place, the marker last."""
    directory = tmp / evidence_id
    evidence = _evidence(100)
    for path in freeze(evidence, directory, parts_at=PLACE, stored=stored_parts(store, PLACE)):
        relative = path.relative_to(directory)
        key = (
            PLACE + path.name
            if relative.parts[0] == PARTS
            else f"evidence/{evidence_id}/{relative.as_posix()}"
        )
        store.put_once(key, path.read_bytes())


def _sweep(services: Services, *args: str, endpoint: str | None = None) -> tuple[int, str, str]:
    env = {**services.env, "RLHEALTH_S3_PREFIX": PREFIX}
    if endpoint is not None:
        env["RLHEALTH_S3_ENDPOINT_URL"] = endpoint
    done = subprocess.run(
        [RL_HEALTH, "sweep", *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout, done.stderr


def test_sweep_on_s3(pipeline_services: Services, tmp_path: Path) -> None:
    """Just short of the windows nothing goes; just past them the dry run lists the evidence and
    its part and deletes nothing, and the sweep deletes exactly what it listed."""
    services = pipeline_services
    store = S3Store(services.store.client, services.settings.s3_bucket, PREFIX)
    sentinel = "evidence-parts/sweep-sentinel/part.parquet"  # the session's prefix: out of reach
    services.store.put_once(sentinel, b"x")
    _freeze(store, tmp_path, "old")
    written = time.time()
    keys = set(store.keys(""))
    assert any(k.startswith("evidence/old/") for k in keys) and store.keys(PLACE)
    window = f"{WINDOW_S:g}s"

    code, out, err = _sweep(services, "--keep", "1h", "--grace", window)
    assert (code, out) == (0, ""), err  # just short of --keep: nothing goes
    assert set(store.keys("")) == keys

    time.sleep(max(0.0, written + WINDOW_S + 2.0 - time.time()))  # just past both windows
    code, dry, err = _sweep(services, "--keep", window, "--grace", window, "--dry-run")
    assert code == 0, err
    assert f"would delete evidence s3://{services.settings.s3_bucket}/{PREFIX}/evidence/old/" in dry
    assert "would delete part " in dry
    assert set(store.keys("")) == keys  # a dry run deletes nothing

    code, out, err = _sweep(services, "--keep", window, "--grace", window)
    assert code == 0, err
    assert out == dry.replace("would delete", "deleted")
    assert store.keys("") == []
    assert services.store.exists(sentinel)  # under the session's own prefix: untouched
    services.store.delete(sentinel)


def test_sweep_with_s3_away_exits_2(pipeline_services: Services) -> None:
    """S3 unreachable (a closed port) from the start: one line naming the endpoint, exit 2, as
    for every dependency that cannot be reached (exit 1 stays for S3 failing midway)."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    code, _out, err = _sweep(pipeline_services, "--keep", "30d", endpoint=endpoint)
    assert code == 2, err
    (line,) = err.strip().splitlines()
    assert endpoint in line and "cannot be reached" in line
