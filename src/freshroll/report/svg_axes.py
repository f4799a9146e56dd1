"""Axes, panels and legends of the report's SVG figures (:mod:`freshroll.report.svg` draws).

A figure is a fixed width and a stack of :class:`Panel` s (one or more, sharing the left
and right margins), with an optional legend of :class:`Entry` s centred under the last one.
Each panel has its plot area's height, an x and a y :class:`Axis`, and its *marks*:
functions that draw data through the panel's :class:`Frame` once the layout is known.

The layout is computed, not guessed, from the estimated widths of the texts drawn around the
plot areas (:func:`freshroll.report.svg.text_width`): the left margin holds the widest y
tick label and the rotated y label beside it (the label never reaches its tick labels), the
right one a panel's legend and half of the last x tick label; below each plot area come its
tick labels and x label, above it its title. Every text is placed on the canvas; a title
or label too long for it is cut with an ellipsis (a y label, no longer than its plot area
is high, first shrinks to 9 px).
Coordinates outside an axis's range are clamped to the plot area's edge; a line of more
points than twice its plot area's width in px keeps four per pixel column (:func:`thin`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from freshroll.report import svg
from freshroll.report.svg import ASCENT, DESCENT, text_width

TICK, LABEL, TITLE, LEGEND = 11.0, 12.0, 13.0, 11.0  # font sizes, px
PAD, TICK_LEN, GAP = 8.0, 4.0, 3.0  # canvas padding, tick mark length, text gap
GRID = 'stroke="#e4e4e4" stroke-width="0.8"'
SPINE = 'stroke="#555" stroke-width="1"'


@dataclass
class Axis:
    """The range [lo, hi] shown; ``ticks``/``labels`` given (``fixed``: categories) or
    chosen at layout (nice steps no finer than ``min_step``)."""

    lo: float
    hi: float
    ticks: list[float] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    min_step: float = 0.0
    fixed: bool = False

    @classmethod
    def of(cls, values: Sequence[float], *, lo: float | None = None, hi: float | None = None,
           margin: float = 0.05, min_step: float = 0.0) -> Axis:
        """The range of the finite ``values`` widened by ``margin`` of it on each side
        (``lo``/``hi`` fixed where given); [0, 1] without values, a small range about a
        single value."""
        vals = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
        vmin, vmax = (min(vals), max(vals)) if vals else (0.0, 1.0)
        if vals and vmax - vmin <= 1e-12 * max(abs(vmin), abs(vmax), 1e-300):
            d = abs(vmin) * 0.05 or 0.5  # one value: a small range about it
            vmin, vmax = vmin - d, vmax + d
        elif vals:
            d = margin * (vmax - vmin)
            vmin, vmax = vmin - d, vmax + d
        low = vmin if lo is None else lo
        high = vmax if hi is None else hi
        if high <= low:
            high = low + (abs(low) * 0.1 or 1.0)
        return cls(low, high, min_step=min_step)

    @classmethod
    def categories(cls, names: Sequence[str]) -> Axis:
        """One tick per name at 0, 1, ... (the first at the top when it is a y axis)."""
        return cls(-0.6, max(len(names), 1) - 0.4, [float(i) for i in range(len(names))],
                   list(names), fixed=True)

    def tick(self, length: float, size: float, vertical: bool) -> tuple[list[float], list[str]]:
        if self.fixed:
            return self.ticks, self.labels
        return svg.axis_ticks(self.lo, self.hi, length, size, vertical=vertical,
                              min_step=self.min_step)


@dataclass(frozen=True)
class Frame:
    """A panel's plot area on the canvas, and its data -> px maps."""

    left: float
    top: float
    width: float
    height: float
    x: Axis
    y: Axis
    flip_y: bool = False  # categories top-down

    def px(self, v: float) -> float:
        f = (v - self.x.lo) / (self.x.hi - self.x.lo)
        return self.left + self.width * min(max(f, -0.01), 1.01)

    def py(self, v: float) -> float:
        f = (v - self.y.lo) / (self.y.hi - self.y.lo)
        f = min(max(f, -0.01), 1.01)
        return self.top + self.height * (f if self.flip_y else 1 - f)


Mark = Callable[[Frame], str]


@dataclass(frozen=True)
class Entry:
    """A legend entry: a line (``dash``: ``-``, ``--``, ``:`` or ``-.``; ``dot`` a marker) or,
    with ``patch``, a filled box."""

    label: str
    color: str
    dash: str = "-"
    width: float = 1.6
    dot: bool = False
    patch: bool = False
    opacity: float = 1.0

    def extent(self) -> float:
        return 28 + text_width(self.label, LEGEND)

    def draw(self, x: float, y: float, room: float) -> str:
        """The entry with its text's baseline at ``y``, from ``x``; ``room`` px at most."""
        mid = y - 0.35 * LEGEND
        if self.patch:
            handle = svg.rect(x, mid - 5, 18, 10, self.color, self.opacity)
        else:
            handle = svg.line(x, mid, x + 20, mid,
                              svg.stroke(self.color, self.width, self.dash, self.opacity))
            if self.dot:
                handle += svg.circles([(x + 10, mid)], 2.5, self.color, self.opacity)
        label = svg.fit(self.label, LEGEND, room - 28)
        return handle + svg.text(label, x + 26, y, LEGEND, anchor="start", cls="legend")


@dataclass
class Panel:
    """One plot area: ``height`` px, its axes, marks, texts and legend (right of it)."""

    x: Axis
    y: Axis
    height: float
    marks: list[Mark] = field(default_factory=list)
    title: str = ""
    xlabel: str = ""
    ylabel: str = ""
    xticks: bool = True  # tick labels under the plot area
    xgrid: bool = True
    ygrid: bool = True
    flip_y: bool = False
    legend: list[Entry] = field(default_factory=list)

    def above(self) -> float:
        return TITLE * 1.6 if self.title else 0.0

    def below(self) -> float:
        ticks = TICK_LEN + GAP + TICK * (ASCENT + DESCENT) if self.xticks else TICK_LEN
        return ticks + (LABEL * 1.4 if self.xlabel else 0.0)


def _rows(entries: Sequence[Entry], room: float) -> list[list[Entry]]:
    rows: list[list[Entry]] = [[]]
    used = 0.0
    for e in entries:
        w = min(e.extent(), room)
        if rows[-1] and used + w > room:
            rows.append([])
            used = 0.0
        rows[-1].append(e)
        used += w + 12
    return [r for r in rows if r]


def _yticks(p: Panel, width: float) -> tuple[list[float], list[str]]:
    """The panel's y ticks and their labels, each cut to a third of the canvas's width (a
    long run label or lane name)."""
    ticks, labels = p.y.tick(p.height, TICK, vertical=True)
    return ticks, [svg.fit(s, TICK, width / 3) for s in labels]


def _margins(width: float, panels: Sequence[Panel]) -> tuple[float, float]:
    """The left and right margins, from the y tick labels, y labels, x tick labels and
    panel legends."""
    left = right = PAD
    for p in panels:
        _, ylabels = _yticks(p, width)
        ticks = max((text_width(s, TICK) for s in ylabels), default=0.0)
        label = LABEL * (ASCENT + DESCENT) + GAP if p.ylabel else 0.0
        left = max(left, PAD + label + ticks + TICK_LEN + GAP)
        legend = max((min(e.extent(), width / 3) for e in p.legend), default=0.0)
        right = max(right, PAD + (legend + 10 if legend else 0.0))
    for p in panels:
        _, xlabels = p.x.tick(width - left - right, TICK, vertical=False)
        if p.xticks and xlabels:
            right = max(right, PAD + text_width(xlabels[-1], TICK) / 2)
            left = max(left, PAD + text_width(xlabels[0], TICK) / 2)
    return left, right


def _axes_text(p: Panel, f: Frame, canvas: tuple[float, float]) -> list[str]:
    """The panel's ticks, tick labels, grid, spines, title and axis labels."""
    out = []
    right, bottom = f.left + f.width, f.top + f.height
    yticks, ylabels = _yticks(p, canvas[0])
    widest = max((text_width(s, TICK) for s in ylabels), default=0.0)
    for v, s in zip(yticks, ylabels, strict=True):
        y = f.py(v)
        if p.ygrid:
            out.append(svg.line(f.left, y, right, y, GRID))
        out.append(svg.line(f.left - TICK_LEN, y, f.left, y, SPINE))
        out.append(svg.text(s, f.left - TICK_LEN - GAP, y + 0.35 * TICK, TICK, anchor="end",
                            cls="ytick", canvas=canvas))
    xticks, xlabels = p.x.tick(f.width, TICK, vertical=False)
    for v, s in zip(xticks, xlabels, strict=True):
        x = f.px(v)
        if p.xgrid:
            out.append(svg.line(x, f.top, x, bottom, GRID))
        out.append(svg.line(x, bottom, x, bottom + TICK_LEN, SPINE))
        if p.xticks:
            out.append(svg.text(s, x, bottom + TICK_LEN + GAP + ASCENT * TICK, TICK,
                                cls="xtick", canvas=canvas))
    out.append(svg.line(f.left, f.top, f.left, bottom, SPINE))
    out.append(svg.line(f.left, bottom, right, bottom, SPINE))
    if p.ylabel:
        size = min(LABEL, max(9.0, LABEL * f.height / text_width(p.ylabel, LABEL)))
        x = f.left - TICK_LEN - GAP - widest - GAP - DESCENT * size
        label = svg.fit(p.ylabel, size, f.height)
        out.append(svg.text(label, x, f.top + f.height / 2, size, cls="ylabel", rotate=True))
    if p.xlabel:
        label = svg.fit(p.xlabel, LABEL, canvas[0] - 2 * PAD)
        y = bottom + p.below() - LABEL * 0.35
        out.append(svg.text(label, f.left + f.width / 2, y, LABEL, cls="xlabel", canvas=canvas))
    if p.title:
        title = svg.fit(p.title, TITLE, canvas[0] - 2 * PAD)
        out.append(svg.text(title, f.left + f.width / 2, f.top - TITLE * 0.6, TITLE,
                            cls="title", canvas=canvas))
    return out


def figure(width: float, panels: Sequence[Panel], legend: Sequence[Entry] = (),
           gap: float = 10.0) -> str:
    """The SVG of ``panels`` stacked top-down on a canvas ``width`` px wide, ``legend``
    centred under them."""
    left, right = _margins(width, panels)
    room = width - 2 * PAD
    rows = _rows(legend, room)
    height = (2 * PAD + sum(p.above() + p.height + p.below() for p in panels)
              + gap * (len(panels) - 1) + LEGEND * 1.7 * len(rows))
    canvas = (width, height)
    body: list[str] = []
    top = PAD
    for p in panels:
        top += p.above()
        f = Frame(left, top, width - left - right, p.height, p.x, p.y, p.flip_y)
        body += ['<g class="panel">', *_axes_text(p, f, canvas), *(m(f) for m in p.marks)]
        for i, e in enumerate(p.legend):
            y = f.top + ASCENT * LEGEND + i * LEGEND * 1.6
            body.append(e.draw(f.left + f.width + 10, y, right - PAD - 10))
        body.append("</g>")
        top += p.height + p.below() + gap
    y = top - gap + LEGEND * (ASCENT + 0.5)
    for row in rows:
        widths = [min(e.extent(), room) for e in row]
        x = (width - sum(widths) - 12 * (len(row) - 1)) / 2
        for e, w in zip(row, widths, strict=True):
            body.append(e.draw(x, y, w))
            x += w + 12
        y += LEGEND * 1.7
    return svg.svg(width, height, body)


# -- marks ----------------------------------------------------------------------------------
def series(xs: Sequence[float], ys: Sequence[float], color: str, *, width: float = 1.6,
           dash: str = "-", dot: bool = False, opacity: float = 1.0) -> Mark:
    """A polyline through the finite points (broken at NaN/inf), with point markers."""
    runs = svg.finite(xs, ys)

    def draw(f: Frame) -> str:
        out = []
        for run in runs:
            pts = [(f.px(x), f.py(y)) for x, y in run]
            if len(pts) > 1:
                line = thin(pts) if len(pts) > 2 * f.width else pts
                out.append(svg.polyline(line, svg.stroke(color, width, dash, opacity)))
            if dot or len(pts) == 1:
                out.append(svg.circles(pts, 2.5, color, opacity))
        return "".join(out)

    return draw


def thin(pts: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """A long polyline drawn the same with fewer points: of the points whose x falls in one
    pixel column (in a row), the first, the lowest, the highest and the last, in order."""
    out: list[tuple[float, float]] = []
    i = 0
    while i < len(pts):
        j = i
        while j + 1 < len(pts) and int(pts[j + 1][0]) == int(pts[i][0]):
            j += 1
        group = pts[i:j + 1]
        keep = {0, len(group) - 1, min(range(len(group)), key=lambda k: group[k][1]),
                max(range(len(group)), key=lambda k: group[k][1])}
        out += [group[k] for k in sorted(keep)]
        i = j + 1
    return out


def steps(xs: Sequence[float], ys: Sequence[float], color: str, *, dash: str = "-",
          width: float = 1.6) -> Mark:
    """A step line: each value holds until the next x (a post step)."""
    px: list[float] = []
    py: list[float] = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if i:
            px.append(x)
            py.append(py[-1])
        px.append(x)
        py.append(y)
    return series(px, py, color, dash=dash, width=width)


def vline(x: float, color: str, dash: str = "--", width: float = 1.5) -> Mark:
    def draw(f: Frame) -> str:
        return svg.line(f.px(x), f.top, f.px(x), f.top + f.height, svg.stroke(color, width, dash))

    return draw


__all__ = ["Axis", "Entry", "Frame", "Mark", "Panel", "figure", "series", "steps", "thin",
           "vline"]
