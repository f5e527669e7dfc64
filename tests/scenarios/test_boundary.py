"""The boundary corpus, table-driven: each threshold and proof rule has a bundle just past it and
one just short of it, and both get the verdict and every gate status the pair names."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenarios.boundary import PAIRS, Pair, Side
from worker.diagnosis import diagnose

SIDES = [(pair, which) for pair in PAIRS for which in ("past", "short")]


def _judged(side: Side, tmp_path: Path) -> tuple[str, dict[str, str]]:
    built = side.build(tmp_path)
    report = diagnose(built.job_dir, now=built.now, probes_dir=built.probes)
    statuses = {name.value: gate.status.value for name, gate in report.gates.items()}
    return report.verdict.value, statuses


@pytest.mark.parametrize(
    ("pair", "which"), SIDES, ids=[f"{pair.name}-{which}" for pair, which in SIDES]
)
def test_boundary(pair: Pair, which: str, tmp_path: Path) -> None:
    """Each side of each pair gets exactly its verdict and gate statuses."""
    side: Side = getattr(pair, which)
    assert _judged(side, tmp_path) == (side.verdict, side.gates), pair.pins


def test_corpus_has_at_least_thirty_pairs_with_different_answers() -> None:
    """At least 30 pairs, each distinct, and the two sides of every pair differ in some answer."""
    assert len(PAIRS) >= 30
    assert len({p.name for p in PAIRS}) == len(PAIRS)
    for pair in PAIRS:
        assert (pair.past.verdict, pair.past.gates) != (pair.short.verdict, pair.short.gates)
