"""The live backend a capture uses: operator settings decide, an event only chooses among them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.models import Event
from shared.settings import Settings
from worker.capture_policy import BackendChoiceError, choose_backend


def test_default_is_no_live_probe() -> None:
    assert choose_backend(None, Settings()) is None


def test_operator_backend_is_used_without_a_request() -> None:
    assert choose_backend(None, Settings(backend="iris")) == "iris"


def test_event_chooses_among_enabled() -> None:
    settings = Settings(backend="iris", backends="iris,local")
    assert choose_backend("local", settings) == "local"


def test_event_cannot_enable_a_backend() -> None:
    with pytest.raises(BackendChoiceError, match="did not enable"):
        choose_backend("kubernetes", Settings(backend="iris"))
    with pytest.raises(BackendChoiceError, match="none"):
        choose_backend("iris", Settings())


def test_unknown_backend_setting_is_refused() -> None:
    with pytest.raises(ValidationError, match="unknown backends"):
        Settings(backends="iris,bash -c id")


def test_event_backend_must_be_a_live_backend() -> None:
    base = {"event_id": "e1", "job_dir": "j", "published_at": "2026-01-01T00:00:00Z"}
    assert Event.model_validate({**base, "backend": "slurm"}).backend == "slurm"
    for bad in ("none", "recorded", "iris; rm -rf /"):
        with pytest.raises(ValidationError):
            Event.model_validate({**base, "backend": bad})
