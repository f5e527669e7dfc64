"""Option types and the clean exit 2 (one line) for unusable arguments or settings, shared by
the commands."""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from shared.safefs import OUTPUT_MODE, UnsafeDirectoryError, owned_directory
from shared.settings import CampaignError, Settings, Thresholds, load_thresholds
from shared.signing import KeyRing, VerdictKeyError

__all__ = [
    "DEBUG_ENV",
    "ISO_DATETIME",
    "UnusableError",
    "debugging",
    "load_campaign_thresholds",
    "load_settings",
    "load_verdict_keys",
    "own_directory",
    "writable_directory",
]


class IsoDatetime(click.ParamType[datetime]):
    """An ISO-8601 timestamp; a trailing Z or no zone means UTC."""

    name = "ISO-8601"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            self.fail(
                f"{value!r} is not an ISO-8601 timestamp (e.g. 2026-07-30T21:15:00Z)", param, ctx
            )
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


ISO_DATETIME = IsoDatetime()


DEBUG_ENV = "RLHEALTH_DEBUG"


def debugging() -> bool:
    """True when `rl-health --debug` or RLHEALTH_DEBUG=1 asks for tracebacks."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


class UnusableError(click.ClickException):
    """An unusable argument, setting or dependency: one line on stderr, exit status 2 (with
    `--debug`, the traceback of its cause above that line)."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        if debugging() and self.__cause__ is not None:
            sys.stderr.write("".join(traceback.format_exception(self.__cause__)))
        click.echo(f"rl-health: {self.format_message()}", err=True)


def _problems(exc: ValidationError, name: Callable[[str], str]) -> str:
    # the offending value is left out: a connection URL may carry a password
    return "; ".join(
        f"{name('.'.join(str(part) for part in error['loc']))}: {error['msg']}"
        for error in exc.errors()
    )


def _env_name(field: str) -> str:
    return f"RLHEALTH_{field.upper()}"


def load_settings() -> Settings:
    """The RLHEALTH_* settings, or exit 2 naming each unusable variable."""
    try:
        return Settings()
    except ValidationError as exc:
        raise UnusableError(f"unusable setting {_problems(exc, _env_name)}") from exc


def load_verdict_keys(settings: Settings) -> KeyRing:
    """The verdict keys every pipeline role needs, or exit 2 with one line naming the setting."""
    try:
        return settings.verdict_keys()
    except VerdictKeyError as exc:
        raise UnusableError(str(exc)) from exc


def load_campaign_thresholds(campaign: Path | None) -> Thresholds:
    """The thresholds from RLHEALTH_* and the campaign file, or exit 2 saying what is wrong."""
    try:
        Thresholds()
    except ValidationError as exc:
        raise UnusableError(f"unusable threshold {_problems(exc, _env_name)}") from exc
    path = campaign or load_settings().campaign_file
    try:
        return load_thresholds(path)
    except CampaignError as exc:
        raise UnusableError(str(exc)) from exc
    except ValidationError as exc:
        raise UnusableError(f"campaign file {path}: {_problems(exc, str)}") from exc


def own_directory(path: Path, option: str, mode: int) -> Path:
    """`path`, made with `mode` if missing and checked to be this process's own
    (`shared.safefs.owned_directory`); exit 2 naming the option otherwise."""
    try:
        return owned_directory(path, mode=mode)
    except UnsafeDirectoryError as exc:
        raise UnusableError(f"{option}: {exc}") from None


def writable_directory(path: Path, option: str) -> Path:
    """`path`, made if missing, this process's own (`own_directory`) and writable; exit 2 naming
    the option otherwise."""
    own_directory(path, option, OUTPUT_MODE)
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".rlhealth-write-test-"):
            pass
    except OSError as exc:
        raise UnusableError(f"{option} {path} is not a writable directory: {exc.strerror}") from exc
    return path
