"""One chunk of scanned lines in, table rows out, the parser state advanced; a chunk is cut before
the first dict or traceback still open near its end (docs/parsing.md)."""

from __future__ import annotations

from typing import Final

import polars as pl

from worker.evidence import schema
from worker.evidence.logs import context, detect, engines, errors, records, replays, timers
from worker.evidence.logs.rules import HEAD_LINES, HEAD_SCAN_LINES
from worker.evidence.logs.scan import Scan
from worker.evidence.logs.state import MAX_EXAMPLES, ParserState

__all__ = ["SCHEMAS", "TABLES", "parse_chunk"]

TABLES: Final = ("metrics", "timers", "engines", "progress", "batches", "errors", "resumes")
PROGRESS_TABLES: Final = ("metrics", "timers", "progress", "batches", "resumes")  # no replays
SCHEMAS: Final[dict[str, dict[str, pl.DataType]]] = {
    "metrics": schema.METRICS,
    "timers": schema.TIMERS,
    "engines": schema.ENGINES,
    "progress": schema.PROGRESS,
    "batches": schema.BATCHES,
    "errors": errors.RAW_ERRORS,  # given their meaning once per file (failures.rows.annotate)
    "resumes": schema.RESUMES,
}
_EXAMPLE_CHARS: Final = 200


def conform(frame: pl.DataFrame, table: str, source: str | None = None) -> pl.DataFrame:
    """`frame` with exactly the columns and types of `table`'s schema."""
    if "ts" in frame.columns:
        frame = frame.rename({"ts": "timestamp"})
    if source is not None:
        frame = frame.with_columns(source=pl.lit(source))
    wanted = SCHEMAS[table]
    return frame.select(pl.col(name).cast(dtype) for name, dtype in wanted.items())


def _note_head(chunk: Scan, state: ParserState) -> None:
    """The first non-empty lines among the file's first HEAD_SCAN_LINES lines, each seen once."""
    if len(state.head) < HEAD_LINES and state.head_seen < HEAD_SCAN_LINES:
        seen = pl.col("idx").cast(pl.Int64) + state.line
        fresh = chunk.head.filter((seen >= state.head_seen) & (seen < HEAD_SCAN_LINES))
        room = HEAD_LINES - len(state.head)
        kept = fresh.head(room)
        state.head.extend(kept.get_column("text").to_list())
        numbers = kept.get_column("idx").cast(pl.Int64) + (state.line + 1)
        state.head_lines.extend(numbers.to_list())
    state.head_seen = max(state.head_seen, state.line + chunk.lines)


def _note_first_content(chunk: Scan, state: ParserState) -> None:
    if state.first_content is None and chunk.first_content is not None:
        state.first_content = state.line + chunk.first_content + 1


def _note_cuts(chunk: Scan, cut: int, state: ParserState, source: str) -> None:
    """Count the committed lines that were cut to LINE_MAX_BYTES; quote the first few."""
    cuts = [c for c in chunk.cuts if c.idx < cut]
    state.cut_lines += len(cuts)
    room = max(MAX_EXAMPLES - len(state.cut_examples), 0)
    state.cut_examples.extend(
        f"{source}:{state.line + c.idx + 1}: {c.length:,} bytes" for c in cuts[:room]
    )


def _cut(ev: pl.DataFrame, blocks: pl.DataFrame, n_lines: int) -> int:
    starts = pl.concat([records.open_blocks(blocks, n_lines), errors.open_tracebacks(ev, n_lines)])
    return int(starts.min()) if len(starts) else n_lines  # type: ignore[arg-type]


def _set_steps(
    ev: pl.DataFrame, mirrors: pl.DataFrame, blocks: pl.DataFrame, progress: pl.DataFrame
) -> pl.DataFrame:
    train = mirrors.filter(pl.col("ok") & (pl.col("mkind") == "train"))
    parts = [
        train.select("idx", set_step="mstep"),
        blocks.filter(pl.col("gstep").is_not_null()).select("idx", set_step="gstep"),
        timers.progress_steps(progress),
        timers.resume_steps(ev),
    ]
    steps = pl.concat([p.cast({"idx": pl.UInt32, "set_step": pl.Int64}) for p in parts])
    steps = steps.unique("idx", keep="last")
    return ev.join(steps, on="idx", how="left", maintain_order="left")


def _malformed(
    mirrors: pl.DataFrame, blocks: pl.DataFrame, state: ParserState, source: str
) -> None:
    bad_mirrors = mirrors.filter(~pl.col("ok")).select("line", "text")
    bad_blocks = blocks.filter(~pl.col("closed") & pl.col("hint")).select("line", "text")
    bad = pl.concat([bad_mirrors, bad_blocks]).sort("line")
    if bad.is_empty():
        return
    state.malformed += bad.height
    room = max(MAX_EXAMPLES - len(state.malformed_examples), 0)
    state.malformed_examples.extend(
        f"{source}:{line}: {text[:_EXAMPLE_CHARS]}" for line, text in bad.head(room).iter_rows()
    )


def _with_context(ev: pl.DataFrame, state: ParserState) -> pl.DataFrame:
    return context.add_step_context(context.add_attempts(ev, state), state)


def _block_context(blocks: pl.DataFrame, ev: pl.DataFrame) -> pl.DataFrame:
    cols = ev.select("idx", "line", "ts", "attempt", "step_ctx")
    return blocks.join(cols, on="idx", how="left")


def _count(state: ParserState, tables: dict[str, pl.DataFrame]) -> None:
    state.count("timer", tables["timers"].height)
    state.count("batch", tables["batches"].height)
    progress = tables["progress"].get_column("kind")
    state.count("training_step_progress", int((progress == "training_step").sum()))
    state.count("generation_buffer", int((progress == "generation_buffer").sum()))


def _metrics(
    ev: pl.DataFrame,
    mirrors: pl.DataFrame,
    pairs: pl.DataFrame,
    blocks: pl.DataFrame,
    state: ParserState,
) -> pl.DataFrame:
    console, policy = records.dict_metrics(blocks)
    closed = blocks.filter(pl.col("closed"))
    state.count("wandb_mirror", int(mirrors.get_column("ok").sum()))
    state.count("console_dict", int(closed.get_column("gstep").is_not_null().sum()))
    policy_blocks = closed.filter(pl.col("gstep").is_null() & pl.col("is_policy"))
    state.count("policy_dict", policy_blocks.height)
    rewards = records.reward_metrics(ev)
    state.count("reward_line", rewards.get_column("line").n_unique())
    parts = [records.mirror_metrics(mirrors, pairs), console, policy, rewards]
    return pl.concat([conform(p, "metrics", "") for p in parts])


def parse_chunk(
    chunk: Scan, state: ParserState, source: str, *, final: bool
) -> tuple[dict[str, pl.DataFrame], Scan | None]:
    """The rows of the committed lines of `chunk` and the lines carried; `state` is advanced."""
    n_lines = chunk.lines
    _note_head(chunk, state)
    _note_first_content(chunk, state)
    ev = context.add_line_context(detect.in_windows(chunk.ev), state)
    ev = errors.with_traceback_ends(ev, pl.col("_start"))
    blocks = records.block_steps(records.dict_blocks(ev))
    cut = n_lines if final else _cut(ev, blocks, n_lines)
    ev = ev.filter(pl.col("idx") < cut).with_columns(
        line=pl.col("idx").cast(pl.Int64) + state.line + 1
    )
    blocks = blocks.filter(pl.col("idx") < cut)
    stats = chunk.stats.filter(pl.col("idx") < cut)
    mirrors = chunk.mirrors.filter(pl.col("idx") < cut)
    progress = timers.progress_parsed(ev)
    ev = _with_context(_set_steps(ev, mirrors, blocks, progress), state)
    mirrors = mirrors.join(ev.select("idx", "line", "ts", "attempt"), on="idx")
    blocks = _block_context(blocks, ev)
    tables = _tables(ev, mirrors, chunk.pairs, blocks, progress, state, source)
    tables = _without(tables, replays.note_replayed(ev, state, source))
    tables["engines"] = conform(
        engines.engine_rows(stats, ev, state, state.line, source), "engines", source
    )
    state.count("vllm_stats", tables["engines"].height)
    _malformed(mirrors, blocks, state, source)
    context.advance_state(ev, state)
    context.note_timestamps(tables["engines"].get_column("timestamp"), state)
    carry = chunk.after(cut) if cut < n_lines else None
    _note_cuts(chunk, cut, state, source)
    state.line += cut
    state.offset += chunk.offset_of(cut)
    return tables, carry


def _without(tables: dict[str, pl.DataFrame], lines: pl.Series) -> dict[str, pl.DataFrame]:
    """`tables` without the progress rows of replayed `lines` (ERRORS keeps them)."""
    if lines.is_empty():
        return tables
    gone = pl.col("line").is_in(lines.implode())
    return {
        name: frame.filter(~gone) if name in PROGRESS_TABLES else frame
        for name, frame in tables.items()
    }


def _tables(
    ev: pl.DataFrame,
    mirrors: pl.DataFrame,
    pairs: pl.DataFrame,
    blocks: pl.DataFrame,
    progress: pl.DataFrame,
    state: ParserState,
    source: str,
) -> dict[str, pl.DataFrame]:
    metrics = _metrics(ev, mirrors, pairs, blocks, state).with_columns(source=pl.lit(source))
    tables = {
        "metrics": metrics,
        "timers": conform(timers.timer_rows(ev), "timers", source),
        "progress": conform(timers.progress_rows(progress, ev), "progress", source),
        "batches": conform(timers.batch_rows(ev, state), "batches", source),
        "errors": conform(errors.error_rows(ev), "errors", source),
        "resumes": conform(timers.resume_rows(ev), "resumes", source),
    }
    _count(state, tables)
    return tables
