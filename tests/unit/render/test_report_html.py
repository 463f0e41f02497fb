"""report.html (issue 15): one static page per output directory, tested in a real browser.

The browser test drives Debian's ``chromium`` through Playwright's Python package
(``apt-get install -y chromium`` and ``pip install playwright``; never ``playwright
install``): the page loads from file:// with no console error, every <img> resolves, the
table sorts, and a screenshot is taken (``INSPECT_MODEL_SCREENSHOT_DIR`` keeps it). It skips
only where no chromium executable exists.
"""

from __future__ import annotations

import html
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from inspect_model.render.html import render_html, table_rows


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    for path in ("/usr/bin/chromium", "/usr/lib/chromium/chromium"):
        if os.path.exists(path):
            return path
    return None


@pytest.fixture
def images(tmp_path: Path) -> list[str]:
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i, (h, w) in enumerate([(30, 40), (36, 28), (32, 32)]):
        p = tmp_path / f"img {i}&<x>.png"  # names that need escaping in HTML and URLs
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    return paths


@pytest.fixture
def cam_run(cli, models_py: Path, images: list[str], tmp_path: Path) -> Path:
    out = tmp_path / "cam out"
    r = cli(["cam", f"{models_py}:TinyCNN", *images, "--weights", "none", "--resize", "24", "--crop", "16",
             "-m", "gradcam", "-m", "eigencam", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.stderr
    return out


def test_page_lists_every_picture_lazily_with_relative_links(cam_run: Path) -> None:
    page = (cam_run / "report.html").read_text()
    doc = json.loads((cam_run / "report.json").read_text())
    assert "report.html" in doc["files"]
    pngs = [f for f in doc["files"] if f.endswith(".png")]
    assert len(pngs) == 3 * 2 * 2 + 1  # overlay and heat map per image and method, one contact sheet
    assert page.count("<img ") == len(pngs) and page.count('loading="lazy"') == len(pngs)
    assert "http://" not in page and "https://" not in page and "file://" not in page  # no network
    assert "img 0&amp;&lt;x&gt;" in page and "<x>" not in page
    title, rows = table_rows(doc)
    assert title.startswith("Maps") and len(rows) == 6
    assert render_html(doc) == page  # deterministic: the page is a function of the report


def test_page_shows_warnings_and_sortable_layers() -> None:
    doc = {"command": "activations", "model": "m", "files": ["overview.png"], "image_count": 2,
           "warnings": [{"message": "layer <b> never ran", "count": 3}],
           "layers": [{"key": "conv", "stats": {"mean": 0.5, "std": 1.0}}, {"key": "fc", "stats": {"mean": -2.0}}]}
    page = render_html(doc)
    assert "layer &lt;b&gt; never ran (x3)" in page
    assert '<table class="sortable">' in page and "<th>Mean</th>" in page and "<th>stats.mean</th>" not in page
    assert 'src="overview.png"' in page


@pytest.mark.skipif(_chromium() is None, reason="no chromium executable (apt-get install -y chromium)")
@pytest.mark.slow  # launches chromium (several seconds): full run only
def test_page_in_a_real_browser(cam_run: Path, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda r: errors.append(f"failed: {r.url}"))
            page.goto((cam_run / "report.html").as_uri())
            page.wait_for_load_state("load")
            assert page.evaluate("document.querySelectorAll('img[loading=lazy]').length") == 13
            # Lazy images load when scrolled to: bring each into view, then wait for all.
            for handle in page.query_selector_all("img"):
                handle.scroll_into_view_if_needed()
            page.wait_for_function("Array.from(document.images).every(i => i.complete)", timeout=15000)
            broken = page.evaluate("Array.from(document.images).filter(i => !(i.naturalWidth > 0))"
                                   ".map(i => i.getAttribute('src'))")
            assert broken == []
            # Sorting: click the "image" header twice, the first column flips order.
            first = "document.querySelector('table.sortable tbody tr td').textContent"
            page.click("table.sortable th:nth-child(1)")
            asc = page.evaluate(first)
            page.click("table.sortable th:nth-child(1)")
            desc = page.evaluate(first)
            assert Path(asc).name.startswith("img 0") and Path(desc).name.startswith("img 2")
            page.evaluate("window.scrollTo(0, 0)")
            shot_dir = Path(os.environ.get("INSPECT_MODEL_SCREENSHOT_DIR", tmp_path))
            shot_dir.mkdir(parents=True, exist_ok=True)
            shot = shot_dir / "report_html.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
        finally:
            browser.close()
    assert errors == []


# ----------------------------------------------------------------- columns per command (issue 29)
# What each command's report.txt shows, in its order; everything else behind "all columns".
COLUMNS = {
    "summary": ["Layer", "Type", "Output shape", "Params", "Trainable", "MACs"],
    "activations": ["Layer", "Type", "Output shape", "Mean", "Std", "Min", "Max", "Zero %", "Neg %", "Dead ch",
                    "NaN/Inf"],
    "grads": ["layer", "type", "output shape", "|grad wrt output|", "mean |g| out", "max |g| out", "rel. norm",
              "|grad wrt input|", "non-finite"],
    "guided-backprop": ["Image", "Target", "Score", "max|g|", "mean|g|", "Nonzero %"],
    "cam": ["Image", "Method", "Layer", "Target", "Prob", "Raw min", "Raw max", "Note"],
    "check": ["Check", "Status", "Value", "Expected", "Detail"],
}


@pytest.fixture
def every_command(cli, models_py: Path, images: list[str], tmp_path: Path) -> dict[str, Path]:
    out = {}
    for command in COLUMNS:
        args = ["--input-size", "3x16x16"] if command == "summary" else [*images[:2], "--resize", "16"]
        d = tmp_path / f"run-{command}"
        r = cli([command, f"{models_py}:TinyCNN", *args, "--weights", "none", "-o", str(d), "-q"])
        assert r.exit_code == 0, (command, r.stderr)
        out[command] = d
    return out


def _txt_header(report_txt: str) -> list[str]:
    """The column names of report.txt's first table (the line above the first dashes)."""
    import re

    lines = report_txt.splitlines()
    dashes = next(i for i, ln in enumerate(lines) if ln.startswith("---"))
    return [c for c in re.split(r"\s{2,}", lines[dashes - 1].strip()) if c]


def test_each_command_table_leads_with_its_report_txt_columns(every_command: dict[str, Path]) -> None:
    import re

    for command, d in every_command.items():
        page = (d / "report.html").read_text()
        heads = re.findall(r"<th(?: class=\"x\")?>(.*?)</th>", page.split("<tbody>")[0])
        shown = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", page.split("<tbody>")[0])]
        assert shown == COLUMNS[command], (command, shown)
        assert len(heads) > len(shown)  # the rest of the record, behind the toggle
        if command in ("summary", "activations", "grads"):
            assert shown == _txt_header((d / "report.txt").read_text()), command
    grads = (every_command["grads"] / "report.html").read_text()
    assert grads.count(">features.0<") >= 1 and ">features.0.weight<" in grads  # layer and parameter names


@pytest.mark.skipif(_chromium() is None, reason="no chromium executable (apt-get install -y chromium)")
@pytest.mark.slow  # launches chromium (several seconds): full run only
def test_every_command_page_in_a_real_browser(every_command: dict[str, Path], tmp_path: Path) -> None:
    """Each page: the visible columns of its first table are report.txt's, the toggle shows
    the rest; a screenshot of each (INSPECT_MODEL_SCREENSHOT_DIR keeps them)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    errors: list[str] = []
    shot_dir = Path(os.environ.get("INSPECT_MODEL_SCREENSHOT_DIR", tmp_path))
    shot_dir.mkdir(parents=True, exist_ok=True)
    visible = ("Array.from(document.querySelector('table.sortable').tHead.rows[0].cells)"
               ".filter(c => c.offsetParent !== null).map(c => c.textContent)")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            for command, d in every_command.items():
                page.goto((d / "report.html").as_uri())
                page.wait_for_load_state("load")
                assert page.evaluate(visible) == COLUMNS[command], command
                page.screenshot(path=str(shot_dir / f"report_html_{command}.png"), full_page=True)
                page.click("button.cols")
                wide = page.evaluate(visible)
                assert wide[:len(COLUMNS[command])] == COLUMNS[command] and len(wide) > len(COLUMNS[command])
                assert page.get_attribute("button.cols", "aria-pressed") == "true"
                if command == "grads":
                    names = page.evaluate("Array.from(document.querySelectorAll('table.sortable')[0].tBodies[0]"
                                          ".rows).map(r => r.cells[0].textContent)")
                    assert names[:2] == ["features.0", "features.1"] and names[-1] == "fc"
        finally:
            browser.close()
    assert errors == []
