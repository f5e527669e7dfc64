"""The one allowlist of read-only commands; `Allowlist.check` refuses everything else.

`worker.backends.spawn` calls `check` before it starts any process, so a command that is not on
this list never runs. Rules, per tool (the tool is the basename of `argv[0]`, or the configured
Iris command prefix):

- `iris` (after its global options `--controller-url`, `--cluster`, `--config`, `-v`):
  `job summary|describe|list|logs`, `task describe`, `attempt describe`, `task exec <task>
  [--timeout N] -- <probe>`, `query <SELECT ...>` (a single SELECT, no writing keyword), and
  `--help` of the top level or of the `job`, `task`, `attempt` groups (feature detection).
- `kubectl` (after `--context`, `--kubeconfig`, `-n/--namespace`, `--request-timeout`):
  `get`, `logs`, `version`, `exec <pod> [-c C] -- <probe>`.
- `squeue`, `sacct`, `sinfo`: any arguments (they only read).
- probes, directly or after `exec ... --`: `py-spy dump ...`,
  `nvidia-smi --query-gpu=... --format=...`, `ps`, `pgrep` and
  `cat /proc/<pid>/{status,cmdline,stat}`.

A configured watcher refresh command is allowed by exact argv only (`Allowlist.with_exact`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import Final

__all__ = ["DEFAULT_ALLOWLIST", "Allowlist", "RefusedCommandError"]


class RefusedCommandError(PermissionError):
    """A command the read-only allowlist refuses; the message names the tool and the verb."""

    def __init__(self, tool: str, verb: str, why: str) -> None:
        super().__init__(f"refused {tool} {verb!r}: {why} (rl-health probes are read-only)")
        self.tool = tool
        self.verb = verb


Check = Callable[[Sequence[str]], None]

_IRIS_GLOBAL_VALUE: Final = frozenset({"--controller-url", "--cluster", "--config"})
_IRIS_GLOBAL_FLAG: Final = frozenset({"-v", "--verbose", "--traceback"})
_IRIS_VERBS: Final = frozenset(
    {
        ("job", "summary"),
        ("job", "describe"),
        ("job", "list"),
        ("job", "logs"),
        ("task", "describe"),
        ("attempt", "describe"),
    }
)
_IRIS_HELP_GROUPS: Final = frozenset({(), ("job",), ("task",), ("attempt",), ("job", "logs")})
_KUBE_GLOBAL_VALUE: Final = frozenset(
    {"--context", "--kubeconfig", "-n", "--namespace", "--request-timeout"}
)
_KUBE_VERBS: Final = frozenset({"get", "logs", "version"})
_SLURM_TOOLS: Final = frozenset({"squeue", "sacct", "sinfo"})
_SQL_WRITES: Final = re.compile(
    r"\b(insert|update|delete|drop|alter|create|replace|attach|detach|pragma|vacuum|reindex|"
    r"truncate|grant|revoke|begin|commit)\b",
    re.IGNORECASE,
)
_SQL_LITERAL: Final = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")
_PROC_FILE: Final = re.compile(r"^/proc/(\d+|self)/(status|cmdline|stat)$")
_PYSPY_FLAGS: Final = frozenset(
    {"--nonblocking", "--native", "--locals", "--subprocesses", "--json"}
)
_NVIDIA_ARG: Final = re.compile(r"^--(query-gpu|format)=[\w.,]+$")


def _tool(argv: Sequence[str]) -> str:
    return PurePath(argv[0]).name if argv else ""


def _strip_options(
    args: Sequence[str], with_value: frozenset[str], flags: frozenset[str]
) -> list[str]:
    """`args` without the global options named (as `--opt value` or `--opt=value`)."""
    rest = list(args)
    while rest and rest[0].startswith("-") and rest[0] != "--":
        name = rest[0].split("=", 1)[0]
        if name in with_value:
            rest = rest[1:] if "=" in rest[0] else rest[2:]
        elif name in flags:
            rest = rest[1:]
        else:
            break
    return rest


def check_sql(sql: str) -> None:
    """Refuse anything but one SELECT statement."""
    body = _SQL_LITERAL.sub("''", sql).strip().rstrip(";").strip()
    first = body.split(None, 1)[0].lower() if body else ""
    if first != "select" or ";" in body:
        raise RefusedCommandError("iris", "query", f"only a single SELECT may run, not {sql!r}")
    found = _SQL_WRITES.search(body)
    if found:
        raise RefusedCommandError("iris", "query", f"SQL keyword {found.group(0)!r} writes")


def check_probe(argv: Sequence[str]) -> None:
    """A process probe: py-spy dump, an nvidia-smi query, ps, pgrep, or cat of a /proc file."""
    tool = _tool(argv)
    args = list(argv[1:])
    if tool == "py-spy" and args[:1] == ["dump"]:
        _check_pyspy(args[1:])
        return
    allowed = (
        tool in {"ps", "pgrep"}
        or (tool == "nvidia-smi" and bool(args) and all(_NVIDIA_ARG.match(a) for a in args))
        or (tool == "cat" and bool(args) and all(_PROC_FILE.match(a) for a in args))
    )
    if not allowed:
        verb = " ".join(argv[:2]) if argv else "(empty)"
        raise RefusedCommandError(tool or "exec", verb, "not an allowed read-only probe")


def _check_pyspy(args: Sequence[str]) -> None:
    rest = list(args)
    while rest:
        if rest[0] == "--pid" and len(rest) > 1 and rest[1].isdigit():
            rest = rest[2:]
        elif rest[0] in _PYSPY_FLAGS:
            rest = rest[1:]
        else:
            raise RefusedCommandError("py-spy", "dump", f"argument {rest[0]!r} is not allowed")


def _exec_probe(tool: str, args: Sequence[str]) -> None:
    """The probe after `--` of `iris task exec` / `kubectl exec`."""
    if "--" not in args:
        raise RefusedCommandError(tool, "exec", "exec needs `--` and an allowed probe after it")
    check_probe(args[list(args).index("--") + 1 :])


def check_iris(args: Sequence[str]) -> None:
    """The read-only subset of the `iris` CLI."""
    rest = _strip_options(args, _IRIS_GLOBAL_VALUE, _IRIS_GLOBAL_FLAG)
    if rest and rest[-1] == "--help" and tuple(rest[:-1]) in _IRIS_HELP_GROUPS:
        return
    verb = tuple(rest[:2])
    if verb in _IRIS_VERBS:
        return
    if verb == ("task", "exec"):
        _exec_probe("iris", rest[2:])
    elif rest[:1] == ["query"]:
        sql = [a for a in rest[1:] if not a.startswith("-") and a not in {"csv", "json", "table"}]
        if len(sql) != 1:
            raise RefusedCommandError("iris", "query", "exactly one SQL statement is needed")
        check_sql(sql[0])
    else:
        raise RefusedCommandError("iris", " ".join(rest[:2]) or "(none)", "not a read-only verb")


def check_kubectl(args: Sequence[str]) -> None:
    """The read-only subset of `kubectl`."""
    rest = _strip_options(args, _KUBE_GLOBAL_VALUE, frozenset())
    verb = rest[0] if rest else "(none)"
    if verb in _KUBE_VERBS:
        return
    if verb == "exec":
        _exec_probe("kubectl", rest[1:])
        return
    raise RefusedCommandError("kubectl", " ".join(rest[:2]) or verb, "not a read-only verb")


_RULES: Final[dict[str, Check]] = {
    "iris": check_iris,
    "kubectl": check_kubectl,
    **{name: (lambda _args: None) for name in _SLURM_TOOLS},
}


@dataclass(frozen=True)
class Allowlist:
    """Which commands may run: the rules above, the Iris command prefixes, exact extra commands."""

    iris_prefixes: tuple[tuple[str, ...], ...] = (("iris",),)
    exact: tuple[tuple[str, ...], ...] = ()

    def with_exact(self, argv: Sequence[str]) -> Allowlist:
        """This allowlist plus exactly `argv` (the configured watcher refresh command)."""
        return replace(self, exact=(*self.exact, tuple(argv)))

    def with_iris_prefix(self, prefix: Sequence[str]) -> Allowlist:
        """This allowlist with `prefix` (e.g. `python -m some.shim`) accepted as the iris CLI."""
        return replace(self, iris_prefixes=(*self.iris_prefixes, tuple(prefix)))

    def check(self, argv: Sequence[str]) -> None:
        """Return when `argv` may run; raise `RefusedCommandError` naming the verb otherwise."""
        argv = tuple(argv)
        if argv in self.exact:
            return
        for prefix in self.iris_prefixes:
            if argv[: len(prefix)] == prefix and len(argv) > len(prefix):
                check_iris(argv[len(prefix) :])
                return
        rule = _RULES.get(_tool(argv))
        if rule is not None:
            rule(argv[1:])
        else:
            check_probe(argv)


DEFAULT_ALLOWLIST: Final = Allowlist()
