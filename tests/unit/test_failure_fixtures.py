"""Real failure text from public issue trackers gives the expected ERRORS rows (table-driven).

Every `[[line]]` of tests/fixtures/real_failures/*.toml, parsed alone, is exactly one row with the
expected kind, catalogue entry, class, component, exception type and specificity; every `[[block]]`
gives exactly its rows. Every catalogue entry is proven by at least one real line.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from worker.evidence.failures import catalogue
from worker.evidence.logs import parse_log_file

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "real_failures"
_FIELDS = ("kind", "entry", "class", "component", "exc_type")


def _documents() -> list[tuple[str, dict[str, Any]]]:
    return [(p.stem, tomllib.loads(p.read_text("utf-8"))) for p in sorted(FIXTURES.glob("*.toml"))]


def _lines() -> list[Any]:
    return [
        pytest.param(case, id=f"{name}-{i}")
        for name, doc in _documents()
        for i, case in enumerate(doc.get("line", []), 1)
    ]


def _blocks() -> list[Any]:
    return [
        pytest.param(block, id=f"{name}-block{i}")
        for name, doc in _documents()
        for i, block in enumerate(doc.get("block", []), 1)
    ]


def _parse(tmp_path: Path, text: str) -> pl.DataFrame:
    path = tmp_path / "finelog.log"
    path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    return parse_log_file(path, "finelog.log").errors


def _expected(case: dict[str, Any]) -> dict[str, Any]:
    found = {name: (case[name] or None) for name in _FIELDS}
    found["specific"] = case.get("specific", True)
    return found


def _actual(row: dict[str, Any]) -> dict[str, Any]:
    found = {name: row[name] for name in _FIELDS if name != "class"}
    found["class"] = row["failure_class"]
    found["specific"] = row["specific"]
    return found


@pytest.mark.parametrize("case", _lines())
def test_real_line_is_one_row_with_its_meaning(case: dict[str, Any], tmp_path: Path) -> None:
    """A verbatim failure line alone gives one row: the expected kind, entry, class, component."""
    errors = _parse(tmp_path, case["text"])
    assert errors.height == 1, errors
    row = errors.row(0, named=True)
    assert _actual(row) == _expected(case), case["url"]
    assert (row["line"], row["last_line"]) == (1, 1)
    assert row["signature"], "every row has a signature"


@pytest.mark.parametrize("block", _blocks())
def test_real_block_gives_exactly_its_rows(block: dict[str, Any], tmp_path: Path) -> None:
    """A verbatim multi-line excerpt gives exactly the expected rows, first and last line each."""
    errors = _parse(tmp_path, block["text"]).sort("line")
    got = [_actual(row) | {"span": (row["line"], row["last_line"])} for row in errors.to_dicts()]
    wanted = [_expected(row) | {"span": (row["line"], row["last_line"])} for row in block["row"]]
    assert got == wanted, block["url"]


def test_every_catalogue_entry_is_proven_by_a_real_line() -> None:
    """Each catalogue entry is the expected match of at least one fixture line or block row."""
    proven = {case["entry"] for _, doc in _documents() for case in doc.get("line", [])}
    proven |= {
        row["entry"] for _, doc in _documents() for b in doc.get("block", []) for row in b["row"]
    }
    missing = [entry.id for entry in catalogue().entries if entry.id not in proven]
    assert not missing


def test_every_entry_source_is_a_fixture_url() -> None:
    """Each entry's `source` names a page one of its proving fixture lines was taken from."""
    urls: dict[str, set[str]] = {}
    for _, doc in _documents():
        for case in doc.get("line", []):
            urls.setdefault(case["entry"], set()).add(case["url"])
        for block in doc.get("block", []):
            for row in block["row"]:
                urls.setdefault(row["entry"], set()).add(block["url"])
    wrong = [e.id for e in catalogue().entries if e.source not in urls.get(e.id, set())]
    assert not wrong


@pytest.mark.parametrize("case", _lines())
def test_python_matcher_agrees_with_the_parser(case: dict[str, Any]) -> None:
    """`Catalogue.first_match` (Python `re`) names the same entry the vectorised parser does."""
    found = catalogue().first_match(case["text"])
    assert (found.id if found else None) == (case["entry"] or None)


def test_fixture_count_and_sources() -> None:
    """The fixtures hold at least one real line per catalogue entry and name an https source."""
    lines = [case for _, doc in _documents() for case in doc.get("line", [])]
    assert len(lines) >= len(catalogue().entries) - 5
    assert all(case["url"].startswith("https://") for case in lines)
