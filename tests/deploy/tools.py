"""The deployment's checks: render the Kustomize overlays with kubectl, find promtool, and read the
metric names the alert rules and the dashboard query. `make system-deps` installs both tools
(kubectl: Debian's kubernetes-client when none is on PATH; promtool: extracted from Debian's
prometheus package under .venv/tools, so no Prometheus server is installed or started)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("dev", "prod")
RULES = K8S / "base" / "prometheusrule.yaml"
DASHBOARD = K8S / "base" / "grafana" / "rl-job-health.json"
SCRAPE = K8S / "prometheus-scrape.yaml"
COMPOSE_PROMETHEUS = ROOT / "deploy" / "prometheus.yml"
FIXTURES = ROOT / "tests" / "fixtures" / "k8s"
# series Prometheus makes itself for every target, not exported by a process
PROMETHEUS_OWN = frozenset({"up"})

_METRIC = re.compile(r"\b(rlhealth_[a-z0-9_]+)\b")
_PROMETHEUS_OWN = re.compile(r"\b(up)\s*\{")
_MISSING = "not installed: `make system-deps` installs it"


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail(f"kubectl {_MISSING} (Debian's kubernetes-client)")
    return found


def promtool() -> str:
    """PROMTOOL, else the one `make system-deps` extracts under .venv/tools, else PATH's."""
    candidates = [os.environ.get("PROMTOOL", ""), str(ROOT / ".venv/tools/usr/bin/promtool")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    found = shutil.which("promtool")
    if found is None:
        pytest.fail(f"promtool {_MISSING} (from Debian's prometheus package)")
    return found


@cache
def render(target: str) -> tuple[dict[str, Any], ...]:
    """`kubectl kustomize deploy/k8s/<target>` as documents (cached: each renders once)."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(K8S / target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {target} failed:\n{done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def of_kind(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def named(docs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


def config(docs: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """The settings ConfigMap's data (its name carries a hash of the content)."""
    (found,) = [
        d["data"]
        for d in of_kind(docs, "ConfigMap")
        if d["metadata"]["name"].startswith("rlhealth-config")
    ]
    return {key: str(value) for key, value in found.items()}


def container(docs: tuple[dict[str, Any], ...], deployment: str) -> dict[str, Any]:
    spec = named(docs, "Deployment", deployment)["spec"]["template"]["spec"]
    (first,) = spec["containers"]
    return dict(first)


def rule_groups() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    groups: list[dict[str, Any]] = document["spec"]["groups"]
    return groups


def rule_exprs() -> list[str]:
    return [str(rule["expr"]) for group in rule_groups() for rule in group["rules"]]


def panel_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        str(target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", ())
        if target.get("expr")
    ]


def queried_metrics(exprs: list[str]) -> set[str]:
    """Every series name the expressions read: `rlhealth_*` names and Prometheus's own."""
    names = {name for expr in exprs for name in _METRIC.findall(expr)}
    return names | {name for expr in exprs for name in _PROMETHEUS_OWN.findall(expr)}
