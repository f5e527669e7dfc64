"""The watcher bundle reader: manifest generations, status strings, freshness, discrepancies."""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.settings import Thresholds
from worker.evidence.bundle import bundle_discrepancies, parse_artifact_status, read_bundle
from worker.evidence.model import ArtifactState

FIXTURES = Path(__file__).parents[1] / "fixtures" / "watcher"
JOB_NAME = "rl-tasktrove-x6-20260730-101418"
NOW = datetime(2026, 7, 30, 21, 15, tzinfo=UTC)
LIMITS = Thresholds()


def manifest(generation: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"manifest.{generation}.json").read_text())
    return data


def make_job(root: Path, data: dict[str, Any] | None, name: str = JOB_NAME) -> Path:
    job = root / "jobs" / "cw-rno2a" / "ops" / name
    job.mkdir(parents=True)
    if data is not None:
        (job / "manifest.json").write_text(json.dumps(data))
    return job


def touch(path: Path, when: datetime, text: str = "x\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    stamp = when.timestamp()
    os.utime(path, (stamp, stamp))


def fill(job: Path, when: datetime, pods: int = 4) -> None:
    """Files for every class, all modified at `when`."""
    touch(job / "finelog.log", when)
    for rank in range(pods):
        touch(job / "pod_logs" / f"iris-ops-rl-{rank}.log", when)
    touch(job / "ray_vllm_logs" / "iris-ops-rl-0" / "worker-1.out", when)
    touch(job / "trace_jobs" / "trial-1" / "result.json", when, "{}")


# --- generations ------------------------------------------------------------------------------


def test_newest_manifest_values(tmp_path: Path) -> None:
    """The newest generation reads identity, times, counts and the watcher's error."""
    info = read_bundle(make_job(tmp_path, manifest("newest")), NOW, LIMITS)
    assert info.manifest_error is None
    assert info.generation == "newest"
    assert info.job_id == f"/ops/{JOB_NAME}"
    assert (info.user, info.job_name, info.cluster) == ("ops", JOB_NAME, "cw-rno2a")
    assert (info.state, info.task_state) == ("running", "running")
    assert info.synced_at == datetime(2026, 7, 30, 21, 14, 52, 117204, tzinfo=UTC)
    assert info.submitted_at == datetime(2026, 7, 30, 10, 14, 18, tzinfo=UTC)
    assert info.finished_at is None
    assert info.trials_uri == "s3://bucket/tmp/ttl=14d/rl-tasktrove-x6/trace_jobs"
    assert info.entrypoint is not None and "main_harbor" in json.loads(info.entrypoint)["argv"][4]
    assert (info.trace_started, info.trace_completed, info.trace_selected) == (3904, 3871, None)
    assert info.errors == (
        "iris-ops-rl-tasktrove-x6-0 Ray/vLLM: Could not archive Ray/vLLM logs (exit=1)",
    )


def test_newest_manifest_statuses(tmp_path: Path) -> None:
    """Each artifact string of the newest manifest becomes a structured status."""
    statuses = read_bundle(make_job(tmp_path, manifest("newest")), NOW, LIMITS).statuses
    assert statuses["finelog"].state is ArtifactState.PRESENT
    assert statuses["finelog"].count == 412_877
    assert (statuses["pod_logs"].count, statuses["pod_logs"].detail) == (4, "pod(s), 4 Running")
    assert statuses["ray_logs"].count == 1318
    traces = statuses["traces"]
    assert traces.state is ArtifactState.PRESENT
    assert (traces.count, traces.available, traces.copied, traces.skipped) == (212, 3904, 37, 2)
    assert "212 of 3904" in traces.detail
    assert "500 of 7311 total" in traces.detail
    assert statuses["slurm_logs"].state is ArtifactState.NOT_APPLICABLE


def test_intermediate_manifest_lacks_task_state(tmp_path: Path) -> None:
    """The intermediate generation has finished_at_ms but no task_state nor trace_selected."""
    info = read_bundle(make_job(tmp_path, manifest("intermediate")), NOW, LIMITS)
    assert info.generation == "intermediate"
    assert info.task_state is None
    assert info.trace_selected is None
    assert info.errors == ()
    assert info.statuses["traces"].count == 212


def test_oldest_manifest_reads_the_old_traces_form(tmp_path: Path) -> None:
    """The oldest generation's `newest <sel>/<avail> traces` string gives the same fields."""
    info = read_bundle(make_job(tmp_path, manifest("oldest")), NOW, LIMITS)
    assert info.generation == "oldest"
    assert info.finished_at is None
    traces = info.statuses["traces"]
    assert traces.state is ArtifactState.PRESENT
    assert (traces.count, traces.available, traces.copied, traces.skipped) == (500, 3904, 37, 2)


def test_missing_keys_are_unknown_not_fine(tmp_path: Path) -> None:
    """An artifact key that is absent gives UNKNOWN with no raw string, and None fields."""
    data = manifest("oldest")
    del data["artifacts"]["ray_logs"]
    del data["artifacts"]["trace_started"]
    del data["synced_at"]
    info = read_bundle(make_job(tmp_path, data), NOW, LIMITS)
    assert info.statuses["ray_logs"].state is ArtifactState.UNKNOWN
    assert info.statuses["ray_logs"].raw is None
    assert info.trace_started is None
    assert info.synced_at is None


def test_cluster_falls_back_to_the_job_cluster_name(tmp_path: Path) -> None:
    """Without a top-level `cluster`, job.cluster.name names the cluster."""
    data = manifest("newest")
    del data["cluster"]
    assert read_bundle(make_job(tmp_path, data), NOW, LIMITS).cluster == "cw-rno2a"


@pytest.mark.parametrize(
    ("raw", "state", "count"),
    [
        ("synced", ArtifactState.PRESENT, None),
        ("current tail (1 line)", ArtifactState.PRESENT, 1),
        ("2 directories synced", ArtifactState.PRESENT, 2),
        ("1,318 files", ArtifactState.PRESENT, 1318),
        ("newest 1 selected", ArtifactState.PRESENT, 1),
        ("partial: 3 of 4 pods", ArtifactState.PARTIAL, None),
        ("unavailable", ArtifactState.UNAVAILABLE, None),
        ("not requested", ArtifactState.NOT_REQUESTED, None),
        ("not requested (terminal)", ArtifactState.NOT_REQUESTED, None),
        ("not applicable (Jupiter)", ArtifactState.NOT_APPLICABLE, None),
        ("no pod yet", ArtifactState.WAITING, None),
        ("awaiting host", ArtifactState.WAITING, None),
        ("something new", ArtifactState.UNKNOWN, None),
    ],
)
def test_status_strings(raw: str, state: ArtifactState, count: int | None) -> None:
    """Each known status form maps to its state and count; an unknown one keeps its raw text."""
    status = parse_artifact_status("x", raw)
    assert (status.state, status.count, status.raw) == (state, count, raw)


def test_a_non_string_status_is_unknown() -> None:
    """A number where a status string belongs is UNKNOWN, with its JSON kept as raw."""
    status = parse_artifact_status("finelog", 12)
    assert (status.state, status.raw) == (ArtifactState.UNKNOWN, "12")


# --- manifest problems ------------------------------------------------------------------------


def test_missing_manifest_is_reported_not_raised(tmp_path: Path) -> None:
    """Without manifest.json the info says why and every status is UNKNOWN."""
    info = read_bundle(make_job(tmp_path, None), NOW, LIMITS)
    assert info.manifest is None
    assert info.manifest_error == "manifest.json is missing"
    assert {s.state for s in info.statuses.values()} == {ArtifactState.UNKNOWN}
    assert "manifest.json is missing" in bundle_discrepancies(info)


def test_unparseable_manifest_is_reported(tmp_path: Path) -> None:
    """A manifest cut off mid-write gives manifest_error, not an exception."""
    job = make_job(tmp_path, None)
    (job / "manifest.json").write_text('{"job_id": "/ops/x", ')
    info = read_bundle(job, NOW, LIMITS)
    assert info.manifest is None
    assert info.manifest_error is not None and "does not parse" in info.manifest_error


def test_manifest_that_is_a_list_is_reported(tmp_path: Path) -> None:
    """A JSON value that is not an object is not a manifest."""
    job = make_job(tmp_path, None)
    (job / "manifest.json").write_text("[1, 2]")
    assert read_bundle(job, NOW, LIMITS).manifest_error == (
        "manifest.json is not a JSON object but list"
    )


def test_manifest_symlink_out_of_the_job_is_refused(tmp_path: Path) -> None:
    """A manifest.json linking outside the job directory is not read and is listed."""
    job = make_job(tmp_path, None)
    (tmp_path / "foreign.json").write_text(json.dumps(manifest("newest")))
    (job / "manifest.json").symlink_to(tmp_path / "foreign.json")
    info = read_bundle(job, NOW, LIMITS)
    assert info.manifest is None
    assert len(info.refused_paths) == 1
    assert info.refused_paths[0] in bundle_discrepancies(info)


# --- freshness --------------------------------------------------------------------------------


@pytest.mark.parametrize("generation", ["newest", "intermediate", "oldest"])
def test_fresh_bundle_of_each_generation(tmp_path: Path, generation: str) -> None:
    """Files written two minutes before now are fresh in every class, with their age."""
    job = make_job(tmp_path, manifest(generation))
    fill(job, NOW - timedelta(minutes=2))
    info = read_bundle(job, NOW, LIMITS)
    for name in ("finelog", "pod_logs", "ray_logs", "traces"):
        fresh = info.freshness[name]
        assert not fresh.stale, fresh
        assert fresh.newest_mtime == NOW - timedelta(minutes=2)
    for name in ("pod_logs", "ray_logs", "traces"):
        assert info.freshness[name].age_s == pytest.approx(120, abs=1)
    assert info.synced_at is not None
    synced_age = (NOW - info.synced_at).total_seconds()  # the sweep refreshed the finelog
    assert info.freshness["finelog"].age_s == pytest.approx(synced_age, abs=1)
    assert info.freshness["pod_logs"].n_files == 4


@pytest.mark.parametrize("generation", ["newest", "intermediate", "oldest"])
def test_old_files_are_stale(tmp_path: Path, generation: str) -> None:
    """A class whose newest file is older than MAX_EVIDENCE_AGE_S is stale, with the reason."""
    job = make_job(tmp_path, manifest(generation))
    fill(job, NOW - timedelta(minutes=2))
    old = NOW - timedelta(hours=2)
    for path in (job / "pod_logs").iterdir():
        os.utime(path, (old.timestamp(), old.timestamp()))
    info = read_bundle(job, NOW, LIMITS)
    assert info.freshness["pod_logs"].stale
    assert "2 h old" in info.freshness["pod_logs"].reason
    assert not info.freshness["finelog"].stale


def test_newest_file_decides_the_class_age(tmp_path: Path) -> None:
    """One fresh file among old ones keeps the class fresh."""
    job = make_job(tmp_path, manifest("newest"))
    touch(job / "ray_vllm_logs" / "p0" / "old.err", NOW - timedelta(hours=5))
    touch(job / "ray_vllm_logs" / "p1" / "new.out", NOW - timedelta(seconds=30))
    fresh = read_bundle(job, NOW, LIMITS).freshness["ray_logs"]
    assert not fresh.stale
    assert fresh.age_s == pytest.approx(30, abs=1)


def test_claimed_but_absent_files_are_stale(tmp_path: Path) -> None:
    """A status claiming 4 pods with an empty pod_logs/ is stale and a discrepancy."""
    job = make_job(tmp_path, manifest("newest"))
    touch(job / "finelog.log", NOW)
    info = read_bundle(job, NOW, LIMITS)
    pods = info.freshness["pod_logs"]
    assert pods.stale
    assert pods.newest_mtime is None
    assert "claims files" in pods.reason
    assert any("pod_logs holds no file" in line for line in bundle_discrepancies(info))


def test_absent_files_without_a_claim_are_not_stale(tmp_path: Path) -> None:
    """No files where the status says `not requested` is not stale, only empty."""
    data = manifest("newest")
    data["artifacts"]["pod_logs"] = "not requested (terminal)"
    info = read_bundle(make_job(tmp_path, data), NOW, LIMITS)
    assert not info.freshness["pod_logs"].stale
    assert info.freshness["pod_logs"].reason == "no files"


def test_threshold_comes_from_settings(tmp_path: Path) -> None:
    """A tighter max_evidence_age_s makes the same files stale."""
    job = make_job(tmp_path, manifest("newest"))
    fill(job, NOW - timedelta(minutes=2))
    info = read_bundle(job, NOW, Thresholds(max_evidence_age_s=60))
    assert info.freshness["pod_logs"].stale


def test_naive_now_is_taken_as_utc(tmp_path: Path) -> None:
    """A naive `now` is read as UTC rather than raising on subtraction."""
    job = make_job(tmp_path, manifest("newest"))
    touch(job / "pod_logs" / "rank-0.log", NOW - timedelta(minutes=1))
    info = read_bundle(job, NOW.replace(tzinfo=None), LIMITS)
    assert info.freshness["pod_logs"].age_s == pytest.approx(60, abs=1)


def test_unchanged_finelog_is_fresh_when_the_sweep_is(tmp_path: Path) -> None:
    """A quiet job's finelog keeps its old mtime; a fresh sweep that reported it present still
    refreshed it, so it is not stale — but an old sweep leaves it stale."""
    job = make_job(tmp_path, manifest("newest"))
    touch(job / "finelog.log", NOW - timedelta(hours=3))
    fresh = read_bundle(job, NOW, LIMITS).freshness["finelog"]
    assert not fresh.stale
    assert fresh.newest_mtime == NOW - timedelta(hours=3)
    stale = read_bundle(job, NOW + timedelta(hours=1), LIMITS).freshness["finelog"]
    assert stale.stale


def test_symlinked_log_leaving_the_job_is_not_used_for_freshness(tmp_path: Path) -> None:
    """A pod log that links outside the job directory is refused and not counted."""
    job = make_job(tmp_path, manifest("newest"))
    touch(tmp_path / "outside.log", NOW)
    (job / "pod_logs").mkdir()
    (job / "pod_logs" / "rank-0.log").symlink_to(tmp_path / "outside.log")
    info = read_bundle(job, NOW, LIMITS)
    assert info.freshness["pod_logs"].n_files == 0
    assert len(info.refused_paths) == 1


# --- discrepancies ----------------------------------------------------------------------------


def test_pod_count_mismatch_is_a_discrepancy(tmp_path: Path) -> None:
    """Two pod logs against `4 pod(s)` is reported, and nothing is repaired."""
    job = make_job(tmp_path, manifest("newest"))
    fill(job, NOW, pods=2)
    info = read_bundle(job, NOW, LIMITS)
    lines = bundle_discrepancies(info)
    assert "artifacts.pod_logs says '4 pod(s), 4 Running' but pod_logs/ holds 2 file(s)" in lines
    assert info.statuses["pod_logs"].count == 4


def test_job_id_not_matching_the_directory(tmp_path: Path) -> None:
    """A manifest for another job than its directory names is a discrepancy."""
    info = read_bundle(make_job(tmp_path, manifest("newest"), name="other-job"), NOW, LIMITS)
    assert any(
        "does not match the directory name 'other-job'" in x for x in bundle_discrepancies(info)
    )


def test_watcher_errors_and_unknown_statuses_are_listed(tmp_path: Path) -> None:
    """The watcher's own errors and unrecognised status strings appear in the discrepancies."""
    data = manifest("newest")
    data["artifacts"]["finelog"] = "exploded"
    info = read_bundle(make_job(tmp_path, data), NOW, LIMITS)
    lines = bundle_discrepancies(info)
    assert "artifacts.finelog: status 'exploded' not recognised" in lines
    assert any(line.startswith("watcher reported: iris-ops") for line in lines)


# --- robustness -------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
KEYS = st.sampled_from(
    ["job_id", "cluster", "synced_at", "trials_uri", "job", "artifacts", "bundle_format"]
)
JOB_KEYS = st.sampled_from(
    ["state", "task_state", "submitted_at_ms", "finished_at_ms", "entrypoint", "cluster", "job_id"]
)
ARTIFACT_KEYS = st.sampled_from(
    ["finelog", "pod_logs", "ray_logs", "traces", "trace_started", "trace_selected", "errors"]
)
MANIFESTS = st.one_of(
    JSON,
    st.dictionaries(KEYS, JSON),
    st.fixed_dictionaries(
        {"job": st.dictionaries(JOB_KEYS, JSON), "artifacts": st.dictionaries(ARTIFACT_KEYS, JSON)}
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=MANIFESTS)
def test_arbitrary_manifest_json_never_raises(data: object) -> None:
    """Any JSON value in manifest.json gives a BundleInfo, never an exception."""
    with tempfile.TemporaryDirectory() as root:
        job = Path(root) / "job"
        job.mkdir()
        (job / "manifest.json").write_text(json.dumps(data))
        info = read_bundle(job, NOW, LIMITS)
        bundle_discrepancies(info)
        assert (info.manifest is None) == (not isinstance(data, dict))
