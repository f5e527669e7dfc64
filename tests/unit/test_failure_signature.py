"""Failure signatures: run-specific tokens normalised away, and only specific ones count."""

from __future__ import annotations

import polars as pl
import pytest

from worker.evidence.failures import (
    is_specific,
    normalise,
    signature,
    signature_expr,
    specific_expr,
)
from worker.evidence.failures.signature import MAX_SIGNATURE


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("id 123e4567-e89b-12d3-a456-426614174000 gone", "id <uuid> gone"),
        ("see https://docs.ray.io/en/latest/x.html#y now", "see <url> now"),
        ("at 2026-05-01T12:00:03.123Z and 2024-04-11 16:38:16,464", "at <time> and <time>"),
        ("[E321 02:07:08.408271257 x]", "[E<n> <time> x]"),
        ("object at 0x7fc640bf6840>", "object at <hex>>"),
        ("from 10.200.84.247<58355> failed", "from <ip>:<port> failed"),
        ("peer 10.0.35.1:29500 closed", "peer <ip>:<port> closed"),
        ("node host-1.cluster.local:8080 down", "node <host>:<port> down"),
        ("Worker port: 43447, PID: 87687", "Worker port=<port>, pid=<pid>"),
        ("(pid=303727, ip=10.233.80.24)", "(pid=<pid>, ip=<ip>)"),
        ('File "/usr/lib/python3.12/x.py", line 3', 'File "<path>", line <n>'),
        ("actor_id=45822b92c9bd792e44a82fb201000000", "actor_id=<id>"),
        ("Tried to allocate 2.00 GiB on GPU 7", "Tried to allocate <n> GiB on GPU <n>"),
        ("a  \t lot   of space ", "a lot of space"),
    ],
)
def test_normalise_replaces_each_run_specific_token(text: str, expected: str) -> None:
    """uuids, urls, times, hex, ip:port, hosts, ports, pids, paths, ids and numbers become
    placeholders."""
    assert normalise(text) == expected


def test_the_same_failure_on_three_attempts_has_one_signature() -> None:
    """Pids, addresses, paths and sizes that differ between attempts do not split a signature."""
    messages = [
        f"NCCL error in: /pytorch/{path}/NCCLUtils.hpp:{line}, unhandled cuda error, pid={pid} "
        f"ip={ip}"
        for path, line, pid, ip in (
            ("a", 268, 1, "10.0.0.1"),
            ("b/c", 275, 22, "10.0.0.2"),
            ("d", 9, 333, "172.16.1.9"),
        )
    ]
    assert len({signature("DistBackendError", m) for m in messages}) == 1


def test_different_failures_keep_different_signatures() -> None:
    """A different exception type or different words are a different signature."""
    base = signature("ValueError", "max seq len (4096) is larger than the KV cache (3664)")
    assert base == "ValueError: max seq len (<n>) is larger than the KV cache (<n>)"
    assert signature("RuntimeError", "max seq len (4096) is larger than the KV cache") != base
    assert signature("ValueError", "No available memory for the cache blocks") != base


def test_signature_without_type_is_the_normalised_line() -> None:
    """A line that names no exception type is signed by its normalised text."""
    assert signature(None, None, "Engine core proc EngineCore_DP1 died unexpectedly") == (
        "Engine core proc EngineCore_DP<n> died unexpectedly"
    )
    assert signature("KeyboardInterrupt", "") == "KeyboardInterrupt"
    assert signature(None, None, "   ") is None


def test_signatures_are_truncated() -> None:
    """A signature never exceeds MAX_SIGNATURE characters."""
    found = signature("ValueError", "word " * 200)
    assert found is not None
    assert len(found) <= MAX_SIGNATURE


@pytest.mark.parametrize(
    ("sig", "specific"),
    [
        ("exit code <n>", False),
        ("FAILED", False),
        ("Killed", False),
        ("Terminated", False),
        ("Signal <n> (SIGKILL) received by PID <pid>", False),
        ("srun: error: nid<n>: tasks <n>: Exited with exit code <n>", False),
        ("exit code <n> abc", False),  # three letters: just short
        ("exit code <n> abcd", True),  # four letters: just past
        (None, False),
        ("", False),
        ("<n> <path> <hex>", False),
        ("ValueError: bad config", True),
        ("EngineCore encountered a fatal error.", True),
        ("OOMKilled", True),
        ("slurmstepd: error: *** STEP <n> CANCELLED AT <time> DUE TO TIME LIMIT ***", True),
    ],
)
def test_specific_signatures(sig: str | None, specific: bool) -> None:
    """Exit records (`exit code N`, Slurm's bare FAILED, a signal) are never a signature alone."""
    assert is_specific(sig) is specific


def test_vectorised_expressions_equal_the_functions() -> None:
    """Signing a frame gives, row for row, what the one-value functions give."""
    rows = {
        "exc_type": ["ValueError", None, "X"],
        "message": ["bad 12", None, ""],
        "text": ["ValueError: bad 12", "exit code 3", "X"],
    }
    frame = pl.DataFrame(rows, schema=dict.fromkeys(rows, pl.String))
    signed = frame.select(
        sig=signature_expr(pl.col("exc_type"), pl.col("message"), pl.col("text"))
    ).with_columns(specific=specific_expr(pl.col("sig")))
    expected = [signature(*values) for values in zip(*rows.values(), strict=True)]
    assert signed["sig"].to_list() == expected
    assert signed["specific"].to_list() == [is_specific(s) for s in expected]
