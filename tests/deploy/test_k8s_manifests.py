"""The Kubernetes manifests (deploy/k8s): every overlay renders with kubectl kustomize and validates
offline — built-in kinds against the Kubernetes schemas of kubernetes-validate, KEDA and
Prometheus-operator resources against their vendored CRDs — and holds the deployment's promises:
least-privilege RBAC, secrets only by reference, memory sized from the parse budget, a grace
period longer than a capture, probes on each process's own health, KEDA reading the queues the
pipeline writes, scrape jobs the rules name."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from shared.settings import Settings
from shared.streams import INGEST_GROUP, StreamNames
from tests.deploy.tools import (
    COMPOSE_PROMETHEUS,
    FIXTURES,
    OVERLAYS,
    ROOT,
    SCRAPE,
    config,
    container,
    named,
    of_kind,
    render,
    rule_exprs,
)

# The Kubernetes versions the manifests must fit: the oldest still common on managed clusters,
# and the newest kubernetes-validate knows.
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
CUSTOM = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.yaml",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda.sh_triggerauthentications.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
}
# verbs that change what they touch; `create` is allowed on pods/exec only (probe-rbac/role.yaml)
WRITE_VERBS = frozenset(
    {"create", "update", "patch", "delete", "deletecollection", "escalate", "bind", "impersonate"}
)
SECRETS = {"rlhealth-redis", "rlhealth-verdict-key", "rlhealth-s3", "rlhealth-probes"}
MAIN_PROCESS_MB = 512  # the worker's main process beside its pool children (worker.yaml)
TASK_OVERHEAD_MB = 512  # Python, polars and matplotlib in a child beside its parse
APPS = ("rlhealth-worker", "rlhealth-ingest", "rlhealth-board")


@pytest.fixture(params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[dict[str, Any], ...]:
    return render(f"overlays/{request.param}")


def _all_docs() -> Iterator[tuple[str, dict[str, Any]]]:
    for target in ("base", "probe-rbac", *(f"overlays/{name}" for name in OVERLAYS)):
        for doc in render(target):
            yield target, doc


# --- it renders and validates ---------------------------------------------------------------------


def test_every_overlay_renders_the_whole_deployment(overlay: tuple[dict[str, Any], ...]) -> None:
    """Each overlay gives the three Deployments, the probe Role and its binding, the scaler, the
    monitoring resources and the dashboard, and no Secret (those are the operator's)."""
    kinds = {doc["kind"] for doc in overlay}
    assert {
        "Deployment",
        "Role",
        "RoleBinding",
        "ScaledObject",
        "TriggerAuthentication",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap",
        "Namespace",
    } <= kinds
    assert "Secret" not in kinds
    assert {d["metadata"]["name"] for d in of_kind(overlay, "Deployment")} >= set(APPS)
    dashboards = [d for d in of_kind(overlay, "ConfigMap") if "rl-job-health.json" in d["data"]]
    assert dashboards and dashboards[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    json.loads(dashboards[0]["data"]["rl-job-health.json"])


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_built_in_kinds_validate_against_the_kubernetes_schemas(version: str) -> None:
    """Every Deployment, Service, policy, role... of every render validates strictly (unknown
    fields refused) against the Kubernetes schemas bundled by kubernetes-validate, offline."""
    checked = 0
    for target, doc in _all_docs():
        if (doc["apiVersion"], doc["kind"]) in CUSTOM:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{target} {doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")
        checked += 1
    assert checked > 40


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The CRD schema with unknown fields refused wherever it lists its fields and does not keep
    unknown ones (the API server would prune them silently: a typo would vanish)."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@cache
def _crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    crd = yaml.safe_load((FIXTURES / "crds" / CUSTOM[(api_version, kind)]).read_text())
    version = api_version.rsplit("/", 1)[1]
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return _strict(found["schema"]["openAPIV3Schema"])


def test_custom_resources_validate_against_the_vendored_crds() -> None:
    """Every ScaledObject, TriggerAuthentication, ServiceMonitor and PrometheusRule validates
    against the CRD of KEDA 2.20.2 or Prometheus-operator 0.93.0, unknown fields refused."""
    seen = set()
    for target, doc in _all_docs():
        key = (doc["apiVersion"], doc["kind"])
        if key not in CUSTOM:
            continue
        validator = jsonschema.Draft7Validator(_crd_schema(*key))
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
        assert not errors, f"{target} {doc['kind']}: {[e.message for e in errors]}"
        seen.add(key)
    assert seen == set(CUSTOM)


def test_the_strict_crd_check_refuses_a_misspelt_field() -> None:
    """The check has teeth: `maxReplicas` (KEDA's field is maxReplicaCount) is refused."""
    scaled = copy.deepcopy(named(render("base"), "ScaledObject", "rlhealth-worker"))
    scaled["spec"]["maxReplicas"] = 3
    validator = jsonschema.Draft7Validator(_crd_schema("keda.sh/v1alpha1", "ScaledObject"))
    assert any("maxReplicas" in error.message for error in validator.iter_errors(scaled))


# --- RBAC -----------------------------------------------------------------------------------------


def rbac_violations(role: dict[str, Any]) -> list[str]:
    """What a Role or ClusterRole grants beyond reading and `create` on pods/exec."""
    found = []
    for rule in role.get("rules", ()):
        verbs, resources = set(rule.get("verbs", ())), set(rule.get("resources", ()))
        if "*" in verbs or "*" in resources or "*" in set(rule.get("apiGroups", ())):
            found.append(f"wildcard in {rule}")
        writes = verbs & WRITE_VERBS
        if writes - {"create"} or ("create" in writes and resources != {"pods/exec"}):
            found.append(f"{sorted(writes)} on {sorted(resources)}")
    return found


def test_no_role_grants_more_than_reading_and_exec() -> None:
    """No Role or ClusterRole of any render grants delete, patch, update or create on anything
    but pods/exec; the worker's Role grants exactly pods get/list, pods/log get and pods/exec
    create."""
    roles = [doc for _t, doc in _all_docs() if doc["kind"] in ("Role", "ClusterRole")]
    assert roles
    for role in roles:
        assert rbac_violations(role) == [], role["metadata"]["name"]
    grants = {
        (resource, verb)
        for rule in named(render("probe-rbac"), "Role", "rlhealth-probe")["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert grants == {
        ("pods", "get"),
        ("pods", "list"),
        ("pods/log", "get"),
        ("pods/exec", "create"),
    }


@pytest.mark.parametrize(
    ("rule", "refused"),
    [
        ({"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}, False),
        ({"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}, True),
        ({"apiGroups": [""], "resources": ["pods/exec", "pods"], "verbs": ["create"]}, True),
        ({"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "delete"]}, True),
        ({"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["patch"]}, True),
        ({"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}, True),
        ({"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]}, False),
    ],
)
def test_the_rbac_check_tells_exec_from_any_other_write(
    rule: dict[str, Any], refused: bool
) -> None:
    """`create` on pods/exec alone passes; create on pods, any delete or patch, or a wildcard is
    refused."""
    assert bool(rbac_violations({"rules": [rule]})) is refused


def test_only_the_worker_gets_a_service_account_token(overlay: tuple[dict[str, Any], ...]) -> None:
    """The worker mounts its token (kubectl in-cluster); ingest and the board get none, and the
    probe Role is bound to the worker's ServiceAccount in the worker's own namespace."""
    tokens = {
        name: named(overlay, "Deployment", name)["spec"]["template"]["spec"].get(
            "automountServiceAccountToken"
        )
        for name in APPS
    }
    assert tokens == {"rlhealth-worker": True, "rlhealth-ingest": False, "rlhealth-board": False}
    worker = named(overlay, "Deployment", "rlhealth-worker")
    binding = named(overlay, "RoleBinding", "rlhealth-probe")
    (subject,) = binding["subjects"]
    assert subject["name"] == worker["spec"]["template"]["spec"]["serviceAccountName"]
    assert subject["namespace"] == worker["metadata"]["namespace"]
    assert binding["metadata"]["namespace"] != worker["metadata"]["namespace"]


# --- secrets by reference -------------------------------------------------------------------------


def _secret_refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key in ("secretKeyRef", "secret", "secretTargetRef"):
            value = node.get(key)
            if isinstance(value, dict):
                yield str(value.get("name") or value.get("secretName"))
            elif isinstance(value, list):
                yield from (str(item["name"]) for item in value)
        for value in node.values():
            yield from _secret_refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _secret_refs(value)


def test_secrets_are_named_never_written(overlay: tuple[dict[str, Any], ...]) -> None:
    """No Secret, no plain-text value of a secret setting: the Redis password, the verdict key
    and the S3 keys come only from the four Secrets the operator creates, each described in
    docs/deploy.md."""
    assert set(_secret_refs(list(overlay))) == SECRETS
    secret_names = re.compile(r"PASSWORD|SECRET|VERDICT_KEY$|ACCESS_KEY|TOKEN|CONTROLLER_URL")
    for name in APPS:
        for env in container(overlay, name).get("env", ()):
            if secret_names.search(env["name"]):
                assert "value" not in env, f"{name}: {env['name']} written in the manifest"
    assert not any(secret_names.search(key) for key in config(overlay))
    guide = (ROOT / "docs" / "deploy.md").read_text()
    for secret in SECRETS:
        assert f"`{secret}`" in guide, secret


# --- sizing, grace, probes ------------------------------------------------------------------------


def _mebibytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * (1024 if unit == "Gi" else 1)


def _concurrency(command: list[str]) -> int:
    (value,) = [arg.split("=", 1)[1] for arg in command if arg.startswith("--concurrency=")]
    return int(value)


def test_worker_memory_holds_its_children_at_their_budget(
    overlay: tuple[dict[str, Any], ...],
) -> None:
    """The worker's memory limit holds --concurrency children at RLHEALTH_WORKER_MEMORY_MB and the
    main process; each child's budget holds a parse at RLHEALTH_PARSE_MEMORY_MB and the rest of
    the task; requests equal limits, so a node never promises memory a capture cannot have."""
    settings = config(overlay)
    parse_mb, task_mb = (
        int(settings["RLHEALTH_PARSE_MEMORY_MB"]),
        int(settings["RLHEALTH_WORKER_MEMORY_MB"]),
    )
    worker = container(overlay, "rlhealth-worker")
    limit = _mebibytes(worker["resources"]["limits"]["memory"])
    assert worker["resources"]["requests"]["memory"] == worker["resources"]["limits"]["memory"]
    assert task_mb >= parse_mb + TASK_OVERHEAD_MB
    assert limit >= _concurrency(worker["command"]) * task_mb + MAIN_PROCESS_MB


def test_the_worker_outlasts_a_capture_when_it_is_stopped(
    overlay: tuple[dict[str, Any], ...],
) -> None:
    """terminationGracePeriodSeconds exceeds the capture's hard time limit and a publish after it,
    so a rollout or a drain lets the captures under way finish."""
    limit = float(config(overlay).get("RLHEALTH_CAPTURE_TIME_LIMIT_S", 300))
    publish = Settings().gate_time_limit_s
    spec = named(overlay, "Deployment", "rlhealth-worker")["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] > limit
    assert spec["terminationGracePeriodSeconds"] < limit + publish + 60  # not hours either


def _arg(command: list[str], option: str) -> str:
    (value,) = [arg.split("=", 1)[1] for arg in command if arg.startswith(f"{option}=")]
    return value


@pytest.mark.parametrize("app", APPS)
def test_probes_ask_each_process_for_its_own_health(
    overlay: tuple[dict[str, Any], ...], app: str
) -> None:
    """Liveness asks /healthz on the port the process serves it on (worker and ingest:
    --health-port; the board: its own port); readiness and start-up ask /readyz where there is
    one."""
    box = container(overlay, app)
    ports = {port["name"]: port["containerPort"] for port in box["ports"]}
    live = box["livenessProbe"]["httpGet"]
    assert live["path"] == "/healthz"
    if app == "rlhealth-board":
        assert ports[live["port"]] == int(_arg(box["command"], "--port"))
        return
    assert ports[live["port"]] == int(_arg(box["command"], "--health-port"))
    assert box["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert box["startupProbe"]["httpGet"]["path"] == "/readyz"


@pytest.mark.parametrize("app", APPS)
def test_each_container_runs_a_command_the_cli_accepts(
    overlay: tuple[dict[str, Any], ...], app: str
) -> None:
    """The image's `rl-health` accepts every option the manifests give it (parsed by the CLI
    itself, nothing started), and the image is the one the Dockerfile builds."""
    import click

    from worker.cli import main

    box = container(overlay, app)
    assert box["image"].split(":")[0].rsplit("/", 1)[-1] == "rl-job-health"
    program, verb, *args = box["command"]
    assert program == "rl-health"
    command = main.get_command(click.Context(main), verb)
    assert command is not None, verb
    args = [re.sub(r"\$\(\w+\)", "pod-0", arg) for arg in args]  # $(POD_NAME), set by the kubelet
    command.make_context(verb, args)


# --- autoscaling ----------------------------------------------------------------------------------


def test_keda_reads_the_queue_and_stream_the_pipeline_writes(
    overlay: tuple[dict[str, Any], ...],
) -> None:
    """The Celery queue's list and the alert stream's `ingest` group, under the ConfigMap's
    stream prefix; min, max and the scale-down wait are set; the metadata keys are ones KEDA's
    redis scalers read, and the authentication gives only parameters they take."""
    names = StreamNames(config(overlay)["RLHEALTH_STREAM_PREFIX"])
    scaled = named(overlay, "ScaledObject", "rlhealth-worker")["spec"]
    triggers = {trigger["type"]: trigger for trigger in scaled["triggers"]}
    assert triggers["redis"]["metadata"]["listName"] == names.task_queue
    assert triggers["redis-streams"]["metadata"]["stream"] == names.alerts
    assert triggers["redis-streams"]["metadata"]["consumerGroup"] == INGEST_GROUP
    assert 1 <= scaled["minReplicaCount"] < scaled["maxReplicaCount"]
    behavior = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300
    known = json.loads((FIXTURES / "keda-trigger-metadata.json").read_text())
    for kind, trigger in triggers.items():
        assert set(trigger["metadata"]) <= set(known[kind]) | set(known["connection"]), kind
        assert trigger["authenticationRef"]["name"] == "rlhealth-redis"
    auth = named(overlay, "TriggerAuthentication", "rlhealth-redis")["spec"]["secretTargetRef"]
    assert {ref["parameter"] for ref in auth} <= set(known["authParams"])
    assert scaled["scaleTargetRef"]["name"] == "rlhealth-worker"


# --- network --------------------------------------------------------------------------------------


def _policies(docs: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc["spec"] for doc in of_kind(docs, "NetworkPolicy")}


def test_network_is_closed_but_for_what_each_process_needs(
    overlay: tuple[dict[str, Any], ...],
) -> None:
    """A default deny for every pod; the worker and ingest are reached by Prometheus only, on
    their metrics port; the board from its own namespace (and Prometheus)."""
    policies = _policies(overlay)
    deny = policies["rlhealth-default-deny"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny
    for app, port in (("rlhealth-worker", 9808), ("rlhealth-ingest", 9809)):
        (rule,) = policies[app]["ingress"]
        (source,) = rule["from"]
        assert source["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
        assert [p["port"] for p in rule["ports"]] == [port]
    board = policies["rlhealth-board"]["ingress"]
    assert {"podSelector": {}} in board[0]["from"]
    assert all("ipBlock" not in source for rule in board for source in rule["from"])


# --- scraping -------------------------------------------------------------------------------------


def _rule_jobs() -> set[str]:
    jobs = set()
    for expr in rule_exprs():
        for matcher in re.findall(r'job=~?"([^"]+)"', expr):
            jobs |= set(re.sub(r"[()^$]", "", matcher).replace("rlhealth-", "").split("|"))
    return {f"rlhealth-{job}" for job in jobs}


def test_the_rules_name_the_jobs_every_scrape_configuration_makes() -> None:
    """The `job` values the rules use are the ServiceMonitors' Services, the jobs of the compose
    Prometheus (deploy/prometheus.yml), and what the annotation scrape config relabels pods to."""
    jobs = _rule_jobs()
    assert jobs == {"rlhealth-worker", "rlhealth-ingest", "rlhealth-board"}
    base = render("base")
    services = {d["metadata"]["name"] for d in of_kind(base, "Service")}
    for monitor in of_kind(base, "ServiceMonitor"):
        selected = monitor["spec"]["selector"]["matchLabels"]
        (service,) = [
            d
            for d in of_kind(base, "Service")
            if selected.items() <= d["metadata"]["labels"].items()
        ]
        assert service["metadata"]["name"] in jobs
    assert jobs <= services
    compose = yaml.safe_load(COMPOSE_PROMETHEUS.read_text())
    assert jobs <= {job["job_name"] for job in compose["scrape_configs"]}
    scrape = SCRAPE.read_text()
    assert "replacement: rlhealth-$1" in scrape
    components = {
        d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        for d in of_kind(base, "Deployment")
    }
    assert {f"rlhealth-{component}" for component in components} == jobs


def test_the_image_reference_is_the_dockerfiles() -> None:
    """The base names the image `rl-job-health`, the name docker-compose.yml builds the
    Dockerfile as; the overlays only choose its registry and tag."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    built = compose["x-rlhealth-app"]["image"].split(":")[0]
    assert built == "rl-job-health" and (ROOT / "Dockerfile").is_file()
    kustomization = yaml.safe_load((ROOT / "deploy/k8s/base/kustomization.yaml").read_text())
    assert [image["name"] for image in kustomization["images"]] == [built]
    for name in OVERLAYS:
        for app in APPS:
            image = container(render(f"overlays/{name}"), app)["image"]
            assert Path(image.split(":")[0]).name == built


def _expand(value: str, known: dict[str, str]) -> str:
    """Kubernetes' `$(NAME)` expansion of an env value: names defined before it (envFrom and
    earlier entries) are replaced, `$$` is a `$`, anything else is left as written."""

    def one(found: re.Match[str]) -> str:
        if found.group(0) == "$$":
            return "$"
        return known.get(found.group(1), found.group(0))

    return re.sub(r"\$\$|\$\((\w+)\)", one, value)


@pytest.mark.parametrize("app", APPS)
def test_the_redis_url_made_in_the_pod_is_the_one_redis_py_reads(
    overlay: tuple[dict[str, Any], ...], app: str
) -> None:
    """The environment a pod gets (the ConfigMap, then the Secret's address, user and password)
    expands to a RLHEALTH_REDIS_URL that redis-py parses into that host, port, user, password and
    database."""
    import redis

    secret = {"address": "redis.internal:6380", "username": "rlhealth", "password": "a1b2c3"}
    known = dict(config(overlay))
    for env in container(overlay, app)["env"]:
        if "value" in env:
            known[env["name"]] = _expand(env["value"], known)
        elif "secretKeyRef" in env.get("valueFrom", {}):
            ref = env["valueFrom"]["secretKeyRef"]
            if ref["name"] == "rlhealth-redis":
                known[env["name"]] = secret[ref["key"]]
    url = known["RLHEALTH_REDIS_URL"]
    assert "$(" not in url
    assert Settings(redis_url=url).redis_url == url
    options = redis.Redis.from_url(url).connection_pool.connection_kwargs
    assert (options["host"], options["port"], options["db"]) == ("redis.internal", 6380, 0)
    assert (options["username"], options["password"]) == ("rlhealth", "a1b2c3")
