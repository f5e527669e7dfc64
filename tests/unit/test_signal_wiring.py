"""Celery signal handlers are connected by the app's factory, never by importing a module."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
from celery import signals
import worker.pipeline.logsetup, worker.pipeline.metrics, worker.pipeline.softlimit
before = len(signals.task_prerun.receivers), len(signals.task_postrun.receivers)
from worker.pipeline.app import make_app
from shared.settings import Settings
make_app(Settings())
once = len(signals.task_prerun.receivers), len(signals.task_postrun.receivers)
make_app(Settings())
twice = len(signals.task_prerun.receivers), len(signals.task_postrun.receivers)
print(before, once, twice)
"""


def _counts() -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout.split(")")


def test_importing_the_handlers_connects_none_and_the_factory_connects_each_once() -> None:
    """Importing metrics, softlimit and logsetup adds no receiver; each app made adds them once."""
    before, once, twice = (part.strip(" (\n") for part in _counts()[:3])
    assert before == "0, 0"
    assert once != before
    assert twice == once
