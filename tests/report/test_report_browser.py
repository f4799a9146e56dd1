"""report.html in a real browser: headless Chromium (Debian's ``chromium``, installed by
``make test``'s set-up when missing) driven by Playwright.

The page loads from disk with no console error and no page error, every plot decodes to an
image of the size its PNG says (non-empty), and a full-page screenshot is written to
``test-artifacts/report.png`` (kept after the run, for a person to look at)."""

from __future__ import annotations

import base64
import shutil
import struct
from pathlib import Path

import pytest

from freshroll.report.html import write_report
from report.test_report import make_run

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:  # a missing browser fails: make test installs it (Makefile: browser)
        pytest.fail("no chromium on PATH: run `make browser` (Debian's chromium package)")
    return path


def _png_size(src: str) -> tuple[int, int]:
    data = base64.b64decode(src.split(",", 1)[1])
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


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
            images = page.eval_on_selector_all(
                "img", "els => els.map(e => [e.alt, e.complete, e.naturalWidth, "
                       "e.naturalHeight, e.getBoundingClientRect().width, e.src])")
            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert len(images) >= 8, [alt for alt, *_ in images]
    for alt, complete, w, h, shown, src in images:
        assert complete and (w, h) == _png_size(src), alt  # decoded, at the PNG's size
        assert w > 100 and h > 100 and shown > 100, alt  # and laid out on the page
    assert shot.stat().st_size > 50_000  # a full page, not a blank one
