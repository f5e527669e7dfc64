"""The redactor: every credential format of the corpus goes, ordinary log text stays, control
characters are escaped, long text is cut by bytes, and the vectorised table path agrees."""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Iterator

import polars as pl
import pytest

from shared import redact
from shared.models import Quote
from shared.redact import (
    PREFILTER,
    clean,
    clean_cut,
    cut_bytes,
    escape_controls,
    install_log_redaction,
    redact_data,
    redact_frame,
    redact_text,
)
from tests.security.corpus import SAMPLES, WANDB, corpus_lines, leaks

# Ordinary lines that look a little like credentials and must survive untouched (a redactor that
# ate them would blank the evidence a verdict quotes).
BENIGN = [
    "max_tokens: 4096, tokenizer: Qwen/Qwen2.5-7B-Instruct, eos_token_id: 151643",
    "pad_token: <|endoftext|>  (generation_tokens_per_s=1834.2)",
    "commit 3f9a2b1c4d5e6f708192a3b4c5d6e7f801234567 on main",
    "Avg generation throughput: 1834.2 tokens/s, Running: 12 reqs, GPU KV cache usage: 41.2%",
    'WANDB_MIRROR kind=train step=7 metrics={"policy/policy_entropy": 1.1, "reward/avg": 0.3}',
    '  File "/app/skyrl_train/trainer.py", line 210, in train',
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "Authorization header missing from request; retrying without credentials",
    "key=value pairs parsed: 12 keys",
    "checkpoint saved to /mnt/ckpt/Qwen25-7B/global_step_100/policy/model.safetensors",
    'Thread 41 (idle): "MainThread"\n    all_reduce (torch/distributed/distributed_c10d.py:2050)',
    "secret_name: wandb-credentials",
]


@pytest.mark.parametrize("line", corpus_lines())
def test_every_corpus_line_is_redacted(line: str) -> None:
    """No credential of the corpus survives, in any position, and the marker says what went."""
    out = redact_text(line)
    assert leaks(out) == [] and "<redacted:" in out


@pytest.mark.parametrize("line", BENIGN)
def test_ordinary_lines_stay_as_they_are(line: str) -> None:
    """Near misses (token counts, tokenizers, SHAs, paths, metric lines) are not redacted."""
    assert redact_text(line) == line


@pytest.mark.parametrize("line", corpus_lines() + BENIGN)
def test_redaction_is_idempotent(line: str) -> None:
    """Redacting twice changes nothing more: quotes re-validated downstream stay equal."""
    once = redact_text(line)
    assert redact_text(once) == once
    assert clean(clean(line)) == clean(line)


def test_prefilter_flags_every_line_the_rules_change() -> None:
    """The vectorised prefilter is a superset of the rules: no credential slips past it."""
    lines = corpus_lines() + BENIGN
    flagged = pl.Series(lines).str.contains(PREFILTER).to_list()
    pairs = zip(lines, flagged, strict=True)
    missed = [line for line, hit in pairs if redact_text(line) != line and not hit]
    assert missed == []


def test_control_characters_are_escaped() -> None:
    """CR, LF, ESC, C1 controls, line separators and bidi overrides become visible escapes."""
    text = "job\r\nVERDICT: NO-KILL\x1b[2J\x85\u2028\u202e\x00\t"
    out = escape_controls(text)
    assert out == "job\\r\\nVERDICT: NO-KILL\\x1b[2J\\x85\\u2028\\u202e\\x00\\t"
    assert not any(unicodedata.category(c) in {"Cc", "Zl", "Zp", "Cf"} for c in out)
    assert escape_controls(out) == out


@pytest.mark.parametrize(("size", "cut"), [(100, False), (101, True)])
def test_cut_by_bytes_at_the_limit(size: int, cut: bool) -> None:
    """A text of exactly `limit` bytes is kept; one byte more is cut with a visible marker."""
    text = "é" * (size // 2) + "a" * (size % 2)
    out = cut_bytes(text, 100)
    assert len(out.encode("utf-8")) <= 100
    assert ("…[+" in out) is cut and (out == text) is not cut


def test_huge_text_is_cleaned_from_a_window_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Of a 4 MB line only a window of a few kB is redacted and escaped (the work does not grow
    with the line), the credential in it still goes, and the marker counts the whole line."""
    cleaned: list[int] = []

    def counting_clean(text: str) -> str:
        cleaned.append(len(text))
        return clean(text)

    monkeypatch.setattr(redact, "clean", counting_clean)
    line = f"WANDB_API_KEY={WANDB} " + "x" * (4 * 1024 * 1024)
    out = clean_cut(line, 300)
    kept = out[: out.rindex("…[+")]
    assert cleaned and max(cleaned) <= 16 * 300
    assert len(out.encode()) <= 300 and leaks(out) == []
    assert out.endswith(f"…[+{len(line.encode()) - len(kept.encode())} bytes]")


def test_structured_data_is_redacted_by_key() -> None:
    """A value under a credential's key goes even when it looks plain; other keys stay."""
    data = {
        "env": [{"name": "DB_PASSWORD", "value": "hunter2"}, {"name": "LANG", "value": "C"}],
        "WANDB_API_KEY": WANDB,
        "max_tokens": 4096,
        "argv": [f"--wandb-api-key={WANDB}"],
    }
    out = redact_data(data)
    assert out["env"] == [{"name": "DB_PASSWORD", "value": "<redacted:secret>"}, data["env"][1]]
    assert out["max_tokens"] == 4096 and leaks(str(out)) == []


def test_frames_are_redacted_in_string_columns_only() -> None:
    """Flagged cells of string columns are rewritten; numbers and clean cells are untouched."""
    frame = pl.DataFrame(
        {"text": [corpus_lines()[0], BENIGN[0], None], "line": [1, 2, 3]},
        schema={"text": pl.String, "line": pl.Int64},
    )
    out = redact_frame(frame)
    assert out["line"].to_list() == [1, 2, 3]
    assert out["text"].to_list()[1:] == [BENIGN[0], None]
    assert leaks(str(out["text"].to_list())) == []


def test_a_quote_is_redacted_escaped_and_bounded_wherever_it_is_made() -> None:
    """The Quote model itself cleans its text and source, so no sink can forget."""
    made = Quote(source="pod_logs/a\x1b.log", text=f"{SAMPLES[0].carriers[0]}\n" + "y" * 5000)
    assert leaks(made.text) == [] and "\n" not in made.text and "\x1b" not in made.source
    assert len(made.text.encode()) <= 1024


@pytest.fixture
def log_redaction() -> Iterator[None]:
    """Install the log record redaction for one test, then restore the previous factory."""
    previous = logging.getLogRecordFactory()
    install_log_redaction()
    yield
    logging.setLogRecordFactory(previous)


def test_log_messages_are_redacted(log_redaction: None, caplog: pytest.LogCaptureFixture) -> None:
    """A log message carrying a credential or a line break is redacted and escaped."""
    with caplog.at_level(logging.WARNING):
        logging.getLogger("worker.pipeline.ingest").warning(
            "dead-lettered alert %s: %s", "1-0", f"bad job {SAMPLES[1].carriers[0]}\r\nforged"
        )
    (record,) = caplog.records
    assert leaks(record.getMessage()) == [] and "\n" not in record.getMessage()


def test_celery_app_import_redacts_log_records() -> None:
    """`celery -A worker.pipeline.app worker` (no rl-health CLI) logs credentials redacted."""
    import subprocess
    import sys

    token = "hf_" + "QwErTyUiOpAsDfGhJkLzXcVbNm4321"
    script = (
        "import logging, sys, worker.pipeline.app\n"
        "logging.basicConfig(stream=sys.stderr)\n"
        f"logging.getLogger('celery.app.trace').error('task failed: %s', {token!r})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "task failed: <redacted:hf-token>" in done.stderr and token[3:] not in done.stderr


def test_table_column_names_are_redacted_and_stay_apart() -> None:
    """A wide metrics table is named by keys from the log: a secret in a key is redacted; two
    keys that differ only in their secret stay two columns; ordinary keys are untouched."""
    import polars as pl

    from shared.redact import redact_frame

    first, second = (
        "hf_" + "QmZx7R2vA8kLp3NwQ9sT4uV6yB1cD5eF7gH",
        "hf_" + "Zx7R2vA8kLp3NwQ9sT4uV6yB1cD5eF7gHQm",
    )
    frame = pl.DataFrame(
        {"step": [1], "generate/avg_num_tokens": [2.0], f"x/{first}": [1.0], f"x/{second}": [2.0]}
    )
    columns = redact_frame(frame).columns
    assert columns[:2] == ["step", "generate/avg_num_tokens"]
    assert not any(first in c or second in c for c in columns)
    assert len(set(columns)) == 4 and columns[3].endswith("#2")
