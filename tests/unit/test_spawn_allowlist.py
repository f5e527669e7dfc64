"""The read-only allowlist, enforced where processes are spawned, and transient retries."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from worker.backends.allowlist import DEFAULT_ALLOWLIST, RefusedCommandError
from worker.backends.retry import is_transient, with_retries
from worker.backends.spawn import MISSING_EXIT_CODE, ProbeResult, run_probe

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
]


@pytest.fixture
def no_spawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record any attempt to start a process."""
    spawned: list[Any] = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: spawned.append(a))
    return spawned


@pytest.mark.parametrize(("argv", "verb"), REFUSED)
def test_mutating_commands_are_refused_before_spawning(
    argv: list[str], verb: str, no_spawn: list[Any]
) -> None:
    """Every mutating or unknown command is refused, naming its verb, and nothing starts."""
    with pytest.raises(RefusedCommandError) as refused:
        run_probe(argv, 5)
    assert verb.split(maxsplit=1)[0] in str(refused.value)
    assert "read-only" in str(refused.value)
    assert no_spawn == []


@pytest.mark.parametrize("argv", ALLOWED)
def test_read_only_probes_are_allowed(argv: list[str]) -> None:
    """The read-only verbs and probes of each tool pass the allowlist."""
    DEFAULT_ALLOWLIST.check(argv)


def test_a_custom_iris_prefix_is_checked_like_iris() -> None:
    """A configured iris command prefix gets the iris rules, not a free pass."""
    allow = DEFAULT_ALLOWLIST.with_iris_prefix((sys.executable, "-m", "shim"))
    allow.check((sys.executable, "-m", "shim", "job", "list"))
    with pytest.raises(RefusedCommandError, match="job kill"):
        allow.check((sys.executable, "-m", "shim", "job", "kill", "/ops/j"))


def test_exact_entry_allows_only_that_command() -> None:
    """The refresh command is allowed by exact argv; a changed argument is refused."""
    allow = DEFAULT_ALLOWLIST.with_exact(("watcher", "--job", "/ops/j"))
    allow.check(("watcher", "--job", "/ops/j"))
    with pytest.raises(RefusedCommandError):
        allow.check(("watcher", "--job", "/ops/other"))


def test_missing_executable_is_exit_127() -> None:
    """A CLI that is not installed is a failed probe, not an exception."""
    result = run_probe(["/nonexistent/iris", "job", "list"], 5)
    assert result.exit_code == MISSING_EXIT_CODE
    assert "command not found" in result.why()


def test_timeout_is_exit_none_and_kills_the_process() -> None:
    """A probe over its time budget has exit code None and its process group is killed."""
    argv = (sys.executable, "-c", "import time; time.sleep(30)")
    result = run_probe(argv, 0.5, allowlist=DEFAULT_ALLOWLIST.with_exact(argv))
    assert result.exit_code is None
    assert result.why() == "timed out"


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
    """Only the markers of DOMAIN.md section 5, for their own tool, are transient."""
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
