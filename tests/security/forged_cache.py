"""Forged log-cache entries, as another user of the machine would write them (issue 28).

The log cache trusts an entry on its own hashes (each file's SHA-256 in its `meta.json`): anyone
who can write the directory can write an entry whose hashes match. `forge` takes entries an honest
parse made and sets every metric value to `FORGED`, recomputing the hashes, so every check of the
cache still passes; a read that takes them reports `FORGED` where the log says otherwise.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Final

import polars as pl

__all__ = ["FORGED", "forge", "forged_in"]

FORGED: Final = 12345.0


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def forge(cache_dir: Path) -> int:
    """Every metric table part (a float `value` column) of every entry under `cache_dir` set to
    `FORGED`, its hash in `meta.json` recomputed; how many parts were forged."""
    forged = 0
    for meta_path in cache_dir.rglob("meta.json"):
        meta = json.loads(meta_path.read_text())
        for name in meta["files"]:
            path = meta_path.parent / name
            if path.suffix != ".parquet":
                continue
            frame = pl.read_parquet(path)
            if frame.schema.get("value") != pl.Float64 or frame.is_empty():
                continue
            frame.with_columns(value=pl.lit(FORGED)).write_parquet(path)
            meta["files"][name] = _sha256(path)
            forged += 1
        meta_path.write_text(json.dumps(meta))
    assert forged, "no metric part to forge: the attack would prove nothing"
    return forged


def forged_in(metrics: pl.DataFrame) -> bool:
    """Whether a forged value reached the metrics."""
    return bool((metrics.get_column("value") == FORGED).any())
