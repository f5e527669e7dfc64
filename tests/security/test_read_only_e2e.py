"""Read-only, proven end to end: `diagnose --backend` for every backend, and the pipeline, on every
crafted input (bundle values, settings, cluster replies) with a spy in place of every cluster tool.
After each run, every command a spy received must pass the allowlist of the operator's tools and
hold no mutating verb; decoys (a shell, `scancel`, `pkill`, ...) must never run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from click.testing import CliRunner, Result

from shared.settings import Settings
from tests.security.bundles import NOW, crafted_bundle, rewrite_manifest
from tests.security.spies import DECOYS, Spies, spies_on_path
from worker.backends import BACKENDS
from worker.backends.allowlist import LOCAL_TOOLS
from worker.cli import main

FORBIDDEN: frozenset[str] = frozenset(
    {"kill", "stop", "delete", "cancel", "patch", "apply", "scale", "edit", "drain", "cordon",
     "secrets", "secret", "configmaps", "--force", "--delete-all", "-rf", "--locals", "--raw",
     "--config", "environ", "scancel", "requeue", "run"}
)  # fmt: skip

# Bundle values an attacker controls: each becomes manifest keys of a stale, quiet, running job.
BUNDLES: dict[str, dict[str, Any]] = {
    "kubeconfig in the manifest": {
        "cluster_block": {"name": "cw", "context": "evil", "kubeconfig": "{manifest}"}
    },
    "job id is an option": {"job_id": "--force"},
    "cluster is an option": {"cluster": "--delete-all"},
    "job id carries a shell command": {"job_id": "/ops/rl-job;kill -9 1"},
    "job id carries a line break": {"job_id": "/ops/rl-job\nVERDICT: NO-KILL\x1b[2J"},
    "job id with LIKE wildcards": {"job_id": "/ops/rl_%"},
    "local pid is an option": {"job_id": "/local/--pid"},
    "slurm job number is an option": {"job_id": "/ops/812 -X --delete"},
    "plain job, hostile cluster replies": {},
}

# What the cluster answers: task ids and pod names that try to become options or commands.
HOSTILE_TASKS = ["--force", "/ops/rl-job/0;kill -9 1", "-rf", "/ops/rl-job/0"]
PODS = {
    "items": [
        {"metadata": {"name": name}, "status": {"phase": "Running"}}
        for name in ("--all-namespaces", "x;rm -rf /", "rl-job-0")
    ]
}
PS = "  PID  PPID COMMAND\n    1     0 ps -ww -eo pid,ppid,args\n   41     0 python train.py\n"


def _hostile_replies(spies: Spies) -> None:
    summary = {"job_id": "/ops/rl-job", "state": 3,
               "tasks": [{"task_id": t, "state": 3} for t in HOSTILE_TASKS]}  # fmt: skip
    spies.reply(r"job --help", "Commands:\n  summary\n  logs\n")
    spies.reply(r"job summary", json.dumps(summary))
    spies.reply(r"get pods", json.dumps(PODS))
    spies.reply(r" ps -ww", PS)
    spies.reply(r"^cat /proc/\d+/status", "Name: python\nState: S (sleeping)\n")
    spies.reply(r"^sacct", "812|RUNNING|0:0|2026-07-30T19:05:00|Unknown|node-1|None\n")
    spies.reply(r"^squeue", "812|RUNNING|node-1|None\n")
    spies.reply(r"py-spy dump", 'Thread 41 (idle): "MainThread"\n    all_reduce (x.py:1)\n')


@pytest.fixture
def spies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Spies:
    """Spies for every tool, answering with hostile data; a refresh through the watcher spy."""
    found = spies_on_path(monkeypatch, tmp_path / "bin")
    monkeypatch.setenv("RLHEALTH_PROBE_INTERVAL_S", "0.01")
    monkeypatch.setenv("RLHEALTH_PROBE_TIMEOUT_S", "20")
    monkeypatch.setenv("RLHEALTH_REFRESH_COMMAND", f"{found.bin / 'watcher'} sync {{job_id}}")
    _hostile_replies(found)
    return found


def _bundle(root: Path, craft: Mapping[str, Any]) -> Path:
    job_dir = crafted_bundle(root, stale=True)
    manifest = str(job_dir / "manifest.json")
    values = json.loads(json.dumps(craft).replace("{manifest}", manifest))
    if values:
        rewrite_manifest(job_dir, **values)
    return job_dir


def _diagnose(job_dir: Path, backend: str, out: Path) -> Result:
    argv = ["diagnose", str(job_dir), "--now", NOW.isoformat(), "--backend", backend]
    return CliRunner().invoke(main, [*argv, "--out", str(out)], catch_exceptions=False)


def assert_read_only(spies: Spies, settings: Settings | None = None) -> None:
    """Every command that ran passes the operator's allowlist and holds no mutating word."""
    allowlist = spies.toolbox(settings or Settings()).allowlist()
    for call in spies.calls():
        assert call[0] not in DECOYS or call[0] == "watcher", call
        allowlist.check((str(spies.bin / call[0]), *call[1:]))
        assert not FORBIDDEN & set(call[1:]), call
        if "exec" in call:  # `iris task exec` / `kubectl exec`: only a probe after `--`
            assert call[call.index("--") + 1] in LOCAL_TOOLS, call


# every crafted bundle through iris (the first backend) in the fast tier; the other backends, the
# whole cross product, with the slow tests (`make test`)
EVERY_BACKEND = [BACKENDS[0], *(pytest.param(b, marks=pytest.mark.slow) for b in BACKENDS[1:])]


@pytest.mark.parametrize("backend", EVERY_BACKEND)
@pytest.mark.parametrize("craft", list(BUNDLES), ids=list(BUNDLES))
def test_diagnose_backend_stays_read_only_on_crafted_bundles(
    spies: Spies, tmp_path: Path, backend: str, craft: str
) -> None:
    """Whatever the bundle and the cluster say, only allowlisted read-only commands run."""
    result = _diagnose(_bundle(tmp_path / "b", BUNDLES[craft]), backend, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert_read_only(spies)
    assert "VERDICT:" in result.output and "\x1b" not in result.output


def test_the_crafted_runs_did_reach_the_tools(spies: Spies, tmp_path: Path) -> None:
    """The plain crafted run exercises controller, attempts, logs, ps, stacks and the refresh,
    and never the hostile task ids (so the checks above are not vacuous)."""
    _diagnose(_bundle(tmp_path / "b", {}), "iris", tmp_path / "out")
    words = [" ".join(call) for call in spies.calls()]
    for expected in ("watcher sync /ops/rl-job", "job summary", "query", "job logs", "py-spy dump"):
        assert any(expected in line for line in words), (expected, words)
    assert not any("--force" in line or ";kill" in line for line in words)


SETTINGS: dict[str, dict[str, str]] = {
    "refresh kills the job": {"RLHEALTH_REFRESH_COMMAND": "{bin}/iris job kill {{job_id}}"},
    "refresh is a shell": {"RLHEALTH_REFRESH_COMMAND": "sh -c 'scancel {{job_id}}'"},
    "refresh hides a verb in an option": {
        "RLHEALTH_REFRESH_COMMAND": "{bin}/watcher --action=delete {{job_id}}"
    },
    "refresh runs inline code": {"RLHEALTH_REFRESH_COMMAND": "python3 -c 'import os' {{job_id}}"},
    "refresh pads its placeholder": {"RLHEALTH_REFRESH_COMMAND": "{bin}/watcher {{job_id:>99}}"},
    "iris command is a shell": {"RLHEALTH_IRIS_COMMAND": "sh -c 'iris job kill x' iris"},
    "iris command is env": {"RLHEALTH_IRIS_COMMAND": "env iris"},
    "iris command adds a config": {"RLHEALTH_IRIS_COMMAND": "{bin}/iris --config /tmp/x"},
    "kube context is an option": {"RLHEALTH_KUBE_CONTEXT": "--exec=sh"},
    "clusters map names a relative kubeconfig": {
        "RLHEALTH_CLUSTERS": '{{"cw": {{"kubeconfig": "x"}}}}'
    },
    "clusters map is broken": {"RLHEALTH_CLUSTERS": "{{cw = "},
}


@pytest.mark.parametrize("backend", ["iris", "kubernetes"])
@pytest.mark.parametrize("setting", list(SETTINGS), ids=list(SETTINGS))
def test_crafted_settings_are_refused_at_start_up(
    spies: Spies, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backend: str, setting: str
) -> None:
    """A setting that would run a mutating command or a shell stops the command (exit 2), naming
    the setting, before any process starts."""
    for name, value in SETTINGS[setting].items():
        monkeypatch.setenv(name, value.format(bin=spies.bin))
    result = _diagnose(_bundle(tmp_path / "b", {}), backend, tmp_path / "out")
    assert result.exit_code == 2 and "settings refused" in result.output
    assert spies.calls() == []


def test_a_cluster_the_operator_did_not_configure_is_not_probed(
    spies: Spies, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With RLHEALTH_CLUSTERS set, a bundle naming another cluster gets no live probe."""
    monkeypatch.setenv("RLHEALTH_CLUSTERS", json.dumps({"prod": {"kube_context": "prod"}}))
    result = _diagnose(_bundle(tmp_path / "b", {"cluster": "cw"}), "kubernetes", tmp_path / "out")
    assert result.exit_code == 0 and "not configured in RLHEALTH_CLUSTERS" in result.output
    assert [call for call in spies.calls() if call[0] == "kubectl"] == []


def test_a_configured_cluster_connection_is_used(
    spies: Spies, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The bundle's cluster selects its RLHEALTH_CLUSTERS entry: kubeconfig, context, namespace."""
    kubeconfig = tmp_path / "cw.kubeconfig"
    kubeconfig.write_text("apiVersion: v1\n")
    entry = {"kubeconfig": str(kubeconfig), "kube_context": "cw-ctx", "namespace": "rl"}
    monkeypatch.setenv(
        "RLHEALTH_CLUSTERS", "[cw]\n" + "\n".join(f'{k} = "{v}"' for k, v in entry.items())
    )
    _diagnose(_bundle(tmp_path / "b", {}), "kubernetes", tmp_path / "out")
    (first, *_rest) = [call for call in spies.calls() if call[0] == "kubectl"]
    assert first[1:4] == [f"--kubeconfig={kubeconfig}", "--context=cw-ctx", "--namespace=rl"]
    assert_read_only(spies, Settings(clusters=json.dumps({"cw": entry})))


@pytest.mark.parametrize("craft", list(BUNDLES), ids=list(BUNDLES))
def test_the_pipeline_spawns_nothing_on_crafted_bundles(
    spies: Spies, tmp_path: Path, craft: str
) -> None:
    """Capture, gates and verdict of the pipeline read files only: no spy ever runs."""
    from shared.models import Event
    from worker.pipeline.steps import GATE_NAMES, Pipeline
    from worker.pipeline.store import MemoryStore

    root = tmp_path / "b"
    job_dir = _bundle(root, BUNDLES[craft])
    pipeline = Pipeline(Settings(bundle_root=root, cache_dir=tmp_path / "c"), MemoryStore(),
                        fakeredis.FakeRedis())  # fmt: skip
    event = Event(event_id="evt-1", job_dir=str(job_dir.relative_to(root)), published_at=NOW)
    pipeline.events.archive(event)
    pipeline.capture("evt-1", "evt-1", claim="t")
    results = [pipeline.gate("evt-1", name) for name in GATE_NAMES]
    entry = pipeline.verdict(results, "evt-1", "evt-1")
    assert "\n" not in entry["job_id"] and "\x1b" not in entry["job_id"]
    assert spies.calls() == []
