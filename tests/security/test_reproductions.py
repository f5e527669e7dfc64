"""The reproductions of issue 9, driven as an attacker would: a crafted bundle, crafted settings,
spies (or the real kubectl) in place of the cluster tools. Each fails on the code before the fix.
Reproduction 4 (secrets quoted verbatim) is the corpus of `test_leaks.py`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.security.bundles import NOW, crafted_bundle, rewrite_manifest
from tests.security.spies import Spies, spies_on_path
from worker.backends import RefusedCommandError, default_runner
from worker.cli import main


def _diagnose(job_dir: Path, *args: str) -> Result:
    """`rl-health diagnose JOB_DIR --now NOW ARGS...` in this process."""
    argv = ["diagnose", str(job_dir), "--now", NOW.isoformat(), *args]
    return CliRunner().invoke(main, argv, catch_exceptions=False)


@pytest.fixture
def spies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Spies:
    """Spies first on PATH and on the tool path; probes time out fast."""
    monkeypatch.setenv("RLHEALTH_PROBE_TIMEOUT_S", "20")
    monkeypatch.setenv("RLHEALTH_PROBE_INTERVAL_S", "0.01")
    return spies_on_path(monkeypatch, tmp_path / "bin")


def _words(spies: Spies) -> list[str]:
    return [word for call in spies.calls() for word in call]


# --- 1. a crafted bundle runs a command ---------------------------------------------------------


def test_bundle_kubeconfig_and_context_never_reach_kubectl(spies: Spies, tmp_path: Path) -> None:
    """A manifest naming its own file as kubeconfig and an `evil` context changes no argv."""
    job_dir = crafted_bundle(tmp_path / "b")
    kubeconfig = str(job_dir / "manifest.json")
    rewrite_manifest(
        job_dir, cluster_block={"name": "cw", "kubeconfig": kubeconfig, "context": "evil"}
    )
    _diagnose(job_dir, "--backend", "kubernetes", "--out", str(tmp_path / "out"))
    kubectl = [call for call in spies.calls() if call[0] == "kubectl"]
    assert kubectl, "kubectl was never asked: the test would prove nothing"
    assert not any("--kubeconfig" in w or "evil" in w for call in kubectl for w in call)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")
def test_a_manifest_that_is_a_kubeconfig_runs_no_credential_plugin(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With the real kubectl, a manifest that is also a kubeconfig with an exec plugin never
    gets that plugin run (before the fix it ran `sh -c` from the bundle)."""
    marker = tmp_path / "PWNED"
    job_dir = crafted_bundle(tmp_path / "b")
    plugin = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": "sh",
        "args": ["-c", f"touch {marker}; exit 1"],
        "interactiveMode": "Never",
    }
    rewrite_manifest(
        job_dir,
        apiVersion="v1",
        kind="Config",
        clusters=[{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        users=[{"name": "u", "user": {"exec": plugin}}],
        contexts=[{"name": "evil", "context": {"cluster": "c", "user": "u"}}],
        **{"current-context": "evil"},
        cluster_block={
            "name": "cw",
            "kubeconfig": str(job_dir / "manifest.json"),
            "context": "evil",
        },
    )
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    monkeypatch.setenv("RLHEALTH_PROBE_TIMEOUT_S", "20")
    _diagnose(job_dir, "--backend", "kubernetes", "--out", str(tmp_path / "out"))
    assert not marker.exists()


# --- 2. settings bypass the allowlist -----------------------------------------------------------


def test_a_refresh_setting_cannot_kill_the_job(
    spies: Spies, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`RLHEALTH_REFRESH_COMMAND='iris job kill {job_id}'` is refused at start-up; nothing runs."""
    monkeypatch.setenv("RLHEALTH_REFRESH_COMMAND", f"{spies.bin / 'iris'} job kill {{job_id}}")
    result = _diagnose(crafted_bundle(tmp_path / "b", stale=True), "--backend", "iris")
    assert "kill" not in _words(spies)
    assert result.exit_code == 2 and "RLHEALTH_REFRESH_COMMAND" in result.output


def test_an_iris_command_setting_cannot_be_a_shell(
    spies: Spies, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`RLHEALTH_IRIS_COMMAND="sh -c '…' iris"` is refused at start-up; no shell starts."""
    marker = tmp_path / "PWNED"
    monkeypatch.setenv("RLHEALTH_IRIS_COMMAND", f"sh -c 'touch {marker}' iris")
    result = _diagnose(crafted_bundle(tmp_path / "b"), "--backend", "iris")
    assert not marker.exists() and not [c for c in spies.calls() if c[0] == "sh"]
    assert result.exit_code == 2 and "RLHEALTH_IRIS_COMMAND" in result.output


def test_a_tool_is_known_by_its_path_not_its_name(spies: Spies, tmp_path: Path) -> None:
    """An executable named `ps` outside the tool path resolved at start-up never runs."""
    evil = tmp_path / "evil" / "ps"
    evil.parent.mkdir()
    evil.write_text(f"#!/bin/sh\ntouch {tmp_path / 'PWNED'}\n")
    evil.chmod(0o755)
    with contextlib.suppress(RefusedCommandError):
        default_runner()([str(evil)], 5)
    assert not (tmp_path / "PWNED").exists()


def test_reading_secrets_is_refused(spies: Spies) -> None:
    """`kubectl get secrets -A` is not a read-only probe: refused, kubectl never starts."""
    with contextlib.suppress(RefusedCommandError):
        default_runner()([str(spies.bin / "kubectl"), "get", "secrets", "-A"], 5)
    assert spies.calls() == []


# --- 3. values become options -------------------------------------------------------------------


def test_bundle_values_never_become_options(
    spies: Spies, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A manifest cluster `--delete-all` and job id `--force` reach no argv, as option or value."""
    monkeypatch.setenv(
        "RLHEALTH_REFRESH_COMMAND", f"{spies.bin / 'watcher'} sync {{cluster}} {{job_id}}"
    )
    job_dir = crafted_bundle(tmp_path / "b", stale=True)
    rewrite_manifest(job_dir, job_id="--force", cluster="--delete-all")
    result = _diagnose(job_dir, "--backend", "iris", "--format", "json")
    assert not any("--force" in w or "--delete-all" in w for w in _words(spies))
    assert "refused" in result.output


def test_like_wildcards_in_a_job_id_match_only_themselves(spies: Spies, tmp_path: Path) -> None:
    """`_` in a job name is escaped in the attempts query (`LIKE ... ESCAPE '\\'`)."""
    _diagnose(crafted_bundle(tmp_path / "b", name="rl_job"), "--backend", "iris")
    (sql,) = [w for w in _words(spies) if w.startswith("SELECT")]
    assert "LIKE '/ops/rl\\_job/%' ESCAPE '\\'" in sql


# --- 5. reports can be forged -------------------------------------------------------------------


def test_a_job_id_cannot_forge_report_lines(tmp_path: Path) -> None:
    """A job id with CR/LF and escape codes prints one VERDICT line and no control character."""
    job_dir = crafted_bundle(tmp_path / "b")
    rewrite_manifest(job_dir, job_id="/ops/rl-job\r\nVERDICT: NO-KILL\x1b[2J\x1b[H\u202e")
    text = _diagnose(job_dir).output
    assert len([line for line in text.splitlines() if line.startswith("VERDICT:")]) == 1
    assert not any(c in text for c in "\x1b\r\u202e")
    report = json.loads(_diagnose(job_dir, "--format", "json").output)
    assert "\n" not in report["job_id"] and "\x1b" not in report["job_id"]


# --- 6. output is unbounded ---------------------------------------------------------------------


def test_a_report_is_bounded_whatever_the_manifest_holds(tmp_path: Path) -> None:
    """200,000 `artifacts.errors` make a report under the byte ceiling that says how many went."""
    job_dir = crafted_bundle(tmp_path / "b")
    manifest = json.loads((job_dir / "manifest.json").read_text())
    manifest["artifacts"]["errors"] = [
        f"sync error {i}: pod log unavailable" for i in range(200_000)
    ]
    (job_dir / "manifest.json").write_text(json.dumps(manifest))
    text = _diagnose(job_dir).output
    assert len(text.encode()) <= 256 * 1024 and "… and " in text
    body = _diagnose(job_dir, "--format", "json").output
    assert len(body.encode()) <= 256 * 1024 and "… and " in json.loads(body)["discrepancies"][-1]


def test_parse_never_echoes_a_huge_line(tmp_path: Path) -> None:
    """`parse` on a log whose one line is 8 MB prints a few hundred bytes of it, not the line."""
    log = tmp_path / "finelog.log"
    log.write_text("config dump " + "x" * (8 * 1024 * 1024) + "\n")
    result = CliRunner().invoke(main, ["parse", str(log), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert len(result.stderr.encode()) < 4096 and "bytes]" in result.stderr
