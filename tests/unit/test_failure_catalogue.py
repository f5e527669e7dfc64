"""The failure catalogue: data that loads and validates, and whose meaning the parser applies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from worker.evidence.failures import (
    CatalogueError,
    Component,
    FailureClass,
    catalogue,
    load_catalogue,
)
from worker.evidence.logs import parse_log_file, rules

GOOD = """
[[entry]]
id = "x.first"
literal = "boom"
kind = "k1"
component = "engine"
class = "hard"
source = "https://example.org/1"
note = "first"

[[entry]]
id = "x.second"
literal = "boom"
pattern = 'boom [0-9]+'
kind = "k2"
component = "auto"
class = "benign"
generic = true
source = "https://example.org/2"
note = "second"
"""


def test_the_shipped_catalogue_has_at_least_sixty_entries() -> None:
    """The package's catalogue loads with 60+ entries, unique ids and every class represented."""
    entries = catalogue().entries
    assert len(entries) >= 60
    assert len({e.id for e in entries}) == len(entries)
    assert {e.failure_class for e in entries} == set(FailureClass)
    assert all(e.source.startswith("https://") and e.note for e in entries)


def test_every_pattern_compiles_for_the_parser() -> None:
    """Each entry's regex is valid for polars' (Rust) engine too, which the parser uses."""
    probe = pl.Series(["x"], dtype=pl.String)
    for entry in catalogue().entries:
        if entry.pattern:
            probe.str.contains(entry.pattern)


def test_a_forked_child_can_parse_after_the_parser_is_imported() -> None:
    """Importing the parser runs no polars work, so a forked child (a Celery prefork worker)
    does not inherit a started polars thread pool and hang in its first polars call."""
    code = (
        "import multiprocessing as mp\n"
        "import worker.evidence.logs\n"
        "def child():\n"
        "    import polars as pl\n"
        "    pl.DataFrame({'a': ['x'] * 10000}).select(pl.col('a').str.contains('x').sum())\n"
        "p = mp.get_context('fork').Process(target=child)\n"
        "p.start(); p.join(60)\n"
        "raise SystemExit(0 if p.exitcode == 0 else 1)\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=120, check=False
    )
    assert found.returncode == 0, found.stderr


def test_benign_noise_is_catalogued() -> None:
    """vLLM's shared-memory broadcast notice and Ray's worker-died notice are benign entries."""
    cat = catalogue()
    assert cat.by_id("vllm.shm_broadcast_wait").failure_class is FailureClass.BENIGN
    assert cat.by_id("ray.worker_died_notice").failure_class is FailureClass.BENIGN


def test_generic_entries_are_exit_records_or_wrappers() -> None:
    """Generic entries (never a signature alone) are exit records, teardown or job banners."""
    kinds = {e.kind for e in catalogue().entries if e.generic}
    assert kinds <= {"exit", "teardown", "job_error"}


def test_every_literal_is_flagged_by_the_parser() -> None:
    """Every entry's literal holds a scan anchor, so no catalogued line can be skipped."""
    assert set(catalogue().literals) <= set(rules.FAILURE_LITERALS)
    flags = set(rules.FLAG_LITERALS)
    for literal in rules._INTEREST:
        assert any(flag in literal for flag in flags), literal


def test_the_shipped_literals_need_no_extra_alternatives() -> None:
    """Every shipped literal holds one of the anchors: the scan's alternation stays short."""
    assert rules._UNCOVERED == ()
    assert len(rules.FLAG_LITERALS) <= 55


def test_load_reads_fields_and_defaults() -> None:
    """A valid file gives entries in order, `auto` as no component, `generic` defaulting off."""
    cat = load_catalogue(GOOD)
    first, second = cat.entries
    assert (first.id, first.component, first.generic) == ("x.first", Component.ENGINE, False)
    assert (second.component, second.generic, second.pattern) == (None, True, "boom [0-9]+")


def test_first_matching_entry_wins() -> None:
    """Order is priority: a line both entries match belongs to whichever comes first."""
    first, second = GOOD.split("\n[[entry]]")[1:]
    assert load_catalogue(GOOD).first_match("boom 12").id == "x.first"  # type: ignore[union-attr]
    swapped = load_catalogue(f"[[entry]]{second}\n[[entry]]{first}")
    assert swapped.first_match("boom 12").id == "x.second"  # type: ignore[union-attr]
    assert swapped.first_match("boom!").id == "x.first"  # type: ignore[union-attr]
    frame = pl.DataFrame({"t": ["boom 1", "no", "boom!"]})
    found = frame.select(swapped.match_expr(pl.col("t"))).to_series().to_list()
    assert found == ["x.second", None, "x.first"]


def test_a_pattern_must_match_as_well_as_the_literal() -> None:
    """With a pattern, the literal alone is not enough."""
    second = load_catalogue(GOOD).by_id("x.second")
    assert second.matches("boom 7")
    assert not second.matches("boom!")
    frame = pl.DataFrame({"t": ["boom 7", "boom!"]})
    assert frame.select(second.condition(pl.col("t"))).to_series().to_list() == [True, False]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('note = "first"', 'note = "first"\nseverity = "x"'), "unknown"),
        (('note = "first"\n', ""), "missing"),
        (('class = "hard"', 'class = "fatal"'), "fatal"),
        (('component = "engine"', 'component = "gpu"'), "gpu"),
        (("pattern = 'boom [0-9]+'", "pattern = 'boom ('"), "does not compile"),
        (('id = "x.second"', 'id = "x.first"'), "repeated"),
        (("[[entry]]", "[[entry"), "not TOML"),
        (("[[entry]]", "[[other]]"), r"no \[\[entry\]\]"),
    ],
)
def test_a_bad_catalogue_is_refused_with_a_reason(change: tuple[str, str], message: str) -> None:
    """Unknown or missing fields, bad values, bad regexes and repeated ids are refused."""
    with pytest.raises(CatalogueError, match=message):
        load_catalogue(GOOD.replace(*change))


def test_kinds_of_the_older_literal_rules_are_kept(tmp_path: Path) -> None:
    """A line an older literal rule matches keeps that rule's kind; the entry agrees with it."""
    cat = catalogue()
    for kind, literal in rules.ERROR_RULES:
        entry = cat.first_match(f"x {literal} y")
        if entry is not None and literal in entry.literal:
            assert entry.kind == kind, (literal, entry.id)
    path = tmp_path / "f.log"
    path.write_text("ray.exceptions.RayTaskError(ActorDiedError): ray::A.b() (pid=1)\n")
    row = parse_log_file(path, "f.log").errors.row(0, named=True)
    assert (row["kind"], row["entry"]) == ("actor_died", "ray.actor_died_error")


def test_ray_host_oom_is_not_a_cuda_oom(tmp_path: Path) -> None:
    """Ray's OutOfMemoryError (host memory) is host_oom; torch's stays cuda_oom."""
    path = tmp_path / "f.log"
    path.write_text(
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
        "torch.OutOfMemoryError: Tried to allocate 2 GiB\n"
    )
    kinds = parse_log_file(path, "f.log").errors.get_column("kind").to_list()
    assert kinds == ["host_oom", "cuda_oom"]
