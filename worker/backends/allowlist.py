"""The one allowlist of read-only commands; `Allowlist.check` refuses everything else.

`worker.backends.spawn` calls `check` before it starts any process, so a command that is not on
this list never runs. A tool is identified by the exact path it was resolved to at start-up
(`worker.backends.tools`), never by its name: an executable called `ps` elsewhere is not `ps`.
Every option of every verb is listed with the pattern of its value; positional values must match
their strict pattern (`worker.backends.identifiers`), so none can start with `-`.

- `iris` (after `--controller-url URL`, `--cluster NAME`, `-v`): `job summary|describe <job>
  [--json]`, `job list [--json]`, `job logs <job> [--tail] [--max-lines N]`, `task describe`,
  `attempt describe`, `task exec <task> [--timeout N] -- <probe>`, `query <SELECT> [-f csv]`
  (one SELECT over `task_attempts`, `tasks` or `jobs`, no writing keyword, no file function),
  and `--help` of the top level and the `job`, `task`, `attempt` groups. Not `--config`.
- `kubectl` (after `--context`, `--kubeconfig` naming a file the operator configured,
  `-n/--namespace`, `--request-timeout`): `get` of pods, jobs, events or nodes (never secrets or
  config maps, never `--raw`), `logs <pod>`, `version`, `exec <pod> [-c C] -- <probe>`.
- `squeue`, `sacct`, `sinfo`: they only read; their option values may not start with `-`.
- probes, directly or after `exec ... --`: `py-spy dump --pid N [--nonblocking|--native|
  --subprocesses|--json]` (not `--locals`: locals hold secrets), `nvidia-smi --query-gpu=...
  --format=...`, `ps`, `pgrep`, `cat /proc/<pid|self>/{status,cmdline,stat}`.
- the watcher refresh command: its template (`{job_id}`, `{cluster}` placeholders) is checked
  when the allowlist is made — no shell or launcher, no inline code, no mutating verb — and a
  command runs only when it is that template filled with values of the strict patterns.
"""

from __future__ import annotations

import itertools
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Final

from shared.redact import clean, cut_bytes
from worker.backends.identifiers import PATTERNS

__all__ = [
    "LOCAL_TOOLS",
    "MUTATING_VERBS",
    "Allowlist",
    "RefusedCommandError",
    "check_iris",
    "check_iris_prefix",
    "check_kubectl",
    "check_probe",
    "check_refresh_template",
    "check_sql",
]


class RefusedCommandError(PermissionError):
    """A command the read-only allowlist refuses; the message names the tool and the verb."""

    def __init__(self, tool: str, verb: str, why: str) -> None:
        shown = cut_bytes(clean(verb), 200)
        super().__init__(f"refused {tool} {shown!r}: {why} (rl-health probes are read-only)")
        self.tool = tool
        self.verb = verb


# --- option specifications ----------------------------------------------------------------------

_INT: Final = re.compile(r"^[0-9]{1,9}$")
_DURATION: Final = re.compile(r"^[0-9]{1,6}[smh]?$")
_WORD: Final = re.compile(r"^[A-Za-z0-9_%][A-Za-z0-9_.,:/=%|!()-]*$")
_SQL_TEXT: Final = re.compile(r"^(?!-)[^\x00]+$", re.DOTALL)
_FORMAT: Final = re.compile(r"^(csv|json|table)$")
_OUTPUT: Final = re.compile(r"^(json|yaml|wide|name)$")
_LEVEL: Final = re.compile(r"^(debug|info|warning|error|critical)$", re.IGNORECASE)
_SELECTOR: Final = re.compile(r"^[A-Za-z0-9_.!][A-Za-z0-9_./=,!-]{0,252}$")


@dataclass(frozen=True)
class Spec:
    """The options of one verb (flags, options with a value pattern) and its positional values."""

    flags: frozenset[str] = frozenset()
    values: Mapping[str, re.Pattern[str]] = field(default_factory=dict)
    positional: re.Pattern[str] | None = None
    count: tuple[int, int] = (0, 0)


def _option(tool: str, token: str, rest: list[str], spec: Spec, verb: str = "") -> list[str]:
    """Consume one option token (and its value) of `verb`; the remaining tokens."""
    name, has_value, value = token.partition("=")
    shown = f"{verb} {token}".strip()
    if name in spec.values:
        if not has_value:
            if not rest:
                raise RefusedCommandError(tool, shown, "option without its value")
            value, rest = rest[0], rest[1:]
        if not spec.values[name].fullmatch(value):
            raise RefusedCommandError(tool, f"{shown} {value}", "option value not allowed")
        return rest
    if token in spec.flags:
        return rest
    raise RefusedCommandError(tool, shown, "option not allowed")


def _positionals(tool: str, verb: str, args: Sequence[str], spec: Spec) -> list[str]:
    """Parse `args` against `spec`; the positional values (each checked against its pattern)."""
    rest, found, ended = list(args), [], False
    while rest:
        token, rest = rest[0], rest[1:]
        if token == "--" and not ended:
            ended = True
        elif token.startswith("-") and not ended:
            rest = _option(tool, token, rest, spec, verb)
        elif spec.positional is None or not spec.positional.fullmatch(token):
            raise RefusedCommandError(tool, f"{verb} {token}", "argument not allowed")
        else:
            found.append(token)
    low, high = spec.count
    if not low <= len(found) <= high:
        raise RefusedCommandError(tool, verb, f"takes {low} to {high} arguments, not {len(found)}")
    return found


# --- SQL ------------------------------------------------------------------------------------------

_SQL_WRITES: Final = re.compile(
    r"\b(insert|update|delete|drop|alter|create|replace|attach|detach|pragma|vacuum|reindex|"
    r"truncate|grant|revoke|begin|commit|load_extension|readfile|writefile|edit|fts3_tokenizer)\b",
    re.IGNORECASE,
)
_SQL_LITERAL: Final = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")
_SQL_SOURCE: Final = re.compile(r"\b(?:from|join)\s+([^\s,;]+)(\s*,)?", re.IGNORECASE)
SQL_TABLES: Final = frozenset({"task_attempts", "tasks", "jobs"})


def check_sql(sql: str) -> None:
    """Refuse anything but one SELECT over the job tables (never the auth or config tables)."""
    body = _SQL_LITERAL.sub("''", sql).strip().rstrip(";").strip()
    first = body.split(None, 1)[0].lower() if body else ""
    if first != "select" or ";" in body:
        raise RefusedCommandError("iris", "query", f"only a single SELECT may run, not {sql!r}")
    found = _SQL_WRITES.search(body)
    if found:
        raise RefusedCommandError("iris", "query", f"SQL keyword {found.group(0)!r} not allowed")
    sources = _SQL_SOURCE.findall(body)
    if not sources:
        raise RefusedCommandError("iris", "query", "a SELECT must read a job table")
    for table, comma in sources:
        if table.strip('"').lower() not in SQL_TABLES or comma:
            raise RefusedCommandError("iris", "query", f"table {table!r} is not a job table")


# --- probes ---------------------------------------------------------------------------------------

LOCAL_TOOLS: Final = ("py-spy", "nvidia-smi", "cat", "ps", "pgrep")
_PROC_FILE: Final = re.compile(r"^/proc/([1-9][0-9]{0,9}|self)/(status|cmdline|stat)$")
_PYSPY: Final = Spec(
    flags=frozenset({"--nonblocking", "--native", "--subprocesses", "--json"}),
    values={"--pid": PATTERNS["pid"]},
)
_NVIDIA_ARG: Final = re.compile(r"^--(query-gpu|format)=[A-Za-z0-9_.,]+$")
_PS_ARG: Final = re.compile(r"^(-[A-Za-z]{1,8}|[a-z]+(,[a-z]+)*)$")
_PGREP: Final = Spec(
    flags=frozenset({"-f", "-a", "-l"}),
    values={"-P": PATTERNS["pid"]},
    positional=re.compile(r"^[A-Za-z0-9_.]{1,64}$"),
    count=(0, 1),
)


def _check_named_probe(tool: str, args: Sequence[str]) -> None:
    if tool == "py-spy" and args[:1] == ["dump"]:
        _positionals("py-spy", "dump", args[1:], _PYSPY)
        if "--pid" not in args and not any(a.startswith("--pid=") for a in args):
            raise RefusedCommandError("py-spy", "dump", "a dump needs --pid")
        return
    if tool == "pgrep":
        _positionals("pgrep", "pgrep", args, _PGREP)
        return
    allowed = (
        (tool == "ps" and all(_PS_ARG.fullmatch(a) for a in args))
        or (tool == "nvidia-smi" and bool(args) and all(_NVIDIA_ARG.fullmatch(a) for a in args))
        or (tool == "cat" and bool(args) and all(_PROC_FILE.fullmatch(a) for a in args))
    )
    if not allowed:
        raise RefusedCommandError(tool, " ".join([tool, *args[:1]]), "not an allowed probe")


def check_probe(argv: Sequence[str]) -> None:
    """A probe named by its bare tool name: py-spy dump, nvidia-smi query, ps, pgrep, cat /proc."""
    tool = argv[0] if argv else ""
    if tool not in LOCAL_TOOLS:
        verb = " ".join(argv[:2]) if argv else "(empty)"
        raise RefusedCommandError(tool or "exec", verb, "not an allowed read-only probe")
    _check_named_probe(tool, list(argv[1:]))


def _split_exec(tool: str, args: Sequence[str]) -> tuple[list[str], list[str]]:
    """The arguments of `exec` before `--`, and the probe after it."""
    if "--" not in args:
        raise RefusedCommandError(tool, "exec", "exec needs `--` and an allowed probe after it")
    cut = list(args).index("--")
    return list(args[:cut]), list(args[cut + 1 :])


# --- iris -----------------------------------------------------------------------------------------

_JOB: Final = PATTERNS["job id"]
_TASK: Final = PATTERNS["task id"]
_IRIS_GLOBAL: Final = Spec(
    flags=frozenset({"-v", "--verbose", "--traceback"}),
    values={"--controller-url": PATTERNS["url"], "--cluster": PATTERNS["cluster"]},
)
_JSON_ONLY: Final = frozenset({"--json"})
_IRIS_VERBS: Final[dict[tuple[str, str], Spec]] = {
    ("job", "summary"): Spec(_JSON_ONLY, positional=_JOB, count=(1, 1)),
    ("job", "describe"): Spec(_JSON_ONLY, positional=_JOB, count=(1, 1)),
    ("job", "list"): Spec(_JSON_ONLY),
    ("job", "logs"): Spec(
        frozenset({"--tail", "--no-tail"}),
        {"--max-lines": _INT, "--since-seconds": _INT, "--since-ms": _INT, "--level": _LEVEL},
        positional=_JOB,
        count=(1, 1),
    ),
    ("task", "describe"): Spec(_JSON_ONLY, positional=_TASK, count=(1, 1)),
    ("attempt", "describe"): Spec(_JSON_ONLY, positional=_TASK, count=(1, 1)),
}
_IRIS_EXEC: Final = Spec(values={"--timeout": _INT}, positional=_TASK, count=(1, 1))
_IRIS_QUERY: Final = Spec(
    values={"-f": _FORMAT, "--format": _FORMAT}, positional=_SQL_TEXT, count=(1, 1)
)
_IRIS_HELP_GROUPS: Final = frozenset({(), ("job",), ("task",), ("attempt",), ("job", "logs")})


def _strip_globals(tool: str, args: Sequence[str], spec: Spec) -> list[str]:
    """`args` after the leading global options (each checked against `spec`)."""
    rest = list(args)
    while rest and rest[0].startswith("-") and rest[0] not in {"--", "--help"}:
        token, rest = rest[0], rest[1:]
        rest = _option(tool, token, rest, spec)
    return rest


def check_iris(args: Sequence[str]) -> None:
    """The read-only subset of the `iris` CLI (the arguments after the iris command prefix)."""
    rest = _strip_globals("iris", args, _IRIS_GLOBAL)
    if rest and rest[-1] == "--help" and tuple(rest[:-1]) in _IRIS_HELP_GROUPS:
        return
    verb = [*rest, "", ""][:2]
    spec = _IRIS_VERBS.get((verb[0], verb[1]))
    if spec is not None:
        _positionals("iris", " ".join(verb), rest[2:], spec)
    elif verb == ["task", "exec"]:
        before, probe = _split_exec("iris", rest[2:])
        _positionals("iris", "task exec", before, _IRIS_EXEC)
        check_probe(probe)
    elif verb[0] == "query":
        check_sql(_positionals("iris", "query", rest[1:], _IRIS_QUERY)[0])
    else:
        raise RefusedCommandError("iris", " ".join(rest[:2]) or "(none)", "not a read-only verb")


_MODULE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PYTHON: Final = re.compile(r"^python[0-9.]*$")
_UV_FLAGS: Final = frozenset({"--frozen", "--no-sync", "--offline", "--locked", "--quiet", "-q"})
_UV_DIRS: Final = re.compile(r"^--(project|directory)=/[A-Za-z0-9_./-]+$")


def check_iris_prefix(prefix: Sequence[str]) -> None:
    """The iris command must be `iris`, `python -m <module>` or `uv run [flags] iris` — never a
    shell, a launcher with inline code, or anything that could carry another command."""
    name = PurePath(prefix[0]).name if prefix else ""
    words = list(prefix[1:])
    shapes = (
        name == "iris" and not words,
        bool(_PYTHON.fullmatch(name)) and len(words) == 2 and words[0] == "-m"
        and bool(_MODULE.fullmatch(words[1])),
        name == "uv" and words[:1] == ["run"] and words[-1:] == ["iris"]
        and all(w in _UV_FLAGS or _UV_DIRS.fullmatch(w) for w in words[1:-1]),
    )  # fmt: skip
    if not any(shapes):
        shown = " ".join(prefix) or "(empty)"
        raise RefusedCommandError(
            "iris", shown, "the iris command must be `iris`, `python -m MODULE` or `uv run iris`"
        )


# --- kubectl --------------------------------------------------------------------------------------

_KUBE_RESOURCES: Final = frozenset(
    {"pods", "pod", "po", "jobs", "job", "jobs.batch", "events", "event", "ev", "nodes", "node"}
)
_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9.-]{0,252}$")
_CONTAINER: Final = {"-c": PATTERNS["namespace"], "--container": PATTERNS["namespace"]}
_KUBE_VERBS: Final[dict[str, Spec]] = {
    "get": Spec(
        frozenset(
            {"--ignore-not-found", "--no-headers", "--show-labels", "-A", "--all-namespaces"}
        ),
        {
            "-l": _SELECTOR,
            "--selector": _SELECTOR,
            "--field-selector": _SELECTOR,
            "-o": _OUTPUT,
            "--output": _OUTPUT,
        },
        positional=_NAME,
        count=(1, 16),
    ),
    "logs": Spec(
        frozenset({"--previous", "-p", "--timestamps", "--all-containers"}),
        {"--since": _DURATION, "--tail": _INT, "--limit-bytes": _INT, **_CONTAINER},
        positional=_NAME,
        count=(1, 2),
    ),
    "version": Spec(frozenset({"--client"}), {"-o": _OUTPUT, "--output": _OUTPUT}),
}
_KUBE_EXEC: Final = Spec(values=_CONTAINER, positional=PATTERNS["pod"], count=(1, 1))


def _kube_globals(kubeconfigs: frozenset[str]) -> Spec:
    files = "|".join(re.escape(path) for path in sorted(kubeconfigs)) or r"(?!)"
    return Spec(
        values={
            "--context": PATTERNS["kube context"],
            "--kubeconfig": re.compile(f"^(?:{files})$"),
            "-n": PATTERNS["namespace"],
            "--namespace": PATTERNS["namespace"],
            "--request-timeout": _DURATION,
        }
    )


def check_kubectl(args: Sequence[str], kubeconfigs: frozenset[str] = frozenset()) -> None:
    """The read-only subset of `kubectl`; `--kubeconfig` only names a file in `kubeconfigs`."""
    rest = _strip_globals("kubectl", args, _kube_globals(kubeconfigs))
    verb = rest[0] if rest else "(none)"
    spec = _KUBE_VERBS.get(verb)
    if spec is not None:
        found = _positionals("kubectl", verb, rest[1:], spec)
        if verb == "get" and found[0] not in _KUBE_RESOURCES:
            raise RefusedCommandError("kubectl", f"get {found[0]}", "resource not allowed")
        return
    if verb == "exec":
        before, probe = _split_exec("kubectl", rest[1:])
        _positionals("kubectl", "exec", before, _KUBE_EXEC)
        check_probe(probe)
        return
    raise RefusedCommandError("kubectl", " ".join(rest[:2]) or verb, "not a read-only verb")


def _check_slurm(tool: str, args: Sequence[str]) -> None:
    """squeue, sacct, sinfo only read; still, no value of theirs may look like an option."""
    for before, value in itertools.pairwise(args):
        if before in {"-j", "--jobs"} and not PATTERNS["slurm job"].fullmatch(value):
            raise RefusedCommandError(tool, f"{before} {value}", "job number not allowed")
    if any(not a.startswith("-") and not _WORD.fullmatch(a) for a in args):
        raise RefusedCommandError(tool, " ".join(args[:2]), "argument not allowed")


# --- the refresh command --------------------------------------------------------------------------

MUTATING_VERBS: Final = frozenset(
    {
        "kill", "pkill", "killall", "stop", "delete", "del", "remove", "rm", "rmdir", "cancel",
        "scancel", "patch", "apply", "scale", "edit", "exec", "drain", "cordon", "uncordon",
        "taint", "label", "annotate", "rollout", "restart", "requeue", "hold", "release",
        "suspend", "resume", "terminate", "destroy", "replace", "create", "submit", "set",
        "update", "preempt", "evict", "shutdown", "reboot", "reset", "purge", "prune", "run",
        "launch", "start", "upgrade", "install", "uninstall", "truncate", "drop", "write",
        "scontrol", "sbatch", "srun", "salloc", "mv", "dd", "chmod", "chown",
    }
)  # fmt: skip
_LAUNCHERS: Final = frozenset(
    {
        "sh", "bash", "dash", "zsh", "ksh", "fish", "csh", "tcsh", "busybox", "env", "sudo",
        "su", "doas", "xargs", "nohup", "setsid", "timeout", "nice", "ionice", "stdbuf", "ssh",
        "scp", "rsh", "eval", "exec", "script", "watch", "parallel", "find", "awk", "gawk",
        "sed", "perl", "ruby", "node", "php", "lua", "tclsh", "expect", "osascript", "docker",
        "podman", "kubectl", "iris", "scancel", "scontrol", "kill", "pkill", "killall", "rm",
    }
)  # fmt: skip
_INLINE_CODE: Final = frozenset({"-c", "-e", "-E", "--eval", "--exec", "-exec", "--command"})
_PLACEHOLDERS: Final = {"job_id": PATTERNS["job id"], "cluster": PATTERNS["cluster"]}
_WORD_PARTS: Final = re.compile(r"[=,:.\s]+")  # not `/`: path parts are not verbs


def _fields(word: str) -> list[str]:
    """The placeholders of a template word; a format spec or conversion is refused."""
    try:
        parsed = list(string.Formatter().parse(word))
    except ValueError as exc:
        raise RefusedCommandError("refresh", word, f"bad placeholder: {exc}") from exc
    if any(spec or conversion for _, name, spec, conversion in parsed if name is not None):
        raise RefusedCommandError("refresh", word, "placeholders take no format spec")
    return [name for _, name, _, _ in parsed if name is not None]


def check_refresh_template(words: Sequence[str]) -> None:
    """The refresh template may not be a shell or launcher, carry inline code or a mutating verb,
    or use a placeholder other than `{job_id}` and `{cluster}`; its executable is fixed."""
    if not words:
        raise RefusedCommandError("refresh", "(empty)", "an empty refresh command")
    name = PurePath(words[0]).name
    if name in _LAUNCHERS or _fields(words[0]):
        raise RefusedCommandError("refresh", name, "a shell, launcher or mutating tool")
    for index, word in enumerate(words[1:], start=1):
        unknown = set(_fields(word)) - set(_PLACEHOLDERS)
        parts = {p.lower() for p in _WORD_PARTS.split(word.lstrip("-")) if p}
        if name == "uv" and index == 1 and word == "run":
            parts = set()  # `uv run <watcher>`: the launcher's own verb, not the watcher's
        if unknown or word in _INLINE_CODE or parts & MUTATING_VERBS:
            raise RefusedCommandError("refresh", word, "not allowed in a read-only refresh")


def _template_pattern(word: str) -> re.Pattern[str]:
    """A word of the template as a regex: literal text, placeholders as their strict patterns."""
    parts: list[str] = []
    for literal, name, _, _ in string.Formatter().parse(word):
        parts.append(re.escape(literal))
        if name is not None:
            parts.append("(?:" + _PLACEHOLDERS[name].pattern.strip("^$") + ")")
    return re.compile("".join(parts))


# --- the allowlist --------------------------------------------------------------------------------

Rule = Callable[[Sequence[str], frozenset[str]], None]


def _slurm_rule(tool: str) -> Rule:
    return lambda args, _kubeconfigs: _check_slurm(tool, args)


def _probe_rule(tool: str) -> Rule:
    return lambda args, _kubeconfigs: _check_named_probe(tool, list(args))


_RULES: Final[dict[str, Rule]] = {
    "kubectl": check_kubectl,
    **{tool: _slurm_rule(tool) for tool in ("squeue", "sacct", "sinfo")},
    **{tool: _probe_rule(tool) for tool in LOCAL_TOOLS},
}


@dataclass(frozen=True)
class Allowlist:
    """Which commands may run: tools by their resolved path, the iris command, the refresh
    template, and the kubeconfig files the operator configured."""

    tools: Mapping[str, str] = field(default_factory=dict)  # argv[0] as resolved -> tool name
    iris_prefixes: tuple[tuple[str, ...], ...] = ()
    refresh: tuple[str, ...] = ()
    kubeconfigs: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for path, tool in self.tools.items():
            if tool not in _RULES or not (PurePath(path).is_absolute() or path == tool):
                raise RefusedCommandError(tool, path, "not a known tool at an absolute path")
        for prefix in self.iris_prefixes:
            check_iris_prefix(prefix)
        if self.refresh:
            check_refresh_template(self.refresh)

    def _fits_refresh(self, argv: Sequence[str]) -> bool:
        if len(argv) != len(self.refresh) or argv[0] != self.refresh[0]:
            return False
        return all(
            _template_pattern(w).fullmatch(a) for w, a in zip(self.refresh, argv, strict=True)
        )

    def check(self, argv: Sequence[str]) -> str:
        """The tool `argv` runs when it may run; `RefusedCommandError` naming the verb otherwise."""
        argv = tuple(argv)
        if not argv:
            raise RefusedCommandError("exec", "(empty)", "an empty command")
        if self.refresh and self._fits_refresh(argv):
            return "refresh"
        for prefix in self.iris_prefixes:
            if argv[: len(prefix)] == prefix and len(argv) > len(prefix):
                check_iris(argv[len(prefix) :])
                return "iris"
        tool = self.tools.get(argv[0])
        if tool is None:
            why = "not a tool resolved at start-up from the operator's settings"
            raise RefusedCommandError(PurePath(argv[0]).name, " ".join(argv[:2]), why)
        _RULES[tool](argv[1:], self.kubeconfigs)
        return tool
