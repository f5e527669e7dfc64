"""Read agentic trial directories (Harbor, terminal-bench) into the TRIALS table.

The trials directory (default `<job>/trace_jobs`) is searched recursively, because Harbor nests
`<job>/<trial>/`. A *trial directory* holds `result.json` (Harbor), `results.json` (terminal-bench)
or only `config.json` (a Harbor trial still running or cut off); a directory that holds such files
but also has trial directories below it is a job or run directory and is skipped. A result file
that does not parse is listed in `unreadable`, never raised. Every read goes through `BundleFiles`,
so nothing outside the job directory (or the explicit trials directory) is opened.

A Harbor trial's verifier output (`verifier/test-stdout.txt`, `verifier/test-stderr.txt`, the
test script's console) is read at its tail for the one line that says the tests could not run at
all (`VERIFIER_NOT_RUN`): the reward of such a trial says nothing about the model.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Final

import polars as pl

from worker.evidence import schema
from worker.evidence.bundle import parse_timestamp
from worker.evidence.parsed import TrialTables
from worker.evidence.paths import BundleFiles
from worker.evidence.values import integer, number, read_json, read_text, text

__all__ = [
    "DEFAULT_TRIALS_DIR",
    "VERIFIER_NOT_RUN",
    "harbor_row",
    "missing_trials",
    "read_trials",
    "simple_row",
    "terminal_bench_row",
    "verifier_not_run",
]

DEFAULT_TRIALS_DIR: Final = "trace_jobs"
TRIAL_FILES: Final = ("result.json", "results.json", "config.json")
SIDE_FILES: Final = ("sync_selection.json", "skipped_objects.json")
HARBOR_PHASES: Final = ("environment_setup", "agent_setup", "agent_execution", "verifier")
TB_CLEAN_MODES: Final = frozenset({"unset", "none"})
TRIAL_FILE_MAX_BYTES: Final = 16 * 2**20  # a trial's result or exception text (KBs in practice)
VERIFIER_DIR: Final = "verifier"
VERIFIER_FILES: Final = ("test-stdout.txt", "test-stderr.txt")  # Harbor's TrialPaths
VERIFIER_TAIL_BYTES: Final = 64 * 1024
"""The tail of a verifier output that is searched: pytest prints its usage error after the summary,
and a script that cannot start prints only that."""
VERIFIER_LINE_MAX: Final = 300
VERIFIER_NOT_RUN: Final = re.compile(
    # pytest: a test path given on its command line does not exist; no test ran (exit code 4)
    r"file or directory not found: \S+"
    # the interpreter was told to run a test script that is not there
    r"|can't open file '[^']+': \[Errno 2\][^\n]*"
    # a file under the tests directory Harbor uploads before the verifier runs (/tests)
    r"|No such file or directory: '/tests/[^']*'"
)
"""A line of the verifier's output saying the tests could not run at all: a missing test file or
test directory, not a test that failed. A test failing on a missing *output* file
(`No such file or directory: '/app/out.txt'`) is the agent's failure and does not match."""

Row = dict[str, Any]


class UnreadableError(ValueError):
    """A result file whose content cannot be read as a trial."""


# --- small readers of untrusted JSON values -------------------------------------------------------


def _dig(data: object, *keys: str) -> object:
    for key in keys:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def _seconds(started: object, finished: object) -> float | None:
    start, end = parse_timestamp(started), parse_timestamp(finished)
    return (end - start).total_seconds() if start and end else None


def _request_seconds(value: object) -> float | None:
    if not isinstance(value, list):
        return None
    millis = [number(item) for item in value]
    return sum(m for m in millis if m is not None) / 1000 if millis else None


# --- one row per trial format ---------------------------------------------------------------------


def _harbor_exception(data: Mapping[str, Any], exception_text: str | None) -> dict[str, Any]:
    info = data.get("exception_info")
    if isinstance(info, Mapping) and (info.get("exception_type") or info.get("exception_message")):
        return {
            "exception_type": text(info.get("exception_type")),
            "exception_message": text(info.get("exception_message")),
        }
    return _exception_from_traceback(exception_text)


def _exception_from_traceback(text: str | None) -> dict[str, Any]:
    """Type and message from the last non-empty line of a traceback (`pkg.Error: message`)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return {"exception_type": None, "exception_message": None}
    head, sep, message = lines[-1].partition(":")
    if " " in head.strip() or not head.strip():
        return {"exception_type": None, "exception_message": lines[-1]}
    return {
        "exception_type": head.strip().rsplit(".", 1)[-1],
        "exception_message": message.strip() if sep else None,
    }


def _harbor_phases(data: Mapping[str, Any]) -> dict[str, float | None]:
    return {
        f"{phase}_s": _seconds(_dig(data, phase, "started_at"), _dig(data, phase, "finished_at"))
        for phase in HARBOR_PHASES
    }


def verifier_not_run(text: str | None) -> str | None:
    """The line of a verifier output that says the tests could not run, or None."""
    found = VERIFIER_NOT_RUN.search(text or "")
    if found is None:
        return None
    start = (text or "").rfind("\n", 0, found.start()) + 1
    end = (text or "").find("\n", found.end())
    line = (text or "")[start : end if end != -1 else None]
    return line.strip()[:VERIFIER_LINE_MAX]


def harbor_row(data: Mapping[str, Any], trial_dir: str, exception_text: str | None = None) -> Row:
    """A TRIALS row from a Harbor `result.json` (and the trial's `exception.txt`, if any)."""
    agent = data.get("agent_result")
    return {
        "trial_name": text(data.get("trial_name")) or trial_dir,
        "task_name": text(data.get("task_name")),
        "status": "finished",
        "reward": number(_dig(data, "verifier_result", "rewards", "reward")),
        **_harbor_exception(data, exception_text),
        "n_turns": integer(_dig(agent, "metadata", "n_episodes")),
        **_harbor_phases(data),
        "llm_request_s": _request_seconds(_dig(agent, "metadata", "api_request_times_msec")),
        "n_input_tokens": integer(_dig(agent, "n_input_tokens")),
        "n_output_tokens": integer(_dig(agent, "n_output_tokens")),
        "started_at": parse_timestamp(data.get("started_at")),
        "finished_at": parse_timestamp(data.get("finished_at")),
        "format": "harbor",
    }


def simple_row(data: Mapping[str, Any], trial_dir: str) -> Row:
    """A TRIALS row from the simple rollout shape (`result.reward`, `steps` as turns)."""
    steps = data.get("steps")
    return {
        "trial_name": text(data.get("trial_name")) or trial_dir,
        "task_name": text(data.get("task")) or text(data.get("task_name")),
        "status": "finished",
        "reward": number(_dig(data, "result", "reward")),
        "n_turns": len(steps) if isinstance(steps, list) else None,
        "started_at": parse_timestamp(data.get("started_at")),
        "finished_at": parse_timestamp(data.get("finished_at")),
        "format": "simple",
    }


def _tb_reward(value: object) -> float | None:
    return float(value) if isinstance(value, bool) else None


def _tb_exception(value: object) -> str | None:
    mode = text(value)
    return None if mode is None or mode.lower() in TB_CLEAN_MODES else mode


def terminal_bench_row(data: Mapping[str, Any], trial_dir: str) -> Row:
    """A TRIALS row from a terminal-bench per-trial `results.json`."""
    return {
        "trial_name": text(data.get("trial_name")) or trial_dir,
        "task_name": text(data.get("task_id")),
        "status": "finished",
        "reward": _tb_reward(data.get("is_resolved")),
        "exception_type": _tb_exception(data.get("failure_mode")),
        "environment_setup_s": _seconds(data.get("trial_started_at"), data.get("agent_started_at")),
        "agent_execution_s": _seconds(data.get("agent_started_at"), data.get("agent_ended_at")),
        "verifier_s": _seconds(data.get("test_started_at"), data.get("test_ended_at")),
        "n_input_tokens": integer(data.get("total_input_tokens")),
        "n_output_tokens": integer(data.get("total_output_tokens")),
        "started_at": parse_timestamp(data.get("trial_started_at")),
        "finished_at": parse_timestamp(data.get("trial_ended_at")),
        "format": "terminal-bench",
    }


# --- reading the directory ------------------------------------------------------------------------


def _opened(files: BundleFiles, path: Path) -> BinaryIO:
    """`path` opened beneath the job directory (`BundleFiles.open`); `UnreadableError` when it
    is refused (a symlink took its place since it was listed)."""
    try:
        handle = files.open(path)
    except OSError as exc:
        raise UnreadableError(f"{type(exc).__name__}: {exc}") from exc
    if handle is None:
        raise UnreadableError("refused: it changed while it was read")
    return handle


def _read_json(files: BundleFiles, path: Path) -> object:
    with _opened(files, path) as handle:
        try:
            return read_json(handle, TRIAL_FILE_MAX_BYTES, int64=True)
        except (OSError, ValueError) as exc:
            raise UnreadableError(f"{type(exc).__name__}: {exc}") from exc


def _read_object(files: BundleFiles, path: Path) -> Mapping[str, Any]:
    data = _read_json(files, path)
    if not isinstance(data, Mapping):
        raise UnreadableError(f"not a JSON object but {type(data).__name__}")
    return data


def _read_text(files: BundleFiles, path: Path) -> str | None:
    try:
        with _opened(files, path) as handle:
            # a traceback's last line names the exception: keep the end of a huge one
            return _tail_text(handle, TRIAL_FILE_MAX_BYTES)
    except (OSError, UnreadableError):
        return None


def _tail_text(handle: BinaryIO, max_bytes: int) -> str:
    size = os.fstat(handle.fileno()).st_size
    if size <= max_bytes:
        return read_text(handle, max_bytes)[0]
    handle.seek(size - max_bytes)
    return handle.read(max_bytes).decode("utf-8", errors="replace")


def _trial_file(directory: Path, names: set[str]) -> Path:
    """The file a trial's row is read from: its result, or `config.json` while it runs."""
    for name in TRIAL_FILES:
        if name in names:
            return directory / name
    raise UnreadableError("no trial file")  # pragma: no cover - callers pass trial directories


def _tail(files: BundleFiles, path: Path, max_bytes: int) -> str | None:
    try:
        with _opened(files, path) as handle:
            return _tail_text(handle, max_bytes)
    except (OSError, UnreadableError):
        return None


def _verifier_fields(files: BundleFiles, outputs: Iterable[Path], job_dir: Path) -> Row:
    """The first line of the trial's verifier outputs that says the tests could not run."""
    for path in outputs:
        line = verifier_not_run(_tail(files, path, VERIFIER_TAIL_BYTES))
        if line is not None:
            return {"verifier_error": line, "verifier_source": _relative_to(path, job_dir)}
    return {}


def _result_row(
    files: BundleFiles, path: Path, names: set[str], outputs: Iterable[Path], job_dir: Path
) -> Row:
    data = _read_object(files, path)
    trial_dir = path.parent.name
    if path.name == "results.json" or "is_resolved" in data or "failure_mode" in data:
        return terminal_bench_row(data, trial_dir)
    if "result" in data and "task_name" not in data and "verifier_result" not in data:
        return simple_row(data, trial_dir)
    exception = path.parent / "exception.txt"
    text = _read_text(files, exception) if "exception.txt" in names else None
    return harbor_row(data, trial_dir, text) | _verifier_fields(files, outputs, job_dir)


def _trial_row(
    files: BundleFiles, path: Path, names: set[str], outputs: Iterable[Path], job_dir: Path
) -> Row:
    if path.name != "config.json":
        return _result_row(files, path, names, outputs, job_dir)
    return {"trial_name": path.parent.name, "status": "running", "format": "harbor"}


def _verifier_outputs(paths: Iterable[Path]) -> dict[Path, list[Path]]:
    """The verifier output files (`<trial>/verifier/test-std*.txt`) by their trial directory."""
    found: dict[Path, list[Path]] = {}
    for path in paths:
        if path.parent.name == VERIFIER_DIR and path.name in VERIFIER_FILES:
            found.setdefault(path.parent.parent, []).append(path)
    return found


def _trial_dirs(paths: Iterable[Path], top: Path) -> dict[Path, set[str]]:
    """Directories holding trial files, without those that have trial directories below them."""
    found: dict[Path, set[str]] = {}
    for path in paths:
        if path.parent != top or path.name not in SIDE_FILES:
            found.setdefault(path.parent, set()).add(path.name)
    candidates = {d: names for d, names in found.items() if names & set(TRIAL_FILES)}
    parents = {parent for d in candidates for parent in d.parents}
    return {d: names for d, names in sorted(candidates.items()) if d not in parents}


def _side_files(
    files: BundleFiles, top: Path, unreadable: list[str], source: str
) -> dict[str, Any]:
    """`sync_selection.json` and `skipped_objects.json` of the trials directory, any shape."""
    selection: dict[str, Any] | None = None
    skipped: tuple[Any, ...] = ()
    for name in SIDE_FILES:
        path = files.open_path(top / name)
        if path is None or not path.is_file():
            continue
        try:
            data = _read_json(files, path)
        except UnreadableError as exc:
            unreadable.append(f"{source}/{name}: {exc}")
            continue
        if name == "sync_selection.json":
            selection = dict(data) if isinstance(data, Mapping) else {"value": data}
        else:
            skipped = tuple(data) if isinstance(data, list) else (data,)
    return {"sync_selection": selection, "skipped_objects": skipped}


def _locate(job_dir: Path, trials_dir: Path | None, files: BundleFiles) -> tuple[BundleFiles, Path]:
    """The files object to read the trials with, and the trials directory.

    A trials directory named inside the job directory is read under the job directory's
    confinement (a symlink out of it is refused); one named outside it (`--trace-jobs-dir`)
    becomes its own confinement root. Relative paths are relative to the current directory, as
    for any path argument. The default is named relative to the job directory (the confinement
    root), never as `job_dir / "trace_jobs"`: a relative `job_dir` would be joined to the root a
    second time and the directory silently missed.
    """
    if trials_dir is None:
        return files, Path(DEFAULT_TRIALS_DIR)
    job = Path(os.path.normpath(job_dir.absolute()))
    wanted = Path(os.path.normpath(trials_dir.absolute()))
    if wanted == job or job in wanted.parents:
        return files, wanted
    return BundleFiles(wanted), wanted


def _relative_to(path: Path, job_dir: Path) -> str:
    """`path` relative to the job directory, or absolute when it lies elsewhere."""
    try:
        return path.relative_to(job_dir.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def _frame(rows: list[Row]) -> pl.DataFrame:
    full = [{column: row.get(column) for column in schema.TRIALS} for row in rows]
    if not full:
        return schema.empty(schema.TRIALS)
    return pl.DataFrame(full, schema=schema.TRIALS)


def missing_trials(trials: TrialTables | None, *, agentic: bool) -> str | None:
    """The discrepancy to state when an agentic run has no trials directory, else None."""
    if not agentic or trials is not None:
        return None
    return (
        f"agentic run without trials: {DEFAULT_TRIALS_DIR}/ is missing from the job directory "
        "(or leaves it), so no rollout can be read"
    )


def read_trials(
    job_dir: Path, trials_dir: Path | None = None, files: BundleFiles | None = None
) -> TrialTables | None:
    """The trials under `trials_dir` (default `job_dir/trace_jobs`), or None when it is absent."""
    files, trials_dir = _locate(job_dir, trials_dir, files or BundleFiles(job_dir))
    top = files.open_path(trials_dir)
    if top is None or not top.is_dir():
        return None
    rows: list[Row] = []
    unreadable: list[str] = []
    paths = list(files.walk(top))
    outputs = _verifier_outputs(paths)
    for directory, names in _trial_dirs(paths, top).items():
        path = _trial_file(directory, names)
        source = _relative_to(path, job_dir)
        try:
            found = _trial_row(files, path, names, outputs.get(directory, ()), job_dir)
            rows.append(found | {"source": source})
        except UnreadableError as exc:
            unreadable.append(f"{source}: {exc}")
    where = _relative_to(top, job_dir)
    side = _side_files(files, top, unreadable, where)
    return TrialTables(trials=_frame(rows), directory=where, unreadable=tuple(unreadable), **side)
