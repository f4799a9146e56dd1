"""The report's SVG kit (:mod:`freshroll.report.svg`, :mod:`freshroll.report.svg_axes`):
nice ticks and compact labels, the text width estimate and its cut, escaping, axis ranges
of awkward data. (tests/report/test_plot_margins.py checks the figures drawn with it.)"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

from freshroll.report import svg
from freshroll.report.svg_axes import Axis, Panel, figure, series


def test_ticks_are_nice_and_labels_compact() -> None:
    assert svg.nice_ticks(0, 1, 5) == ([0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0], 0.2)
    assert svg.tick_labels([1000.0, 1200.0, 1400.0], 200.0) == ["1.0k", "1.2k", "1.4k"]
    assert svg.tick_labels([0.0, 250000.0], 50000.0) == ["0", "250k"]
    assert svg.tick_labels([0.0, 0.05, 0.1], 0.05) == ["0", "0.05", "0.10"]
    assert svg.tick_labels([1e-5, 3e-5], 2e-5) == ["1e-05", "3e-05"]
    assert svg.tick_labels([-2.0, 0.0, 2.0], 2.0) == ["-2", "0", "2"]
    for lo, hi in ((0.0, 1.0), (-3.3, 123456.0), (1e-9, 2e-9), (5.0, 5.5)):
        ticks, step = svg.nice_ticks(lo, hi, 6)
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert any(math.isclose(mantissa, m) for m in (1, 2, 5)) and 1 <= len(ticks) <= 12
        assert all(lo - 1e-9 * abs(hi) <= t <= hi + 1e-9 * abs(hi) for t in ticks)


def test_the_width_estimate_is_generous_and_fit_cuts() -> None:
    assert svg.text_width("0123456789", 10) >= 63.6  # DejaVu Sans digits: 0.636 em
    assert svg.text_width("W", 10) > svg.text_width("i", 10)
    cut = svg.fit("a long label " * 10, 11, 100)
    assert cut.endswith("…") and svg.text_width(cut, 11) <= 100
    assert svg.fit("short", 11, 100) == "short"


def test_text_is_escaped_and_kept_on_the_canvas() -> None:
    t = svg.text('a<b & "c"', -50, 0, 11, canvas=(100.0, 50.0))
    el = ET.fromstring(t)
    assert el.text == 'a<b & "c"' and float(el.get("x", "")) >= 0
    assert float(el.get("y", "")) >= svg.ASCENT * 11


def test_axis_ranges_of_awkward_data() -> None:
    nan, inf = float("nan"), float("inf")
    assert (Axis.of([]).lo, Axis.of([]).hi) == (0.0, 1.0)
    a = Axis.of([nan, inf, 2.0])  # one finite value: a small range about it
    assert a.lo < 2.0 < a.hi
    a = Axis.of([0.0, 0.0])
    assert a.lo < 0.0 < a.hi
    a = Axis.of([0.0, 10.0], lo=0.0)
    assert a.lo == 0.0 and math.isclose(a.hi, 10.5)
    assert Axis.of([5.0], lo=9.0).hi > 9.0  # a fixed bound above the data still draws
    cats = Axis.categories([])
    assert cats.tick(100, 11, vertical=True) == ([], [])


def test_a_figure_of_nothing_is_well_formed() -> None:
    panel = Panel(Axis.of([]), Axis.of([]), 100.0, [series([], [], "#000")])
    root = ET.fromstring(figure(300.0, [panel]))
    assert root.get("viewBox", "").startswith("0 0 300 ")


def test_a_long_y_label_stays_on_a_panel_without_a_title() -> None:
    from report.test_plot_margins import box, parse

    panel = Panel(Axis.of([0.0, 1e6]), Axis.of([0.0, 1.0]), 60.0,
                  ylabel="a y label much longer than its panel is high " * 2)
    root, width, height = parse(figure(300.0, [panel]))
    for t in root.iter("{http://www.w3.org/2000/svg}text"):
        b = box(t)
        assert b.x0 >= 0 and b.y0 >= 0 and b.x1 <= width and b.y1 <= height, t.text


def test_axis_ticks_are_as_many_as_fit() -> None:
    for lo, hi in ((3.8832, 3.8877), (-0.05, 0.95), (0.0, 2.6e5), (0.9, 3.1), (-1e-7, 3e-7)):
        for length in (120.0, 250.0, 560.0):
            for vertical in (True, False):
                ticks, labels = svg.axis_ticks(lo, hi, length, 11, vertical=vertical)
                assert 2 <= len(ticks) <= 9 and len(set(labels)) == len(labels), (lo, hi)
                gap = length * (ticks[1] - ticks[0]) / (hi - lo)
                need = 22 if vertical else max(svg.text_width(s, 11) for s in labels) + 11
                assert gap >= need - 1e-9
    assert svg.axis_ticks(-0.6, 2.6, 500, 11, vertical=False, min_step=1.0)[1] == [
        "0", "1", "2"]


def test_a_long_line_is_thinned_to_the_same_shape() -> None:
    from freshroll.report.svg_axes import thin

    pts = [(i / 10, math.sin(i / 7) * 50) for i in range(5000)]
    kept = thin(pts)
    assert len(kept) <= 4 * 500 and kept[0] == pts[0] and kept[-1] == pts[-1]
    where = {p: i for i, p in enumerate(pts)}
    assert [where[p] for p in kept] == sorted(where[p] for p in kept)  # in order, a subset
    for col in {int(x) for x, _ in pts}:  # each column's extremes survive
        ys = [y for x, y in pts if int(x) == col]
        got = [y for x, y in kept if int(x) == col]
        assert min(ys) in got and max(ys) in got
