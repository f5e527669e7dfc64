"""Connections to clusters come from the operator's settings only.

One connection from the single settings (`RLHEALTH_IRIS_CONTROLLER_URL`, `RLHEALTH_IRIS_CLUSTER`,
`RLHEALTH_KUBECONFIG`, `RLHEALTH_KUBE_CONTEXT`, `RLHEALTH_KUBE_NAMESPACE`), or, when one worker
serves several clusters, `RLHEALTH_CLUSTERS`: a map from a cluster name to its connection, as JSON
or TOML text or the path of a `.json`/`.toml` file. A bundle's cluster name may only *select* an
entry of that map; a name the operator did not configure refuses the live probes
(`UnconfiguredClusterError`). Nothing read from a bundle (its `kubeconfig`, `context`, a URL) is
ever a connection.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from shared.settings import Settings
from worker.backends.identifiers import PATTERNS, RefusedValueError, checked

__all__ = [
    "ClusterConnection",
    "ConnectionSettingsError",
    "UnconfiguredClusterError",
    "configured_clusters",
    "connection_for",
    "operator_connection",
]


class ConnectionSettingsError(ValueError):
    """A connection setting that cannot be read or does not fit its pattern."""


class UnconfiguredClusterError(RefusedValueError):
    """A bundle names a cluster the operator did not configure in RLHEALTH_CLUSTERS."""


class ClusterConnection(BaseModel):
    """How to reach one cluster; every value checked against its strict pattern."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    iris_controller_url: str | None = None
    iris_cluster: str | None = None
    kubeconfig: str | None = None
    kube_context: str | None = None
    namespace: str | None = None

    @field_validator("iris_controller_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else checked("url", value)

    @field_validator("iris_cluster")
    @classmethod
    def _cluster(cls, value: str | None) -> str | None:
        return None if value is None else checked("cluster", value)

    @field_validator("kube_context")
    @classmethod
    def _context(cls, value: str | None) -> str | None:
        return None if value is None else checked("kube context", value)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        return None if value is None else checked("namespace", value)

    @field_validator("kubeconfig")
    @classmethod
    def _kubeconfig(cls, value: str | None) -> str | None:
        if value is not None and not (Path(value).is_absolute() and value.isprintable()):
            raise ValueError(f"kubeconfig {value!r} must be an absolute path")
        return value


def _load_map(text: str) -> Any:
    path = Path(text) if "\n" not in text and len(text) < 4096 else None
    if path is not None and path.suffix in {".json", ".toml"} and path.is_file():
        text, toml = path.read_text(encoding="utf-8"), path.suffix == ".toml"
    else:
        toml = not text.lstrip().startswith("{")
    return tomllib.loads(text) if toml else json.loads(text)


def configured_clusters(settings: Settings) -> dict[str, ClusterConnection]:
    """The RLHEALTH_CLUSTERS map (empty when unset); ConnectionSettingsError when it is bad."""
    text = (settings.clusters or "").strip()
    if not text:
        return {}
    try:
        data = _load_map(text)
        if not isinstance(data, dict):
            raise ValueError("RLHEALTH_CLUSTERS must be a map from cluster name to connection")
        return {
            checked("cluster", name): ClusterConnection.model_validate(entry)
            for name, entry in data.items()
        }
    except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConnectionSettingsError(f"RLHEALTH_CLUSTERS: {_first_line(exc)}") from exc


def _first_line(exc: Exception) -> str:
    text = str(exc).splitlines()
    return text[0] if text else type(exc).__name__


def operator_connection(settings: Settings) -> ClusterConnection:
    """The connection of the single settings; ConnectionSettingsError when a value is bad."""
    try:
        return ClusterConnection(
            iris_controller_url=settings.iris_controller_url,
            iris_cluster=settings.iris_cluster,
            kubeconfig=str(settings.kubeconfig) if settings.kubeconfig else None,
            kube_context=settings.kube_context,
            namespace=settings.kube_namespace,
        )
    except (ValidationError, ValueError) as exc:
        raise ConnectionSettingsError(f"connection settings: {_first_line(exc)}") from exc


def connection_for(settings: Settings, cluster: str | None) -> ClusterConnection:
    """The connection for a bundle's `cluster`: its RLHEALTH_CLUSTERS entry when the map is set
    (a name not in it is refused), else the single settings."""
    clusters = configured_clusters(settings)
    if not clusters:
        return operator_connection(settings)
    if cluster is not None and PATTERNS["cluster"].fullmatch(cluster) and cluster in clusters:
        return clusters[cluster]
    names = ", ".join(sorted(clusters))
    raise UnconfiguredClusterError(
        f"cluster {cluster!r} is not configured in RLHEALTH_CLUSTERS ({names}): no live probe"
    )
