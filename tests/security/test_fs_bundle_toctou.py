"""Issue 28, Medium 6: a bundle file swapped for a symlink between the path check and the open.

The job's author can change their files while a diagnosis runs: a finelog checked to lie inside
the job directory, then swapped for a symlink to a file elsewhere, was read (5 of 12 racy runs):
a line of the outside file became the kill proof while the same report listed the path as
refused. Here the swap is made at the worst moment, every time. Now a bundle file is opened
beneath the job directory's descriptor, one component at a time with O_NOFOLLOW, and checked with
fstat: the check and the read are one act.
"""

from __future__ import annotations

from pathlib import Path, PurePath
from typing import Any

import pytest

from tests.unit.test_pipeline_logcache import NOW, World
from worker.diagnosis import collect_evidence
from worker.evidence.logs import budget
from worker.evidence.paths import BundleFiles

OUTSIDE_KEY = "policy/outside_only_metric"
OUTSIDE = (
    "(skyrl_entrypoint pid=1) 2026-03-27 11:00:00.000 | INFO     | skyrl.train.trainer:train:320"
    " - {'outside_only_metric': 4242.0}\n"
)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _swap_for_a_symlink(log: Path, outside: Path) -> None:
    """Replace `log` by a symlink to `outside` (once; later calls leave it)."""
    if not log.is_symlink():
        log.unlink()
        log.symlink_to(outside)


def test_a_finelog_swapped_after_it_was_listed_is_not_read(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finelog is swapped for a symlink to a log outside the job between its listing and
    its read: nothing of the outside log is in the evidence, and the report says the finelog
    was refused."""
    outside = world.tmp / "outside.log"
    outside.write_text(OUTSIDE * 50)
    original = budget.ParseBudget.for_logs.__func__  # type: ignore[attr-defined]

    def swapping(cls: type[budget.ParseBudget], *args: Any, **kwargs: Any) -> Any:
        _swap_for_a_symlink(world.log, outside)  # listed and sized already; read next
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(budget.ParseBudget, "for_logs", classmethod(swapping))
    evidence = collect_evidence(world.job, now=NOW)
    assert world.log.is_symlink(), "the swap never happened: the test would prove nothing"
    keys = evidence.logs.metrics["key"].to_list() if evidence.logs is not None else []
    assert OUTSIDE_KEY not in keys
    assert any("finelog.log" in note and "refused" in note for note in evidence.discrepancies)


def test_the_open_itself_refuses_a_symlink_put_after_the_check(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`BundleFiles.open` checks the path, then opens it beneath the root's descriptor: a swap
    between the two is refused by the open (O_NOFOLLOW), with the path named, never read."""
    from shared import safefs

    outside = world.tmp / "outside.log"
    outside.write_text(OUTSIDE)
    original = safefs.Beneath.open

    def swapped_first(self: safefs.Beneath, relative: Any) -> Any:
        _swap_for_a_symlink(world.log, outside)
        return original(self, relative)

    monkeypatch.setattr(safefs.Beneath, "open", swapped_first)
    files = BundleFiles(world.job)
    assert files.open("finelog.log") is None
    assert files.refused == ["refused 'finelog.log': a symlink stands on its way"]


def test_a_directory_on_the_way_swapped_for_a_symlink_is_refused(world: World) -> None:
    """A directory between the root and the file, swapped for a symlink once the root is held,
    is refused by the open too (every component is opened without following)."""
    from shared.safefs import Beneath

    pods = world.job / "pod_logs"
    pods.mkdir()
    (pods / "rank-0.log").write_text("inside\n")
    elsewhere = world.tmp / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "rank-0.log").write_text(OUTSIDE)
    root = Beneath(world.job)
    with root.open(PurePath("pod_logs/rank-0.log")) as handle:
        assert handle.read() == b"inside\n"
    pods.rename(world.job / "pods-old")
    pods.symlink_to(elsewhere)
    with pytest.raises(ValueError, match="a symlink stands on its way"):
        root.open(PurePath("pod_logs/rank-0.log"))


def test_a_fifo_in_place_of_a_log_is_refused_without_blocking(world: World) -> None:
    """A named pipe where a file should be is refused (fstat: not a regular file), and opening
    it does not wait for a writer."""
    import os

    os.mkfifo(world.job / "stuck.json")
    files = BundleFiles(world.job)
    assert files.open("stuck.json") is None
    assert files.refused == ["refused 'stuck.json': it is not a regular file"]
