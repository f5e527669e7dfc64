"""The alert rules and the dashboard, checked by Prometheus's own promtool (Debian's prometheus
package): the rules load (`check rules`: PromQL and the annotation templates), each alert fires
just past its threshold and not just short of it (`test rules`, tests/deploy/rules.test.yaml),
every panel query parses, and both scrape configurations load (`check config`)."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.tools import (
    COMPOSE_PROMETHEUS,
    DASHBOARD,
    SCRAPE,
    panel_exprs,
    promtool,
    rule_groups,
)

HERE = Path(__file__).parent


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd
    )


def _write_rules(path: Path, groups: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    """The PrometheusRule's groups load in Prometheus: every expression parses, every annotation
    template renders, every alert has a severity, a summary and a runbook."""
    done = _promtool("check", "rules", str(_write_rules(tmp_path / "rules.yaml", rule_groups())))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
    for group in rule_groups():
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert {"summary", "description", "runbook_url"} <= set(rule["annotations"])


def test_each_alert_fires_just_past_its_threshold_and_not_short_of_it(tmp_path: Path) -> None:
    """`promtool test rules` on rules.test.yaml: every alert of the PrometheusRule has a case on
    each side of its threshold, and all pass."""
    groups = rule_groups()
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)  # compared verbatim by promtool; checked above
    _write_rules(tmp_path / "rules.yaml", groups)
    shutil.copy(HERE / "rules.test.yaml", tmp_path / "rules.test.yaml")
    done = _promtool("test", "rules", "rules.test.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    tested = set(re.findall(r"alertname: (\w+)", (HERE / "rules.test.yaml").read_text()))
    alerts = {rule["alert"] for group in rule_groups() for rule in group["rules"]}
    assert tested == alerts


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """Each panel's PromQL (Grafana's $__rate_interval as 5m) loads as a recording rule."""
    exprs = panel_exprs()
    assert len(exprs) >= 12
    rules = [
        {"record": f"rlhealth:panel_{i}", "expr": expr.replace("$__rate_interval", "5m")}
        for i, expr in enumerate(exprs)
    ]
    path = _write_rules(tmp_path / "panels.yaml", [{"name": "panels", "rules": rules}])
    done = _promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_is_one_grafana_can_import() -> None:
    """One JSON object with a uid, a Prometheus datasource variable every panel uses, and panels
    that do not overlap on the grid."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "rl-job-health"
    (variable,) = dashboard["templating"]["list"]
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
    taken: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        box = panel["gridPos"]
        cells = {
            (x, y)
            for x in range(box["x"], box["x"] + box["w"])
            for y in range(box["y"], box["y"] + box["h"])
        }
        assert not cells & taken, panel["title"]
        taken |= cells


def test_both_scrape_configurations_load(tmp_path: Path) -> None:
    """deploy/prometheus.yml (compose) and deploy/k8s/prometheus-scrape.yaml pass `promtool check
    config` — the latter with its pod discovery swapped for a static target, since Debian's
    Prometheus is built without Kubernetes discovery; its relabelling is checked just as well."""
    snippet = yaml.safe_load(SCRAPE.read_text())
    jobs = copy.deepcopy(snippet["scrape_configs"])
    for job in jobs:
        assert job.pop("kubernetes_sd_configs") == [
            {"role": "pod", "namespaces": {"names": ["rlhealth"]}}
        ]
        job["static_configs"] = [{"targets": ["10.0.0.1:9808"]}]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": jobs}))
    for path in (config, COMPOSE_PROMETHEUS):
        done = _promtool("check", "config", "--syntax-only", str(path))
        assert done.returncode == 0, f"{path}: {done.stdout}{done.stderr}"


def _relabel(labels: dict[str, str], configs: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus's `keep` and `replace` relabelling (regex anchored, `;` between the source
    labels, `$1` in the replacement); None when the target is dropped."""
    labels = dict(labels)
    for step in configs:
        value = ";".join(labels.get(name, "") for name in step["source_labels"])
        found = re.fullmatch(step.get("regex", "(.*)"), value)
        if step.get("action", "replace") == "keep":
            if found is None:
                return None
            continue
        if found is not None:
            template = re.sub(r"\$(\d)", r"\\g<\1>", step.get("replacement", "$1"))
            labels[step["target_label"]] = found.expand(template)
    return labels


def _pod_labels(pod: dict[str, Any]) -> dict[str, str]:
    """The discovery labels Prometheus's pod role gives a pod of a Deployment (ip 10.0.0.7)."""
    meta = pod["spec"]["template"]["metadata"]

    def clean(name: str) -> str:
        return re.sub(r"[^a-zA-Z0-9_]", "_", name)

    labels = {"__address__": "10.0.0.7", "__meta_kubernetes_namespace": "rlhealth"}
    labels |= {f"__meta_kubernetes_pod_label_{clean(k)}": v for k, v in meta["labels"].items()}
    annotations = meta.get("annotations", {})
    labels |= {f"__meta_kubernetes_pod_annotation_{clean(k)}": v for k, v in annotations.items()}
    return labels


def test_pod_discovery_names_each_job_as_the_rules_do() -> None:
    """The annotation scrape config, applied to the rendered pods, keeps the worker, ingest and
    board pods at their metrics port and path with job rlhealth-<component>, and drops a pod of
    another app."""
    from tests.deploy.tools import of_kind, render

    (job,) = yaml.safe_load(SCRAPE.read_text())["scrape_configs"]
    seen = {}
    for deployment in of_kind(render("overlays/prod"), "Deployment"):
        target = _relabel(_pod_labels(deployment), job["relabel_configs"])
        assert target is not None, deployment["metadata"]["name"]
        seen[target["job"]] = (target["__address__"], target["__metrics_path__"])
    assert seen == {
        "rlhealth-worker": ("10.0.0.7:9808", "/metrics"),
        "rlhealth-ingest": ("10.0.0.7:9809", "/metrics"),
        "rlhealth-board": ("10.0.0.7:8080", "/metrics"),
    }
    stranger = {"__address__": "10.0.0.8", "__meta_kubernetes_pod_label_app": "other"}
    assert _relabel(stranger, job["relabel_configs"]) is None
