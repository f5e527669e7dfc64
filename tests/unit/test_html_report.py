"""The HTML report: self-contained, everything at a glance, every piece of evidence escaped."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from reports import html as html_module
from reports.html import CSP, escape, html_key, render_html
from reports.plots import MAX_POINTS
from shared.models import (
    Confidence,
    GateName,
    GateResult,
    GateStatus,
    KillProof,
    Mode,
    Quote,
    Report,
    RestartsResult,
    Verdict,
)
from tests import factories as f
from worker.diagnosis import collect_evidence, judge
from worker.pipeline import sinks
from worker.pipeline.sinks import store_html
from worker.pipeline.store import MemoryStore

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples/jobs/cw-rno2a/ops/rl-gsm8k-stalled"
DEMO_PROBES = ROOT / "examples/probes/rl-gsm8k-stalled"
DEMO_NOW = datetime(2026, 7, 30, 19, 17, tzinfo=UTC)
HOSTILE = "<script>alert('x')</script> & \"q\" \x1b[2J\u202edlrow"


@pytest.fixture(scope="module")
def demo() -> tuple[Report, Any]:
    evidence = collect_evidence(DEMO, now=DEMO_NOW, probes_dir=DEMO_PROBES)
    return judge(evidence), evidence


@pytest.fixture(scope="module")
def demo_html(demo: tuple[Report, Any]) -> str:
    return render_html(*demo)


def _report(verdict: Verdict = Verdict.NO_KILL, text: str = "ok", **changes: Any) -> Report:
    gate = GateResult(
        status=GateStatus.PASS,
        summary=text,
        evidence=(Quote(source="finelog.log", line=7, text=text),),
        details=(text,),
    )
    base: dict[str, Any] = {
        "job_id": "/ops/rl-job",
        "captured_at": f.NOW,
        "evidence_dir": "jobs/cw/ops/rl-job",
        "verdict": verdict,
        "confidence": Confidence.HIGH,
        "mode": Mode.STANDARD,
        "restarts": RestartsResult(count=0, same_failure=None, interpretation=text),
        "gates": dict.fromkeys(GateName, gate),
        "reasoning": text,
        "next_action": text,
        "flip_signal": text,
    }
    return Report(**(base | changes))


def test_the_demo_report_has_the_verdict_every_gate_and_every_plot(demo_html: str) -> None:
    """The demo's KILL, confidence, mode, five gates with statuses and six PNG plots are there."""
    assert 'class="verdict v-kill"' in demo_html and "<h1>KILL</h1>" in demo_html
    assert "confidence <b>high</b>" in demo_html and "mode <b>standard</b>" in demo_html
    for name in GateName:
        assert f'id="gate-{name.value}"' in demo_html
    assert 'Liveness <span class="badge s-fail">FAIL</span>' in demo_html
    assert demo_html.count('src="data:image/png;base64,') == 6
    assert "all_reduce" in demo_html  # the quoted stack frame that proves the stall


def test_the_page_is_self_contained(demo_html: str) -> None:
    """No script, no stylesheet link, every src a data URI, every href an anchor, and a CSP that
    forbids the browser any fetch."""
    assert "<script" not in demo_html.lower() and "<link" not in demo_html.lower()
    assert f'content="{CSP}"' in demo_html
    assert all(
        src.startswith("data:image/png;base64,") for src in re.findall(r'src="([^"]*)"', demo_html)
    )
    assert all(href.startswith("#") for href in re.findall(r'href="([^"]*)"', demo_html))
    assert "url(" not in demo_html  # no CSS fetch either


def test_hostile_text_is_escaped_everywhere() -> None:
    """Markup, quotes, an ANSI escape and a right-to-left override in a job id, a summary, a quote
    and a detail line come out as inert text."""
    page = render_html(_report(text=HOSTILE, job_id=HOSTILE))
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;q&quot;" in page
    assert "\x1b" not in page and "\\x1b[2J" in page
    assert "\u202e" not in page and "\\u202edlrow" in page


def test_escape_keeps_ordinary_text_and_newlines() -> None:
    """Unicode text, tabs and newlines pass unchanged; only markup and unsafe controls change."""
    assert escape("naïve — ok\tline\nnext") == "naïve — ok\tline\nnext"
    assert escape("\x00\x7f") == "\\x00\\x7f"


def test_a_kill_proof_is_rendered_with_its_quotes() -> None:
    """A report carrying `kill_proof` shows its rule, mechanism, time and quoted evidence."""
    proof = KillProof(
        rule="stall proven by two stack dumps",
        mechanism="ranks parked in all_reduce",
        established_at=f.NOW,
        evidence=(Quote(source="probes/stacks/a.txt", line=6, text="Thread 1: all_reduce"),),
    )
    report = _report(Verdict.KILL, kill_proof=proof)
    page = render_html(report)
    section = page[page.index('id="kill-proof"') : page.index('id="glance"')]
    assert 'class="proof"' in page
    for text in (
        "stall proven by two stack dumps",
        "ranks parked in all_reduce",
        "2026-07-30T21:15:00Z",
        "Thread 1: all_reduce",
        "probes/stacks/a.txt:6",
    ):
        assert text in section


def test_only_a_kill_has_a_proof_section() -> None:
    """NO-KILL and ERROR reports carry no kill proof, and their pages have no proof section."""
    for verdict in (Verdict.NO_KILL, Verdict.ERROR):
        assert 'id="kill-proof"' not in render_html(_report(verdict))


def test_the_demo_kill_shows_its_proof(demo_html: str) -> None:
    """The demo's KILL page opens with the stall proof and the stack quotes behind it."""
    section = demo_html[demo_html.index('id="kill-proof"') : demo_html.index('id="glance"')]
    assert "all_reduce" in section and "probes/stacks/" in section


def test_without_evidence_the_page_says_there_is_nothing_to_plot() -> None:
    """Rendered from the report alone, the plots section says the tables were not available."""
    page = render_html(_report())
    assert "No data: the evidence tables were not available to plot." in page
    assert "<img" not in page


def test_a_plot_without_data_says_so_in_the_page() -> None:
    """A standard run with no TIS metrics shows the reason in place of the TIS image."""
    logs = f.logs(metrics=f.metric_rows({"reward/avg_raw_reward": [0.1] * 12}))
    page = render_html(_report(), f.evidence(log_tables=logs))
    assert "No data: no TIS metric logged (looked for policy/tis/imp_ratio_mean" in page


def test_a_downsampled_plot_says_so_in_its_caption_and_a_whole_one_does_not() -> None:
    """MAX_POINTS + 1 steps of reward: the page's caption of that plot says `N of M points
    drawn`; MAX_POINTS steps: drawn whole, no such note."""
    for steps, cut in ((MAX_POINTS, False), (MAX_POINTS + 1, True)):
        logs = f.logs(metrics=f.metric_rows({"reward/avg_raw_reward": [0.5] * steps}))
        page = render_html(_report(), f.evidence(log_tables=logs))
        figure = page[page.index('id="plot-reward"') :]
        caption = figure[: figure.index("</figcaption>")]
        assert (f"of {steps:,} points drawn" in caption) is cut


def test_store_html_writes_once_beside_the_json_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page lands at the JSON key with `.html`, as text/html, and is not drawn twice."""
    store = MemoryStore()
    drawn: list[int] = []
    real = sinks.render_html

    def counting(report: Report, evidence: Any = None) -> str:
        drawn.append(1)
        return real(report, evidence)

    monkeypatch.setattr(sinks, "render_html", counting)
    key = "reports/cw/ops/rl-job/2026-07-30T21:15:00Z-e1.json"
    evidence = f.evidence()
    assert store_html(store, key, _report(), evidence) == html_key(key)
    assert html_key(key).endswith("-e1.html")
    assert store.get(html_key(key)).startswith(b"<!DOCTYPE html>")
    store_html(store, key, _report(), evidence)
    assert len(drawn) == 1


def test_a_page_that_cannot_be_drawn_is_stored_without_plots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When drawing with the evidence fails, the page is stored from the report alone."""

    def broken(evidence: Any) -> Any:
        raise RuntimeError("matplotlib is unwell")

    monkeypatch.setattr(html_module, "render_plots", broken)
    store = MemoryStore()
    key = store_html(store, "reports/a/b/c/d.json", _report(), f.evidence())
    assert b"the evidence tables were not available to plot" in store.get(key)
