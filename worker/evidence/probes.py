"""Read and write the probe directory of docs/probes.md: what the live probes of a backend returned.

Layout (every file optional):

    probes.json      {"captured_at", "backend", "job_id", "commands": [{argv, started_at,
                      exit_code (null: timed out), output}]}
    controller.json  the keys of `iris job summary --json`, states as lower-case names
    attempts.json    [{task_id, attempt_id, state, exit_code, error, started_at_ms, ...}]
    stacks/<task-or-pod>-pid<pid>-<n>.txt   `py-spy dump` output
    processes.json   [{target, pid, ppid, args, role, why}]: each probed process and its role
    gpus/<pod>.csv   `nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total,
                      power.draw,power.limit --format=csv`

`read_probes` never raises on bad content: a file that does not parse, a command that timed out
or failed, or an expected output that is missing becomes a line in `failures`. `write_probes`
writes the same layout, so the live backends and the recorded backend share one format. The Iris
helpers turn `iris query` CSV and `iris job summary --json` output into the same models.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Final, TypeVar

from pydantic import ValidationError

from shared.redact import redact_data, redact_text
from shared.safefs import write_file
from worker.evidence.bundle import mtime_utc, parse_timestamp
from worker.evidence.model import (
    AttemptRecord,
    ControllerView,
    ProbeCommand,
    ProbeEvidence,
    ProcessRecord,
    StackDump,
)
from worker.evidence.paths import BundleFiles, resolve_inside
from worker.evidence.pslist import parse_ps
from worker.evidence.values import loads_json, read_json, read_text

__all__ = [
    "GPU_COLUMNS",
    "IRIS_STATES",
    "attempts_from_iris_query_csv",
    "controller_from_iris_summary",
    "controller_from_mapping",
    "iris_state_name",
    "parse_gpu_csv",
    "read_probes",
    "render_gpu_csv",
    "write_probes",
]

# docs/domain.md#iris-job-and-task-states: job states 0-8, task states add 9-12.
IRIS_STATES: Final[dict[int, str]] = {
    0: "unspecified",
    1: "pending",
    2: "building",
    3: "running",
    4: "succeeded",
    5: "failed",
    6: "killed",
    7: "worker_failed",
    8: "unschedulable",
    9: "assigned",
    10: "preempted",
    11: "cosched_failed",
    12: "missing",
}
# nvidia-smi query field -> (short name, unit written in the csv header)
GPU_COLUMNS: Final[dict[str, tuple[str, str]]] = {
    "index": ("index", ""),
    "utilization.gpu": ("utilization_gpu_pct", "%"),
    "memory.used": ("memory_used_mib", "MiB"),
    "memory.total": ("memory_total_mib", "MiB"),
    "power.draw": ("power_draw_w", "W"),
    "power.limit": ("power_limit_w", "W"),
}
_STACK_NAME: Final = re.compile(r"^(?P<target>.+)-pid(?P<pid>\d+)-(?P<n>\d+)\.txt$")
_STATE_PREFIXES: Final = ("job_state_", "task_state_", "attempt_state_")

_T = TypeVar("_T")

# A stack dump or GPU table is KBs; a bigger one is read up to this and marked as cut.
PROBE_TEXT_MAX_BYTES: Final = 8 * 2**20
PROBES_JSON: Final = "probes.json"
CONTROLLER_JSON: Final = "controller.json"
ATTEMPTS_JSON: Final = "attempts.json"
PROCESSES_JSON: Final = "processes.json"


class ProbeFileError(ValueError):
    """A probe file whose content does not fit the layout."""


# --- states ---------------------------------------------------------------------------------------


def iris_state_name(value: object) -> str:
    """A state as a lower-case name: Iris numbers mapped, proto prefixes dropped, None `unknown`."""
    if isinstance(value, bool) or value is None:
        return "unknown"
    if isinstance(value, int):
        return IRIS_STATES.get(value, f"state_{value}")
    text = str(value).strip().lower()
    if text.isdigit():
        return iris_state_name(int(text))
    for prefix in _STATE_PREFIXES:
        text = text.removeprefix(prefix)
    return text or "unknown"


def _named_states(task: Mapping[str, Any]) -> dict[str, Any]:
    return {**task, "state": iris_state_name(task.get("state"))} if "state" in task else dict(task)


def _state_counts(value: object) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return {}
    return {iris_state_name(key): count for key, count in value.items()}


def _tasks(value: object) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list):
        return ()
    return tuple(_named_states(task) for task in value if isinstance(task, Mapping))


def controller_from_mapping(data: Mapping[str, Any]) -> ControllerView:
    """A ControllerView from summary-shaped JSON; numeric states become names."""
    fields = {
        **data,
        "state": iris_state_name(data.get("state")),
        "task_state_counts": _state_counts(data.get("task_state_counts")),
        "tasks": _tasks(data.get("tasks")),
    }
    return ControllerView.model_validate(fields)


def controller_from_iris_summary(json_text: str) -> ControllerView:
    """The output of `iris job summary <id> --json` as a ControllerView (bounded JSON:
    `ValueError` past a bound)."""
    data = loads_json(json_text, int64=True)
    if not isinstance(data, Mapping):
        raise ProbeFileError(f"job summary is not a JSON object but {type(data).__name__}")
    return controller_from_mapping(data)


# Milliseconds a datetime can hold (years 1970-9999); a value outside is no time at all.
_MAX_MS: Final = 253_402_300_799_999
_MS_FIELDS: Final = ("started_at_ms", "finished_at_ms")


def _millis(value: object) -> object:
    """A millisecond field as given, or None when it is a number no datetime can hold."""
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number = int(value.strip()) if len(value.strip()) < 20 else _MAX_MS + 1
    if number is not None and not 0 <= number <= _MAX_MS:
        return None
    return value


def _attempt(data: Mapping[str, Any]) -> AttemptRecord:
    blanks_as_none = {key: (None if value == "" else value) for key, value in data.items()}
    times = {name: _millis(blanks_as_none[name]) for name in _MS_FIELDS if name in blanks_as_none}
    return AttemptRecord.model_validate(
        {**blanks_as_none, **times, "state": iris_state_name(blanks_as_none.get("state"))}
    )


def attempts_from_iris_query_csv(text: str) -> tuple[AttemptRecord, ...]:
    """Rows of `iris query "SELECT ... FROM task_attempts" -f csv` (numeric states) as records."""
    reader = csv.DictReader(io.StringIO(text.strip()))
    return tuple(_attempt(row) for row in reader if any(row.values()))


# --- nvidia-smi csv -------------------------------------------------------------------------------


def _gpu_column(header: str) -> str:
    field = header.strip().split(" [", 1)[0].strip()
    known = GPU_COLUMNS.get(field)
    return known[0] if known else re.sub(r"\W+", "_", field).strip("_")


def _gpu_value(text: str) -> float | None:
    token = text.strip().split(" ", 1)[0]
    try:
        return float(token)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]", ""


def parse_gpu_csv(text: str) -> tuple[dict[str, float | None], ...]:
    """`nvidia-smi --query-gpu=... --format=csv` output as rows of floats keyed by short names."""
    rows = [row for row in csv.reader(io.StringIO(text.strip())) if any(c.strip() for c in row)]
    if not rows:
        return ()
    if _gpu_value(rows[0][0]) is None:
        header, body = [_gpu_column(cell) for cell in rows[0]], rows[1:]
    else:  # csv,noheader: the documented query order
        header, body = [short for short, _ in GPU_COLUMNS.values()], rows
    return tuple(dict(zip(header, map(_gpu_value, row), strict=False)) for row in body)


def render_gpu_csv(rows: Iterable[Mapping[str, float | None]]) -> str:
    """The csv `nvidia-smi` would print for rows in the short-name form (inverse of the parser)."""
    lines = [", ".join(f"{f} [{u}]" if u else f for f, (_, u) in GPU_COLUMNS.items())]
    for row in rows:
        cells = [_gpu_cell(row.get(short), unit) for short, unit in GPU_COLUMNS.values()]
        lines.append(", ".join(cells))
    return "\n".join(lines) + "\n"


def _gpu_cell(value: float | None, unit: str) -> str:
    if value is None:
        return "[N/A]"
    number = str(int(value)) if value.is_integer() else repr(value)
    return f"{number} {unit}" if unit else number


# --- reading --------------------------------------------------------------------------------------


def _load_json(files: BundleFiles, name: str) -> object | None:
    """The parsed JSON file, None when absent; `ProbeFileError` when it does not parse."""
    path = files.open_path(name)
    if path is None or not path.is_file():
        return None
    try:
        with _opened(files, path) as handle:
            return read_json(handle, int64=True)
    except (OSError, ValueError) as exc:
        raise ProbeFileError(f"{name} does not parse: {exc}") from exc


def _opened(files: BundleFiles, path: Path) -> BinaryIO:
    """`path` opened beneath the probe directory (`BundleFiles.open`); `ProbeFileError` when
    it is refused (a symlink took its place since it was listed)."""
    handle = files.open(path)
    if handle is None:
        raise ProbeFileError(f"{files.relative(path)} refused: it changed while it was read")
    return handle


FAILURE_TAIL_BYTES: Final = 4096
"""How much of a failed command's output is read back for its reason (its last lines)."""


def _failure_reason(text: str) -> str | None:
    """The reason a failed command's output gives: the Recorder ends it with `--- <why>` (e.g.
    `--- exited 1: Error: Failed to find python version from target process`); else its last
    non-empty line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    marked = [line[4:] for line in lines if line.startswith("--- ") and line != "--- stderr ---"]
    found = marked[-1] if marked else (lines[-1] if lines else None)
    return redact_text(found)[:300] if found else None


def _with_reason(files: BundleFiles, command: ProbeCommand) -> ProbeCommand:
    """A failed command with the reason its `failed/` output gives (as the live Recorder knew it),
    so a replay of recorded probes reads what the diagnosis that took them read."""
    if command.exit_code == 0 or not command.output or command.why:
        return command
    path = files.open_path(command.output)
    if path is None or not path.is_file():
        return command
    try:
        with _opened(files, path) as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - FAILURE_TAIL_BYTES))
            text = handle.read(FAILURE_TAIL_BYTES).decode("utf-8", errors="replace")
    except (OSError, ProbeFileError):
        return command
    reason = _failure_reason(text)
    return command.model_copy(update={"why": reason}) if reason else command


def _commands(data: Mapping[str, Any]) -> tuple[ProbeCommand, ...]:
    commands = data.get("commands")
    if not isinstance(commands, list):
        return ()
    return tuple(ProbeCommand.model_validate(c) for c in commands if isinstance(c, Mapping))


def _probes_json(files: BundleFiles) -> dict[str, Any]:
    data = _load_json(files, PROBES_JSON)
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ProbeFileError(f"{PROBES_JSON} is not a JSON object")
    return {
        "captured_at": parse_timestamp(data.get("captured_at")),
        "backend": data.get("backend") if isinstance(data.get("backend"), str) else None,
        "job_id": data.get("job_id") if isinstance(data.get("job_id"), str) else None,
        "commands": _commands(data),
    }


def _controller(files: BundleFiles) -> ControllerView | None:
    data = _load_json(files, CONTROLLER_JSON)
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise ProbeFileError(f"{CONTROLLER_JSON} is not a JSON object")
    return controller_from_mapping(data)


def _attempts(files: BundleFiles) -> tuple[AttemptRecord, ...] | None:
    data = _load_json(files, ATTEMPTS_JSON)
    if data is None:
        return None
    if not isinstance(data, list):
        raise ProbeFileError(f"{ATTEMPTS_JSON} is not a JSON list")
    return tuple(_attempt(item) for item in data if isinstance(item, Mapping))


def _processes(files: BundleFiles) -> tuple[ProcessRecord, ...]:
    data = _load_json(files, PROCESSES_JSON)
    if data is None:
        return ()
    if not isinstance(data, list):
        raise ProbeFileError(f"{PROCESSES_JSON} is not a JSON list")
    return tuple(ProcessRecord.model_validate(item) for item in data if isinstance(item, Mapping))


def _listed(files: BundleFiles) -> tuple[ProcessRecord, ...]:
    """Without `processes.json`, the process tables the live backends record as
    `raw/ps-<target>.txt` (`ps -ww -eo pid,ppid,args` run in the task): each process's command
    line, its role left to `worker.evidence.roles` (a timed-out or failed dump of a helper is
    then known for one)."""
    records: list[ProcessRecord] = []
    for path in files.walk("raw", "ps-*.txt"):
        try:
            with _opened(files, path) as handle:
                text, _ = read_text(handle, PROBE_TEXT_MAX_BYTES)
        except (OSError, ProbeFileError):
            continue
        target = path.name.removeprefix("ps-").removesuffix(".txt")
        records += [
            ProcessRecord(target=target, pid=row.pid, ppid=row.ppid, args=row.args[:4096])
            for row in parse_ps(text)
        ]
    return tuple(records)


def _stack(
    files: BundleFiles, path: Path, prefix: str, started: Mapping[str, datetime | None]
) -> StackDump:
    match = _STACK_NAME.match(path.name)
    if match is None:
        raise ProbeFileError(f"stacks/{path.name}: name is not <task-or-pod>-pid<pid>-<n>.txt")
    relative = files.relative(path)
    return StackDump(
        target=match["target"],
        pid=int(match["pid"]),
        n=int(match["n"]),
        source=f"{prefix}/{relative}" if prefix else relative,
        captured_at=started.get(relative) or mtime_utc(path),
        text=_probe_text(files, path),
    )


def _probe_text(files: BundleFiles, path: Path) -> str:
    """A probe output, at most PROBE_TEXT_MAX_BYTES of it (marked when cut)."""
    with _opened(files, path) as handle:
        content, cut = read_text(handle, PROBE_TEXT_MAX_BYTES)
    return content + (f"\n[... cut at {PROBE_TEXT_MAX_BYTES:,} bytes]" if cut else "")


def _stacks(
    files: BundleFiles, commands: tuple[ProbeCommand, ...], prefix: str, failures: list[str]
) -> tuple[StackDump, ...]:
    started = {os.path.normpath(c.output): c.started_at for c in commands if c.output}
    stacks: list[StackDump] = []
    for path in files.walk("stacks", "*.txt"):
        try:
            stacks.append(_stack(files, path, prefix, started))
        except (ProbeFileError, OSError) as exc:
            failures.append(str(exc))
    return tuple(sorted(stacks, key=lambda s: (s.target, s.pid, s.n)))


def _gpu_table(files: BundleFiles, path: Path) -> tuple[dict[str, float | None], ...]:
    try:
        with _opened(files, path) as handle:
            return parse_gpu_csv(read_text(handle, PROBE_TEXT_MAX_BYTES)[0])
    except csv.Error as exc:
        raise ProbeFileError(f"gpus/{path.name} does not parse: {exc}") from exc


def _gpus(files: BundleFiles) -> dict[str, tuple[dict[str, float | None], ...]]:
    return {path.stem: _gpu_table(files, path) for path in files.walk("gpus", "*.csv")}


def _command_failure(files: BundleFiles, command: ProbeCommand) -> str | None:
    reasons: list[str] = []
    if command.exit_code is None:
        reasons.append("timed out (exit_code null)")
    elif command.exit_code != 0:
        reasons.append(f"exited {command.exit_code}")
    if command.output:
        path = files.open_path(command.output)
        if path is None or not path.is_file():
            reasons.append(f"its output {command.output} is missing")
    if not reasons:
        return None
    return f"`{shlex.join(command.argv)}`: " + "; ".join(reasons)


def _guarded(
    failures: list[str], read: Callable[[BundleFiles], _T], files: BundleFiles
) -> _T | None:
    """`read(files)`, or None with the reason appended to `failures` when the file is bad."""
    try:
        return read(files)
    except (ProbeFileError, ValidationError, OSError) as exc:
        failures.append(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return None


def read_probes(probe_dir: Path, source_prefix: str = "probes") -> ProbeEvidence:
    """The probe directory read back; stack sources are quoted as `<source_prefix>/stacks/...`."""
    files = BundleFiles(probe_dir)
    failures: list[str] = []
    header: dict[str, Any] = _guarded(failures, _probes_json, files) or {}
    commands: tuple[ProbeCommand, ...] = tuple(
        _with_reason(files, c) for c in header.get("commands", ())
    )
    header["commands"] = commands
    failures.extend(filter(None, (_command_failure(files, c) for c in commands)))
    evidence = ProbeEvidence(
        directory=source_prefix,
        **header,
        controller=_guarded(failures, _controller, files),
        attempts=_guarded(failures, _attempts, files),
        stacks=_stacks(files, commands, source_prefix, failures),
        processes=_guarded(failures, _processes, files) or _listed(files),
        gpus=_guarded(failures, _gpus, files) or {},
    )
    return evidence.model_copy(update={"failures": (*failures, *files.refused)})


# --- writing --------------------------------------------------------------------------------------


def _write(probe_dir: Path, relative: str, text: str) -> Path:
    """Write one probe file; its text passes the redactor first (outputs hold env and argv).
    Written whole under a new name (`shared.safefs.write_file`): a symlink there is replaced."""
    path = resolve_inside(probe_dir, relative)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_file(path.parent, path.name, redact_text(text).encode())


def _iso(value: datetime | None) -> str | None:
    """ISO-8601 UTC with every microsecond kept (the reader must get the same instant back)."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value else None


def _json_text(data: object) -> str:
    """JSON with every value under a credential's key hidden (`redact_data`) before writing."""
    return json.dumps(redact_data(data), indent=2, sort_keys=True) + "\n"


def _probes_header(evidence: ProbeEvidence) -> dict[str, Any]:
    commands = [
        {
            "argv": list(c.argv),
            "started_at": _iso(c.started_at),
            "exit_code": c.exit_code,
            "output": c.output,
        }
        for c in evidence.commands
    ]
    return {
        "captured_at": _iso(evidence.captured_at),
        "backend": evidence.backend,
        "job_id": evidence.job_id,
        "commands": commands,
    }


def _write_stack(probe_dir: Path, stack: StackDump, outputs: Mapping[str, str]) -> None:
    relative = f"stacks/{Path(stack.source).name}"
    if relative in outputs:
        return
    path = _write(probe_dir, relative, stack.text)
    if stack.captured_at is not None:
        nanos = int(stack.captured_at.timestamp()) * 10**9 + stack.captured_at.microsecond * 1000
        os.utime(path, ns=(nanos, nanos))


def write_probes(evidence: ProbeEvidence, outputs: dict[str, str], probe_dir: Path) -> None:
    """Write `evidence` in the probe layout; `outputs` are raw command outputs by relative path.

    Raw outputs are written as returned, but redacted (`shared.redact`), and win over a rendering
    of the same file. A stack's file gets its `captured_at` as modification time, so a reader
    without the command still dates it.
    """
    probe_dir.mkdir(parents=True, exist_ok=True)
    for relative, text in outputs.items():
        _write(probe_dir, relative, text)
    _write(probe_dir, PROBES_JSON, _json_text(_probes_header(evidence)))
    if evidence.controller is not None:
        _write(probe_dir, CONTROLLER_JSON, _json_text(evidence.controller.model_dump(mode="json")))
    if evidence.attempts is not None:
        attempts = [a.model_dump(mode="json") for a in evidence.attempts]
        _write(probe_dir, ATTEMPTS_JSON, _json_text(attempts))
    if evidence.processes:
        processes = [p.model_dump(mode="json") for p in evidence.processes]
        _write(probe_dir, PROCESSES_JSON, _json_text(processes))
    for stack in evidence.stacks:
        _write_stack(probe_dir, stack, outputs)
    for pod, rows in evidence.gpus.items():
        if f"gpus/{pod}.csv" not in outputs:
            _write(probe_dir, f"gpus/{pod}.csv", render_gpu_csv(rows))
