"""Diagnose what people have: a folder of logs with any names, a single log file, or a watcher
job directory — each file taken for what its lines show or skipped with the reason, nothing in
silence — and the date of time-only lines stated with where it came from."""

from __future__ import annotations

import os
import shutil
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from click.testing import CliRunner, Result

from reports.text import logical_lines
from testkit.bundles import write_job_bundle
from worker.cli import main
from worker.diagnosis import collect_evidence
from worker.evidence.layout import discover, sniff
from worker.evidence.logdate import LogDate, has_time_only_lines, reference_date

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/fixtures"
SKYRL = FIXTURES / "logs/skyrl_gsm8k_yottalabs.log"  # a real SkyRL stdout (source note inside)
CRASHLOOP = FIXTURES / "logs/job_logs_crashloop.txt"  # Iris `[HH:MM:SS]` lines only
HARBOR = FIXTURES / "harbor/parse_skyrl__trace_jobs_min"
TB = FIXTURES / "terminal-bench/tb_trial_agent_timeout_unresolved.results.json"
VLLM = (
    "(AsyncVLLMInferenceEngine pid=77, ip=10.0.0.2) INFO 07-30 18:24:36 [loggers.py:118] "
    "Engine 000: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 2450.0 "
    "tokens/s, Running: 48 reqs, Waiting: 6 reqs, GPU KV cache usage: 46.0%, Prefix cache hit "
    "rate: 0.0%\n"
)
NOW = datetime(2026, 3, 26, 16, 0, tzinfo=UTC)


def _folder(tmp_path: Path) -> Path:
    """A folder as a person has it: the trainer's stdout under its own name, a vLLM log, a Harbor
    run folder, flat terminal-bench results and a note."""
    folder = tmp_path / "my-run"
    folder.mkdir()
    shutil.copy(SKYRL, folder / "skyrl-stdout-rank0.txt")
    (folder / "vllm-engine.log").write_text(VLLM * 3)
    shutil.copytree(HARBOR, folder / "harbor-run")
    shutil.copy(TB, folder / TB.name)
    (folder / "README.md").write_text("what I ran\n")
    return folder


def test_a_folder_of_logs_with_any_names_is_mapped_onto_the_readers(tmp_path: Path) -> None:
    """The SkyRL stdout is the trainer log, the vLLM log is read for its engine lines, the
    Harbor folder is the trials directory; the flat terminal-bench file and the note are skipped,
    each with its reason, and every decision is in the evidence's inputs."""
    evidence = collect_evidence(_folder(tmp_path), now=NOW)
    assert evidence.logs is not None and not evidence.logs.metrics.is_empty()
    assert "skyrl-stdout-rank0.txt" in evidence.logs.summary.files
    assert not evidence.logs.engines.is_empty()
    assert evidence.trials is not None and evidence.trials.trials.height == 1
    said = "\n".join(evidence.inputs)
    assert "took skyrl-stdout-rank0.txt as the trainer log" in said
    assert "took vllm-engine.log as a vLLM engine log" in said
    assert "took harbor-run/ as the trials directory" in said
    assert "trial results outside a trial folder (the trials reader" in said and TB.name in said
    assert "README.md; it begins 'what I ran'" in said


def test_one_trainer_line_is_a_log_and_none_is_skipped(tmp_path: Path) -> None:
    """A text file with one phase timer line is taken as the trainer log; the same file without
    it is skipped, saying what it begins with."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a/out.txt").write_text("hello\nStarted: 'step'\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b/out.txt").write_text("hello\nworld\n")
    assert discover(tmp_path / "a").trainer == "out.txt"
    skipped = discover(tmp_path / "b")
    assert skipped.trainer is None
    assert any("out.txt; it begins 'hello'" in line for line in skipped.inputs())


def test_the_trainer_is_the_driver_named_log_among_several(tmp_path: Path) -> None:
    """Two trainer-like logs: the one named like a driver's stdout is the trainer log, the other
    is read for its engine and error lines, and the report says so."""
    for name in ("rank3.log", "driver.log"):
        shutil.copy(SKYRL, tmp_path / name)
    layout = discover(tmp_path)
    assert (layout.trainer, layout.pods) == ("driver.log", ["rank3.log"])
    assert any(
        line.startswith("took rank3.log as another trainer-like log") for line in layout.inputs()
    )


def test_compressed_binary_and_ray_worker_files(tmp_path: Path) -> None:
    """A .gz and a binary file are skipped with their reasons; a Ray worker log keeps its role."""
    (tmp_path / "old.log.gz").write_bytes(b"\x1f\x8b\x08\0")
    (tmp_path / "core.bin").write_bytes(b"\x7fELF\0\0\0")
    (tmp_path / "worker-abc-01000000-77.out").write_text(VLLM)
    layout = discover(tmp_path)
    said = "\n".join(layout.inputs())
    assert "compressed (decompress it to have it read): old.log.gz" in said
    assert "binary (not a text log): core.bin" in said
    assert layout.rays == ["worker-abc-01000000-77.out"]


def test_a_symlink_out_of_the_folder_is_refused_and_named(tmp_path: Path) -> None:
    """A link to a log outside the folder is never read, and the inputs name it."""
    outside = tmp_path / "outside.log"
    shutil.copy(SKYRL, outside)
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "trainer.log").symlink_to(outside)
    evidence = collect_evidence(folder, now=NOW)
    assert evidence.logs is None
    assert any("trainer.log" in line and "refused" in line for line in evidence.inputs)


def test_a_watcher_directory_is_quiet_unless_something_is_skipped(tmp_path: Path) -> None:
    """The watcher layout read as it is says nothing; a stray file in it is named as skipped."""
    job = write_job_bundle(tmp_path)
    assert discover(job).quiet() and collect_evidence(job).inputs == ()
    (job / "notes.txt").write_text("x")
    (job / "finelog.stderr").write_text("sync warning\n")
    said = "\n".join(discover(job).inputs())
    assert "not part of the watcher layout" in said and "notes.txt" in said
    assert "the log sync's stderr" in said and "finelog.stderr" in said


def test_sniff_counts_what_the_first_lines_show() -> None:
    """Trainer, engine and error lines are counted; a NUL byte makes it binary."""
    found = sniff(b"Started: 'step'\n" + VLLM.encode() + b"Traceback (most recent call last)\n")
    assert (found.trainer, found.engine, found.errors, found.role) == (1, 1, 1, "trainer")
    assert sniff(VLLM.encode()).role == "engine"
    assert not sniff(b"\0\0").text


# --- the date of time-only lines ----------------------------------------------------------------


HEAD = CRASHLOOP.read_bytes()


def _dated(**changes: object) -> LogDate:
    base: dict[str, object] = {
        "given": None,
        "submitted": None,
        "head": HEAD,
        "trainer": "crash.log",
        "modified": datetime(2026, 7, 30, 10, 13, tzinfo=UTC),
        "now": datetime(2026, 7, 30, 10, 20, tzinfo=UTC),
    }
    return reference_date(**(base | changes))  # type: ignore[arg-type]


def test_the_date_given_wins_then_the_submission_then_a_dated_line() -> None:
    """--log-date beats the manifest, which beats the log's first full date."""
    given = _dated(given=date(2026, 1, 2), submitted=datetime(2025, 5, 5, tzinfo=UTC))
    assert (given.day, given.source) == (date(2026, 1, 2), "set by --log-date")
    submitted = _dated(submitted=datetime(2025, 5, 5, tzinfo=UTC))
    assert submitted.day == date(2025, 5, 5)
    in_log = _dated(head=b"[10:00:00] task=/a/b/0 | x\n2026-03-26 14:44:59.431 | INFO | y\n")
    assert in_log.day == date(2026, 3, 26)
    assert in_log.source == "the first dated line of crash.log (line 2)"


def test_a_file_modified_at_the_time_judged_dates_the_lines_and_one_second_later_does_not() -> None:
    """Modified exactly at `now`: its date is used (stated as the modification time). Modified a
    second after `now` (a copy): the date judged is used instead, saying why."""
    now = datetime(2026, 7, 30, 10, 20, tzinfo=UTC)
    at = _dated(modified=now)
    assert at.day == date(2026, 7, 30) and "modification time" in at.source
    later = _dated(modified=now + timedelta(seconds=1))
    assert later.day == date(2026, 7, 30) and "modified after it" in later.source


def test_a_log_that_began_before_midnight_is_dated_the_day_before() -> None:
    """The first [23:50:00] line, judged at 00:10: the lines began the day before."""
    head = b"[23:50:00] task=/a/b/0 | Started: 'step'\n"
    dated = _dated(
        head=head,
        modified=datetime(2026, 9, 1, tzinfo=UTC),
        now=datetime(2026, 7, 31, 0, 10, tzinfo=UTC),
    )
    assert dated.day == date(2026, 7, 30)


def test_time_only_lines_are_recognised_by_their_prefix() -> None:
    """`[10:12:25] task=...` is a time-only line; a loguru line is not."""
    assert has_time_only_lines(HEAD)
    assert not has_time_only_lines(SKYRL.read_bytes())


# --- the commands ---------------------------------------------------------------------------------


def _run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_diagnose_a_copied_log_file_dates_its_lines_as_judged(tmp_path: Path) -> None:
    """A `cp` of a crash-loop log (time-only lines, modified now) judged as of its day: the
    OOMs are dated that day, not the copy's (no 'evidence dated after now'), and INPUTS says
    where the date came from."""
    copy = tmp_path / "crash.log"
    shutil.copy(CRASHLOOP, copy)
    result = _run("diagnose", copy, "--now", "2026-07-30T10:20:00Z")
    assert result.exit_code == 0, result.output
    text = "\n".join(logical_lines(result.stdout))
    assert "(crash.log:2, 2026-07-30T10:12:26Z)" in text
    assert "after now" not in text
    assert "took crash.log as the trainer log (a single file was given" in text
    assert "time-only lines ([HH:MM:SS]) of crash.log dated 2026-07-30: the time judged" in text


def test_log_date_sets_the_date_of_time_only_lines(tmp_path: Path) -> None:
    """--log-date 2026-07-29 dates the same lines a day earlier, and the report says it was set."""
    copy = tmp_path / "crash.log"
    shutil.copy(CRASHLOOP, copy)
    os.utime(copy, (0, 0))
    result = _run("diagnose", copy, "--now", "2026-07-30T10:20:00Z", "--log-date", "2026-07-29")
    text = "\n".join(logical_lines(result.stdout))
    assert "(crash.log:2, 2026-07-29T10:12:26Z)" in text
    assert "dated 2026-07-29: set by --log-date" in text


def test_a_malformed_log_date_is_refused() -> None:
    """--log-date 30/07/2026 is not a date: exit 2."""
    result = _run("diagnose", CRASHLOOP, "--log-date", "30/07/2026")
    assert result.exit_code == 2 and "is not a date YYYY-MM-DD" in result.output


def test_probes_without_probes_json_is_refused_and_its_probes_folder_is_found(
    tmp_path: Path,
) -> None:
    """A --probes folder without probes.json stops with one line; the folder `--out` wrote
    (holding probes/probes.json) is read through its probes/ with a note."""
    job = ROOT / "examples/jobs/cw-rno2a/ops/rl-gsm8k-stalled"
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = _run("diagnose", job, "--probes", empty)
    assert refused.exit_code == 2 and "holds no probes.json" in refused.stderr
    out = tmp_path / "out"
    shutil.copytree(ROOT / "examples/probes/rl-gsm8k-stalled", out / "probes")
    found = _run("diagnose", job, "--probes", out, "--now", "2026-07-30T19:17:00Z")
    assert found.exit_code == 0 and "VERDICT: KILL" in found.stdout
    assert f"reading {out / 'probes'}" in found.stderr


def test_signatures_names_what_it_read_and_skipped_in_a_folder(tmp_path: Path) -> None:
    """`signatures` on a folder says on stderr which file it took as the trainer log and that
    the flat terminal-bench results were skipped, and why."""
    result = _run("signatures", _folder(tmp_path))
    assert result.exit_code == 0, result.output
    assert "input: took skyrl-stdout-rank0.txt as the trainer log" in result.stderr
    assert "trial results outside a trial folder" in result.stderr and TB.name in result.stderr
