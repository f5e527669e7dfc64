"""Metric records: WANDB_MIRROR JSON, console dicts (one line or pprint-ed), policy dicts, rewards.
Pairs are pulled out with `str.extract_all` and exploded, never parsed per line."""

from __future__ import annotations

from typing import Final

import polars as pl

from worker.evidence import schema
from worker.evidence.logs.rules import WINDOW_LINES

__all__ = [
    "block_steps",
    "dict_blocks",
    "dict_metrics",
    "mirror_metrics",
    "mirror_pairs",
    "mirror_records",
    "open_blocks",
    "reward_metrics",
]

_MIRROR: Final = r"WANDB_MIRROR kind=\w+ step=-?\d+ metrics=\{.*\}\s*$"
# The leftmost header of a line matching _MIRROR is where its match starts (`.*` spans the rest), so
# the fields come from a short match and the JSON is what follows it: no capture over the JSON.
_MIRROR_HEAD: Final = r"WANDB_MIRROR kind=(\w+) step=(-?\d+) metrics=\{"
_BEFORE_JSON: Final = r"^.*?WANDB_MIRROR kind=\w+ step=-?\d+ metrics=\{"
_JSON_PAIR: Final = r'"(?:[^"\\]|\\.)*"\s*:\s*(?:"(?:[^"\\]|\\.)*"|[^,}\s]+)'
_JSON_KEY: Final = r'^"((?:[^"\\]|\\.)*)"'
_PY_PAIR: Final = r"'(?:[^'\\]|\\.)*'\s*:\s*(?:'(?:[^'\\]|\\.)*'|[^,}]+)"
_PY_KEY: Final = r"^'((?:[^'\\]|\\.)*)'"
_REWARD_PAIR: Final = r"(?:reward/[^\s:,]+|avg_final_rewards|avg_response_length): [^\s,]+"
_GLOBAL_STEP: Final = r"'trainer/global_step':\s*'?(-?\d+)"
_METRIC_HINT: Final = ("'trainer/", "'reward/", "'policy", "'timing/", "'final_loss'")
_KEEP: Final = ("step", "key", "value", "line", "ts", "attempt")
PAIR_BATCH_BYTES: Final = 4 * 2**20
_NO_ROWS: Final = pl.DataFrame(schema={k: {**schema.METRICS, "ts": schema.TS}[k] for k in _KEEP})
# What a bare JSON value (a number, NaN, Infinity, true, null) never holds.
_NOT_BARE: Final = (" ", "\t", ",", "{", "}", "[", "]", "(", ")", '"', "'")


def _values(token: pl.Expr) -> pl.Expr:
    """A value token as a float: quotes and wrappers like `np.float64(...)` removed."""
    bare = token.str.strip_chars().str.strip_chars("'\"")
    unwrapped = bare.str.replace(r"^[A-Za-z_][\w.]*\((.*)\)$", "$1")
    return unwrapped.str.strip_chars("'\" ").cast(pl.Float64, strict=False)


def _explode_pairs(frame: pl.DataFrame, text: str, pair: str, key: str) -> pl.DataFrame:
    """One row per `key: value` pair of column `text` with a numeric value (without `text`:
    exploding it too would repeat a whole record's text on each of its pairs)."""
    found = frame.with_columns(_pair=pl.col(text).str.extract_all(pair)).drop(text)
    pairs = found.explode("_pair")
    pairs = pairs.filter(pl.col("_pair").is_not_null())
    token = pl.col("_pair").str.replace(r"^" + key.removeprefix("^") + r"\s*:\s*", "")
    pairs = pairs.with_columns(key=pl.col("_pair").str.extract(key, 1), value=_values(token))
    return pairs.filter(pl.col("value").is_not_null() & pl.col("key").is_not_null())


def mirror_records(ev: pl.DataFrame) -> pl.DataFrame:
    """Every WANDB_MIRROR line: `idx`, `text`, `mkind`, `mstep`, `json` and `ok` (false:
    malformed)."""
    rows = ev.select("idx", "kind", "text", "msg").filter(pl.col("kind") == "mirror")
    msg = pl.col("msg")
    whole = msg.str.contains(_MIRROR)
    head = msg.str.extract_groups(_MIRROR_HEAD).struct
    json = msg.str.replace(_BEFORE_JSON, "{").str.strip_chars_end()
    rows = rows.with_columns(
        mkind=pl.when(whole).then(head.field("1")),
        mstep=pl.when(whole).then(head.field("2").cast(pl.Int64, strict=False)),
        json=pl.when(whole).then(json),
    )
    ok = pl.col("json").is_not_null() & pl.col("mstep").is_not_null()
    return rows.select("idx", "text", "mkind", "mstep", "json", ok=ok)


def _batches(frame: pl.DataFrame, column: str, max_bytes: int) -> list[pl.DataFrame]:
    """`frame` in consecutive slices whose `column` holds at most about `max_bytes` (a row
    longer than that is a slice by itself)."""
    ends = frame.get_column(column).str.len_bytes().cast(pl.Int64).cum_sum()
    if frame.is_empty() or int(ends[-1]) <= max_bytes:
        return [frame]
    parts, start = [], 0
    while start < frame.height:
        before = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(ends.search_sorted(before + max_bytes, side="right")))
        parts.append(frame.slice(start, stop - start))
        start = stop
    return parts


def _plain_pairs(part: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The pairs of the records of `part` written as `json.dumps` writes them, split at `, ` and
    `: ` (exactly the pairs `_JSON_PAIR` finds, at a third of its cost); and the other records,
    left whole to the pattern."""
    body = pl.col("json").str.strip_prefix("{").str.strip_suffix("}")
    pieces = part.select("idx", _p=body.str.split(", ")).explode("_p")
    kv = pl.col("_p").str.split_exact(": ", 1).struct
    pieces = pieces.with_columns(_k=kv.field("field_0"), _v=kv.field("field_1"))
    plain = (
        (pl.col("_p").str.count_matches('"', literal=True) == 2)
        & pl.col("_k").str.starts_with('"')
        & pl.col("_k").str.ends_with('"')
        & (pl.col("_k").str.len_bytes() >= 2)
        & ~pl.col("_v").str.contains_any(list(_NOT_BARE))
    ).fill_null(False)
    odd = pieces.filter(~plain).get_column("idx").unique().implode()
    found = pieces.filter(~pl.col("idx").is_in(odd)).select(
        "idx",
        key=pl.col("_k").str.strip_prefix('"').str.strip_suffix('"'),
        value=pl.col("_v").cast(pl.Float64, strict=False),
    )
    return found.filter(pl.col("value").is_not_null()), part.filter(pl.col("idx").is_in(odd))


def _record_pairs(part: pl.DataFrame) -> pl.DataFrame:
    plain, other = _plain_pairs(part)
    if other.is_empty():
        return plain
    rest = _explode_pairs(other, "json", _JSON_PAIR, _JSON_KEY).select("idx", "key", "value")
    return pl.concat([plain, rest]).sort("idx", maintain_order=True)


def mirror_pairs(records: pl.DataFrame) -> pl.DataFrame:
    """`idx`, `key` and `value` of each numeric pair of the well-formed train records, exploded
    PAIR_BATCH_BYTES of JSON at a time (a read of records would otherwise hold every pair's text
    at once)."""
    train = records.filter(pl.col("ok") & (pl.col("mkind") == "train")).select("idx", "json")
    parts = [_record_pairs(part) for part in _batches(train, "json", PAIR_BATCH_BYTES)]
    return parts[0] if len(parts) == 1 else pl.concat(parts)


def mirror_metrics(records: pl.DataFrame, pairs: pl.DataFrame) -> pl.DataFrame:
    """METRICS rows (before stitching) of `pairs` (`mirror_pairs`) of the `records` given, which
    carry the provenance of their line."""
    context = records.select("idx", "line", "ts", "attempt", step="mstep")
    rows = pairs.join(context, on="idx", how="inner", maintain_order="left")
    return rows.select(*_KEEP).with_columns(origin=pl.lit("mirror"))


def dict_blocks(ev: pl.DataFrame) -> pl.DataFrame:
    """Dicts printed on one line or over several lines of one actor, joined: idx (of the first
    line), actor, text, closed, last_idx, hint (has metric-like keys)."""
    rows = ev.filter(pl.col("kind").is_in(["dict_start", "dict_cont"]))
    if rows.is_empty():
        return pl.DataFrame(
            schema={
                "idx": pl.UInt32,
                "actor": pl.String,
                "text": pl.String,
                "closed": pl.Boolean,
                "last_idx": pl.UInt32,
                "hint": pl.Boolean,
            }
        )
    body = pl.when(pl.col("kind") == "dict_start").then(pl.col("msg")).otherwise(pl.col("text"))
    rows = rows.with_columns(body=body.str.strip_chars_end())
    close = pl.col("body").str.ends_with("}")
    start = pl.col("kind") == "dict_start"
    prev_closed = close.shift(1).over("actor").fill_null(True)
    new_seg = start | prev_closed
    seg = pl.when(new_seg).then(pl.col("idx")).forward_fill().over("actor")
    rows = rows.with_columns(seg=seg).filter(pl.col("idx") - pl.col("seg") <= WINDOW_LINES)
    blocks = rows.group_by("actor", "seg", maintain_order=True).agg(
        first_start=start.first(),
        closed=close.last(),
        last_idx=pl.col("idx").last(),
        text=pl.col("body").str.join(" "),
    )
    blocks = blocks.filter(pl.col("first_start")).rename({"seg": "idx"})
    hint = pl.col("text").str.contains_any(list(_METRIC_HINT))
    return blocks.select("idx", "actor", "text", "closed", "last_idx", hint=hint)


def open_blocks(blocks: pl.DataFrame, n_lines: int) -> pl.Series:
    """First-line indices of dicts still open at the end of a chunk of `n_lines` lines."""
    still = ~pl.col("closed") & (pl.col("idx") >= n_lines - 1 - WINDOW_LINES)
    return blocks.filter(still).get_column("idx")


def dict_metrics(blocks: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """METRICS rows of console dicts (`trainer/global_step`) and of unprefixed policy dicts."""
    if blocks.is_empty():
        return _NO_ROWS.with_columns(origin=pl.lit("console")), _NO_ROWS.with_columns(
            origin=pl.lit("policy_dict")
        )
    closed = blocks.filter(pl.col("closed"))
    console = closed.filter(pl.col("gstep").is_not_null())
    console_pairs = _explode_pairs(console, "text", _PY_PAIR, _PY_KEY)
    console_rows = console_pairs.with_columns(step=pl.col("gstep")).select(*_KEEP)
    policy = closed.filter(pl.col("gstep").is_null() & pl.col("is_policy"))
    policy_pairs = _explode_pairs(policy, "text", _PY_PAIR, _PY_KEY)
    policy_rows = policy_pairs.with_columns(
        step=pl.col("step_ctx"), key=pl.lit("policy/") + pl.col("key")
    ).select(*_KEEP)
    return (
        console_rows.with_columns(origin=pl.lit("console")),
        policy_rows.with_columns(origin=pl.lit("policy_dict")),
    )


def reward_metrics(ev: pl.DataFrame) -> pl.DataFrame:
    """METRICS rows of `reward/...: X` and `avg_final_rewards: X` lines (step from context)."""
    rows = ev.select("kind", "msg", "line", "ts", "attempt", "step_ctx")
    rows = rows.filter(pl.col("kind") == "reward")
    pairs = rows.with_columns(_pair=pl.col("msg").str.extract_all(_REWARD_PAIR)).explode("_pair")
    pairs = pairs.filter(pl.col("_pair").is_not_null())
    parts = pl.col("_pair").str.split_exact(": ", 1).struct
    name = parts.field("field_0")
    key = pl.when(name.str.starts_with("reward/")).then(name).otherwise(pl.lit("loss/") + name)
    pairs = pairs.with_columns(key=key, value=_values(parts.field("field_1")))
    pairs = pairs.filter(pl.col("value").is_not_null()).with_columns(step=pl.col("step_ctx"))
    return pairs.select(*_KEEP).with_columns(origin=pl.lit("reward_line"))


def block_steps(blocks: pl.DataFrame) -> pl.DataFrame:
    """Add `gstep` (the console dict's global step) and `is_policy` to `blocks`."""
    text = pl.col("text")
    return blocks.with_columns(
        gstep=pl.when(pl.col("closed"))
        .then(text.str.extract(_GLOBAL_STEP, 1).cast(pl.Int64, strict=False))
        .otherwise(None),
        is_policy=text.str.contains("'policy_loss'", literal=True)
        | text.str.contains("'final_loss'", literal=True),
    )
