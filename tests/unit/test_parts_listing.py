"""`StoredLater`: the stored parts listed by a thread while a freeze hashes its rows."""

from __future__ import annotations

import threading

import pytest

from worker.pipeline.parts import StoredLater, stored_parts
from worker.pipeline.store import MemoryStore

PLACE = "evidence-parts/job/"
DIGEST, SHA = "a" * 32, "b" * 64


class _SlowStore(MemoryStore):
    """A store whose listing waits for `release` (and fails when told to)."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.release = threading.Event()
        self.listed = threading.Event()
        self.fail = fail

    def keys(self, prefix: str) -> list[str]:
        assert self.release.wait(10)
        if self.fail:
            raise ConnectionError("the listing failed")
        found = super().keys(prefix)
        self.listed.set()
        return found


def _store(fail: bool = False) -> _SlowStore:
    store = _SlowStore(fail)
    store.objects[f"{PLACE}{DIGEST}-{SHA}.parquet"] = b"part"
    store.objects[f"{PLACE}not-a-part.txt"] = b"other"
    return store


def test_the_listing_runs_while_the_caller_goes_on() -> None:
    """Made, it lists in a thread: the caller is not held until it asks; then it gets what
    `stored_parts` gives."""
    store = _store()
    with StoredLater(store, PLACE) as stored:
        assert not store.listed.is_set()  # the listing waits, the caller went on
        store.release.set()
        assert dict(stored) == stored_parts(store, PLACE) == {DIGEST: SHA}
        assert DIGEST in stored and "c" * 32 not in stored and len(stored) == 1


def test_a_failed_listing_is_raised_at_the_first_lookup() -> None:
    store = _store(fail=True)
    store.release.set()
    with StoredLater(store, PLACE) as stored, pytest.raises(ConnectionError, match="listing"):
        _ = DIGEST in stored


def test_leaving_waits_for_the_listing() -> None:
    """No request outlives the capture: leaving the block waits for a listing nobody asked
    for."""
    store = _store()
    threading.Timer(0.05, store.release.set).start()
    with StoredLater(store, PLACE):
        pass
    assert store.listed.is_set()
