"""Open a page in Debian's headless Chromium through Playwright and check that it rendered.

Playwright drives `/usr/bin/chromium` (`executable_path`): it never downloads a browser of its own.
`make test` installs the `chromium` package when it is missing (`make system-deps`). The flags keep
Chromium off the network it would otherwise try to reach at start (this machine has none).
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib import image as mimage

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--no-sandbox",  # the tests run as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium() -> str:
    """The Chromium binary, or a skip that says why (printed, as the suite's rules ask)."""
    found = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if found is None:
        print("chromium is not installed (make system-deps installs it); skipping")
        pytest.skip("chromium binary absent")
    return found


@dataclass
class Rendered:
    """What one page load showed."""

    screenshot: Path
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    images: list[dict[str, Any]] = field(default_factory=list)
    title: str = ""
    text: str = ""


def _listen(page: Any, seen: Rendered) -> None:
    page.on("console", lambda m: seen.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen.page_errors.append(str(e)))
    page.on("request", lambda r: seen.requests.append(r.url))
    page.on("requestfailed", lambda r: seen.failed.append(f"{r.url}: {r.failure}"))


_IMAGES = """Array.from(document.images).map(i => ({
    alt: i.alt, complete: i.complete, width: i.naturalWidth, height: i.naturalHeight}))"""


def render(
    url: str,
    screenshot: Path,
    *,
    then: Callable[[Any], None] | None = None,
    width: int = 1100,
) -> Rendered:
    """Load `url` (and run `then(page)`), take a full-page screenshot, report what was seen."""
    from playwright.sync_api import sync_playwright

    seen = Rendered(screenshot=screenshot)
    with sync_playwright() as playwright:  # each launch gets a new, empty profile
        browser = playwright.chromium.launch(
            executable_path=chromium(), headless=True, args=[*FLAGS]
        )
        page = browser.new_page(viewport={"width": width, "height": 900})
        _listen(page, seen)
        page.goto(url, wait_until="load")
        if then is not None:
            then(page)
            page.wait_for_load_state("load")
        seen.images = page.evaluate(_IMAGES)
        seen.title, seen.text = page.title(), page.inner_text("body")
        page.screenshot(path=str(screenshot), full_page=True)
        browser.close()
    return seen


def blank(png: Path) -> bool:
    """True when a screenshot is one flat colour (nothing was painted)."""
    pixels = np.asarray(mimage.imread(io.BytesIO(png.read_bytes()), format="png"))
    flat = pixels.reshape(-1, pixels.shape[-1])
    return (
        bool(flat.std() < 0.01) or len(np.unique(flat[:: max(1, len(flat) // 20000)], axis=0)) < 3
    )


def assert_rendered(seen: Rendered, *, images: int) -> None:
    """A non-blank screenshot, `images` images all loaded, no console or page error."""
    assert seen.screenshot.is_file() and not blank(seen.screenshot), "blank screenshot"
    assert len(seen.images) == images, seen.images
    unloaded = [i for i in seen.images if not (i["complete"] and i["width"] > 0)]
    assert not unloaded, f"images that did not load: {unloaded}"
    assert not seen.console_errors, seen.console_errors
    assert not seen.page_errors, seen.page_errors
    assert not seen.failed, seen.failed
