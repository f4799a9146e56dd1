"""report.html in a real browser: headless Chromium (Debian's ``chromium``, installed by
``make test``'s set-up when missing) driven by Playwright.

The page loads from disk with no console error and no page error, every plot is an inline
SVG laid out on the page (non-empty), every text of every figure lies inside its SVG's
viewBox as the browser measures it with a real font (``getBBox``: the check of the width
estimate the figures' margins are computed from, :mod:`freshroll.report.svg`), and a
full-page screenshot is written to ``test-artifacts/report.png`` (kept after the run, for a
person to look at)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from freshroll.report.html import write_report
from report.test_report import make_run

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        _missing(os.geteuid() == 0 or bool(os.environ.get("CI")))
    assert path is not None
    return path


def _missing(must_have: bool) -> None:
    """No browser: a failure where ``make test`` can install one (as root: CI is), else a
    skip naming the command (a developer without root is not kept from a green loop)."""
    why = "no chromium on PATH: run `sudo make browser` (Debian's chromium package)"
    if must_have:
        pytest.fail(why)
    pytest.skip(why)


def test_a_missing_browser_fails_as_root_and_skips_naming_the_command_otherwise() -> None:
    with pytest.raises(pytest.fail.Exception, match="sudo make browser"):
        _missing(True)
    with pytest.raises(pytest.skip.Exception, match="sudo make browser"):
        _missing(False)


#: per figure: its name, its laid-out width and height, its viewBox, and each text's
#: content and box in the viewBox's units (a text's box through its own transform: the
#: figures' texts sit in groups without one)
FIGURES = """svgs => svgs.map(s => {
  const vb = s.viewBox.baseVal, r = s.getBoundingClientRect();
  const texts = [...s.querySelectorAll('text')].map(t => {
    const b = t.getBBox(), own = t.transform.baseVal.consolidate();  // rotate(-90 x y)
    const m = own ? own.matrix : {a: 1, b: 0, c: 0, d: 1, e: 0, f: 0};
    const tm = new DOMMatrix([m.a, m.b, m.c, m.d, m.e, m.f]);
    const pts = [[b.x, b.y], [b.x + b.width, b.y], [b.x, b.y + b.height],
                 [b.x + b.width, b.y + b.height]].map(([x, y]) =>
      new DOMPoint(x, y).matrixTransform(tm));
    const xs = pts.map(p => p.x), ys = pts.map(p => p.y);
    return [t.textContent, Math.min(...xs), Math.min(...ys), Math.max(...xs),
            Math.max(...ys)];
  });
  return [s.getAttribute('aria-label'), r.width, r.height, vb.width, vb.height, texts];
})"""


def test_the_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    from playwright.sync_api import ConsoleMessage, sync_playwright

    run = make_run(tmp_path / "async_run", max_staleness=1, mode="async", steps=12)
    base = make_run(tmp_path / "sync_run", max_staleness=0, seed=1, mode="sync", steps=12)
    page_path = write_report(run, baseline=base, out=tmp_path / "report.html")
    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(),
                                     args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})

            def console(m: ConsoleMessage) -> None:
                if m.type in ("error", "warning"):
                    problems.append(f"console {m.type}: {m.text}")

            page.on("console", console)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            page.goto(page_path.as_uri())
            page.wait_for_load_state("load")
            figures = page.eval_on_selector_all("figure.plot svg", FIGURES)
            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert len(figures) >= 8, [name for name, *_ in figures]
    for name, shown_w, shown_h, width, height, texts in figures:
        assert shown_w > 100 and shown_h > 100, name  # laid out on the page
        assert texts, name
        for text, x0, y0, x1, y1 in texts:  # the real font's boxes, inside the viewBox
            assert x0 >= -0.5 and y0 >= -0.5 and x1 <= width + 0.5 and y1 <= height + 0.5, (
                f"{name}: {text!r} at {(x0, y0, x1, y1)} is off {width}x{height}")
    assert shot.stat().st_size > 50_000  # a full page, not a blank one
