"""`worker.pipeline.gcwarm`: a pool child's long-lived objects frozen out of full collections."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from worker.pipeline import gcwarm


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    kept = list(gcwarm.FREEZES)
    gcwarm.FREEZES.clear()
    yield
    gc.unfreeze()
    gcwarm.FREEZES[:] = kept


def test_a_child_start_freezes_what_is_alive() -> None:
    alive = _Node()
    gcwarm._child_started()
    assert gc.get_freeze_count() > 0 and gcwarm.FREEZES == ["at the child's start"]
    assert all(obj is not alive for obj in gc.get_objects())  # frozen: no collection walks it


def test_garbage_at_the_moment_is_collected_not_frozen() -> None:
    dropped = _Node()
    gone = weakref.ref(dropped)
    del dropped
    gcwarm.freeze_survivors("test")
    assert gone() is None


def test_garbage_made_after_a_freeze_is_still_collected() -> None:
    gcwarm.freeze_survivors("test")
    later = _Node()
    gone = weakref.ref(later)
    del later
    gc.collect()
    assert gone() is None


def test_only_the_first_task_freezes() -> None:
    """The end of the first task freezes once; later tasks add nothing.

    The frozen count may fall (a frozen object freed by its last reference leaves the permanent
    generation; CI saw 5 go from another test's leftovers) but must not grow, and objects made
    after the first freeze stay where collections see them."""
    gcwarm._task_finished()
    count = gc.get_freeze_count()
    assert gcwarm.FREEZES == ["after its first task"]
    kept = [_Node() for _ in range(100)]
    gcwarm._task_finished()
    assert gcwarm.FREEZES == ["after its first task"]
    assert gc.get_freeze_count() <= count and all(obj in gc.get_objects() for obj in kept[:3])
