"""The capture policy: which evidence a diagnosis needs beyond the local bundle, and why. Pure.

1. The bundle is judged first. When its manifest is older than MAX_EVIDENCE_AGE_S (or has no
   `synced_at`), it is stale (`stale_reason`); the adapter (`worker.pipeline.capture`) then runs
   the configured watcher refresh.
2. `needs_live_probes` names the reasons to query the cluster: the manifest is missing or stale,
   the trainer log is missing, the attempt history is not in hand (the bundle never holds it),
   the controller state contradicts the log, or the trainer log has been quiet beyond
   STALL_FLOOR_S while the job may still run (`quiet_reason`: stacks and GPU state disappear with
   the job). No reason, no probe.
3. `choose_backend`: the live backend is the event's choice only when the operator enabled it.

The CLI (`rl-health diagnose --live`) and the pipeline apply the same policy; running the probes
is `worker.pipeline.capture`'s.
"""

from __future__ import annotations

from shared.settings import Settings
from worker.evidence.case import Evidence
from worker.evidence.jobstate import JobState

__all__ = [
    "BackendChoiceError",
    "choose_backend",
    "needs_live_probes",
    "quiet_reason",
    "stale_reason",
]


class BackendChoiceError(ValueError):
    """An event asked for a backend the operator did not enable."""


def choose_backend(requested: str | None, settings: Settings) -> str | None:
    """The live backend one capture probes through: the event's choice when the operator enabled
    it (RLHEALTH_BACKENDS, default RLHEALTH_BACKEND), else RLHEALTH_BACKEND; None: no live probe.
    Raises `BackendChoiceError` for a backend the operator did not enable (data never selects a
    tool on its own)."""
    enabled = settings.enabled_backends()
    if requested is None:
        return None if settings.backend == "none" else settings.backend
    if requested not in enabled:
        allowed = ", ".join(enabled) or "none (RLHEALTH_BACKEND=none)"
        raise BackendChoiceError(
            f"the event asks for backend {requested!r}, which the operator did not enable "
            f"(enabled: {allowed})"
        )
    return requested


def _terminal(state: str | None) -> bool:
    """The one job-state enum decides (`worker.evidence.jobstate`), whatever form the state has."""
    parsed = JobState.parse(state)
    return parsed is not None and parsed.terminal


def stale_reason(evidence: Evidence) -> str | None:
    """Why the bundle is stale (manifest older than MAX_EVIDENCE_AGE_S), or None when fresh."""
    bundle, limit = evidence.bundle, evidence.thresholds.max_evidence_age_s
    if bundle.manifest is None:
        return None
    if bundle.synced_at is None:
        return "bundle stale: the manifest has no synced_at"
    age = (evidence.now - bundle.synced_at).total_seconds()
    if age <= limit:
        return None
    return f"bundle stale: manifest synced_at is {age:.0f} s old (> MAX_EVIDENCE_AGE_S={limit:g})"


def quiet_reason(evidence: Evidence) -> str | None:
    """Why live stacks are needed: the trainer log is quiet beyond STALL_FLOOR_S, job not over."""
    if _terminal(evidence.bundle.state) or evidence.logs is None:
        return None
    last = evidence.logs.summary.last_timestamp
    floor = evidence.thresholds.stall_floor_s
    if last is None:
        return None
    quiet = (evidence.now - last).total_seconds()
    if quiet <= floor:
        return None
    return (
        f"trainer log quiet for {quiet:.0f} s (> STALL_FLOOR_S={floor:g}): stacks and GPU state "
        "disappear with the job"
    )


def _missing_reasons(evidence: Evidence) -> list[str]:
    bundle, found = evidence.bundle, []
    if bundle.manifest is None:
        found.append(f"manifest missing: {bundle.manifest_error or 'no manifest.json'}")
    if evidence.logs is None or evidence.logs.summary.lines == 0:
        found.append("trainer log missing or empty")
    return found


def _contradiction(evidence: Evidence) -> str | None:
    bundle = evidence.bundle
    last = evidence.logs.summary.last_timestamp if evidence.logs else None
    if _terminal(bundle.state) and bundle.finished_at and last and last > bundle.finished_at:
        finished, advanced = bundle.finished_at.isoformat(), last.isoformat()
        return (
            f"contradictory: controller state {bundle.state} (finished {finished}) but the log "
            f"advanced at {advanced}"
        )
    if not _terminal(bundle.state) and bundle.state and bundle.finished_at:
        return f"contradictory: controller state {bundle.state} but a finished_at is recorded"
    return None


def _attempts_reason(evidence: Evidence) -> str | None:
    """The bundle never holds the attempt history the restarts gate needs: the controller does."""
    if evidence.probes is not None and evidence.probes.attempts is not None:
        return None
    return "attempt history unavailable locally: the restarts gate needs the controller's"


def needs_live_probes(evidence: Evidence) -> tuple[str, ...]:
    """The reasons to query the cluster (empty: the bundle suffices). Pure."""
    reasons = [*_missing_reasons(evidence), stale_reason(evidence), _contradiction(evidence)]
    reasons.append(_attempts_reason(evidence))
    reasons.append(quiet_reason(evidence))
    return tuple(r for r in reasons if r)
