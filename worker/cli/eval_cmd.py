"""`rl-health eval DIR`: score the verdict rules on a folder of labelled bundles.

Every folder under DIR that holds a `case.json` is a case (DIR itself may be one). Each case is
diagnosed in this process exactly as `rl-health diagnose JOB_DIR --probes P --now T [--mode M]`
would, and compared with its label (`worker/evaluation.py`). A case that cannot be run (a
malformed `case.json`, a path that leaves the case folder, a diagnosis that raised) is a miss
with its reason; the others still run. Exit 0 when every case matched, 1 on any miss, 2 for an
unusable DIR.
"""

from __future__ import annotations

import json
import time
from fnmatch import fnmatch
from pathlib import Path

import click

from shared.redact import clean
from shared.settings import Thresholds
from worker.cli.options import UnusableError, load_campaign_thresholds
from worker.evaluation import (
    CaseError,
    CaseOutcome,
    Expected,
    Score,
    load_case,
    render_score,
    score,
)

__all__ = ["eval_command"]


def _case_folders(root: Path) -> list[Path]:
    if (root / "case.json").is_file():
        return [root]
    return sorted(path.parent for path in root.rglob("case.json") if path.is_file())


def _name(folder: Path, root: Path) -> str:
    return folder.relative_to(root).as_posix() if folder != root else folder.name


def _first_sentence(text: str, limit: int = 160) -> str:
    head = text.split(". ", 1)[0]
    return head if len(head) <= limit else head[: limit - 1] + "…"


def _label(folder: Path) -> Expected | None:
    """The label of a case whose other fields are unusable, when it can still be read."""
    try:
        raw = json.loads((folder / "case.json").read_text(encoding="utf-8"))
        return Expected.model_validate(raw["expected"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _run(folder: Path, name: str, thresholds: Thresholds | None) -> CaseOutcome:
    from worker.diagnosis import collect_evidence, judge

    try:
        case, job_dir, probes = load_case(folder)
    except CaseError as exc:
        return CaseOutcome(name, _label(folder), None, {}, broken=clean(str(exc)))
    try:
        evidence = collect_evidence(
            job_dir, now=case.now, mode=case.mode, probes_dir=probes, thresholds=thresholds
        )
        report = judge(evidence)
    except Exception as exc:  # a crash on one case is that case's miss, never the run's end
        why = f"the diagnosis raised {exc.__class__.__name__}: {clean(str(exc))[:200]}"
        return CaseOutcome(name, case.expected, None, {}, why=case.why, broken=why)
    gates = {gate: result.status for gate, result in report.gates.items()}
    return CaseOutcome(
        name,
        case.expected,
        report.verdict,
        gates,
        why=case.why,
        reasoning=_first_sentence(report.reasoning),
        summaries={gate: _first_sentence(r.summary, 200) for gate, r in report.gates.items()},
    )


def _json(result: Score) -> str:
    return json.dumps(
        {
            "cases": len(result.outcomes),
            "misses": [o.miss_line() for o in result.misses],
            "false_kill": result.false_kill,
            "false_no_kill": result.false_no_kill,
            "kill_precision": result.kill_precision,
            "kill_recall": result.kill_recall,
            "outcomes": [
                {
                    "case": o.name,
                    "expected": o.expected.verdict if o.expected else None,
                    "got": o.verdict,
                    "hit": o.hit,
                    "gate_misses": list(o.gate_misses),
                    "unusable": o.broken or None,
                }
                for o in result.outcomes
            ],
        },
        indent=2,
    )


@click.command("eval")
@click.argument(
    "directory", type=click.Path(path_type=Path, exists=True, file_okay=False), metavar="DIR"
)
@click.option("--only", "patterns", multiple=True, help="Run only cases whose name matches (glob).")
@click.option(
    "--campaign",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="A campaign file (JSON or TOML) overriding thresholds for every case.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON document.")
@click.option("--quiet", "-q", is_flag=True, help="Print only the figures and the misses.")
def eval_command(
    directory: Path, patterns: tuple[str, ...], campaign: Path | None, as_json: bool, quiet: bool
) -> None:
    """Score the verdict rules on DIR, a folder of labelled bundles (one case.json per case).

    case.json: {"job_dir", "now", optional "probes", "mode", "why", "expected": {"verdict",
    optional "gates": {gate: status}}}, paths relative to the case folder. Prints a confusion
    matrix, KILL precision and recall, false KILLs and false NO-KILLs, and one line per miss;
    exit 1 on any miss.
    """
    folders = _case_folders(directory)
    names = [(folder, _name(folder, directory)) for folder in folders]
    names = [(f, n) for f, n in names if not patterns or any(fnmatch(n, p) for p in patterns)]
    if not names:
        raise UnusableError(f"no case.json under {directory}")
    thresholds = load_campaign_thresholds(campaign) if campaign else None
    outcomes = []
    started = time.monotonic()
    for folder, name in names:
        outcome = _run(folder, name, thresholds)
        outcomes.append(outcome)
        if not quiet and not as_json:
            mark = "ok  " if outcome.hit else "MISS"
            got = outcome.verdict.value if outcome.verdict else "unusable"
            want = outcome.expected.verdict.value if outcome.expected else "?"
            click.echo(f"{mark} {name:<44} {got:<8} (expected {want})")
    result = score(outcomes)
    if as_json:
        click.echo(_json(result))
    else:
        click.echo(render_score(result))
        click.echo(f"{len(outcomes)} case(s) in {time.monotonic() - started:.1f} s")
    raise SystemExit(1 if result.misses else 0)
