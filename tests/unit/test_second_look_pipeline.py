"""The second look in the pipeline, without a broker: when it is due, the countdown task that
replaces the verdict (no sleep), the lease kept past the countdown, the frozen second look that a
replay judges without waiting or probing, and its rendering in the text, JSON and HTML reports."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from reports.html import render_html
from reports.json_report import render_json
from reports.text import render_text
from shared.models import Event, Report, SecondLookOutcome, Verdict
from shared.settings import Settings
from tests.factories import NOW
from tests.unit.test_second_look import (
    LATER,
    MOVING,
    _dumps,
    _first,
    _look,
    _probe,
    _second,
)
from worker.diagnosis import GATE_NAMES, judge, run_gate
from worker.evidence.case import Evidence
from worker.evidence.frozen import freeze
from worker.pipeline import second_look as look_module
from worker.pipeline import tasks
from worker.pipeline.second_look import MIN_LOOK_WAIT_S
from worker.pipeline.steps import Pipeline
from worker.pipeline.store import MemoryStore
from worker.pipeline.watchdog import Watchdog

LEAD = "evt-stall"


def _pipeline(tmp_path: Path, **settings: Any) -> Pipeline:
    settings.setdefault("backend", "local")
    base = Settings(
        bundle_root=tmp_path / "bundles", stream_prefix="t", lease_s=5,
        cache_dir=tmp_path / "cache", **settings,
    )  # fmt: skip
    return Pipeline(base, MemoryStore(), fakeredis.FakeRedis())


def _frozen(p: Pipeline, evidence: Evidence, evidence_id: str = LEAD) -> list[dict[str, Any]]:
    """Freeze `evidence` as the capture would, archive its event; the gate results."""
    with tempfile.TemporaryDirectory() as tmp:
        for path in freeze(evidence, Path(tmp)):
            key = f"evidence/{evidence_id}/{path.relative_to(tmp).as_posix()}"
            p.store.put_once(key, path.read_bytes())
    p.events.archive(Event(event_id=evidence_id, job_dir="jobs/cw/ops/rl-job", published_at=NOW))
    p.leases.register(evidence_id, "jobs/cw/ops/rl-job", evidence_id, "")
    results = [run_gate(name, evidence) for name in GATE_NAMES]
    return [
        {"name": name, "result": r.model_dump(mode="json")}
        for name, r in zip(GATE_NAMES, results, strict=True)
    ]


class Looks:
    """The adapter edge, faked: `observe_again` returns the given second observations."""

    def __init__(self, *seen: Evidence) -> None:
        self.seen = list(seen)
        self.calls = 0

    def __call__(self, event: Event, first: Evidence, settings: Settings, **_: Any) -> Evidence:
        self.calls += 1
        return self.seen.pop(0)


def _report(p: Pipeline, entry: dict[str, Any]) -> dict[str, Any]:
    key = entry["report_uri"].removeprefix(p.store.uri(""))
    return dict(json.loads(p.store.get(key)))


# --- when it is due -------------------------------------------------------------------------------


def _at_first_dumps(p: Pipeline, later_s: float = 0.0) -> None:
    """The pipeline's clock `later_s` after the first look's newest dump (`_first`: at NOW)."""
    p.looks.clock = lambda: NOW.timestamp() + later_s


@pytest.mark.parametrize(("reobserve_s", "due"), [(60.0, 60.0), (0.0, None)])
def test_a_stall_kill_waits_reobserve_s_and_zero_turns_it_off(
    tmp_path: Path, reobserve_s: float, due: float | None
) -> None:
    """A KILL on stacks waits RLHEALTH_REOBSERVE_S; with 0 it is decided at once, no look."""
    p = _pipeline(tmp_path, reobserve_s=reobserve_s)
    _at_first_dumps(p)
    results = _frozen(p, _first())
    plan = p.plan_verdict(results, LEAD, LEAD)
    if due is None:
        assert plan["entry"]["verdict"] == "KILL"
        assert _report(p, plan["entry"])["second_look"] is None
    else:
        assert plan == {"look_in_s": due}
        assert p.publisher.decided(LEAD) is None  # nothing stored or decided before the second look


@pytest.mark.parametrize(
    ("later_s", "due"), [(15.0, 45.0), (59.0, 1.0), (61.0, MIN_LOOK_WAIT_S), (-5.0, 60.0)]
)
def test_the_look_is_due_reobserve_s_after_the_first_look_dumps(
    tmp_path: Path, later_s: float, due: float
) -> None:
    """The countdown runs from the newest dump the proof quotes, not from the verdict: 15 s
    after it, 45 s are left; past RLHEALTH_REOBSERVE_S, the shortest countdown; a clock behind
    the dumps waits the whole of it."""
    p = _pipeline(tmp_path, reobserve_s=60)
    _at_first_dumps(p, later_s)
    plan = p.plan_verdict(_frozen(p, _first()), LEAD, LEAD)
    assert plan == {"look_in_s": due}


@pytest.mark.parametrize("backends", [{"backend": "none"}, {"backend": "iris"}])
def test_without_a_backend_to_look_through_it_is_error_at_once(
    tmp_path: Path, backends: dict[str, str]
) -> None:
    """No live backend (or none the event may use): nothing to wait for; the blind look is ERROR
    at once, never the first look's KILL."""
    p = _pipeline(tmp_path, reobserve_s=60, **backends)
    results = _frozen(p, _first())
    if backends["backend"] == "iris":  # the event asks for one the operator did not enable
        p.store.delete(f"events/{LEAD}.json")
        job = "jobs/cw/ops/rl-job"
        p.events.archive(Event(event_id=LEAD, job_dir=job, published_at=NOW, backend="slurm"))
    plan = p.plan_verdict(results, LEAD, LEAD)
    assert "look_in_s" not in plan
    assert plan["entry"]["verdict"] == "ERROR"
    look = _report(p, plan["entry"])["second_look"]
    assert look is not None and look["outcome"] == "blind"


@pytest.mark.parametrize("recorded", [{"probes": "probes/rl-job"}, {"now": NOW}])
def test_an_event_judged_on_recorded_evidence_takes_no_second_look(
    tmp_path: Path, recorded: dict[str, Any]
) -> None:
    """Recorded probes named by the event, or a fixed `now`, are judged as recorded (as
    `diagnose --probes` does): there is no live job behind them to look at again."""
    p = _pipeline(tmp_path, reobserve_s=60)
    results = _frozen(p, _first())
    p.store.delete(f"events/{LEAD}.json")
    p.events.archive(
        Event(event_id=LEAD, job_dir="jobs/cw/ops/rl-job", published_at=NOW, **recorded)
    )
    plan = p.plan_verdict(results, LEAD, LEAD)
    assert plan["entry"]["verdict"] == "KILL"
    assert _report(p, plan["entry"])["second_look"] is None


def test_a_verdict_that_is_not_a_kill_on_stacks_takes_no_second_look(tmp_path: Path) -> None:
    """The same quiet log without stacks is an ERROR (stacks needed), not a KILL: no look."""
    p = _pipeline(tmp_path, reobserve_s=60)
    report = judge(_look(now=NOW, probes=_probe(NOW)))
    assert report.verdict is not Verdict.KILL
    assert p.looks.wait(report, LEAD, LEAD) is None


# --- the countdown task -------------------------------------------------------------------------


def test_the_verdict_task_hands_over_to_a_countdown_not_a_sleep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verdict task replaces itself by `rlhealth.second_look` with countdown=REOBSERVE_S
    (the worker's main process holds the message: no slot waits); nothing sleeps; the lease
    runs out no sooner than the countdown plus a lease."""
    p = _pipeline(tmp_path, reobserve_s=30)
    _at_first_dumps(p)
    results = _frozen(p, _first())
    monkeypatch.setattr(tasks, "pipeline", lambda: p)
    monkeypatch.setattr(tasks, "settings", lambda: p.settings)
    monkeypatch.setattr(time, "sleep", _no_sleep)
    replaced: list[Any] = []
    monkeypatch.setattr(tasks.verdict, "replace", replaced.append, raising=False)
    before_ms = time.time() * 1000
    tasks.verdict.run(results, LEAD, LEAD, lead=LEAD, deadline=time.time() + 600)
    (sig,) = replaced
    assert sig.task == "rlhealth.second_look" and sig.options["countdown"] == 30.0
    assert sig.args == (results, LEAD, LEAD) and sig.kwargs["lead"] == LEAD
    deadline_ms = p.leases.deadline_ms(LEAD)
    assert deadline_ms is not None and deadline_ms >= before_ms + 30_000 + 5_000 - 50


def _no_sleep(seconds: float) -> None:
    raise AssertionError(f"the second look slept {seconds} s instead of a countdown")


def test_a_countdown_longer_than_the_lease_keeps_the_watchdog_away(tmp_path: Path) -> None:
    """Lease 5 s, countdown 30 s: extended, the lead is not expired and the watchdog sends
    nothing; the same lead whose lease ran out (the control) is sent again."""
    p = _pipeline(tmp_path)
    p.leases.register(LEAD, "job", LEAD, "")
    sent: list[tuple[str, str, str]] = []
    watchdog = Watchdog(p, lambda *args: sent.append(args))
    assert p.leases.extend(LEAD, 30)
    now_ms = time.time() * 1000
    deadline_ms = p.leases.deadline_ms(LEAD)
    assert deadline_ms is not None and deadline_ms - now_ms > 30_000  # past the countdown
    assert watchdog.tick() == 0 and sent == []
    p.redis.zadd(p.names.leases, {LEAD: 0})  # as it would be without the extension, 5 s on
    assert watchdog.tick() == 1 and [s[0] for s in sent] == [LEAD]


def test_a_lease_extension_never_shortens_and_skips_unknown_leads(tmp_path: Path) -> None:
    p = _pipeline(tmp_path)
    p.leases.register(LEAD, "job", LEAD, "")
    assert p.leases.extend(LEAD, 60)
    long = p.leases.deadline_ms(LEAD)
    assert not p.leases.extend(LEAD, 1) and p.leases.deadline_ms(LEAD) == long
    assert not p.leases.extend("unknown", 60) and p.leases.deadline_ms("unknown") is None


# --- the step, frozen, and the replay -----------------------------------------------------------


def test_still_wedged_is_kill_frozen_and_replayed_without_probing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look is frozen under evidence/<id>/second_look/; the KILL quotes both observations;
    a replay on the frozen evidence judges the frozen look at once (no wait, no probe)."""
    p = _pipeline(tmp_path, reobserve_s=60)
    results = _frozen(p, _first())
    looks = Looks(_second())
    monkeypatch.setattr(look_module, "observe_again", looks)
    entry = p.second_look(results, LEAD, LEAD, scheduled_at=time.time() - 61)
    report = _report(p, entry)
    assert entry["verdict"] == "KILL" and looks.calls == 1
    assert report["second_look"]["outcome"] == "confirmed"
    since_first_dumps = time.time() - NOW.timestamp()  # counted from the first look's dumps
    assert report["second_look"]["waited_s"] >= since_first_dumps - 60
    sources = [q["source"] for q in report["kill_proof"]["evidence"]]
    assert any(s.startswith("probes/stacks/") for s in sources)
    assert any(s.startswith("second_look/probes/stacks/") for s in sources)
    assert p.store.exists(f"evidence/{LEAD}/second_look/evidence.json")
    assert p.store.exists(f"evidence/{LEAD}/second_look/look.json")
    replay = p.plan_verdict(results, "evt-replay", LEAD)  # no look left to give: would raise
    assert replay["entry"]["verdict"] == "KILL" and looks.calls == 1
    replayed = _report(p, replay["entry"])
    assert replayed["second_look"] == report["second_look"]
    assert replayed["kill_proof"] == report["kill_proof"]


def test_a_replay_of_a_diagnosis_without_a_second_look_takes_none(tmp_path: Path) -> None:
    """The original took no look (REOBSERVE_S=0 then): the replay neither waits nor probes."""
    p = _pipeline(tmp_path, reobserve_s=60)
    results = _frozen(p, _first())
    plan = p.plan_verdict(results, "evt-replay", LEAD)
    assert plan["entry"]["verdict"] == "KILL"
    assert _report(p, plan["entry"])["second_look"] is None


def test_a_job_that_moved_is_no_kill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _pipeline(tmp_path, reobserve_s=60)
    results = _frozen(p, _first())
    moved = _second(probes=_probe(LATER, stacks=_dumps(LATER, texts=(MOVING, MOVING))))
    monkeypatch.setattr(look_module, "observe_again", Looks(moved))
    entry = p.second_look(results, LEAD, LEAD, scheduled_at=time.time() - 60)
    report = _report(p, entry)
    assert (entry["verdict"], report["kill_proof"]) == ("NO-KILL", None)
    assert report["second_look"]["outcome"] == "moved"
    assert "re-alert" in report["flip_signal"]


def test_a_second_look_that_breaks_is_error_not_a_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundle cannot be read again: the look is blind, the verdict ERROR."""
    p = _pipeline(tmp_path, reobserve_s=60)
    results = _frozen(p, _first())

    def broken(event: Event, first: Evidence, settings: Settings) -> Evidence:
        raise FileNotFoundError("jobs/cw/ops/rl-job is gone")

    monkeypatch.setattr(look_module, "observe_again", broken)
    entry = p.second_look(results, LEAD, LEAD, scheduled_at=time.time())
    report = _report(p, entry)
    assert entry["verdict"] == "ERROR" and report["second_look"]["outcome"] == "blind"


# --- rendering ----------------------------------------------------------------------------------


def _settled() -> Report:
    from worker.second_look import compare, observe, settle

    report = judge(_first())
    look = compare(observe(_first()), observe(_second(), prefix="second_look/"), 60.0)
    assert look.outcome is SecondLookOutcome.CONFIRMED
    return settle(report, look)


def test_the_text_report_closes_liveness_with_the_second_look() -> None:
    """One `second look —` line right after the LIVENESS lines, its quotes indented under it."""
    lines = render_text(_settled()).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  second look — "))
    head = "  second look — confirmed after 1 min (taken 2026-07-30T21:16:00Z)"
    assert lines[at].startswith(head)
    resources = next(i for i, line in enumerate(lines) if line.startswith("RESOURCES:"))
    liveness = next(i for i, line in enumerate(lines) if line.startswith("LIVENESS:"))
    assert liveness < at < resources
    assert all(line.startswith("    ") for line in lines[at + 1 : resources])
    assert "second_look/probes/stacks/" in "\n".join(lines[at:resources])
    assert "second look" not in render_text(judge(_first()))


def test_the_json_and_html_reports_carry_the_second_look() -> None:
    report = _settled()
    document = json.loads(render_json(report))
    assert document["second_look"]["outcome"] == "confirmed"
    assert document["second_look"]["taken_at"] == "2026-07-30T21:16:00Z"
    assert json.loads(render_json(judge(_first())))["second_look"] is None
    page = render_html(report)
    assert 'id="second-look"' in page and "second_look/probes/stacks/" in page
    assert 'id="second-look"' not in render_html(judge(_first()))


def test_one_delivery_at_a_time_takes_the_look_the_other_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one task holds the second look's claim another waits (CaptureBusyError, retried);
    once the look is frozen, any delivery judges the frozen one without probing again."""
    from worker.pipeline.claim import CaptureClaim
    from worker.pipeline.steps import CaptureBusyError

    p = _pipeline(tmp_path, reobserve_s=60)
    results = _frozen(p, _first())
    looks = Looks(_second())
    monkeypatch.setattr(look_module, "observe_again", looks)
    other = CaptureClaim(p.redis, p.names.capture_claim(f"{LEAD}:second-look"), "task-a", 60)
    assert other.acquire()
    with pytest.raises(CaptureBusyError, match="another second look"):
        p.second_look(results, LEAD, LEAD, scheduled_at=time.time(), claim="task-b")
    assert looks.calls == 0
    other.release()
    first = p.second_look(results, LEAD, LEAD, scheduled_at=time.time(), claim="task-a")
    p.redis.delete(p.names.entry(LEAD))  # as if task-a died before its entry was kept
    again = p.second_look(results, LEAD, LEAD, scheduled_at=time.time(), claim="task-b")
    assert looks.calls == 1 and again["verdict"] == first["verdict"] == "KILL"
