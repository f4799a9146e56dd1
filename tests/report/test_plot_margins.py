"""The report's figures are SVG drawn by the report's own kit (issues 22 and 25: matplotlib
was most of a short run's CPU). Its margins come from an estimate of each text's width
(``svg.text_width``): by that estimate every text a figure draws lies inside its viewBox,
a y label stays left of its tick labels and x tick labels do not overlap, at awkward inputs
too: wide numbers, long legend labels, many lanes, several stacked panels, NaN and inf,
empty, one-point and constant series. Every figure is well-formed XML, and text from data
is escaped. (tests/report/test_report_browser.py checks the estimate against a real font.)"""

from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import NamedTuple

import pytest

from freshroll.report import plots, svg

WIDE_Y = [0.0, 123456.0, 2.5e5, 98765.4]
X = [1.0, 2.0, 3.0, 4.0]
NS = "{http://www.w3.org/2000/svg}"
NASTY = 'a<b & "c"'
NAN, INF = float("nan"), float("inf")

CASES: dict[str, Callable[[], str]] = {
    "line chart, wide numbers": lambda: plots.line_chart(
        [plots.Line("run", X, WIDE_Y), plots.Line("baseline (sync run)", X, X, baseline=True)],
        title="Reward vs step", xlabel="trainer step", ylabel="mean reward"),
    "lag histogram with its bound": lambda: plots.lag_histogram({0: 5000, 1: 120000, 3: 7}, 2),
    "lag histogram of many lags": lambda: plots.lag_histogram({i: 10 * i for i in range(90)},
                                                              None),
    "stage bars, two runs": lambda: plots.stage_bars(
        {"async": {"queue": 0.01, "generation": 0.2, "transfer": 0.01, "reward": 0.02,
                   "buffer": 0.01, "trainer": 0.3},
         "sync (baseline)": {"generation": 0.25, "trainer": 0.3}}),
    "per-step chart with a baseline": lambda: plots.per_step_chart(
        plots.Line("wait share of each step", X, [0.1, 0.5, 0.2, 0.9]),
        plots.Line("running idle ratio", X, [0.1, 0.3, 0.3, 0.4]),
        plots.Line("baseline: running idle ratio", X, [0.2, 0.2, 0.2, 0.2], baseline=True),
        title="Trainer idle over time", ylabel="waiting for data (share)", ratio=True),
    "rate chart": lambda: plots.rate_chart(
        [0.0, 10.0, 20.0, 30.0], [1500.0, 2400.0, 12000.0],
        plots.Line("running accepted/s", [10.0, 20.0, 30.0], [1500.0, 1900.0, 5300.0]), None,
        title="Throughput over time", ylabel="accepted rollouts / s"),
    "off-policy panels with legends": lambda: plots.off_policy_panels(
        [("importance weight", [plots.Line("mean", X, [1.0, 1.01, 1.0, 1.0]),
                                plots.Line("max", X, [1.0, 1.4, 1.2, 1.1])]),
         ("mismatch KL", [plots.Line("mismatch_kl", X, [0.0, 0.006, 0.004, 0.0015])]),
         ("lag", [plots.Line("mean lag of the step's samples", X, [0, 1, 1, 1]),
                  plots.Line("max", X, [0, 1, 2, 2]),
                  plots.Line("baseline (sync)", X, [0, 0, 0, 0], baseline=True)])]),
    "timeline with the controller": lambda: plots.timeline(
        ["segments", "controller_decided", "worker_fenced", "resumed"],
        [(0.0, "segments"), (1.5, "controller_decided"), (2.0, "worker_fenced"),
         (900.0, "resumed")],
        controls=[(0.0, 2, 8), (450.0, 4, 16), (900.0, 3, 12)]),
    "timeline, many lanes and marks": lambda: plots.timeline(
        [f"lane number {i} of a long list" for i in range(12)],
        [(t * 0.37, f"lane number {t % 12} of a long list") for t in range(800)]),
    "timeline, controls only": lambda: plots.timeline(["a"], [], controls=[(0.0, 1, 1)]),
    "NaN, inf, one point, constant, empty": lambda: plots.off_policy_panels(
        [("with NaN and inf", [plots.Line("x", X, [1.0, NAN, INF, 2.0])]),
         ("one point", [plots.Line("one", [3.0], [0.5])]),
         ("constant", [plots.Line("same", X, [7.0] * 4)]),
         ("empty", [plots.Line("none", [], [])])]),
    "tiny and huge values": lambda: plots.line_chart(
        [plots.Line("tiny", X, [1e-7, 3e-7, 2e-7, 0.0]), plots.Line("neg", X, [-1e-7] * 4)],
        title="t", xlabel="x", ylabel="y"),
    "long labels": lambda: plots.line_chart(
        [plots.Line("a very long run label that goes on " * 4, X, X),
         plots.Line(NASTY, X, X[::-1], baseline=True)],
        title="A title that is much longer than the figure is wide " * 3,
        xlabel="an x label far too long for the figure's width " * 3,
        ylabel="a y label longer than the plot area is high " * 2),
    "stage bars, a run label longer than the figure": lambda: plots.stage_bars(
        {"a run directory label far longer than the figure is wide " * 5: {"queue": 1.0},
         NASTY: {"queue": 0.5, "trainer": 2.0}}),
    "all empty": lambda: plots.rate_chart([], [], None, None, title="nothing", ylabel="y"),
}


class Box(NamedTuple):
    x0: float
    y0: float
    x1: float
    y1: float


def box(t: ET.Element) -> Box:
    """A ``<text>``'s box by the kit's estimate (anchor, baseline, a -90 degree rotation)."""
    size = float(t.get("font-size", "0"))
    x, y = float(t.get("x", "0")), float(t.get("y", "0"))
    w = svg.text_width(t.text or "", size)
    start = x - {"start": 0.0, "middle": w / 2, "end": w}[t.get("text-anchor", "start")]
    up, down = svg.ASCENT * size, svg.DESCENT * size
    if t.get("transform"):
        assert t.get("transform") == f"rotate(-90 {t.get('x')} {t.get('y')})"
        return Box(x - up, y - (start + w - x), x + down, y + (x - start))
    return Box(start, y - up, start + w, y + down)


def parse(markup: str) -> tuple[ET.Element, float, float]:
    root = ET.fromstring(markup)  # well-formed XML
    assert root.tag == f"{NS}svg"
    x0, y0, width, height = map(float, root.get("viewBox", "").split())
    assert (x0, y0) == (0, 0) and root.get("width") and root.get("height")
    return root, width, height


@pytest.mark.parametrize("case", CASES)
def test_every_text_is_on_the_canvas_and_clear_of_its_neighbours(case: str) -> None:
    root, width, height = parse(CASES[case]())
    texts = list(root.iter(f"{NS}text"))
    assert texts, case
    for t in texts:
        b = box(t)
        assert b.x0 >= -0.5 and b.y0 >= -0.5 and b.x1 <= width + 0.5 and b.y1 <= height + 0.5, (
            f"{case}: {t.text!r} at {b} is off {width}x{height}")
    panels = root.findall(f"{NS}g[@class='panel']")
    assert panels
    for panel in panels:
        kind = {c: [box(t) for t in panel.iter(f"{NS}text") if t.get("class") == c]
                for c in ("ylabel", "ytick", "xtick")}
        for label in kind["ylabel"]:
            assert kind["ytick"], case
            assert label.x1 <= min(b.x0 for b in kind["ytick"]), case
        xs = sorted(kind["xtick"])
        assert all(a.x1 <= b.x0 for a, b in itertools.pairwise(xs)), case


@pytest.mark.parametrize("case", CASES)
def test_every_figure_is_svg_with_finite_coordinates(case: str) -> None:
    markup = CASES[case]()
    assert markup == CASES[case]()  # deterministic
    assert not re.search(r"nan|inf", re.sub(r"<text[^>]*>[^<]*</text>", "", markup), re.I)
    parse(markup)


def test_text_from_data_is_escaped() -> None:
    figures = [
        plots.line_chart([plots.Line(NASTY, X, X), plots.Line("b", X, X)], title=NASTY,
                         xlabel=NASTY, ylabel=NASTY),
        plots.stage_bars({NASTY: {NASTY: 1.0}}),
        plots.timeline([NASTY], [(1.0, NASTY)]),
        plots.off_policy_panels([(NASTY, [plots.Line(NASTY, X, X), plots.Line("b", X, X)])]),
    ]
    for markup in figures:
        assert NASTY not in markup and "&lt;b &amp; &quot;c&quot;" in markup
        root, _, _ = parse(markup)
        assert NASTY in [t.text for t in root.iter(f"{NS}text")]
