"""Confinement of reads to the job directory (`worker.evidence.paths`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.evidence.paths import BundleFiles, PathEscapeError, resolve_inside


@pytest.fixture
def job(tmp_path: Path) -> Path:
    root = tmp_path / "jobs" / "cw" / "ops" / "rl-job"
    (root / "pod_logs").mkdir(parents=True)
    (root / "pod_logs" / "rank-0.log").write_text("hello\n")
    (tmp_path / "secret.txt").write_text("outside\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.log").write_text("outside\n")
    return root


def test_resolve_inside_accepts_a_plain_relative_path(job: Path) -> None:
    """A path under the root resolves to the file inside it."""
    assert resolve_inside(job, "pod_logs/rank-0.log") == (job / "pod_logs/rank-0.log").resolve()


def test_resolve_inside_accepts_dotdot_that_stays_inside(job: Path) -> None:
    """`..` that comes back under the root is fine."""
    assert resolve_inside(job, "pod_logs/../pod_logs/rank-0.log").name == "rank-0.log"


def test_resolve_inside_refuses_dotdot_escape(job: Path) -> None:
    """`..` that leaves the root raises PathEscapeError."""
    with pytest.raises(PathEscapeError, match="outside"):
        resolve_inside(job, "../../../../secret.txt")


def test_resolve_inside_refuses_an_absolute_path_elsewhere(job: Path, tmp_path: Path) -> None:
    """An absolute path outside the root is refused like a relative one."""
    with pytest.raises(PathEscapeError):
        resolve_inside(job, tmp_path / "secret.txt")


def test_resolve_inside_refuses_a_symlink_leaving_the_root(job: Path, tmp_path: Path) -> None:
    """A symlink whose target is outside the root is refused."""
    (job / "finelog.log").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(PathEscapeError):
        resolve_inside(job, "finelog.log")


def test_open_path_records_the_refusal_instead_of_raising(job: Path) -> None:
    """BundleFiles.open_path returns None and keeps the reason in `refused`."""
    files = BundleFiles(job)
    assert files.open_path("../../../../secret.txt") is None
    assert len(files.refused) == 1
    assert "secret.txt" in files.refused[0]


def test_walk_skips_escaping_file_and_directory_links(job: Path, tmp_path: Path) -> None:
    """walk lists real files and refuses (and records) links that leave the root."""
    (job / "pod_logs" / "leak.log").symlink_to(tmp_path / "secret.txt")
    (job / "pod_logs" / "leakdir").symlink_to(tmp_path / "elsewhere")
    files = BundleFiles(job)
    names = [path.name for path in files.walk("pod_logs")]
    assert names == ["rank-0.log"]
    assert len(files.refused) == 2


def test_walk_follows_a_link_that_stays_inside(job: Path) -> None:
    """A symlinked file whose target is inside the root is listed (as its target)."""
    (job / "pod_logs" / "alias.log").symlink_to(job / "pod_logs" / "rank-0.log")
    files = BundleFiles(job)
    assert [path.name for path in files.walk("pod_logs")] == ["rank-0.log", "rank-0.log"]
    assert files.refused == []


def test_walk_of_a_missing_directory_is_empty(job: Path) -> None:
    """Walking a directory that does not exist yields nothing and refuses nothing."""
    files = BundleFiles(job)
    assert list(files.walk("ray_vllm_logs")) == []
    assert files.refused == []
