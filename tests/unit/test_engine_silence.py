"""Engines read by their own silence (worker.gates.engine_idle): vLLM logs every interval with
tokens at INFO and the others at DEBUG, so an engine's last line at 0 tok/s followed by nothing
is the idle signal; and engine stat lines dated after `now` are a discrepancy, never fresh."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from shared.models import GateStatus
from tests import factories as f
from worker.evidence.model import ClassFreshness
from worker.gates import resources
from worker.gates.engine_idle import engines_generated_since

ADVANCED = f.at(30)  # the trainer's newest advancement in these tests
RAY = "ray_vllm_logs/pod-0/worker-ab12-01000000-{pid}.out"


def stat(
    engine: int, minutes_ago: float, line: int, *, source: str | None = None, **values: float
) -> dict[str, Any]:
    """One ENGINES row of engine `engine` (its own Ray worker log); busy unless `values` say."""
    row = {"running": 48, "waiting": 6, "kv_cache_pct": 46.0, "generation_tokens_per_s": 2450.0}
    row |= {"prompt_tokens_per_s": 1200.0, **values}
    pid = 1000 + engine
    return {
        "timestamp": f.at(minutes_ago),
        "engine": f"{RAY.format(pid=pid)}/000",
        "source": source or RAY.format(pid=pid),
        "line": line,
        "attempt": 0,
        **row,
    }


def idle(engine: int, minutes_ago: float, line: int, **values: float) -> dict[str, Any]:
    """vLLM's last INFO line after generation stops: 0 tok/s, nothing running or waiting."""
    base = {"running": 0, "waiting": 0, "kv_cache_pct": 0.0}
    base |= {"generation_tokens_per_s": 0.0, "prompt_tokens_per_s": 0.0}
    return stat(engine, minutes_ago, line, **(base | values))


def fleet_then(last: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two engines busy from 50 to 33 min before NOW, then each engine's `last` line."""
    rows = [stat(e, 50 - i, 10 * e + i) for e in range(2) for i in range(18)]
    return rows + last


def silence(rows: list[dict[str, Any]], **bundle: Any) -> Any:
    ev = f.evidence(log_tables=f.logs(engines=rows), **bundle)
    return engines_generated_since(ev, ADVANCED)


# --- the idle signal ------------------------------------------------------------------------------


@pytest.mark.parametrize(("tokens", "holds"), [(0.0, True), (1.0, False)])
def test_a_last_line_at_zero_tokens_then_silence_is_the_idle_signal(
    tokens: float, holds: bool
) -> None:
    """Each engine's last line before the newest advancement at 0 tok/s with nothing running,
    then nothing, corroborates that no engine generated since; a last line at 1 tok/s followed
    by silence is a log that stopped, not idleness."""
    found = silence(
        fleet_then([idle(0, 32, 100), idle(1, 32, 200, generation_tokens_per_s=tokens)])
    )
    assert found.holds is holds, found.reason
    if not holds:
        assert "not the idle signal" in found.reason
        assert found.quotes and found.quotes[0].line == 200


@pytest.mark.parametrize(("running", "holds"), [(0, True), (1, False)])
def test_a_request_still_running_on_the_last_line_is_not_idle(running: int, holds: bool) -> None:
    """A last line at 0 tok/s with a request running and then silence is not the idle signal."""
    found = silence(fleet_then([idle(0, 32, 100), idle(1, 32, 200, running=running)]))
    assert found.holds is holds, found.reason


def test_a_silent_engine_holding_requests_generates_nothing_and_is_named() -> None:
    """A last line at 0 tok/s, none running, 23 waiting, then nothing: no tokens since either
    (a wedged engine), and the reason says that engines hold requests."""
    found = silence(fleet_then([idle(0, 32, 100), idle(1, 32, 200, waiting=23)]))
    assert found.holds
    assert "1 of them holding requests" in found.reason


def test_tokens_after_the_newest_advancement_are_generation() -> None:
    """An engine that logged tokens after the newest advancement generated, whatever its last
    line says."""
    rows = fleet_then([stat(0, 20, 100), idle(0, 19, 101), idle(1, 32, 200)])
    found = silence(rows)
    assert not found.holds
    assert found.reason == "engines generated after the newest advancement"


def test_silence_of_a_stale_ray_log_class_proves_nothing() -> None:
    """The silence of engines read from `ray_vllm_logs/` that the last sync did not refresh
    proves nothing; the same lines with the class fresh do."""
    rows = fleet_then([idle(0, 32, 100), idle(1, 32, 200)])
    stale = ClassFreshness(name="ray_logs", newest_mtime=f.at(32), age_s=1920.0, stale=True)
    fresh = stale.model_copy(update={"stale": False, "age_s": 60.0})
    assert not silence(rows, freshness={"ray_logs": stale}).holds
    assert silence(rows, freshness={"ray_logs": fresh}).holds


def test_no_engine_line_in_the_newest_attempt_corroborates_nothing() -> None:
    """Without a stat line of the newest attempt nothing can be read from silence."""
    rows = [{**r, "attempt": 1} for r in fleet_then([idle(0, 32, 100), idle(1, 32, 200)])]
    timer = {"event": "started", "phase": "step", "source": "finelog.log", "line": 1}
    ev = f.evidence(
        log_tables=f.logs(engines=rows, timers=[{**timer, "timestamp": f.at(60), "attempt": 2}])
    )
    assert engines_generated_since(ev, ADVANCED).reason.startswith("no vLLM engine stat line")


# --- stat lines dated after now ---------------------------------------------------------------


def _ahead(seconds: float) -> dict[str, Any]:
    row = stat(0, 0, 900, waiting=999)
    return {**row, "timestamp": f.NOW + timedelta(seconds=seconds)}


@pytest.mark.parametrize(("seconds", "stated"), [(61, True), (59, False)])
def test_an_engine_line_past_the_clock_tolerance_is_a_stated_discrepancy(
    seconds: float, stated: bool
) -> None:
    """CLOCK_TOLERANCE_S (60 s): an engine stat line 61 s after now is a discrepancy naming its
    lead; 59 s after is clock noise, not stated."""
    ev = f.evidence(log_tables=f.logs(engines=fleet_then([_ahead(seconds)])))
    found = [d for d in ev.facts.discrepancies() if "engine stat line" in d]
    assert bool(found) is stated
    if stated:
        assert "1 min 1 s ahead" in found[0] and ":900" in found[0]


def test_an_engine_line_after_now_is_never_idle_nor_busy_evidence() -> None:
    """A line dated after now makes the engine's silence unplaceable (no corroboration), and the
    resources gate neither counts it (its 999 waiting) nor keeps quiet about it."""
    rows = fleet_then([idle(0, 32, 100), idle(1, 32, 200), _ahead(300)])
    found = silence(rows)
    assert not found.holds and "after now" in found.reason
    recent = [stat(e, 12 - i, 500 + 20 * e + i) for e in range(2) for i in range(12)]
    result = resources.check(f.evidence(log_tables=f.logs(engines=[*recent, _ahead(300)])))
    assert result.status is GateStatus.PASS
    assert "waiting max 6" in result.summary
    assert "dated up to 5 min after now" in result.summary
