"""Score the verdict rules on labelled bundles: the pure part of `rl-health eval`.

A labelled case is a folder holding `case.json`:

    {"job_dir": "job", "now": "2026-07-30T19:17:00Z", "probes": "probes", "mode": "standard",
     "why": "every rank parked in one all_reduce beside Ray's helpers",
     "expected": {"verdict": "KILL", "gates": {"liveness": "FAIL"}}}

Paths are relative to the case folder and may not leave it. `Case` validates the file (unknown
keys are refused, so a typo is not a silently ignored expectation); `CaseOutcome` is what the
diagnosis gave; `score` joins outcomes into the figures an operator asks for: a confusion matrix,
KILL precision and recall, false KILLs (a kill order the label did not want) and false NO-KILLs
(a healthy answer where the label wanted a kill or an error), and one line per miss.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shared.models import GateName, GateStatus, Mode, UtcDatetime, Verdict

__all__ = [
    "Case",
    "CaseError",
    "CaseOutcome",
    "Expected",
    "Score",
    "load_case",
    "render_score",
    "score",
]

VERDICTS: tuple[Verdict, ...] = (Verdict.KILL, Verdict.NO_KILL, Verdict.ERROR)


class CaseError(ValueError):
    """A case folder whose `case.json` cannot be used, with the reason."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Expected(_Frozen):
    """The label: the verdict the procedure says, optionally the status of some gates."""

    verdict: Verdict
    gates: dict[GateName, GateStatus] = Field(default_factory=dict)


class Case(_Frozen):
    """One labelled bundle, as written in `case.json` (paths relative to the case folder)."""

    job_dir: str
    now: UtcDatetime
    probes: str | None = None
    mode: Mode | None = None
    why: str = ""
    expected: Expected

    @field_validator("mode")
    @classmethod
    def _declared(cls, mode: Mode | None) -> Mode | None:
        if mode is Mode.UNDECLARED:
            raise ValueError("mode is agentic or standard; leave it out for an undeclared mode")
        return mode


def _inside(folder: Path, relative: str, key: str) -> Path:
    path = (folder / relative).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise CaseError(f"{key} {relative!r} leaves the case folder")
    if not path.is_dir():
        raise CaseError(f"{key} {relative!r} is not a directory in the case folder")
    return path


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'case.json'}: {e['msg']}" for e in exc.errors()
    )


def load_case(folder: Path) -> tuple[Case, Path, Path | None]:
    """The case of `folder`, its job directory and its probe directory (CaseError when unusable)."""
    try:
        text = (folder / "case.json").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CaseError(f"case.json cannot be read: {exc.__class__.__name__}") from exc
    try:
        case = Case.model_validate_json(text)
    except ValidationError as exc:
        raise CaseError(_problems(exc)) from exc
    job = _inside(folder, case.job_dir, "job_dir")
    probes = _inside(folder, case.probes, "probes") if case.probes is not None else None
    return case, job, probes


@dataclass(frozen=True)
class CaseOutcome:
    """What the diagnosis of one case gave (`verdict` None: the case could not be run)."""

    name: str
    expected: Expected | None  # None: case.json could not be read
    verdict: Verdict | None
    gates: dict[GateName, GateStatus]
    why: str = ""
    reasoning: str = ""
    broken: str = ""  # why the case could not be run
    summaries: dict[GateName, str] = field(default_factory=dict)  # each gate's one-line summary

    @property
    def gate_misses(self) -> tuple[str, ...]:
        if self.expected is None:
            return ()
        return tuple(
            f"{name.value} {self.gates.get(name, 'missing')} (expected {status.value})"
            + (f": {self.summaries[name]}" if name in self.summaries else "")
            for name, status in self.expected.gates.items()
            if self.gates.get(name) is not status
        )

    @property
    def hit(self) -> bool:
        return (
            self.expected is not None
            and self.verdict is self.expected.verdict
            and not self.gate_misses
        )

    def miss_line(self, width: int = 400) -> str:
        """One line saying what was expected, what came, and why the case exists."""
        if self.broken or self.expected is None:
            return f"MISS {self.name}: case unusable: {self.broken}"
        got = self.verdict.value if self.verdict else "nothing"
        parts = [f"expected {self.expected.verdict.value}, got {got}"]
        parts += [f"gate {m}" for m in self.gate_misses]
        if self.reasoning and not self.gate_misses:
            parts.append(f"report: {self.reasoning}")
        if self.why:
            parts.append(f"case: {self.why}")
        line = f"MISS {self.name}: " + "; ".join(parts)
        return line if len(line) <= width else line[: width - 1] + "…"


@dataclass(frozen=True)
class Score:
    """The figures of one evaluation run."""

    outcomes: tuple[CaseOutcome, ...]
    matrix: dict[tuple[Verdict, Verdict | None], int]

    @property
    def misses(self) -> tuple[CaseOutcome, ...]:
        return tuple(o for o in self.outcomes if not o.hit)

    def count(self, expected: Verdict | None = None, got: Verdict | None = None) -> int:
        return sum(
            n
            for (want, have), n in self.matrix.items()
            if (expected is None or want is expected) and (got is None or have is got)
        )

    def count_cell(self, expected: Verdict, got: Verdict | None) -> int:
        """One cell of the matrix; `got` None counts the cases that could not be run."""
        return self.matrix.get((expected, got), 0)

    @property
    def false_kill(self) -> int:
        return self.count(got=Verdict.KILL) - self.count(Verdict.KILL, Verdict.KILL)

    @property
    def false_no_kill(self) -> int:
        return self.count(got=Verdict.NO_KILL) - self.count(Verdict.NO_KILL, Verdict.NO_KILL)

    @property
    def kill_precision(self) -> float | None:
        called = self.count(got=Verdict.KILL)
        return self.count(Verdict.KILL, Verdict.KILL) / called if called else None

    @property
    def kill_recall(self) -> float | None:
        wanted = self.count(expected=Verdict.KILL)
        return self.count(Verdict.KILL, Verdict.KILL) / wanted if wanted else None


def score(outcomes: Sequence[CaseOutcome]) -> Score:
    """Join the outcomes of every case into the evaluation's figures."""
    matrix = Counter((o.expected.verdict, o.verdict) for o in outcomes if o.expected is not None)
    return Score(tuple(outcomes), dict(matrix))


def _ratio(value: float | None, numerator: int, denominator: int) -> str:
    if value is None:
        return "n/a (0/0)"
    return f"{100 * value:.1f}% ({numerator}/{denominator})"


def _matrix_lines(result: Score) -> list[str]:
    columns: list[Verdict | None] = [*VERDICTS, None]
    header = "".join(f"{v.value if v else 'unusable':>10}" for v in columns)
    lines = ["confusion (rows: expected, columns: got)", f"  {'':<9}{header}"]
    for want in VERDICTS:
        cells = "".join(f"{result.count_cell(want, have):>10}" for have in columns)
        lines.append(f"  {want.value:<9}{cells}")
    return lines


def render_score(result: Score) -> str:
    """The text an operator reads: the matrix, the figures, then one line per miss."""
    kills = result.count(Verdict.KILL, Verdict.KILL)
    gate_misses = sum(1 for o in result.outcomes if o.verdict is not None and o.gate_misses)
    broken = sum(1 for o in result.outcomes if o.broken)
    hits = len(result.outcomes) - len(result.misses)
    lines = [
        *_matrix_lines(result),
        f"KILL precision {_ratio(result.kill_precision, kills, result.count(got=Verdict.KILL))}, "
        f"recall {_ratio(result.kill_recall, kills, result.count(expected=Verdict.KILL))}",
        f"false KILL {result.false_kill}, false NO-KILL {result.false_no_kill}, "
        f"gate mismatches {gate_misses}, unusable cases {broken}",
        f"score {hits}/{len(result.outcomes)} "
        f"({100 * hits / len(result.outcomes) if result.outcomes else 0:.1f}%)",
    ]
    lines += [o.miss_line() for o in result.misses]
    return "\n".join(lines)
