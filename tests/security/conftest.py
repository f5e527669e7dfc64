"""Fixtures of the attack corpus: a directory a second user (uid 4242) reaches too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.other_user import shared_directory


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory like `/tmp` that uid 4242 reaches (the test is skipped unless run as root)."""
    with shared_directory() as path:
        yield path
