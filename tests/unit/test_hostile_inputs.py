"""Every hostile input of issue 11 (`bench/hostile.py`, at a size that runs in seconds) gives a
report or a clean exit, with a named discrepancy, within the parse memory budget.

The full-size corpus (a 300 MB line, 2.2 GB of records, ...) is `python -m bench.hostile run`
(docs/reliability.md records its figures)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from shared.models import Verdict
from testkit.hostile import INPUTS, NOW, Input, build, run_command
from worker.cli.tables import write_tables
from worker.diagnosis import collect_evidence, judge
from worker.evidence import parsed
from worker.evidence.logs import LINE_MAX_BYTES, ParseBudget, parse_log_file
from worker.evidence.logs.budget import Held, LogBudgetError, parse_settings

RL_HEALTH = str(Path(sys.executable).with_name("rl-health"))
ROOT = Path(__file__).resolve().parents[2]
MOMENT = datetime.fromisoformat(NOW.replace("Z", "+00:00")).astimezone(UTC)
BY_NAME = {item.name: item for item in INPUTS}


def _built(tmp_path: Path, name: str, *, full: bool = False) -> Path:
    return build(BY_NAME[name], tmp_path, full=full)


def _diagnose(job: Path, monkeypatch: pytest.MonkeyPatch, item: Input) -> tuple[Verdict, list[str]]:
    memory = item.memory_mb.get("small")
    if memory is not None:
        monkeypatch.setenv("RLHEALTH_PARSE_MEMORY_MB", str(memory))
    report = judge(collect_evidence(job, now=MOMENT))
    return report.verdict, list(report.discrepancies)


def _cli(*args: str | Path, memory_mb: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHEALTH_")}
    if memory_mb is not None:
        env["RLHEALTH_PARSE_MEMORY_MB"] = str(memory_mb)
    return subprocess.run(
        [RL_HEALTH, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


# --- long lines --------------------------------------------------------------------------------


def test_line_longer_than_a_read_is_cut_counted_and_quoted(tmp_path: Path) -> None:
    """A 16 MB line without a newline, read 4 MiB at a time, is one line: its head and a marker
    naming its length; the summary counts it and a note quotes where it is."""
    job = _built(tmp_path, "long_line")
    tables = parse_log_file(job / "finelog.log", "finelog.log", chunk_bytes=4 * 2**20)
    summary = tables.summary
    assert (summary.lines, summary.cut_lines, summary.bytes) == (1, 1, 16_000_000)
    assert summary.head[0].endswith("[... line cut: 16,000,000 bytes]")
    assert len(summary.head[0].encode()) <= LINE_MAX_BYTES
    assert summary.cut_examples == ("finelog.log:1: 16,000,000 bytes",)
    assert "1 line longer than 1,048,576 bytes cut" in summary.notes[0]
    assert summary.malformed == 1  # the record never closes: malformed, quoted, not raised


def test_line_just_over_the_cap_inside_a_read_is_cut_and_one_at_the_cap_is_not(
    tmp_path: Path,
) -> None:
    """Inside an ordinary read, a line of LINE_MAX_BYTES + 1 bytes is cut and one of exactly
    LINE_MAX_BYTES is kept whole; the lines around them are read as usual."""
    record = 'WANDB_MIRROR kind=train step=1 metrics={"reward/avg_raw_reward": 0.5}'
    at_cap = "a" * LINE_MAX_BYTES
    over = "b" * (LINE_MAX_BYTES + 1)
    log = tmp_path / "finelog.log"
    log.write_text(f"{at_cap}\n{over}\n{record}\n")
    tables = parse_log_file(log, "finelog.log")
    assert tables.summary.cut_lines == 1
    assert tables.summary.cut_examples == (f"finelog.log:2: {LINE_MAX_BYTES + 1:,} bytes",)
    assert tables.metrics.get_column("value").to_list() == [0.5]
    assert tables.metrics.get_column("line").to_list() == [3]


def test_cut_lines_keep_byte_offsets_for_the_incremental_cache(tmp_path: Path) -> None:
    """A log whose long line is skipped (not held) and carried with an open dict re-parses after
    growth exactly as a full parse: the offsets count the bytes the cut dropped."""
    from worker.evidence.log_cache import LogCache

    ray = "(skyrl_entrypoint pid=1) "
    head = [f"{ray}{{'async/staleness_max': 0,", f"{ray} 'reward/avg_raw_reward': '0.3',"]
    tail = [f"{ray} 'trainer/global_step': 5}}", "Training Step Progress: 5 / 10"]
    data = ("\n".join(head) + "\n" + "x" * 1_200_000 + "\n" + "\n".join(tail) + "\n").encode()
    log = tmp_path / "finelog.log"
    cache = LogCache()
    for end in (len(data) // 2, len(data) - 5, len(data)):
        log.write_bytes(data[:end])
        grown = parse_log_file(log, "finelog.log", cache=cache, chunk_bytes=64 * 1024)
    full = parse_log_file(log, "finelog.log", chunk_bytes=64 * 1024)
    for name in ("metrics", "progress"):
        assert getattr(grown, name).equals(getattr(full, name))
    assert grown.summary == full.summary
    assert full.summary.cut_lines == 1


# --- NUL bytes and sparse files -------------------------------------------------------------


@pytest.mark.parametrize("name", ["nul_256mb", "nul_2gb"])
def test_sparse_nul_files_full_size_are_one_cut_line_read_quickly(
    tmp_path: Path, name: str
) -> None:
    """The issue's 256 MB and 2 GB sparse NUL files (full size: holes are jumped, not read) are
    one line, cut; the verdict is ERROR (no usable evidence), never a crash."""
    job = _built(tmp_path, name, full=True)
    tables = parse_log_file(job / "finelog.log", "finelog.log")
    size = (job / "finelog.log").stat().st_size
    assert (tables.summary.lines, tables.summary.cut_lines, tables.summary.bytes) == (1, 1, size)
    report = judge(collect_evidence(job, now=MOMENT))
    assert report.verdict is Verdict.ERROR
    assert any("longer than 1,048,576 bytes cut" in d for d in report.discrepancies)


def test_nul_bytes_inside_lines_are_blanked(tmp_path: Path) -> None:
    """NUL bytes inside ordinary lines become spaces; the record after them is read."""
    log = tmp_path / "finelog.log"
    log.write_bytes(
        b"\x00" * 5000
        + b'\nWANDB_MIRROR kind=train step=2 metrics={"reward/avg_raw_reward": 0.25}\x00\n'
    )
    tables = parse_log_file(log, "finelog.log")
    assert tables.metrics.get_column("step").to_list() == [2]
    assert tables.summary.cut_lines == 0


# --- compressed content -----------------------------------------------------------------------


def test_gzip_finelog_is_a_named_discrepancy_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gzip-compressed finelog is not read (nor expanded): the report names it."""
    job = _built(tmp_path, "gzip_finelog")
    verdict, found = _diagnose(job, monkeypatch, BY_NAME["gzip_finelog"])
    assert verdict is Verdict.ERROR
    assert "finelog.log is gzip-compressed: not read (the logs must be synced as text)" in found


@pytest.mark.parametrize("first", [b"x^", b"x\x9c", b"x\x01", b"\x28\xb5\x2f\xfd"])
def test_lines_starting_like_a_compressed_stream_are_read_as_text(
    tmp_path: Path, first: bytes
) -> None:
    """A read whose first line starts with zlib or zstd magic bytes is split as text (polars'
    CSV reader would try to decompress it and fail, or expand it)."""
    log = tmp_path / "finelog.log"
    record = b'WANDB_MIRROR kind=train step=3 metrics={"reward/avg_raw_reward": 0.75}\n'
    log.write_bytes(b"a" * 100 + b"\n" + first + b" not compressed\n" + record)
    tables = parse_log_file(log, "finelog.log", chunk_bytes=101)  # the 2nd read starts there
    assert tables.summary.lines == 3
    assert tables.metrics.get_column("step").to_list() == [3]


def test_gzip_bytes_inside_a_log_are_never_decompressed(tmp_path: Path) -> None:
    """A gzip stream starting a line in the middle of a plain log stays bytes, even when a read
    begins with it: no line of its decompressed text appears."""
    hidden = gzip.compress(b'WANDB_MIRROR kind=train step=9 metrics={"reward/avg_raw_reward": 1}\n')
    log = tmp_path / "finelog.log"
    log.write_bytes(b"a" * 100 + b"\n" + hidden.replace(b"\n", b" ") + b"\n")
    tables = parse_log_file(log, "finelog.log", chunk_bytes=101)
    assert tables.metrics.is_empty()
    assert tables.summary.lines == 2


# --- links and JSON -----------------------------------------------------------------------------


def test_finelog_symlinked_to_itself_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finelog that is a symlink loop is refused with a named discrepancy."""
    job = _built(tmp_path, "symlink_loop")
    verdict, found = _diagnose(job, monkeypatch, BY_NAME["symlink_loop"])
    assert verdict is Verdict.ERROR
    assert "refused 'finelog.log': a symlink loop" in found


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("deep_manifest", "manifest.json does not parse: nested deeper than 64 levels"),
        ("deep_trial", "trace_jobs/run/t-deep/result.json: JsonLimitError: nested deeper than 64"),
        ("huge_int_trial", "trace_jobs/run/t-huge/result.json: JsonLimitError: holds an integer"),
    ],
)
def test_deep_json_and_huge_integers_are_named_discrepancies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, expected: str
) -> None:
    """JSON nested 100,000 deep and a 400-digit integer are each a named discrepancy."""
    job = _built(tmp_path, name)
    verdict, found = _diagnose(job, monkeypatch, BY_NAME[name])
    assert verdict is Verdict.ERROR
    assert any(line.startswith(expected) for line in found), found


def test_deep_record_in_the_log_is_malformed_not_a_crash(tmp_path: Path) -> None:
    """A WANDB_MIRROR record nested 100,000 deep is read by patterns, not recursion: no
    metric, no exception."""
    job = _built(tmp_path, "deep_mirror")
    tables = parse_log_file(job / "finelog.log", "finelog.log")
    assert tables.metrics.is_empty()


def test_json_just_within_the_depth_bound_is_read(tmp_path: Path) -> None:
    """A trial result nested 63 levels below its object is read; 64 levels is refused."""
    from worker.evidence.values import JsonLimitError, read_json

    path = tmp_path / "x.json"
    path.write_text('{"a":' * 64 + "1" + "}" * 64)
    with path.open("rb") as handle:
        assert isinstance(read_json(handle), dict)
    path.write_text('{"a":' * 65 + "1" + "}" * 65)
    with pytest.raises(JsonLimitError, match="nested deeper than 64"), path.open("rb") as handle:
        read_json(handle)


def test_int64_bound_is_exact() -> None:
    """2**63 - 1 is an integer of a trial file; 2**63 is past the bound."""
    from worker.evidence.values import JsonLimitError, integer, loads_json, number

    assert loads_json(f'{{"n": {2**63 - 1}}}', int64=True) == {"n": 2**63 - 1}
    with pytest.raises(JsonLimitError, match="beyond 64 bits"):
        loads_json(f'{{"n": {2**63}}}', int64=True)
    assert integer(2**63) is None and integer(2**63 - 1) == 2**63 - 1
    assert number(10**400) is None


# --- the memory budget ------------------------------------------------------------------------


@pytest.mark.slow
def test_metric_records_past_the_budget_give_error_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 MB of records under a 256 MB setting cannot be kept: ERROR, and the discrepancy says
    which file, the budget and how far the read got."""
    job = _built(tmp_path, "metric_records")
    verdict, found = _diagnose(job, monkeypatch, BY_NAME["metric_records"])
    assert verdict is Verdict.ERROR
    reason = next(d for d in found if "parse memory budget" in d)
    assert reason.startswith("finelog.log could not be read within the parse memory budget of 256")


def test_metric_records_within_the_budget_are_read(tmp_path: Path) -> None:
    """The same records, fewer of them (1 MB), fit the 256 MB budget and are read whole."""
    job = _built(tmp_path, "metric_records")
    log = job / "finelog.log"
    log.write_bytes(log.read_bytes()[:1_000_000].rsplit(b"\n", 1)[0] + b"\n")
    tables = parse_log_file(log, "finelog.log", budget=ParseBudget.for_logs(1_000_000, 256))
    assert tables.metrics.height == 37 * tables.summary.lines


def test_the_limit_is_the_setting() -> None:
    """The parse stops only past the setting, whatever the logs' size."""
    mb = 2**20
    assert ParseBudget.for_logs(1000 * mb, 4096).limit_mb == 4096
    assert ParseBudget.for_logs(10 * mb, 256).limit_mb == 256


def test_a_parse_past_one_and_a_half_times_the_log_but_within_the_setting_is_read() -> None:
    """A 500 MB log whose parse holds ~900 MB (past 1.5x the log: 750 MB) is within the default
    2048 MB setting: read, not refused (before, every log of ~350-700 MB was refused: ERROR).
    Just past the setting it stops, naming the setting."""
    mb = 2**20
    budget = ParseBudget.for_logs(500 * mb, 2048)
    budget.base_rss = None  # the estimate alone, not this test process's RSS
    budget.check(Held(total=800 * mb), "finelog.log", 1, 1)  # ~1.2 GB with its copies ahead
    with pytest.raises(LogBudgetError, match=r"budget of 2,048 MB \(RLHEALTH_PARSE_MEMORY_MB\)"):
        budget.check(Held(total=1400 * mb), "finelog.log", 1, 1)


def test_unusable_memory_setting_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """RLHEALTH_PARSE_MEMORY_MB below 256 (255) or not a number is refused with its name; 256
    is accepted."""
    monkeypatch.setenv("RLHEALTH_PARSE_MEMORY_MB", "255")
    with pytest.raises(ValueError, match="parse_memory_mb"):
        parse_settings()
    monkeypatch.setenv("RLHEALTH_PARSE_MEMORY_MB", "256")
    assert parse_settings()[0] == 256


def test_cli_refuses_an_unusable_memory_setting(tmp_path: Path) -> None:
    """Both commands exit 2 with one line naming the setting (no traceback)."""
    (tmp_path / "finelog.log").write_text("x\n")
    for args in (("parse", tmp_path), ("diagnose", tmp_path, "--now", NOW)):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLHEALTH_")}
        env["RLHEALTH_PARSE_MEMORY_MB"] = "lots"
        done = subprocess.run(
            [RL_HEALTH, *map(str, args)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert "parse_memory_mb" in done.stderr
        assert "Traceback" not in done.stderr


def _peak_above_base(args: list[str | Path], tmp_path: Path, memory_mb: int) -> float:
    """Peak RSS of `rl-health` on `args` minus its peak on an empty log (the interpreter and
    its imports), in MB."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHEALTH_")}
    env["RLHEALTH_PARSE_MEMORY_MB"] = str(memory_mb)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "finelog.log").write_text("x\n")
    out = tmp_path / "out"
    base = run_command([RL_HEALTH, "parse", str(empty), "--out", str(out)], env).rss_mb
    ran = run_command([RL_HEALTH, *map(str, args)], env)
    assert "Traceback" not in ran.stderr
    assert base > 50  # the interpreter and polars: the measure is the command's, not pytest's
    return ran.rss_mb - base


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "memory_mb"), [("long_line", 256), ("metric_records", 256), ("nul_2gb", 256)]
)
def test_parse_memory_stays_within_the_setting(tmp_path: Path, name: str, memory_mb: int) -> None:
    """`rl-health parse` of a 16 MB line (longer than a read), 40 MB of records past the budget
    and a 2 GB sparse file adds at most the setting to the process's memory."""
    job = _built(tmp_path, name, full=name == "nul_2gb")
    above = _peak_above_base(["parse", job, "--out", tmp_path / "o"], tmp_path, memory_mb)
    assert above <= memory_mb, f"{name}: {above:.0f} MB above the base, setting {memory_mb} MB"


@pytest.mark.slow
def test_parse_past_the_budget_exits_2_with_one_line(tmp_path: Path) -> None:
    """`rl-health parse` of logs past the budget exits 2 with one line saying why."""
    job = _built(tmp_path, "metric_records")
    done = _cli("parse", job, "--out", tmp_path / "o", memory_mb=256)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "could not be read within the parse memory budget of 256 MB" in line


# --- distinct keys ----------------------------------------------------------------------------


@pytest.mark.slow
def test_many_keys_full_size_pivots_only_the_gates_keys_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's 300,000-key log: the gates never pivot every key, and each set of keys they
    ask for is pivoted once (it took 244 s when every gate pivoted every key)."""
    job = _built(tmp_path, "many_keys", full=True)
    asked: list[tuple[str, ...] | None] = []
    pivot = parsed._pivot

    def counting(metrics: pl.DataFrame, keys: tuple[str, ...] | None) -> pl.DataFrame:
        asked.append(keys)
        return pivot(metrics, keys)

    monkeypatch.setattr(parsed, "_pivot", counting)
    evidence = collect_evidence(job, now=MOMENT)
    assert evidence.logs is not None
    assert evidence.logs.metrics.get_column("key").n_unique() == 300_000
    judge(evidence)
    judge(evidence)
    assert None not in asked
    assert len(asked) == len(set(asked))


def test_too_many_keys_are_written_long(tmp_path: Path) -> None:
    """`write_tables` writes 30,000 keys as `metrics_long` (a wide table would be 30,000
    columns); 10 keys stay wide."""
    job = _built(tmp_path, "many_keys")
    tables = parse_log_file(job / "finelog.log", "finelog.log")
    written = {p.name for p in write_tables(tables, tmp_path / "out")}
    assert "metrics_long.csv" in written and "metrics.csv" not in written
    few = parsed.LogTables(metrics=tables.metrics.filter(pl.col("step") <= 1).head(10))
    assert "metrics.csv" in {p.name for p in write_tables(few, tmp_path / "few")}


def test_metrics_wide_of_given_keys_equals_the_full_pivot_columns(tmp_path: Path) -> None:
    """`metrics_wide(keys)` holds the same values as the full pivot for those keys."""
    record = 'WANDB_MIRROR kind=train step={} metrics={{"a": {}, "b": 2, "c": 3}}\n'
    log = tmp_path / "finelog.log"
    log.write_text("".join(record.format(s, s / 10) for s in range(1, 6)))
    tables = parse_log_file(log, "finelog.log")
    full = tables.metrics_wide().select("step", "a", "b")
    assert tables.metrics_wide(["a", "b", "missing"]).equals(full)


def test_corpus_lists_every_input_of_the_issue() -> None:
    """The corpus holds each hostile input the issue names (so the runner measures them all)."""
    names = {item.name for item in INPUTS}
    assert {"long_line", "nul_256mb", "nul_2gb", "metric_records", "many_keys"} <= names
    assert {"deep_manifest", "deep_trial", "gzip_finelog", "symlink_loop"} <= names
    assert "huge_int_trial" in names
    assert json.dumps([i.what for i in INPUTS])


@pytest.mark.slow
def test_module_command_past_the_budget_exits_2(tmp_path: Path) -> None:
    """`python -m worker.evidence.logs` (the parse command) on logs past the budget returns 2
    with the reason."""
    job = _built(tmp_path, "metric_records")
    env = {**os.environ, "RLHEALTH_PARSE_MEMORY_MB": "256", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "worker.evidence.logs", str(job), "--out", str(tmp_path / "o")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 2, done.stderr
    assert "parse memory budget of 256 MB" in done.stderr
