"""Recorded probes without `processes.json` know their processes as the live capture did: the
`ps` listing the backends record (`raw/ps-*.txt`) gives each process's command line, and a failed
dump's reason is read back from its `failed/` output."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from tests.corpus import raynode as rn
from tests.scenarios.builder import JobBuilder
from worker.evidence.probes import read_probes
from worker.evidence.roles import Role, roles_of

FIRST = datetime(2026, 7, 30, 19, 0, tzinfo=UTC)


def _probes(tmp_path: Path, *, listing: bool, **capture: object) -> Path:
    b = JobBuilder(tmp_path, "rl-roles", FIRST)
    procs = [rn.driver(), *[rn.rank(3001 + i, (rn.RANK_COLLECTIVE,) * 2) for i in range(2)]]
    procs += rn.ray_helpers()
    rn.Capture(procs, FIRST, **capture).record(b)  # type: ignore[arg-type]
    if not listing:
        b.probe_files = {k: v for k, v in b.probe_files.items() if not k.startswith("raw/")}
    probe_dir = b.write_probes(tmp_path / "probes")
    assert probe_dir is not None
    return probe_dir


def test_a_failed_dump_reads_back_with_its_reason(tmp_path: Path) -> None:
    """py-spy's error for the raylet comes back from `failed/stacks/...` as the command's reason."""
    probes = read_probes(_probes(tmp_path, listing=False))
    failed = [c for c in probes.commands if c.exit_code == 1]
    assert failed and all("Failed to find python version" in (c.why or "") for c in failed)


def test_a_native_process_is_known_by_its_failed_dump(tmp_path: Path) -> None:
    """Without any listing, the raylet whose dump found no Python interpreter is native."""
    roles = roles_of(read_probes(_probes(tmp_path, listing=False)))
    assert roles.of("ops_rl-roles_0", 112).role is Role.NATIVE


def test_a_timed_out_helper_is_known_by_the_recorded_listing(tmp_path: Path) -> None:
    """A dump that timed out says nothing; the recorded `ps` listing names the dashboard agent."""
    probe_dir = _probes(tmp_path, listing=True, timeouts={131})
    assert roles_of(read_probes(probe_dir)).of("ops_rl-roles_0", 131).role is Role.HELPER


def test_without_the_listing_a_timed_out_process_is_unknown(tmp_path: Path) -> None:
    """The same timed-out dump with no listing is unknown: a hole, never assumed a helper."""
    probe_dir = _probes(tmp_path, listing=False, timeouts={131})
    assert roles_of(read_probes(probe_dir)).of("ops_rl-roles_0", 131).role is Role.UNKNOWN
