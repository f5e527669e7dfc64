"""What the user gave, mapped onto the bundle layout the readers expect — and what was left out.

`rl-health diagnose PATH` (and `parse`, `signatures`) accept what people have:

- a **watcher job directory** (`manifest.json`, `finelog.log`, `pod_logs/`, `ray_vllm_logs/`,
  `trace_jobs/`, any of them): read as it is; any other file in it is named as skipped;
- a **folder of logs with any names** (a trainer's stdout, pod logs, vLLM logs, Harbor or
  terminal-bench trial folders): each file's first `SNIFF_BYTES` are read and the file is taken
  for what its lines show — the trainer log (the one the readers treat as `finelog.log`), a pod or
  engine log (read for engine and error lines, as `pod_logs/` are), a Ray worker log, the trials
  directory — or skipped, with the reason;
- a **single log file**: taken as the trainer log (the folder around it is not read).

The result is a `Layout`: the confinement root (every read goes through `BundleFiles`, so nothing
outside it is opened and no symlink is followed), the files each reader takes, and a line per
decision (`Layout.inputs`): what each file was taken to be and why, and every file skipped and why.
Nothing is skipped in silence. Skipped files of one kind are grouped (a count and the first few
names), so a watcher directory with a thousand Ray process logs stays readable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Final, Literal

from worker.evidence.paths import BundleFiles

__all__ = [
    "SNIFF_BYTES",
    "LaidOutFiles",
    "Layout",
    "Sniffed",
    "discover",
    "sniff",
]

Kind = Literal["watcher job directory", "folder of logs", "single log file"]
Role = Literal["trainer", "pod", "engine", "ray", "errors"]

SNIFF_BYTES: Final = 64 * 1024  # enough for a few hundred lines: start-up, the first steps
_EXAMPLES: Final = 3  # names shown per group of skipped files
FINELOG: Final = "finelog.log"
MANIFEST: Final = "manifest.json"
_ABSENT: Final = ".rlhealth-not-in-the-layout"
WATCHER_NAMES: Final = frozenset(
    {"manifest.json", FINELOG, "pod_logs", "ray_vllm_logs", "trace_jobs"}
)
TRIAL_FILES: Final = frozenset({"result.json", "results.json", "config.json"})
_COMPRESSED: Final = (".gz", ".bz2", ".xz", ".zst", ".zip", ".tar", ".tgz", ".lz4")
_DATA: Final = (".json", ".jsonl", ".csv", ".parquet", ".yaml", ".yml", ".toml", ".png", ".jpg")
_RAY_WORKER: Final = re.compile(r"^worker-.*\.(?:out|err)$")
# What a file's lines show. Hypothesis: a SkyRL trainer prints phase timers, step counters or
# metric records within its first lines; a vLLM engine prints its stat lines and its start-up;
# a Python process that died prints a traceback. A log without any of these in its first
# SNIFF_BYTES holds nothing the gates read.
_TRAINER: Final = re.compile(
    r"Started: '|Finished: '|WANDB_MIRROR|skyrl|trainer/global_step|Training Step Progress"
    r"|Generation Buffer Progress|reward/avg_|\[iris setup\]|policy_loss|global_step"
)
_ENGINE: Final = re.compile(
    r"Avg prompt throughput|Avg generation throughput|GPU KV cache usage|EngineCore"
    r"|AsyncVLLMInferenceEngine|vllm\.|vLLM"
)
_ERRORS: Final = re.compile(
    r"Traceback \(most recent call last\)|CUDA out of memory|CUDA error|ActorDiedError"
    r"|RayTaskError|Error: |Exception: "
)
_DRIVER_NAME: Final = re.compile(r"finelog|driver|trainer|stdout|entrypoint|main|train", re.I)


@dataclass(frozen=True)
class Sniffed:
    """What the first bytes of a file show: counts of trainer, engine and error lines, whether
    it is text, and its first non-empty line (to say what a skipped log looks like)."""

    trainer: int = 0
    engine: int = 0
    errors: int = 0
    text: bool = True
    first_line: str = ""

    @property
    def role(self) -> Role | None:
        """The reader that takes a file with these lines, or None when none would."""
        if self.trainer and self.trainer >= self.engine:
            return "trainer"
        if self.engine:
            return "engine"
        return "errors" if self.errors else None

    def looks(self) -> str:
        """In words, for the report."""
        found = [
            f"{n} {what} line(s)"
            for n, what in (
                (self.trainer, "trainer"),
                (self.engine, "vLLM engine"),
                (self.errors, "error"),
            )
            if n
        ]
        return ", ".join(found) or "no trainer, engine or error line"


def sniff(head: bytes) -> Sniffed:
    """Classify the first bytes of a file (pure)."""
    if b"\0" in head[:4096]:
        return Sniffed(text=False)
    lines = head.decode("utf-8", errors="replace").splitlines()
    first = next((line.strip() for line in lines if line.strip() and not line.startswith("# ")), "")
    return Sniffed(
        trainer=sum(1 for line in lines if _TRAINER.search(line)),
        engine=sum(1 for line in lines if _ENGINE.search(line)),
        errors=sum(1 for line in lines if _ERRORS.search(line)),
        first_line=first[:120],
    )


@dataclass
class Layout:
    """What one PATH holds, for the readers: `root` confines every read; the rest are paths
    relative to it. `inputs` says what each file was taken to be, and what was skipped and why."""

    root: Path
    kind: Kind
    given: str = ""  # PATH as given
    trainer: str | None = None
    pods: list[str] = field(default_factory=list)
    rays: list[str] = field(default_factory=list)
    trials: str | None = None
    manifest: str | None = None
    taken: list[str] = field(default_factory=list)
    skipped: dict[str, list[str]] = field(default_factory=dict)  # reason -> paths

    @cached_property
    def files(self) -> BundleFiles:
        """The files object the readers open with (one, so what it refused is reported once):
        the bundle layout itself for a watcher directory, else one that maps its names onto the
        files taken."""
        if self.kind == "watcher job directory":
            return BundleFiles(self.root)
        return LaidOutFiles(self.root, layout=self)

    def skip(self, reason: str, path: str) -> None:
        self.skipped.setdefault(reason, []).append(path)

    def inputs(self) -> tuple[str, ...]:
        """One line per decision: each file taken and what as, each group skipped and why."""
        lines = [f"{self.kind}: {self.given or self.root}", *self.taken]
        for reason, paths in self.skipped.items():
            named = ", ".join(paths[:_EXAMPLES])
            more = f" and {len(paths) - _EXAMPLES} more" if len(paths) > _EXAMPLES else ""
            lines.append(f"skipped {len(paths)} file(s), {reason}: {named}{more}")
        return tuple(lines)

    def quiet(self) -> bool:
        """A watcher job directory read as it is, with nothing skipped: nothing to say."""
        return self.kind == "watcher job directory" and not self.skipped


class LaidOutFiles(BundleFiles):
    """`BundleFiles` over a folder that is not in the bundle layout: the names the log readers
    ask for (`finelog.log`, `pod_logs/*.log`, `ray_vllm_logs/**/worker-*`) are answered with the
    files the layout took for those roles; everything else, as `BundleFiles` does. Quotes keep
    each file's own name."""

    def __init__(self, root: Path, *, layout: Layout) -> None:
        super().__init__(root)
        self.layout = layout

    def open_path(self, relative: str | Path) -> Path | None:
        mapped = {FINELOG: self.layout.trainer, MANIFEST: self.layout.manifest}
        name = Path(relative).as_posix()
        if name not in mapped:
            return super().open_path(relative)
        if mapped[name] is None:  # the layout has none: a path that is no file
            return self.root.resolve() / _ABSENT / name
        return super().open_path(str(mapped[name]))

    def walk(self, relative: str | Path = ".", pattern: str = "*") -> Iterator[Path]:
        mapped = {"pod_logs": self.layout.pods, "ray_vllm_logs": self.layout.rays}
        if str(relative) not in mapped:
            yield from super().walk(relative, pattern)
            return
        for name in mapped[str(relative)]:
            found = super().open_path(name)
            if found is not None and found.is_file():
                yield found


# --- discovery ------------------------------------------------------------------------------------


def discover(path: Path) -> Layout:
    """The layout of `path`: a watcher job directory, a folder of logs, or a single log file."""
    if path.is_file():
        layout = _single(path)
    else:
        names = {entry.name for entry in os.scandir(path)} if path.is_dir() else set()
        layout = _watcher(path) if names & WATCHER_NAMES or not names else _folder(path)
    layout.given = str(path)
    return layout


def _single(path: Path) -> Layout:
    layout = Layout(root=path.parent, kind="single log file", trainer=path.name)
    looks = _sniffed(layout.files, path.name)
    layout.taken.append(
        f"took {path.name} as the trainer log (a single file was given; {looks.looks()} in its "
        f"first {SNIFF_BYTES // 1024} KB)"
    )
    return layout


def _sniffed(files: BundleFiles, relative: str) -> Sniffed:
    opened = files.open(relative)
    if opened is None:
        return Sniffed(text=False)
    with opened:
        return sniff(opened.read(SNIFF_BYTES))


def _watcher(path: Path) -> Layout:
    """The watcher layout as it is; every file no reader takes is named as skipped. The trials
    directory is left to the trials reader (it names what it cannot read), so a job with
    thousands of trials is not listed twice."""
    layout = Layout(root=path, kind="watcher job directory", trainer=FINELOG)
    files = layout.files
    tops = sorted(os.scandir(path), key=lambda e: e.name) if path.is_dir() else []
    for entry in tops:
        if entry.name == "trace_jobs":
            continue
        names = (
            _relative_files_under(files, entry.name)
            if entry.is_dir(follow_symlinks=False)
            else [entry.name]
        )
        for name in names:
            reason = _watcher_skip(name)
            if reason is not None:
                layout.skip(reason, name)
    return layout


def _relative_files_under(files: BundleFiles, top: str) -> list[str]:
    return [files.relative(p) for p in files.walk(top)]


def _watcher_skip(name: str) -> str | None:
    """Why a file of a watcher job directory is not read, or None when a reader takes it."""
    top, _, rest = name.partition("/")
    if name in ("manifest.json", FINELOG) or top == "trace_jobs":
        return None
    if top == "pod_logs":
        return None if name.endswith(".log") else "in pod_logs/ but not a .log"
    if top == "ray_vllm_logs":
        if _RAY_WORKER.match(Path(rest).name):
            return None
        return "Ray's own process logs (only worker-*.out/.err, the actors' output, are read)"
    if name == "finelog.stderr":
        return "the log sync's stderr (the job's own lines are in finelog.log)"
    return (
        "not part of the watcher layout (manifest.json, finelog.log, pod_logs/, "
        "ray_vllm_logs/, trace_jobs/)"
    )


def _trial_dirs(names: Iterable[str]) -> set[str]:
    return {str(Path(n).parent) for n in names if Path(n).name in TRIAL_FILES and "/" in n}


def _common_parent(dirs: set[str]) -> str:
    """The deepest folder holding every trial folder ("." for the root itself)."""
    parents = {str(Path(d).parent) for d in dirs}
    common = os.path.commonpath(list(parents)) if parents else "."
    return common or "."


def _folder(path: Path) -> Layout:
    layout = Layout(root=path, kind="folder of logs")
    files = layout.files
    names = _relative_files_under(files, ".")
    trial_dirs = _trial_dirs(names)
    if trial_dirs:
        layout.trials = _common_parent(trial_dirs)
        layout.taken.append(
            f"took {layout.trials}/ as the trials directory ({len(trial_dirs)} trial folder(s) "
            "holding result.json, results.json or config.json)"
        )
    candidates: list[tuple[str, Sniffed]] = []
    for name in names:
        if any(name == d or name.startswith(f"{d}/") for d in trial_dirs):
            continue  # read by the trials reader
        sniffed = _classify(layout, files, name)
        if sniffed is not None:
            candidates.append((name, sniffed))
    _assign(layout, candidates)
    for refused in files.refused:
        layout.skip("refused (a symlink leaving the folder, or not a regular file)", refused)
    return layout


def _classify(layout: Layout, files: BundleFiles, name: str) -> Sniffed | None:
    """A log file's sniffed lines, or None after recording why it is skipped."""
    lower = name.lower()
    if Path(name).name == "probes.json":
        layout.skip("a recorded probe directory's header (give that folder as --probes)", name)
        return None
    if lower.endswith(("result.json", "results.json")):
        layout.skip(
            "trial results outside a trial folder (the trials reader takes one folder per "
            "trial, holding result.json or results.json)",
            name,
        )
        return None
    if lower.endswith(_COMPRESSED):
        layout.skip("compressed (decompress it to have it read)", name)
        return None
    if lower.endswith(_DATA):
        layout.skip("not a log (data: JSON, CSV, Parquet, YAML, TOML or an image)", name)
        return None
    try:
        found = _sniffed(files, name)
    except OSError as exc:
        layout.skip(f"unreadable ({exc.strerror or exc})", name)
        return None
    if not found.text:
        layout.skip("binary (not a text log)", name)
        return None
    if _RAY_WORKER.match(Path(name).name):
        layout.rays.append(name)
        layout.taken.append(f"took {name} as a Ray worker log (engine stat and actor-death lines)")
        return None
    if found.role is None:
        begins = f"; it begins {found.first_line!r}" if found.first_line else " (empty)"
        layout.skip(
            f"no trainer, vLLM or error line in its first {SNIFF_BYTES // 1024} KB", name + begins
        )
        return None
    return found


def _assign(layout: Layout, candidates: list[tuple[str, Sniffed]]) -> None:
    """The trainer log is the trainer-like file named like a driver's stdout, else the one with
    the most trainer lines (then the largest); every other log is read as a pod log is (its
    engine and error lines fill what the trainer log lacks)."""
    trainers = [(n, s) for n, s in candidates if s.role == "trainer"]
    if trainers:
        best = max(
            trainers,
            key=lambda item: (
                bool(_DRIVER_NAME.search(Path(item[0]).name)),
                item[1].trainer,
                (layout.root / item[0]).stat().st_size,
            ),
        )
        layout.trainer = best[0]
        layout.taken.append(f"took {best[0]} as the trainer log ({best[1].looks()})")
    for name, found in candidates:
        if name == layout.trainer:
            continue
        layout.pods.append(name)
        what = {"trainer": "another trainer-like log", "engine": "a vLLM engine log"}.get(
            found.role or "", "a log with errors"
        )
        layout.taken.append(
            f"took {name} as {what}, read for its engine and error lines ({found.looks()})"
        )
    if layout.trainer is None:
        layout.taken.append(
            "no trainer log found: no phase timer, step counter or metric line in any file"
        )
