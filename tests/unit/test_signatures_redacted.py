"""Failure signatures and messages are made from redacted text (issue 9 regression): a credential
in an error line reaches neither `rl-health parse`'s tables and stdout nor `rl-health signatures`,
whole or in pieces, and two lines that differ only in a secret have one signature.

Normalising replaces the digits inside a token (`hf_QmZx7R2v...` -> `hf_QmZx<n>R<n>v...`), which
hid the rest of it from the redactor the writers run: the signature column leaked it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from testkit.hostile import INPUTS, build
from tests.security.corpus import AWS_ID, AWS_SECRET, HF, JWT, URL_PASSWORD, leaks
from worker.cli import main
from worker.evidence.failures import signature
from worker.evidence.logs import parse_log_file

RL_HEALTH = str(Path(sys.executable).with_name("rl-health"))
SECRETS = (JWT, HF, AWS_ID, AWS_SECRET, URL_PASSWORD)
# A second set of the same shapes: lines that differ from the first only in the secret.
OTHER_JWT = (
    "eyJhbGciOiJSUzI1NiIsImtpZCI6IjQ0In0.eyJzdWIiOiJvcHMtYm90IiwiZXhwIjoxNzk5OTk5OTk5fQ."
    "Zk7pQ2mX9vB4nR8tL1wC6yH3jF5dG0aSeUoIiKlMpN"
)
OTHER_HF = "hf_Tr8Yq2Wm5Zx7Lv3Pn9Bk4Hc6Jd1Fg0SaUeI"
OTHER_AWS_ID = "AKIAQ4W8E2R6T1Y5U9IO"
OTHER_AWS_SECRET = "Zp4Lm8Qx2Rv6Tn0Wk3Bh7Cj1Df5Gs9Ha2Ue4Io6y"
OTHER_PASSWORD = "An0th3rPa55w0rdY7"
OTHERS = (OTHER_JWT, OTHER_HF, OTHER_AWS_ID, OTHER_AWS_SECRET, OTHER_PASSWORD)
IRIS = "[10:00:{second:02d}] task=/u/job/0 | "


def _failures(jwt: str, hf: str, aws_id: str, aws_secret: str, password: str) -> list[str]:
    """Failure lines of every kind the parser signs, each carrying a credential."""
    return [
        f"RuntimeError: request failed with Authorization: Bearer {jwt}",
        f"ValueError: bad token {hf} given",
        f"ConnectionError: cannot reach https://ops:{password}@registry.example.com/v2/",
        f"botocore.exceptions.ClientError: key {aws_id} secret {aws_secret} denied",
        "Traceback (most recent call last):",
        '  File "/app/main.py", line 3, in <module>',
        f"PermissionError: upload with {jwt} refused",
        f"torch.OutOfMemoryError: CUDA out of memory. token {hf} on GPU 0",
        f"huggingface_hub.errors.HfHubHTTPError: 401 for hf_token={hf}",
    ]


def _log(path: Path, *secrets: tuple[str, str, str, str, str]) -> Path:
    lines = [line for five in secrets for line in _failures(*five)]
    path.write_text(
        "".join(IRIS.format(second=i) + line + "\n" for i, line in enumerate(lines)),
        encoding="utf-8",
    )
    return path


def _files(directory: Path) -> str:
    """Every file under `directory` as text (Parquet read back as CSV text too)."""
    texts = []
    for path in sorted(directory.rglob("*")):
        if path.suffix == ".parquet":
            texts.append(pl.read_parquet(path).write_csv())
        if path.is_file():
            texts.append(path.read_bytes().decode("utf-8", errors="replace"))
    return "\n".join(texts)


@pytest.fixture
def secret_log(tmp_path: Path) -> Path:
    return _log(tmp_path / "finelog.log", SECRETS, OTHERS)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_parse_tables_and_stdout_hold_no_secret(secret_log: Path, tmp_path: Path, fmt: str) -> None:
    """The errors table (text, message, signature) and the command's output hold no credential
    of either set, whole or a 12-character piece; the redaction markers show instead."""
    out = tmp_path / f"out-{fmt}"
    result = CliRunner().invoke(
        main, ["parse", str(secret_log), "--out", str(out), "--format", fmt]
    )
    assert result.exit_code == 1, result.output  # no metrics in this log: exit 1, tables written
    written = _files(out)
    assert "errors" in written or (out / f"errors.{fmt}").exists()
    assert leaks(written, SECRETS + OTHERS) == []
    assert leaks(result.output, SECRETS + OTHERS) == []
    errors = pl.read_parquet(out / "errors.parquet") if fmt == "parquet" else None
    if errors is None:
        errors = pl.read_csv(out / "errors.csv")
    assert errors.height == 14
    assert errors.get_column("signature").str.contains("<redacted:", literal=True).sum() >= 10


def test_signatures_output_holds_no_secret(secret_log: Path) -> None:
    """`rl-health signatures`, as text and as JSON, shows no credential; markers instead."""
    for args in ([], ["--format", "json"]):
        result = CliRunner().invoke(main, ["signatures", *args, str(secret_log)])
        assert result.exit_code == 0, result.output
        assert leaks(result.output, SECRETS + OTHERS) == []
        assert "<redacted:jwt>" in result.output
        assert "<redacted:hf-token>" in result.output


def test_lines_differing_only_in_a_secret_have_one_signature(secret_log: Path) -> None:
    """Each failure of the first set has the signature of the same failure with the second set's
    secrets: 7 distinct signatures for 14 rows (the block's first line is its final line's)."""
    errors = parse_log_file(secret_log, "finelog.log").errors
    assert errors.height == 14
    first, second = errors.head(7), errors.tail(7)
    assert first.get_column("signature").to_list() == second.get_column("signature").to_list()
    assert errors.get_column("signature").n_unique() == 7
    assert leaks(errors.write_csv(), SECRETS + OTHERS) == []


def test_a_line_without_a_secret_keeps_its_signature(tmp_path: Path) -> None:
    """Just short of a credential (a short token count, a path, a hex id), nothing is redacted:
    the signature is the normalised line as before, and the numbers still become `<n>`."""
    log = tmp_path / "finelog.log"
    log.write_text(
        IRIS.format(second=1) + "ValueError: bad token count 12 in /data/shard_7.json\n"
        + IRIS.format(second=2) + "KeyError: 'tokenizer_config' missing at step 40\n",
        encoding="utf-8",
    )  # fmt: skip
    errors = parse_log_file(log, "finelog.log").errors
    assert errors.get_column("signature").to_list() == [
        "ValueError: bad token count <n> in <path>",
        "KeyError: 'tokenizer_config' missing at step <n>",
    ]
    assert errors.get_column("text").str.contains("<redacted:", literal=True).sum() == 0


def test_single_value_signature_redacts_first() -> None:
    """`signature` on one value (as the gates use it) redacts before normalising: the digits of a
    token are never replaced inside it; and a redaction marker does not make it specific."""
    assert signature("ValueError", f"bad token {HF} given") == (
        "ValueError: bad token <redacted:hf-token> given"
    )
    assert signature("ValueError", f"bad token {OTHER_HF} given") == signature(
        "ValueError", f"bad token {HF} given"
    )
    from worker.evidence.failures import is_specific

    assert not is_specific(signature(None, None, f"exit code 1 {AWS_ID}"))
    assert is_specific(signature(None, None, f"exit code 1 quota {AWS_ID}"))


# --- the memory budget --------------------------------------------------------------------------


def _cli(*args: str | Path, memory_mb: int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHEALTH_")}
    env["RLHEALTH_PARSE_MEMORY_MB"] = str(memory_mb)
    return subprocess.run(
        [RL_HEALTH, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_signatures_past_the_budget_exits_2_with_one_line(tmp_path: Path) -> None:
    """40 MB of metric records under a 256 MB setting: exit 2, one line saying why (no
    traceback); the same records cut to 1 MB are read (exit 0)."""
    records = next(item for item in INPUTS if item.name == "metric_records")
    job = build(records, tmp_path, full=False)
    done = _cli("signatures", job, memory_mb=256)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("rl-health signatures: finelog.log could not be read within the parse")
    assert "memory budget of 256 MB" in line
    log = job / "finelog.log"
    log.write_bytes(log.read_bytes()[:1_000_000].rsplit(b"\n", 1)[0] + b"\n")
    done = _cli("signatures", job, memory_mb=256)
    assert done.returncode == 0, done.stderr
    assert "0 failure row(s)" in done.stdout


@pytest.mark.slow
def test_signatures_refuses_an_unusable_memory_setting(tmp_path: Path) -> None:
    """An unusable RLHEALTH_PARSE_MEMORY_MB is one line naming the setting, exit 2."""
    log = _log(tmp_path / "finelog.log", SECRETS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHEALTH_")}
    env["RLHEALTH_PARSE_MEMORY_MB"] = "lots"
    done = subprocess.run(
        [RL_HEALTH, "signatures", str(log)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "parse_memory_mb" in done.stderr and "Traceback" not in done.stderr
