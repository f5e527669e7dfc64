"""The demo's HTML report in a real browser: headless Chromium loads it from disk, every plot
image decodes, nothing errors, and nothing is fetched from anywhere."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from reports.html import render_html
from tests.browser.harness import assert_rendered, render
from tests.unit.test_html_report import HOSTILE, _report

pytestmark = pytest.mark.integration  # headless Chromium, which `make system-deps` installs

ROOT = Path(__file__).resolve().parents[2]


def _make_demo(out: Path) -> str:
    """`make demo` into `out` (the virtual environment as it is: `-o` keeps make from rebuilding
    it); returns what it printed."""
    argv = ["make", "-s", "-o", ".venv/.installed", "demo", f"DEMO_OUT={out}"]
    result = subprocess.run(
        argv, cwd=ROOT, check=False, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("demo")
    return out / "report.html", _make_demo(out)


def test_make_demo_writes_the_html_report_and_prints_its_path(demo: tuple[Path, str]) -> None:
    """`make demo` prints the text report, then the path of the HTML report it wrote."""
    page, printed = demo
    assert printed.splitlines()[-1] == f"HTML report: {page}"
    assert "VERDICT: KILL" in printed
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_the_demo_report_renders_in_chromium(demo: tuple[Path, str], tmp_path: Path) -> None:
    """The demo's HTML report from `make demo`: a non-blank page, six plots loaded, no console
    error, no request but the file itself and its data URIs."""
    page, _printed = demo
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
