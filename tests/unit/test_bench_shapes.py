"""The benchmark's log shapes and its plain one-pass baseline: the shapes hold the shares of bytes
they are named for, and the baseline keeps the rows the parser keeps (so the ratio compares the
same work)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.baseline_honest import baseline_tables, counts
from testkit.gen_continuous import generate_continuous
from testkit.gen_finelog import generate
from testkit.gen_records import generate_dense, generate_noisy
from worker.evidence.logs import parse_log_file

SHAPES = {
    "continuous": generate_continuous,
    "dense": generate_dense,
    "noisy": generate_noisy,
    "generated": generate,
}


def _share(path: Path, literals: tuple[str, ...]) -> float:
    lines = path.read_bytes().splitlines(keepends=True)
    held = sum(len(line) for line in lines if any(lit.encode() in line for lit in literals))
    return held / path.stat().st_size


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_baseline_keeps_the_rows_the_parser_keeps(name: str, tmp_path: Path) -> None:
    """On 1 MB of each shape, the baseline's metrics, phases, engines and progress rows are as
    many as the parser's tables hold."""
    path = SHAPES[name](tmp_path / "finelog.log", 1.0)
    tables = parse_log_file(path, "finelog.log")
    found = {table: getattr(tables, table).height for table in counts(baseline_tables(path))}
    assert found == counts(baseline_tables(path))
    assert found["metrics"] > 100 and found["engines"] > 100


def test_the_dense_log_is_records_and_stat_lines(tmp_path: Path) -> None:
    """Stat lines ~52% of the bytes, timers ~28%, mirror records ~12% (about 840 bytes each),
    reward lines ~7%."""
    path = generate_dense(tmp_path / "dense.log", 2.0)
    assert _share(path, ("Avg prompt throughput",)) == pytest.approx(0.52, abs=0.01)
    assert _share(path, ("Started: '", "Finished: '")) == pytest.approx(0.28, abs=0.015)
    assert _share(path, ("WANDB_MIRROR",)) == pytest.approx(0.12, abs=0.015)
    assert _share(path, ("reward/avg_pass_at_1: ", "avg_final_rewards")) == pytest.approx(
        0.07, abs=0.01
    )
    mirrors = [line for line in path.read_bytes().splitlines() if b"WANDB_MIRROR" in line]
    assert sum(map(len, mirrors)) / len(mirrors) == pytest.approx(840, abs=30)


def test_the_noisy_log_is_the_records_and_45_percent_noise(tmp_path: Path) -> None:
    """The same records, ~45% of the bytes request logs, `Added request` lines, tqdm bars,
    raylet and NCCL warnings; every line behind an Iris prefix."""
    path = generate_noisy(tmp_path / "noisy.log", 2.0)
    noise = ("Received request", "Added request", "Processed prompts", "(raylet", "NCCL.cpp")
    assert _share(path, noise) == pytest.approx(0.45, abs=0.01)
    assert all(
        line.startswith(b"[") and b"] task=" in line for line in path.read_bytes().splitlines()
    )


def test_a_shape_is_the_same_bytes_for_the_same_seed(tmp_path: Path) -> None:
    """Deterministic: the same seed gives the same bytes, another seed other bytes."""
    first = generate_noisy(tmp_path / "a.log", 0.2).read_bytes()
    assert generate_noisy(tmp_path / "b.log", 0.2).read_bytes() == first
    assert generate_noisy(tmp_path / "c.log", 0.2, seed=5).read_bytes() != first
