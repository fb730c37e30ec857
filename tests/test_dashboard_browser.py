"""Served tests of the dashboard: ``panel serve`` on a free localhost port, driven by headless Chromium.

Debian's ``chromium`` (``apt-get install chromium``) is driven through the Python ``playwright``
package with ``executable_path`` (``playwright install`` cannot download browsers offline). The tests
assert what a user sees: plots drawn, no error text, the data of a plot following the depth control,
no request leaving localhost (the page works offline) and no failed request, five independent
concurrent sessions. A screenshot is saved under ``test-output/``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import urlopen

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboards" / "osa_dashboard.py"
CHROMIUM = os.environ.get("OSA_LAB_CHROMIUM", "/usr/bin/chromium")
OUTPUT = ROOT / "test-output"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
#: small sizes so that each session's sweep is quick
QUERY = "depth=4&tokens=16&dim=16&seeds=2"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"headless Chromium not found at {CHROMIUM} (apt-get install chromium)"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")

#: max layer in every ColumnDataSource that has a 'layer' column (the plots' data in the browser)
JS_LAYERS = """() => {
  const out = [];
  for (const doc of (window.Bokeh ? Bokeh.documents : []))
    for (const m of doc.all_models)
      if (m.type === 'ColumnDataSource' && m.data && m.data.layer && m.data.layer.length)
        out.push(Math.max(...Array.from(m.data.layer)));
  return out;
}"""


JS_TITLES = """() => {
  const out = [];
  for (const doc of (window.Bokeh ? Bokeh.documents : []))
    for (const m of doc.all_models)
      if (m.type === 'Title' && m.text) out.push(String(m.text));
  return out;
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    """``panel serve dashboards/osa_dashboard.py`` on a free port; yields the app URL."""
    port = _free_port()
    OUTPUT.mkdir(exist_ok=True)
    log_path = OUTPUT / f"panel_serve_{port}.log"  # one per server (pytest-xdist workers run their own)
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "panel", "serve", str(APP), "--port", str(port), "--address", "127.0.0.1",
         "--allow-websocket-origin", f"127.0.0.1:{port}"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "OSA_DASHBOARD_TORCH_THREADS": "1"},
    )
    url = f"http://127.0.0.1:{port}/osa_dashboard"
    deadline = time.time() + 90
    while True:
        try:
            with urlopen(f"http://127.0.0.1:{port}/", timeout=2):
                break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                log.close()
                pytest.fail(f"panel serve did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.3)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
    text = log_path.read_text()
    for marker in ("dashboard computation failed", "Uncaught exception", "Exception in callback", "Error running"):
        assert marker not in text, f"the server logged {marker!r}; see {log_path}"


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


class PageWatch:
    """Records every request, failed request, HTTP error and console error of a page."""

    def __init__(self, page):
        self.page, self.requests, self.failed, self.errors = page, [], [], []
        page.on("request", lambda r: self.requests.append(r.url))
        page.on("requestfailed", lambda r: self.failed.append(f"{r.url} ({r.failure})"))
        page.on("response", lambda r: r.status >= 400 and self.failed.append(f"{r.url} (HTTP {r.status})"))
        page.on("pageerror", lambda e: self.errors.append(str(e)))

    def external(self) -> list[str]:
        hosts = {"127.0.0.1", "localhost"}
        return [u for u in self.requests
                if urlparse(u).scheme in ("http", "https", "ws", "wss") and urlparse(u).hostname not in hosts]


def _open(browser, url: str) -> PageWatch:
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    watch = PageWatch(context.new_page())
    watch.page.goto(url, wait_until="domcontentloaded", timeout=60_000)
    return watch


def _wait_layers(page, want: int, timeout: float = 90) -> list[int]:
    """Wait until every plot source with a 'layer' column ends at layer ``want``."""
    deadline, seen = time.time() + timeout, []
    while time.time() < deadline:
        seen = page.evaluate(JS_LAYERS)
        if seen and all(x == want for x in seen):
            return seen
        time.sleep(0.25)
    raise AssertionError(f"plots did not show layer {want} within {timeout}s; sources end at {seen}")


def _set_depth(page, current: int, new: int) -> None:
    """Move the Depth slider with the keyboard as a user would (the change fires on key release)."""
    handle = page.locator(".noUi-handle").first
    handle.focus()
    key = "ArrowRight" if new > current else "ArrowLeft"
    for _ in range(abs(new - current)):
        handle.press(key)


def _assert_clean(watch: PageWatch) -> None:
    page = watch.page
    assert page.get_by_text("Traceback").count() == 0
    assert page.get_by_text("computation failed").count() == 0
    assert watch.external() == [], f"requests left localhost: {watch.external()}"
    assert watch.failed == [], f"failed requests: {watch.failed}"
    assert watch.errors == [], f"JavaScript errors: {watch.errors}"


def test_served_dashboard_draws_and_follows_depth(server, browser):
    watch = _open(browser, f"{server}?{QUERY}")
    page = watch.page
    page.wait_for_selector(".osa-badge", timeout=90_000)
    assert _wait_layers(page, 4)
    # non-empty figures: bokeh canvases with a size, the OSA-check badges, the plot title
    canvases = page.locator("canvas")
    assert canvases.count() >= 2
    box = canvases.first.bounding_box()
    assert box and box["width"] > 100 and box["height"] > 100
    assert page.locator(".osa-badge").count() == 4
    titles = page.evaluate(JS_TITLES)  # Bokeh draws titles into the canvas: read its models
    assert any(t.endswith("across depth") for t in titles), titles
    _set_depth(page, 4, 6)
    assert _wait_layers(page, 6)
    assert "depth=6" in page.url  # the control state is in the URL
    # the spectra tab draws heatmaps for the same depth
    page.get_by_text("Spectra", exact=True).click()
    assert _wait_layers(page, 6)
    page.get_by_text("Rank collapse", exact=True).click()
    page.wait_for_timeout(500)
    OUTPUT.mkdir(exist_ok=True)
    page.screenshot(path=str(OUTPUT / "dashboard.png"), full_page=True)
    _assert_clean(watch)
    page.context.close()


def test_impossible_setting_shows_a_message_and_keeps_figures(server, browser):
    watch = _open(browser, f"{server}?{QUERY}&heads=3")  # 16 % 3 != 0
    page = watch.page
    page.get_by_text("not divisible by heads").first.wait_for(timeout=90_000)
    assert page.get_by_text("Traceback").count() == 0
    # fixing it brings the figures (the session survived)
    page.goto(f"{server}?{QUERY}&heads=2", wait_until="domcontentloaded")
    assert _wait_layers(page, 4)
    page.context.close()


def test_five_concurrent_sessions_are_independent(server, browser):
    watches = [_open(browser, f"{server}?{QUERY}") for _ in range(5)]
    for w in watches:
        assert _wait_layers(w.page, 4, timeout=150)
    targets = [5, 6, 7, 3, 2]
    for w, depth in zip(watches, targets, strict=True):
        _set_depth(w.page, 4, depth)
    for w, depth in zip(watches, targets, strict=True):
        assert _wait_layers(w.page, depth, timeout=150)  # each session shows its own depth
    for w in watches:
        _assert_clean(w)
        w.page.context.close()
