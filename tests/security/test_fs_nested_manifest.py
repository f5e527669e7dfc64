"""Issue 28, a low item: a deeply nested manifest of the shared log cache.

`json.loads` of a manifest nested a hundred thousand levels deep raised `RecursionError`, which
the capture noted and went on, leaving the manifest in S3: every capture of the job fetched it
again. Now a manifest is read with a bound on its depth (`_MANIFEST_DEPTH`, 8: a real one nests
3), refused like any malformed one, and deleted, so no worker fetches it again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_pipeline_logcache import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_a_manifest_nested_beyond_recursion_is_refused_and_deleted(world: World) -> None:
    """A manifest nested 100,000 levels deep is refused with a note and deleted from S3, and
    the logs are read whole."""
    depth = 100_000
    bad = world.replace_archive(b'{"format": 2, "entries": ' + b"[" * depth + b"]" * depth + b"}")
    evidence, run = world.capture()
    assert bad not in world.store.keys("")
    assert any("ignored the shared log cache" in note for note in run.notes), run.notes
    assert evidence.logs is not None and not evidence.logs.metrics.is_empty()


@pytest.mark.parametrize(("lists", "used"), [(7, True), (8, False)])
def test_a_manifest_is_read_within_the_depth_bound(world: World, lists: int, used: bool) -> None:
    """A worker's real manifest with a field of 7 nested lists (8 levels in all) is read by a
    cold worker; with 8 lists it is refused and deleted."""
    world.capture("w1")
    manifest = json.loads(world.store.get(world.archives()[-1]))
    manifest["x"] = json.loads("[" * lists + "]" * lists)
    key = world.replace_archive(json.dumps(manifest).encode())
    _, run = world.capture("w2")
    assert (run.origin == "s3") is used, run.notes
    assert (key in world.store.keys("")) is used
