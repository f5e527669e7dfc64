"""The mode is declared from the launched configuration, never from trace_jobs/."""

from __future__ import annotations

import json

import pytest

from shared.models import Mode
from worker.mode import declare_mode, entrypoint_argv

HARBOR = json.dumps(
    {
        "argv": [
            "uv", "run", "python", "-m",
            "examples.train_integrations.harbor.entrypoints.main_harbor",
            "terminal_bench_config.trials_dir=s3://bucket/tmp/ttl=14d/rl-x/trace_jobs",
        ]
    }
)  # fmt: skip
GSM8K = json.dumps(
    {"argv": ["python", "-m", "skyrl_train.entrypoints.main_base", "trainer.epochs=1"]}
)


@pytest.mark.parametrize(
    ("explicit", "entrypoint", "expected"),
    [
        (None, HARBOR, Mode.AGENTIC),
        (None, GSM8K, Mode.STANDARD),
        (None, None, Mode.UNDECLARED),
        (None, "", Mode.UNDECLARED),
        (Mode.STANDARD, HARBOR, Mode.STANDARD),
        (Mode.AGENTIC, None, Mode.AGENTIC),
        (None, "python train.py +generator.daytona.api_key=x", Mode.AGENTIC),
    ],
)
def test_mode_declaration(explicit: Mode | None, entrypoint: str | None, expected: Mode) -> None:
    """Explicit mode wins; else agentic harness settings in the entrypoint; else undeclared."""
    assert declare_mode(explicit, entrypoint).mode is expected


def test_agentic_reason_quotes_the_argv_token() -> None:
    """The reason names the token that made the run agentic, so the report can quote it."""
    decision = declare_mode(None, HARBOR)
    assert "harbor" in decision.reason


def test_entrypoint_forms() -> None:
    """The entrypoint may be {"argv": [...]}, a JSON list, or a plain command line."""
    assert entrypoint_argv('{"argv": ["a", "b"]}') == ("a", "b")
    assert entrypoint_argv('["a", "b"]') == ("a", "b")
    assert entrypoint_argv("python -m x") == ("python", "-m", "x")
    assert entrypoint_argv("{not json") == ("{not", "json")
