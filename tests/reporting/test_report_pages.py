"""The executed reports as a reader meets them: the depth study's answer on the first screen, no κ
beyond float64 printed as a number, every table through the shared formatter, wide figures.

The reports are executed once per module with the quick parameters (``osa-lab report --quick``;
report 05 draws the committed study results, so its κ beyond float64 are real). Set
``OSA_LAB_REPORTS`` to a folder of reports already executed (e.g. by ``make report``) to check
those instead.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import struct
from pathlib import Path

import pytest

from osa_lab.reporting import runner as report
from osa_lab.studies.summaries import KAPPA_RESOLVED

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("OSA_LAB_CHROMIUM", "/usr/bin/chromium")
SCREEN = {"width": 1400, "height": 900}

#: a number as a report prints it: 4.5e15, 5.59e+20, 1.13e210, 12345678901234567 (digits only)
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?![\w.])")


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> Path:
    given = os.environ.get("OSA_LAB_REPORTS")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("reports")
    names = report.discover(report.NOTEBOOK_DIR)
    params = report.load_params(report.NOTEBOOK_DIR / report.QUICK_PARAMS)
    # report 04 trains into `runs_dir` (reports/train_runs by default): under pytest -n 2 both workers may
    # run this fixture at once, and the second then met the first's run lock there; each gets its own
    params["04_skipless_training"] = {**params.get("04_skipless_training", {}), "runs_dir": str(out / "train_runs")}
    results = report.run_reports(names, params, out, cell_timeout=report.QUICK_CELL_TIMEOUT,
                                 cwd=report.NOTEBOOK_DIR.parent, progress=False)  # fmt: skip
    failed = [r.name for r in results if not r.ok]
    assert not failed, f"reports failed: {failed}"
    return out


def visible_text(page: str) -> str:
    """The text of an HTML report as a reader sees it: no scripts, styles or embedded images."""
    page = re.sub(r"<script.*?</script>|<style.*?</style>", " ", page, flags=re.S)
    page = re.sub(r"data:image/[a-z]+;base64,[A-Za-z0-9+/=]+", " ", page)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def numbers_beyond_float64(text: str) -> list[str]:
    """Every number in ``text`` at or above 1/ε of float64 (rounded the way the reports round: 4.5e15 is the
    ceiling itself, not a value beyond it)."""
    return [m.group(0) for m in _NUMBER.finditer(text) if float(m.group(0)) > 4.51e15]


def test_numbers_beyond_float64_finds_what_the_reports_must_not_print():
    assert numbers_beyond_float64("κ 6.99e+162, 5.59e+20 and 1.13e210; 12345678901234567") == [
        "6.99e+162", "5.59e+20", "1.13e210", "12345678901234567"]
    assert numbers_beyond_float64("κ > 4.5e15 (≥ 4.5e15), 2.25e7, 38.1, git 574ecc01c7") == []
    assert KAPPA_RESOLVED > 4.5e15


def test_no_report_prints_a_kappa_beyond_float64_as_a_number(reports):
    pages = sorted(reports.glob("0*.html"))
    assert len(pages) == len(report.discover(report.NOTEBOOK_DIR)), pages
    for page in pages:
        text = visible_text(page.read_text())
        assert numbers_beyond_float64(text) == [], page.name
    # the committed depth study has κ beyond float64: report 05 says so in words and tables
    depth = visible_text((reports / "05_depth_study.html").read_text())
    assert depth.count("> 4.5e15") >= 5


def test_every_table_goes_through_the_shared_formatter(reports):
    """No pandas dump: every table of every report has human headers and no index column; the only other
    table is the provenance at the end."""
    for page in sorted(reports.glob("0*.html")):
        text = page.read_text()
        tables = re.findall(r"<table[^>]*>", text)
        ours = [t for t in tables if "osa-table" in t]
        assert len(tables) - len(ours) <= 1, (page.name, tables)
        for table in re.findall(r'<table class="dataframe osa-table">(.*?)</table>', text, flags=re.S):
            headers = re.findall(r"<th>(.*?)</th>", table)
            assert headers and "" not in headers, (page.name, headers)
            assert not [h for h in headers if re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)+", h)], (page.name, headers)


def _figures(notebook: Path) -> list[tuple[int, int]]:
    sizes = []
    for cell in json.loads(notebook.read_text())["cells"]:
        for output in cell.get("outputs", []):
            png = output.get("data", {}).get("image/png")
            if png:
                head = base64.b64decode(png[:64])
                sizes.append(struct.unpack(">II", head[16:24]))
    return sizes


def test_depth_study_figures_are_at_least_600_px_wide(reports):
    sizes = _figures(reports / "05_depth_study.ipynb")
    assert len(sizes) >= 5
    assert all(width >= 600 for width, _ in sizes), sizes


@pytest.mark.browser
def test_depth_study_answer_and_first_figure_are_on_the_first_screen(reports):
    """At 1400 × 900 the reader sees the answer table and the whole figure of accuracy against depth
    without scrolling (headless Chromium; skipped without it)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"headless Chromium not found at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport=SCREEN)
            page.goto((reports / "05_depth_study.html").as_uri())
            table = page.locator("table.osa-table").first.bounding_box()
            figure = page.locator(".jp-OutputArea-output img").first
            box = figure.bounding_box()
            assert table is not None and box is not None
            assert table["y"] + table["height"] <= box["y"]  # the table first, then the figure
            assert box["y"] + box["height"] <= SCREEN["height"], box  # the whole figure on the first screen
            assert box["width"] >= 600, box
            first_heading = page.locator("h1").first.bounding_box()
            assert first_heading is not None and first_heading["y"] < box["y"]
        finally:
            browser.close()


def test_no_report_shows_a_warning_or_other_stderr_output(reports):
    for page in sorted(reports.glob("0*.html")):
        text = page.read_text()
        shown = re.findall(r'<div class="[^"]*jp-OutputArea-output"[^>]*application/vnd\.jupyter\.stderr[^>]*>\s*<pre>(.{0,160})',
                           text, flags=re.S)  # fmt: skip
        assert shown == [], (page.name, shown)


def test_the_large_depth_report_leads_with_how_far_the_study_got(reports):
    """Report 06 opens with the study's state (PARTIAL until every planned run finished), before any table."""
    text = visible_text((reports / "06_large_depth_study.html").read_text())
    state = re.search(r"Finding of this run:\s*(PARTIAL|Complete): (\d+) of (\d+) final runs", text)
    assert state, text[:2000]
    assert (state.group(1) == "Complete") == (state.group(2) == state.group(3))
    assert text.index("Finding of this run") < text.index("final training loss, median")
