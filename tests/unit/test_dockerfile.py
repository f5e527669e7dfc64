"""The Dockerfile's stages as written (no engine needed): a build stage compiles the parser's native
pass into a virtual environment, the runtime stage copies that environment and carries the probe
tools a worker runs, as an unprivileged user. tests/integration/test_image.py builds the image and
imports the extension where Docker is available."""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE_SOURCE = "worker/evidence/logs/_fastscan.c"
NATIVE_MODULE = "worker.evidence.logs._fastscan"
COMPILERS = ("gcc", "build-essential", "clang", "cc")


@dataclass
class Stage:
    """One `FROM` of a Dockerfile and its instructions (keyword, arguments), in order."""

    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def runs(self) -> str:
        return "\n".join(self.args("RUN"))

    def installs(self) -> set[str]:
        """The packages its `apt-get install` commands name."""
        found: set[str] = set()
        for run in self.args("RUN"):
            words = shlex.split(run)
            for at, word in enumerate(words[:-1]):
                if word == "apt-get" and "install" in words[at:]:
                    rest = words[words.index("install", at) + 1 :]
                    ends = [i for i, w in enumerate(rest) if w in {"&&", "||", ";", "|"}]
                    found |= {w for w in rest[: ends[0] if ends else None] if w[0] != "-"}
        return found


def _logical_lines(text: str) -> list[str]:
    """Instructions one per line: comments dropped, continuation lines joined."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        if raw.strip().startswith("#"):
            continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line:
            lines.append(line)
    return lines


def read_stages(text: str) -> list[Stage]:
    """The stages of a Dockerfile, `ARG` defaults before the first `FROM` substituted."""
    defaults: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines(text):
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "ARG" and not stages:
            name, _, value = args.partition("=")
            defaults[name.strip()] = value.strip()
        elif keyword == "FROM":
            words = re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m[1], m[0]), args).split()
            name = words[2] if len(words) > 2 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(base=words[0], name=name))
        elif stages:
            stages[-1].instructions.append((keyword, args.strip()))
    return stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return read_stages((ROOT / "Dockerfile").read_text())


def _venv(stage: Stage) -> str:
    """The directory the stage makes its virtual environment in."""
    found = re.search(r"python3? -m venv (\S+)", stage.runs())
    assert found, f"stage {stage.name} makes no virtual environment"
    return found[1]


def _build(stages: list[Stage]) -> Stage:
    """The stage the final one copies its virtual environment from."""
    final = stages[-1]
    names = [m[1] for c in final.args("COPY") if (m := re.match(r"--from=(\S+)", c))]
    assert names, "the final stage copies nothing from a build stage"
    (build,) = [stage for stage in stages[:-1] if stage.name == names[0]]
    return build


def _copied(stage: Stage) -> list[str]:
    """The sources of the stage's `COPY` instructions (not those from another stage)."""
    sources: list[str] = []
    for args in stage.args("COPY"):
        words = [w for w in args.split() if not w.startswith("--")]
        if not args.startswith("--from"):
            sources += words[:-1]
    return sources


def test_a_build_stage_compiles_the_native_pass(stages: list[Stage]) -> None:
    """The build stage installs a C compiler, copies setup.py and the C source, installs the
    package (setup.py builds the extension) and imports the extension, so a build that lost it
    fails instead of shipping the slower fallback."""
    build = _build(stages)
    assert build.installs() & set(COMPILERS), build.installs()
    copied = _copied(build)
    assert "setup.py" in copied
    assert any(NATIVE_SOURCE.startswith(source.rstrip("/") + "/") for source in copied), copied
    assert re.search(r"pip install [^\n]*\"\.(\[[\w,]+\])?\"", build.runs()), build.runs()
    assert f"import {NATIVE_MODULE}" in build.runs()


def test_the_runtime_stage_copies_the_venv_without_a_compiler(stages: list[Stage]) -> None:
    """The final stage takes the build stage's virtual environment (on its PATH) from the same
    base image, and has neither a compiler nor the source tree."""
    build, final = _build(stages), stages[-1]
    venv = _venv(build)
    assert any(c.split()[-1].rstrip("/") == venv for c in final.args("COPY")), final.args("COPY")
    assert any(f"PATH={venv}/bin:" in env for env in final.args("ENV")), final.args("ENV")
    assert final.base == build.base
    assert not final.installs() & set(COMPILERS), final.installs()
    assert not {"worker", "setup.py"} & set(_copied(final))


def test_the_image_carries_the_probe_tools(stages: list[Stage]) -> None:
    """py-spy and the iris CLI (the `iris` extra, marin-iris pinned, httpx below 1) are in the
    virtual environment; kubectl (Debian's kubernetes-client) and ps are in the runtime."""
    build, final = _build(stages), stages[-1]
    installed = build.runs()
    assert '".[iris]"' in installed
    assert re.search(r"\"py-spy[><=]", installed), installed
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(re.fullmatch(r"marin-iris==\S+", dep) for dep in extra["iris"]), extra["iris"]
    assert any(dep.startswith("httpx") and "<1" in dep for dep in extra["iris"]), extra["iris"]
    assert {"kubernetes-client", "procps"} <= final.installs(), final.installs()
    assert "bookworm" in final.base  # the Debian release whose kubernetes-client is installed


def test_the_image_runs_as_an_unprivileged_user(stages: list[Stage]) -> None:
    """The final stage ends as a named user with a non-zero uid, never root."""
    final = stages[-1]
    users = final.args("USER")
    assert users and users[-1] not in {"root", "0"}, users
    made = re.search(rf"useradd [^\n]*--uid (\d+)[^\n]* {re.escape(users[-1])}\b", final.runs())
    assert made and int(made[1]) != 0, final.runs()


def test_the_build_context_leaves_out_secrets_and_host_builds() -> None:
    """.dockerignore keeps the operator's .env and a native pass built on the host (for another
    Python or libc) out of the image's build context."""
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".env", "**/*.so", ".git", ".venv"} <= ignored


def test_the_reader_finds_a_single_stage_image_wanting() -> None:
    """The previous single-stage Dockerfile (no compiler, no setup.py) fails the build check."""
    old = read_stages(
        "FROM python:3.11-slim\nWORKDIR /app\nCOPY pyproject.toml README.md ./\n"
        "COPY worker worker\nRUN pip install . \\\n    && useradd --uid 10001 rlhealth\n"
        "USER rlhealth\n"
    )
    with pytest.raises(AssertionError):
        test_a_build_stage_compiles_the_native_pass(old)
