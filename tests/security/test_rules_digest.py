"""`RULES_DIGEST` changes with the redactor: what was found clean, or stored redacted, under
older rules is not trusted under newer ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared import redact


def test_the_digest_is_that_of_the_module_source() -> None:
    assert redact._rules_digest() == redact.RULES_DIGEST
    assert re.fullmatch(r"[0-9a-f]{16}", redact.RULES_DIGEST)


def test_any_change_to_the_source_changes_the_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = Path(redact.__file__).read_text(encoding="utf-8")
    copy = tmp_path / "redact.py"
    copy.write_text(source, encoding="utf-8")
    monkeypatch.setattr(redact, "__file__", str(copy))
    assert redact._rules_digest() == redact.RULES_DIGEST
    copy.write_text(source.replace(r"\bhf_[A-Za-z0-9]{20,}", r"\bhf_[A-Za-z0-9]{16,}"))
    assert redact._rules_digest() != redact.RULES_DIGEST


def test_without_the_source_the_patterns_stand_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redact, "__file__", str(tmp_path / "gone.py"))
    before = redact._rules_digest()
    assert before != redact.RULES_DIGEST
    rule, replace = redact.RULES[5]
    changed = (re.compile(rule.pattern + "x"), replace)
    monkeypatch.setattr(redact, "RULES", (*redact.RULES[:5], changed, *redact.RULES[6:]))
    assert redact._rules_digest() != before
