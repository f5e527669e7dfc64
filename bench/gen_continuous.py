"""Write the continuous finelog of `testkit.gen_continuous` for the parse benchmark.

    python bench/gen_continuous.py [--mb 200] [--seed 11] [--out bench/data/continuous_200mb.log]

The generator lives in `testkit/` (the tests use it too); its names are re-exported here so the
benchmark scripts keep importing `bench.gen_continuous`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]  # also run as a script

from testkit.gen_continuous import ENGINE_SHARE, generate_continuous  # noqa: E402

__all__ = ["ENGINE_SHARE", "generate_continuous", "main"]


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(__file__).parent / "data" / f"continuous_{int(args.mb)}mb.log"
    print(generate_continuous(out, args.mb, args.seed))


if __name__ == "__main__":
    main()
