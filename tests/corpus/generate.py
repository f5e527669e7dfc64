"""Write the labelled corpus: `python -m tests.corpus.generate [OUT]` (default tests/corpus/cases).

Each case module lists its `CASES`; every case is built into `OUT/<name>/` with its `case.json`
(the folder is emptied first, so a removed case leaves nothing behind). The written folders are
committed: they are the labelled bundles `rl-health eval tests/corpus/cases` scores in
`make test`, and they stay what they are when the builders change.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from tests.corpus import (
    cases_attempts,
    cases_deaths,
    cases_engines,
    cases_healthy,
    cases_quality,
    cases_stalls,
)
from tests.corpus.kit import Labelled, write_case

__all__ = ["ALL", "main"]

ALL: tuple[Labelled, ...] = (
    *cases_stalls.CASES,
    *cases_engines.CASES,
    *cases_attempts.CASES,
    *cases_deaths.CASES,
    *cases_quality.CASES,
    *cases_healthy.CASES,
)
DEFAULT_OUT = Path(__file__).parent / "cases"


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else DEFAULT_OUT
    names = [case.name for case in ALL]
    duplicated = {n for n in names if names.count(n) > 1}
    if duplicated:
        print(f"duplicate case names: {sorted(duplicated)}", file=sys.stderr)
        return 2
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for case in ALL:
        write_case(case, out)
    print(f"{len(ALL)} cases written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
