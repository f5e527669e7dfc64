"""Settings from `RLHEALTH_*` environment variables, with per-campaign overrides from a file.

Two typed objects: `Settings` (connections, names, budgets) and `Thresholds` (the judgement
thresholds of docs/domain.md#healthy-ranges-and-thresholds, one field per row of its table). A
campaign file (JSON or TOML, named by `RLHEALTH_CAMPAIGN_FILE` or passed explicitly) may override
any threshold under a `thresholds` table and set `artifact_retention_days`.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.signing import KeyRing, VerdictKeyError, parse_keys

__all__ = ["CampaignError", "Settings", "Thresholds", "load_thresholds", "user_cache_dir"]

_KEY_SETTINGS = "RLHEALTH_VERDICT_KEY or RLHEALTH_VERDICT_KEY_FILE"
_REDIS_SCHEMES: Final = ("redis", "rediss", "unix")
_S3_SCHEMES: Final = ("http", "https")


class CampaignError(ValueError):
    """A campaign file that cannot be read or does not fit the thresholds."""


class Thresholds(BaseSettings):
    """Judgement thresholds; env names are `RLHEALTH_<FIELD NAME IN CAPITALS>`."""

    model_config = SettingsConfigDict(env_prefix="RLHEALTH_", frozen=True, extra="ignore")

    max_evidence_age_s: float = Field(900, gt=0)
    stall_floor_s: float = Field(600, ge=0)
    stall_factor: float = Field(4, gt=0)
    init_grace_s: float = Field(2700, ge=0)
    min_window_steps: int = Field(10, ge=1)
    # Divergence needs NaN/inf through this many newest steps: one spike (a skipped optimizer step,
    # one bad batch) is followed by finite steps, while NaN weights make every later step
    # non-finite. Three rules out a lone spike and a loss-scale back-off of one or two steps.
    non_finite_persist_steps: int = Field(3, ge=1)
    kv_floor_pct: float = Field(2, ge=0)
    kv_busy_pct: float = Field(10, ge=0)
    buffer_wait_share: float = Field(0.05, ge=0)
    starved_tokens_per_s: float = Field(10, ge=0)
    starved_window_s: float = Field(600, ge=0)
    one_turn_median: float = Field(1.5, ge=0)
    same_cause_share: float = Field(0.9, gt=0, le=1)
    collapse_ratio: float = Field(0.2, ge=0)
    entropy_collapse_ratio: float = Field(0.05, ge=0)
    phase_inflation: float = Field(3, gt=1)
    churn_share: float = Field(0.10, ge=0, le=1)
    env_setup_p90_s: float = Field(10, ge=0)
    churn_grace_s: float = Field(900, ge=0)
    duty_cycle_trials: int = Field(200, ge=1)
    tis_ratio_mean_min: float = 0.79
    tis_ratio_mean_max: float = 1.02
    tis_log_ratio_abs_max: float = 0.1
    tis_capped_fraction_max: float = 1e-3
    tis_exact_match_min: float = 0.95
    router_replay_log_ratio_max: float = 15.0
    router_replay_policy_loss: float = 1e3
    router_replay_grad_norm: float = 1e4
    artifact_retention_days: float | None = None


class Settings(BaseSettings):
    """Connections, names and budgets; env names are `RLHEALTH_<FIELD NAME IN CAPITALS>`."""

    model_config = SettingsConfigDict(env_prefix="RLHEALTH_", frozen=True, extra="ignore")

    redis_url: str = "redis://127.0.0.1:6379/0"
    stream_prefix: str = "rlhealth"
    s3_endpoint_url: str | None = None
    s3_bucket: str = "rlhealth"
    s3_prefix: str = ""
    bundle_root: Path = Path("/srv/iris-job-bundles")
    coalesce_s: float = Field(300, ge=0)
    campaign_file: Path | None = None
    cache_dir: Path | None = None  # default: `user_cache_dir()`, never a shared temp directory
    iris_controller_url: str | None = None
    iris_cluster: str | None = None
    iris_command: str = "iris"  # the iris CLI as shell words, e.g. "uv run iris"
    kube_context: str | None = None
    refresh_command: str | None = None
    # Connections and tools come from these settings only, never from a bundle (docs/security.md)
    kubeconfig: Path | None = None
    kube_namespace: str | None = None
    clusters: str | None = None  # JSON or TOML map cluster -> connection, or a .json/.toml path
    tool_path: str | None = None  # where cluster tools are resolved at start-up (default: PATH)
    probe_timeout_s: float = Field(60, gt=0)
    probe_interval_s: float = Field(5, gt=0)  # between the two py-spy dumps of one process
    probe_process_match: str | None = None  # regex picking the trainer's processes for py-spy
    # The pipeline's fault budgets (docs/reliability.md).
    lease_s: float = Field(120, ge=5)  # a diagnosis with no sign of life this long is re-sent
    redispatch_max: int = Field(2, ge=0)  # re-sends before the diagnosis is answered ERROR
    retry_deadline_s: float = Field(1800, gt=0)  # infrastructure faults retried until this old
    worker_memory_mb: int = Field(8192, ge=0)  # a task's resident memory budget (0: none)
    capture_time_limit_s: float = Field(300, gt=1)  # hard; the soft limit is 80 % of it
    gate_time_limit_s: float = Field(90, gt=1)  # for gates, verdict and publish
    # the most memory one parse of a job's logs may use (it also stays within 1.5x the logs)
    parse_memory_mb: int = Field(2048, ge=256)
    # the native pass (the C extension, when built) reads the lines it can; off: polars reads all
    parse_native: bool = True
    # Live capture in the pipeline (docs/pipeline.md): the backend the capture task probes through
    # when the capture policy calls for it ("none": never probe), the backends an event's
    # "backend" may choose (comma-separated; default: only RLHEALTH_BACKEND), and the total time
    # one capture may spend probing (a Celery soft time limit stands behind it).
    backend: Literal["iris", "kubernetes", "slurm", "local", "none"] = "none"
    backends: str | None = None
    capture_budget_s: float = Field(120, gt=0)
    # The second look before a KILL that rests on stacks: wait this long, then look again (0: off).
    reobserve_s: float = Field(60, ge=0)
    # The verdict key (shared/signing.py): hex, or `kid:hex,kid:hex` to rotate; the file holds the
    # same text. Every pipeline role needs one; `diagnose` and `parse` do not.
    verdict_key: SecretStr | None = None
    verdict_key_file: Path | None = None
    # where worker and ingest serve /metrics (0.0.0.0 only when a scraper elsewhere needs it)
    metrics_addr: str = "127.0.0.1"
    # how worker and ingest write their logs: text lines, or one JSON object per line
    # (worker.pipeline.logsetup); and whether error lines come with their traceback (--debug)
    log_format: Literal["text", "json"] = "text"
    debug: bool = False

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        """A URL redis-py can connect with; the reason never quotes the URL (a password)."""
        _check_url(value, _REDIS_SCHEMES, path_is_db=True)
        return value

    @field_validator("s3_endpoint_url")
    @classmethod
    def _s3_endpoint_url(cls, value: str | None) -> str | None:
        if value:
            _check_url(value, _S3_SCHEMES, path_is_db=False)
        return value or None

    @field_validator("backends")
    @classmethod
    def _known_backends(cls, value: str | None) -> str | None:
        if value is None:
            return value
        known = {"iris", "kubernetes", "slurm", "local", "none"}
        unknown = sorted({n.strip() for n in value.split(",")} - known - {""})
        if unknown:
            choices = ", ".join(sorted(known))
            raise ValueError(f"unknown backends {', '.join(unknown)}; use {choices}")
        return value

    def cache_root(self) -> Path:
        """Where the worker keeps its caches: RLHEALTH_CACHE_DIR, else the user's own."""
        return self.cache_dir or user_cache_dir()

    def verdict_keys(self) -> KeyRing:
        """The verdict key ring; raises `VerdictKeyError` naming the setting that is missing or
        unusable (never its value)."""
        if self.verdict_key is not None and self.verdict_key_file is not None:
            raise VerdictKeyError(f"set one of {_KEY_SETTINGS}, not both")
        if self.verdict_key is not None:
            return _ring("RLHEALTH_VERDICT_KEY", self.verdict_key.get_secret_value())
        if self.verdict_key_file is not None:
            path = self.verdict_key_file
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                reason = getattr(exc, "strerror", None) or type(exc).__name__
                raise VerdictKeyError(f"RLHEALTH_VERDICT_KEY_FILE {path}: {reason}") from None
            return _ring(f"RLHEALTH_VERDICT_KEY_FILE {path}", text)
        raise VerdictKeyError(
            f"{_KEY_SETTINGS} is not set: every pipeline role signs or verifies verdicts with it "
            "(hex, at least 32 bytes; e.g. python -c 'import secrets;print(secrets.token_hex(32))')"
        )

    def enabled_backends(self) -> tuple[str, ...]:
        """The live backends an event may choose, in the operator's order."""
        names = [self.backend] if self.backends is None else self.backends.split(",")
        return tuple(dict.fromkeys(n.strip() for n in names if n.strip() not in ("", "none")))


def _check_url(value: str, schemes: tuple[str, ...], *, path_is_db: bool) -> None:
    """Raise `ValueError` saying what is wrong with a connection URL, without quoting it."""
    try:
        parts = urlsplit(value.strip())
        _ = parts.port  # raises for a port that is not a number or out of range
    except ValueError as exc:
        raise ValueError(f"not a usable URL ({_without_value(exc)})") from None
    if parts.scheme not in schemes:
        raise ValueError(f"the scheme must be one of {', '.join(f'{s}://' for s in schemes)}")
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError("a unix:// URL needs the socket's path")
        return
    if not parts.hostname:
        raise ValueError("no host in the URL")
    db = parts.path.strip("/")
    if path_is_db and db and not db.isdigit():
        raise ValueError("the database (the URL's path) must be a number, e.g. /0")


def _without_value(exc: ValueError) -> str:
    text = str(exc)
    return "the port is not a number from 0 to 65535" if "port" in text.lower() else text


def user_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/rl-job-health` (an absolute XDG_CACHE_HOME), else
    `~/.cache/rl-job-health`: the user's own, not a temp directory another user may create first."""
    xdg = Path(os.environ.get("XDG_CACHE_HOME", ""))
    base = xdg if xdg.is_absolute() else Path.home() / ".cache"
    return base / "rl-job-health"


def _ring(setting: str, text: str) -> KeyRing:
    try:
        return parse_keys(text)
    except VerdictKeyError as exc:
        raise VerdictKeyError(f"{setting} is unusable: {exc}") from None


def _read_campaign(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CampaignError(f"campaign file {path}: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise CampaignError(f"campaign file {path} does not parse: {exc}") from exc
    if not isinstance(data, dict):
        raise CampaignError(f"campaign file {path} must hold an object, not {type(data).__name__}")
    return data


def load_thresholds(campaign_file: Path | None = None) -> Thresholds:
    """Environment thresholds, overridden by the campaign file's `thresholds` table."""
    base = Thresholds()
    path = campaign_file or Settings().campaign_file
    if path is None:
        return base
    data = _read_campaign(path)
    overrides = {str(k).lower(): v for k, v in dict(data.get("thresholds") or {}).items()}
    if "artifact_retention_days" in data:
        overrides["artifact_retention_days"] = data["artifact_retention_days"]
    unknown = sorted(set(overrides) - set(Thresholds.model_fields))
    if unknown:
        raise CampaignError(f"campaign file {path}: unknown thresholds {', '.join(unknown)}")
    merged = base.model_dump() | overrides
    return Thresholds.model_validate(merged)
