"""The read-only allowlist, enforced where processes are spawned, and transient retries."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from shared.settings import Settings
from tests.security.spies import Spies, make_spybin
from worker.backends.allowlist import Allowlist, RefusedCommandError
from worker.backends.retry import is_transient, with_retries
from worker.backends.spawn import MISSING_EXIT_CODE, ProbeResult, run_probe
from worker.backends.tools import Toolbox, ToolSettingsError, resolve_tools

REFUSED = [
    (["iris", "job", "kill", "/ops/j"], "job kill"),
    (["iris", "job", "stop", "/ops/j"], "job stop"),
    (["iris", "--controller-url=http://c", "job", "run", "x"], "job run"),
    (["iris", "task", "exec", "/ops/j/0", "--", "rm", "-rf", "/"], "rm -rf"),
    (["iris", "task", "exec", "/ops/j/0", "--", "kill", "1"], "kill 1"),
    (["iris", "task", "exec", "/ops/j/0", "ls"], "exec"),
    (["iris", "query", "DELETE FROM jobs"], "query"),
    (["iris", "query", "SELECT 1; DROP TABLE jobs"], "query"),
    (["iris", "query", "UPDATE tasks SET state = 6"], "query"),
    (["iris", "cluster", "stop"], "cluster stop"),
    (["kubectl", "delete", "pod", "p"], "delete pod"),
    (["kubectl", "scale", "--replicas=0", "deploy/x"], "scale --replicas=0"),
    (["kubectl", "patch", "pod", "p", "-p", "{}"], "patch pod"),
    (["kubectl", "apply", "-f", "x.yaml"], "apply -f"),
    (["kubectl", "edit", "pod", "p"], "edit pod"),
    (["kubectl", "--context", "cw", "rollout", "restart", "deploy/x"], "rollout restart"),
    (["kubectl", "exec", "p", "--", "kill", "1"], "kill 1"),
    (["kubectl", "exec", "p", "--", "py-spy", "record", "--pid", "1"], "py-spy record"),
    (["kubectl", "cordon", "node"], "cordon node"),
    (["scancel", "123"], "scancel 123"),
    (["scontrol", "requeue", "123"], "scontrol requeue"),
    (["kill", "-9", "1"], "kill -9"),
    (["pkill", "python"], "pkill python"),
    (["nvidia-smi", "-r"], "nvidia-smi -r"),
    (["py-spy", "dump", "--pid", "1", "--output", "/etc/x"], "dump"),
    (["cat", "/etc/shadow"], "cat /etc/shadow"),
    (["rm", "-rf", "/"], "rm -rf"),
    # reading secrets, options from data, files and tables that hold credentials (issue 9)
    (["kubectl", "get", "secrets", "-A"], "get secrets"),
    (["kubectl", "get", "secret", "db", "-o", "yaml"], "get secret"),
    (["kubectl", "get", "configmaps"], "get configmaps"),
    (["kubectl", "get", "--raw", "/api/v1/secrets"], "get --raw"),
    (["kubectl", "--kubeconfig=/bundles/jobs/cw/ops/j/manifest.json", "get", "pods"], "kubeconfig"),
    (["kubectl", "--context=--exec", "get", "pods"], "--context"),
    (["kubectl", "logs", "--force", "p"], "logs --force"),
    (["kubectl", "exec", "p", "--", "cat", "/proc/1/environ"], "cat /proc/1/environ"),
    (["iris", "--config=/bundles/x/manifest.json", "job", "list"], "--config"),
    (["iris", "job", "summary", "--force"], "job summary --force"),
    (["iris", "job", "logs", "/ops/j", "--follow"], "job logs --follow"),
    (["iris", "--cluster=--delete-all", "job", "list"], "--cluster"),
    (["iris", "query", "SELECT * FROM auth_api_keys"], "query"),
    (["iris", "query", "SELECT environment_json FROM job_config"], "query"),
    (["iris", "query", "SELECT * FROM jobs, auth_controller_secrets"], "query"),
    (["iris", "query", "SELECT * FROM (SELECT * FROM auth_api_keys)"], "query"),
    (["iris", "query", "SELECT load_extension('/tmp/x.so') FROM jobs"], "query"),
    (["py-spy", "dump", "--pid", "1", "--locals"], "dump --locals"),
    (["sacct", "-j", "--delete-all"], "-j --delete-all"),
    (["ps", "x;rm"], "ps x;rm"),
]

ALLOWED = [
    ["iris", "--controller-url=http://c:1", "job", "summary", "/ops/j", "--json"],
    ["iris", "--cluster", "cw", "job", "logs", "/ops/j", "--tail", "--max-lines", "10"],
    ["iris", "job", "--help"],
    ["iris", "query", "SELECT task_id FROM task_attempts WHERE error LIKE '%drop%'", "-f", "csv"],
    ["iris", "task", "exec", "/ops/j/0", "--timeout", "5", "--", "py-spy", "dump", "--pid", "7"],
    ["iris", "task", "exec", "/ops/j/0", "--", "ps", "-ww", "-eo", "pid,ppid,args"],
    ["kubectl", "--context=cw", "get", "pods", "-l", "job-name=j", "-o", "json"],
    ["kubectl", "logs", "p", "--since=1h", "--tail=10"],
    ["kubectl", "exec", "p", "--", "nvidia-smi", "--query-gpu=index,power.draw", "--format=csv"],
    ["kubectl", "exec", "p", "--", "cat", "/proc/1/status"],
    ["squeue", "-j", "1"],
    ["sacct", "-j", "1", "-P"],
    ["py-spy", "dump", "--pid", "12"],
    ["pgrep", "-P", "12"],
    ["iris", "job", "summary", "--json", "--", "/ops/rl_job"],
    ["iris", "job", "logs", "--tail", "--max-lines", "2000", "--", "/ops/j"],
    ["iris", "query", "SELECT 1 FROM task_attempts WHERE task_id LIKE '/a\\_b/%' ESCAPE '\\'"],
    ["kubectl", "logs", "--since=1h", "--tail=2000", "--", "rl-job-0"],
    ["sacct", "-j", "812", "-P", "-n", "-X", "--duplicates", "--format=JobID,State"],
    ["squeue", "-j", "812", "-h", "-o", "%i|%T|%N|%r"],
]


@pytest.fixture
def no_spawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record any attempt to start a process."""
    spawned: list[Any] = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: spawned.append(a))
    return spawned


@pytest.fixture
def spies(tmp_path: Path) -> Spies:
    """A spy for every tool, in a folder of its own."""
    return make_spybin(tmp_path / "bin")


@pytest.fixture
def tools(spies: Spies) -> Toolbox:
    """The tools resolved from the spy folder at 'start-up'."""
    return spies.toolbox()


def _resolved(tools: Toolbox, argv: Sequence[str]) -> tuple[str, ...]:
    """`argv` with its tool name replaced by the path it was resolved to."""
    head = tools.iris if argv[0] == "iris" else (tools.argv0(argv[0]),)
    return (*head, *argv[1:])


@pytest.mark.parametrize(("argv", "verb"), REFUSED)
def test_mutating_commands_are_refused_before_spawning(
    argv: list[str], verb: str, tools: Toolbox, no_spawn: list[Any]
) -> None:
    """Every mutating or unknown command is refused, naming its verb, and nothing starts."""
    with pytest.raises(RefusedCommandError) as refused:
        run_probe(_resolved(tools, argv), 5, allowlist=tools.allowlist())
    assert verb.split(maxsplit=1)[0] in str(refused.value)
    assert "read-only" in str(refused.value)
    assert no_spawn == []


@pytest.mark.parametrize("argv", ALLOWED)
def test_read_only_probes_are_allowed(argv: list[str], tools: Toolbox) -> None:
    """The read-only verbs and probes of each tool pass the allowlist."""
    tools.allowlist().check(_resolved(tools, argv))


def test_a_custom_iris_prefix_is_checked_like_iris(spies: Spies) -> None:
    """A configured iris command prefix gets the iris rules, not a free pass."""
    tools = resolve_tools(Settings(iris_command=f"{sys.executable} -m shim"), search_path="/x")
    allow = tools.allowlist()
    allow.check((sys.executable, "-m", "shim", "job", "list"))
    with pytest.raises(RefusedCommandError, match="job kill"):
        allow.check((sys.executable, "-m", "shim", "job", "kill", "/ops/j"))


def test_refresh_template_allows_only_checked_values(tools: Toolbox, spies: Spies) -> None:
    """The refresh template runs filled with values of the strict patterns, nothing else."""
    template = f"{spies.bin / 'watcher'} sync --job={{job_id}} {{cluster}}"
    settings = Settings(refresh_command=template)
    allow = spies.toolbox(settings).allowlist()
    watcher = str(spies.bin / "watcher")
    assert allow.check((watcher, "sync", "--job=/ops/j", "cw")) == "refresh"
    for bad in [("--job=--force", "cw"), ("--job=/ops/j", "--delete-all"), ("--job=/ops/j", "a b")]:
        with pytest.raises(RefusedCommandError):
            allow.check((watcher, "sync", *bad))


@pytest.mark.parametrize(
    ("template", "allowed"),
    [
        ("{bin}/watcher sync --root=/var/run/bundles {{job_id}}", True),
        ("{bin}/watcher sync --action=kill {{job_id}}", False),
        ("{bin}/watcher delete {{job_id}}", False),
        ("{bin}/watcher sync {{job_id}} {{user}}", False),
        ("{bin}/bash {{job_id}}", False),
    ],
)
def test_refresh_templates_just_inside_and_outside_the_rules(
    spies: Spies, template: str, allowed: bool
) -> None:
    """A path holding `run` is fine; a verb hidden in an option, an unknown placeholder or a
    shell is refused when the tools are resolved."""
    settings = Settings(refresh_command=template.format(bin=spies.bin))
    if allowed:
        spies.toolbox(settings)
    else:
        with pytest.raises(ToolSettingsError, match="RLHEALTH_REFRESH_COMMAND"):
            spies.toolbox(settings)


def test_missing_tool_is_exit_127_without_a_path_lookup(no_spawn: list[Any]) -> None:
    """A tool not found at start-up keeps its bare name and answers 127; nothing is spawned."""
    tools = resolve_tools(Settings(), search_path="/nonexistent")
    result = run_probe(("kubectl", "version"), 5, allowlist=tools.allowlist())
    assert result.exit_code == MISSING_EXIT_CODE and "not found" in result.why()
    assert no_spawn == []


def test_missing_executable_is_exit_127() -> None:
    """A configured CLI path that is not installed is a failed probe, not an exception."""
    tools = resolve_tools(Settings(iris_command="/nonexistent/iris"), search_path="/x")
    result = run_probe(["/nonexistent/iris", "job", "list"], 5, allowlist=tools.allowlist())
    assert result.exit_code == MISSING_EXIT_CODE
    assert "command not found" in result.why()


def test_timeout_is_exit_none_and_kills_the_process(tmp_path: Path) -> None:
    """A probe over its time budget has exit code None and its process group is killed."""
    script = tmp_path / "slow_watcher.py"
    script.write_text("import time\ntime.sleep(30)\n")
    settings = Settings(refresh_command=f"{sys.executable} {script} {{job_id}}")
    allow = resolve_tools(settings, search_path="/x").allowlist()
    result = run_probe((sys.executable, str(script), "/ops/j"), 0.5, allowlist=allow)
    assert result.exit_code is None
    assert result.why() == "timed out"


def test_an_allowlist_cannot_be_built_around_its_rules() -> None:
    """An allowlist made by hand still refuses a shell as iris and a mutating refresh template."""
    with pytest.raises(RefusedCommandError):
        Allowlist(iris_prefixes=(("/bin/sh", "-c", "iris job kill x", "iris"),))
    with pytest.raises(RefusedCommandError):
        Allowlist(refresh=("/usr/bin/iris-watcher", "job", "kill", "{job_id}"))
    with pytest.raises(RefusedCommandError):
        Allowlist(tools={"/tmp/x/ps": "rm"})


def _result(code: int, stderr: str) -> ProbeResult:
    from datetime import UTC, datetime

    return ProbeResult(("iris",), datetime.now(UTC), code, "", stderr)


@pytest.mark.parametrize(
    ("tool", "stderr", "transient"),
    [
        ("iris", "DNS error: no records found for query", True),
        ("iris", "finelog.errors.StatsError: boom", True),
        ("iris", "job not found", False),
        ("kubectl", "error dialing backend: EOF", True),
        ("kubectl", "<HTML><body>502</body>", True),
        ("kubectl", "pods 'x' not found", False),
        ("squeue", "connection reset", False),
    ],
)
def test_transient_markers_per_tool(tool: str, stderr: str, transient: bool) -> None:
    """Only the markers of docs/domain.md#iris-job-and-task-states, for their own tool, are
    transient."""
    assert is_transient(tool, _result(1, stderr)) is transient


def test_transient_failure_is_retried_then_succeeds() -> None:
    """A transient failure is retried; the first success is returned."""
    replies = [_result(1, "temporary failure in name resolution"), _result(0, "")]
    result, tries = with_retries("iris", lambda: replies.pop(0), wait_s=0)
    assert result.ok and tries == 2


def test_real_failure_is_not_retried() -> None:
    """A failure without a transient marker returns at once."""
    calls: list[int] = []

    def call() -> ProbeResult:
        calls.append(1)
        return _result(1, "permission denied")

    result, tries = with_retries("iris", call, wait_s=0)
    assert not result.ok and tries == 1 and len(calls) == 1


def test_retries_stop_at_the_budget() -> None:
    """A transient failure that persists is returned after the last try."""
    result, tries = with_retries("kubectl", lambda: _result(1, "i/o timeout"), wait_s=0)
    assert not result.ok and tries == 3
