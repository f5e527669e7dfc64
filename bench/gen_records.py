"""Write the record-dense or the noisy benchmark log of `testkit.gen_records`.

    python bench/gen_records.py dense|noisy [--mb 200] [--seed 13] [--out PATH]

The generator lives in `testkit/` (the tests use it too); its names are re-exported here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]  # also run as a script

from testkit.gen_records import DENSE, NOISY, generate_dense, generate_noisy  # noqa: E402

__all__ = ["DENSE", "NOISY", "generate_dense", "generate_noisy", "main"]


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser()
    parser.add_argument("shape", choices=("dense", "noisy"))
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(__file__).parent / "data" / f"{args.shape}_{args.mb:g}mb.log"
    make = generate_dense if args.shape == "dense" else generate_noisy
    print(make(out, args.mb) if args.seed is None else make(out, args.mb, args.seed))


if __name__ == "__main__":
    main()
