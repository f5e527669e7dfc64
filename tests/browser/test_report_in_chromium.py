"""The demo's HTML report in a real browser: headless Chromium loads it from disk, every plot
image decodes, nothing errors, and nothing is fetched from anywhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from reports.html import render_html
from tests.browser.harness import assert_rendered, render
from tests.unit.test_html_report import HOSTILE, _report

ROOT = Path(__file__).resolve().parents[2]
RL_HEALTH = str(Path(sys.executable).with_name("rl-health"))
DEMO = [
    RL_HEALTH,
    "diagnose",
    str(ROOT / "examples/jobs/cw-rno2a/ops/rl-gsm8k-stalled"),
    "--probes",
    str(ROOT / "examples/probes/rl-gsm8k-stalled"),
    "--now",
    "2026-07-30T19:17:00Z",
    "--format",
    "html",
]


def test_the_demo_report_renders_in_chromium(tmp_path: Path) -> None:
    """`diagnose --format html` of the demo: a non-blank page, six plots loaded, no console
    error, no request but the file itself and its data URIs."""
    page = tmp_path / "report.html"
    result = subprocess.run(DEMO, check=False, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    page.write_text(result.stdout, encoding="utf-8")
    seen = render(page.as_uri(), tmp_path / "report.png")
    assert_rendered(seen, images=6)
    assert seen.title.startswith("KILL — /ops/rl-gsm8k-stalled")
    assert "KILL" in seen.text and "all_reduce" in seen.text
    outside = [u for u in seen.requests if not u.startswith(("data:", page.as_uri()))]
    assert outside == []


def test_hostile_quotes_stay_text_in_the_browser(tmp_path: Path) -> None:
    """A quote carrying markup, an image pointing at a local port and a script runs nothing and
    fetches nothing: the browser shows it as text."""
    trap = '<img src="http://127.0.0.1:9/leak"><script>document.title="owned"</script>'
    page = tmp_path / "hostile.html"
    page.write_text(render_html(_report(text=trap + HOSTILE, job_id=trap)), encoding="utf-8")
    seen = render(page.as_uri(), tmp_path / "hostile.png")
    assert_rendered(seen, images=0)
    assert seen.title.startswith("NO-KILL — <img")  # the script never set it to "owned"
    assert not [u for u in seen.requests if "127.0.0.1:9" in u]
    assert '<img src="http://127.0.0.1:9/leak">' in seen.text  # shown, not obeyed
