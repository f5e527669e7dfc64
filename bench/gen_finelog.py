"""Write the realistic merged finelog of `testkit.gen_finelog` for the benchmark.

    python bench/gen_finelog.py [--mb 200] [--seed 7] [--out bench/data/finelog_200mb.log]

The generator lives in `testkit/` (the tests use it too); its names are re-exported here so the
benchmark scripts keep importing `bench.gen_finelog`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]  # also run as a script

from testkit.gen_finelog import KEYS, PHASES, RAY, TASK, _mirror, _Writer, generate  # noqa: E402

__all__ = ["KEYS", "PHASES", "RAY", "TASK", "_Writer", "_mirror", "generate", "main"]


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(__file__).parent / "data" / f"finelog_{int(args.mb)}mb.log"
    print(generate(out, args.mb, args.seed))


if __name__ == "__main__":
    main()
