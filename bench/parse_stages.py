"""CPU of each stage of a parse, summed over a whole log (the scan's stages, then the chunk parse).

    POLARS_MAX_THREADS=1 .venv/bin/python bench/parse_stages.py LOG [--no-drop]

One read at a time, in this thread, each stage timed with `time.process_time` (run it with one
polars thread, or polars' own threads are counted too): the native pass, the split of the rest
lines, the flags, the picked lines' text, their classification (and the merge with those the pass
read), the mirror records and pairs,
the head; then the whole `scan` again and the chunk parse. `--no-drop` hands every rest line to
polars (`native.DROP` off: the pass as before issue 12's fourth round).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

import polars as pl  # noqa: E402

from worker.evidence.logs import chunk as chunk_mod  # noqa: E402
from worker.evidence.logs import detect, native, records  # noqa: E402
from worker.evidence.logs import scan as scan_mod  # noqa: E402
from worker.evidence.logs.budget import MemoryBudget  # noqa: E402
from worker.evidence.logs.lines import (  # noqa: E402
    LINE_MAX_BYTES,
    Read,
    bound_lines,
    iter_reads,
    split_read,
)
from worker.evidence.logs.state import ParserState  # noqa: E402

SPENT: defaultdict[str, float] = defaultdict(float)
COUNTS = {"lines": 0, "rest": 0, "picked": 0, "read natively": 0}


def timed(name: str, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    start = time.process_time()
    result = work(*args, **kwargs)
    SPENT[name] += time.process_time() - start
    return result


def _rest_lines(nat: native.Native) -> pl.Series:
    return bound_lines(split_read(nat.rest, len(nat.rest)))[0]


def _evidence(picked: pl.DataFrame) -> pl.DataFrame:
    return detect._classify(detect._strip_prefixes(picked.lazy())).collect()


def _merged(ev: pl.DataFrame, nat: native.Native) -> pl.DataFrame:
    """`ev` with the lines the pass read (as `evidence_lines` merges them)."""
    if not len(nat.picked):
        return ev
    return ev.merge_sorted(detect._native_rows(nat.picked), key="idx")


def _stages(read: Read) -> None:
    """The scan's stages of `read`, one by one."""
    nat = timed("C pass", native.native_scan, read.data, read.end, scan_mod.KEEP)
    if nat is None:
        raise SystemExit("the native pass is not built")
    lines = timed("split of the rest", _rest_lines, nat)
    flags = timed("flags", detect._flags, lines, nat.where)
    idx = timed("picked", detect._picked, flags, nat.n_lines)
    if len(nat.picked):  # the lines the pass read are not taken again (`evidence_lines`)
        idx = idx.filter(~idx.is_in(nat.picked.get_column("idx").implode()))
    raw = timed("raw", detect._raw, lines, nat, idx)
    picked = pl.DataFrame({"idx": idx, "raw": raw}).with_columns(
        tb=pl.col("idx").is_in(flags.tb.implode()),
        window_only=~pl.col("idx").is_in(flags.interest.implode()),
    )
    ev = timed("classify", _evidence, picked)
    ev = timed("merge", _merged, ev, nat)
    mirrors = timed("mirrors", records.mirror_records, ev)
    timed("pairs", records.mirror_pairs, mirrors)
    timed("head", scan_mod._head_native, lines, nat)
    COUNTS["lines"] += nat.n_lines
    COUNTS["rest"] += len(lines)
    COUNTS["picked"] += len(idx)
    COUNTS["read natively"] += nat.picked.height


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--no-drop", action="store_true")
    args = parser.parse_args()
    native.DROP = not args.no_drop  # type: ignore[misc]
    budget = MemoryBudget.for_logs(args.log.stat().st_size)
    state, carry = ParserState.initial(None), None
    with args.log.open("rb") as handle:
        for read in iter_reads(handle, budget.chunk_bytes, LINE_MAX_BYTES):
            _stages(read)
            done = timed("scan total (again)", scan_mod.scan, read)
            whole = carry.then(done) if carry is not None else done
            _, carry = timed(
                "parse_chunk", chunk_mod.parse_chunk, whole, state, args.log.name, final=read.final
            )
            if read.final:
                break
    for name, spent in SPENT.items():
        print(f"{name:20s} {spent:.3f} s")
    print(", ".join(f"{k} {v:,}" for k, v in COUNTS.items()))


if __name__ == "__main__":
    main()
