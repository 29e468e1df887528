"""Open a local HTML file in Debian's headless Chromium (driven by playwright) and report what a
person would see: console errors, page errors, any network request the page tried, each plotly
graph's drawn traces, and a screenshot.

Chromium's own background traffic is switched off (the machine's network is closed); every
request the page makes other than its own file is refused and recorded, so "self-contained"
is checked, not assumed.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# every graph div has its SVG root: plotly has drawn them all
_DRAWN_JS = """() => { const g = document.querySelectorAll('.plotly-graph-div');
  return g.length > 0 && Array.from(g).every(d => d.querySelector('svg.main-svg')) }"""
# per graph div: plotly's SVG root and the traces it drew in it
_GRAPHS_JS = """() => Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => ({
  id: d.id,
  svg: d.querySelectorAll('svg.main-svg').length,
  traces: d.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length,
  data: (d._fullData || []).length,
}))"""


def why_no_browser() -> str | None:
    """Why the browser test cannot run here, or None."""
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (pip install -e '.[dev]')"
    if not os.access(CHROMIUM, os.X_OK):
        return (
            f"{CHROMIUM} is missing: `make test` installs Debian's chromium where apt-get runs "
            "as root"
        )
    return None


@dataclass(slots=True)
class PageView:
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # refused: anything but the file itself
    graphs: list[dict] = field(default_factory=list)
    title: str = ""
    undrawn: bool = False  # some graph had no SVG when the wait ran out


def view(page_file: Path, screenshot: Path, timeout_ms: int = 10_000) -> PageView:
    """Load ``page_file``, wait until every plotly graph has drawn, take a full-page screenshot."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    seen = PageView()
    url = page_file.resolve().as_uri()

    def route(r):
        if r.request.url == url:
            r.continue_()
        else:
            seen.requests.append(r.request.url)
            r.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.on("console", lambda m: m.type == "error" and seen.console_errors.append(m.text))
            page.on("pageerror", lambda e: seen.page_errors.append(str(e)))
            page.route("**/*", route)
            page.goto(url, wait_until="load", timeout=timeout_ms)
            try:
                page.wait_for_function(_DRAWN_JS, timeout=timeout_ms)
            except PlaywrightTimeout:
                seen.undrawn = True  # the graphs below say which one never drew
            seen.graphs = page.evaluate(_GRAPHS_JS)
            seen.title = page.title()
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return seen
