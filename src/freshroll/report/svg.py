"""A small SVG drawing kit for the report's figures: text, ticks, and the shapes they use.

No plotting library: a figure is a string of SVG markup, drawn in the page itself (the report
stays one self-contained file). What this module guarantees:

* **Text is escaped.** :func:`text` and :func:`esc` escape every string they are given
  (``&``, ``<``, ``>``, quotes): a run label like ``a<b & "c"`` is drawn as text.
* **Text widths are estimated, deterministically and generously.** :func:`text_width` sums
  per-character widths (in em) of DejaVu Sans / Verdana, the widest of the fonts the figures
  name (``FONT``); narrower fallbacks (Arial, Helvetica, Liberation Sans) only draw smaller.
  Margins are computed from these widths, and :func:`text` keeps a text's estimated box on
  the canvas. Vertically a text spans ``ASCENT`` em above its baseline and ``DESCENT`` below.
* **Ticks are nice**: steps of 1, 2 or 5 x 10^k (:func:`nice_ticks`), as many as fit their
  labels without overlap, labelled compactly (:func:`tick_labels`: ``1.2k``, ``250k``,
  ``0.05``, ``3e-05``).
* **Numbers are finite**: coordinates are written with :func:`n`, which drops NaN and inf
  to 0 (callers filter non-finite data points before drawing; this is a last guard so that
  the markup stays well-formed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

FONT = "DejaVu Sans, Verdana, Geneva, sans-serif"
ASCENT, DESCENT = 0.95, 0.25  # em above / below the baseline (DejaVu Sans: 0.93, 0.24)

#: per-character advance widths in em (DejaVu Sans, rounded up); others: by class below
_WIDE = dict.fromkeys("mwMW%@", 1.0) | dict.fromkeys("=+<>~≤≥→←×÷±", 0.84)
_NARROW = dict.fromkeys("il|!.,:;'", 0.32) | dict.fromkeys("jft()[]{} \"`/\\-", 0.42)
_DIGIT, _LOWER, _UPPER, _OTHER = 0.64, 0.64, 0.8, 0.84


def char_width(c: str) -> float:
    """One character's estimated advance in em."""
    if c in _WIDE:
        return _WIDE[c]
    if c in _NARROW:
        return _NARROW[c]
    if c.isdigit():
        return _DIGIT
    if c.isalpha():
        return _UPPER if c.isupper() else _LOWER
    return _OTHER


def text_width(s: str, size: float) -> float:
    """Estimated width in px of ``s`` at font size ``size`` px (never less than the real
    width in the fonts of ``FONT``)."""
    return size * sum(char_width(c) for c in s)


def fit(s: str, size: float, room: float) -> str:
    """``s``, cut with an ellipsis where its estimated width would pass ``room`` px."""
    if text_width(s, size) <= room + 1e-6:
        return s
    while s and text_width(s + "…", size) > room:
        s = s[:-1]
    return s + "…" if s else ""


def n(v: float) -> str:
    """A coordinate as short text: finite, two decimals at most."""
    if not math.isfinite(v):
        v = 0.0
    s = f"{v:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def number(value: float, digits: int = 4) -> str:
    """``value`` as text for a reader: at most ``digits`` significant digits, and never in
    scientific notation from 1e-3 up (``123,456`` and ``12,346``, not ``1.235e+05`` and
    ``1.235e+04``: a whole count written as a float in JSON is still a count); smaller, as
    ``1.20e-05``."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    if abs(value) >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    if abs(value) >= 1e-3:
        return f"{value:.{digits}g}"
    return f"{value:.2e}"


def esc(s: str) -> str:
    """Text (or an attribute value) escaped for XML."""
    return escape(s, quote=True)


# -- ticks --------------------------------------------------------------------------------
def nice_step(raw: float) -> float:
    """The smallest 1, 2 or 5 x 10^k at least ``raw`` (> 0)."""
    k = math.floor(math.log10(raw))
    for m in (1.0, 2.0, 5.0, 10.0):
        step = m * 10.0**k
        if step >= raw * (1 - 1e-9):
            return step
    return 10.0 ** (k + 1)


def nice_ticks(lo: float, hi: float, count: int, min_step: float = 0.0) -> tuple[list[float],
                                                                                float]:
    """About ``count`` (at most) multiples of a nice step within [lo, hi], and the step."""
    step = nice_step(max((hi - lo) / max(count, 1), min_step, 1e-300))
    return ticks_at(lo, hi, step), step


def ticks_at(lo: float, hi: float, step: float) -> list[float]:
    """The multiples of ``step`` within [lo, hi] (0 written as 0)."""
    first = math.ceil(lo / step - 1e-9)
    last = math.floor(hi / step + 1e-9)
    ticks = [i * step for i in range(first, last + 1)] if last - first < 1000 else [lo, hi]
    return [0.0 if abs(t) < step * 1e-9 else t for t in ticks]


_SUFFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def tick_labels(ticks: Sequence[float], step: float) -> list[str]:
    """Compact labels for ticks ``step`` apart: ``1.2k``, ``250k``, ``0.05``, ``3e-05``."""
    if not ticks:
        return []
    top = max(abs(t) for t in ticks)
    scale, suffix = next(((s, x) for s, x in _SUFFIXES if top >= s), (1.0, ""))
    if not suffix and 0 < step < 1e-3:
        return [f"{t:.2g}" if t else "0" for t in ticks]
    decimals = min(6, max(0, -math.floor(math.log10(step / scale) + 1e-9)))
    return [f"{t / scale:.{decimals}f}{suffix}" if t else "0" for t in ticks]


def axis_ticks(lo: float, hi: float, length: float, size: float, *, vertical: bool,
               min_step: float = 0.0) -> tuple[list[float], list[str]]:
    """Ticks for an axis of ``length`` px showing [lo, hi]: the finest nice step (at most
    about 8 ticks) whose labels do not overlap (x: their widths plus a gap; y: 2 lines
    apart), no finer than ``min_step``."""
    if not (hi > lo and length > 0):
        return [], []
    step = nice_step(max((hi - lo) / 8, min_step, 1e-300))
    for _ in range(60):
        ticks = ticks_at(lo, hi, step)
        labels = tick_labels(ticks, step)
        need = (2 * size if vertical
                else max((text_width(s, size) for s in labels), default=0) + size)
        if length * step / (hi - lo) >= need:
            return ticks, labels
        step = nice_step(step * 1.5)  # the next nice step: 1 -> 2 -> 5 -> 10
    return [], []


# -- elements -----------------------------------------------------------------------------
def text(s: str, x: float, y: float, size: float, *, anchor: str = "middle",
         canvas: tuple[float, float] | None = None, cls: str = "", fill: str = "",
         weight: str = "", rotate: bool = False) -> str:
    """A ``<text>`` with its baseline at ``y``; ``anchor``: start, middle or end. With
    ``canvas`` (width, height) the text is moved, by its estimated width, onto it."""
    if canvas is not None and not rotate:
        w = text_width(s, size)
        left = x - {"start": 0, "middle": w / 2, "end": w}[anchor]
        x += max(0.0, 1 - left) - max(0.0, left + w - canvas[0] + 1)
        y = min(max(y, ASCENT * size + 1), canvas[1] - DESCENT * size - 1)
    attrs = [f'x="{n(x)}"', f'y="{n(y)}"', f'font-size="{n(size)}"']
    if anchor != "start":
        attrs.append(f'text-anchor="{anchor}"')
    if rotate:
        attrs.append(f'transform="rotate(-90 {n(x)} {n(y)})"')
    for key, value in (("class", cls), ("fill", fill), ("font-weight", weight)):
        if value:
            attrs.append(f'{key}="{esc(value)}"')
    return f"<text {' '.join(attrs)}>{esc(s)}</text>"


DASHES = {"-": "", "--": "5 3", ":": "1.5 2.5", "-.": "6 2.5 1.5 2.5"}


def stroke(color: str, width: float, dash: str = "-", opacity: float = 1.0) -> str:
    """Stroke attributes; ``dash``: ``-`` solid, ``--`` dashed, ``:`` dotted, ``-.`` dash-dot."""
    out = f'fill="none" stroke="{esc(color)}" stroke-width="{n(width)}"'
    if DASHES.get(dash, ""):
        out += f' stroke-dasharray="{DASHES[dash]}"'
    return out + (f' stroke-opacity="{n(opacity)}"' if opacity < 1 else "")


def line(x1: float, y1: float, x2: float, y2: float, attrs: str) -> str:
    return f'<line x1="{n(x1)}" y1="{n(y1)}" x2="{n(x2)}" y2="{n(y2)}" {attrs}/>'


def polyline(points: Sequence[tuple[float, float]], attrs: str) -> str:
    pts = " ".join(f"{n(x)},{n(y)}" for x, y in points)
    return f'<polyline points="{pts}" stroke-linejoin="round" {attrs}/>'


def rect(x: float, y: float, w: float, h: float, fill: str, opacity: float = 1.0) -> str:
    extra = f' fill-opacity="{n(opacity)}"' if opacity < 1 else ""
    return (f'<rect x="{n(x)}" y="{n(y)}" width="{n(max(w, 0))}" height="{n(max(h, 0))}" '
            f'fill="{esc(fill)}"{extra}/>')


def circles(points: Sequence[tuple[float, float]], r: float, fill: str,
            opacity: float = 1.0) -> str:
    """Point markers, one ``<circle>`` each, in one group."""
    extra = f' fill-opacity="{n(opacity)}"' if opacity < 1 else ""
    dots = "".join(f'<circle cx="{n(x)}" cy="{n(y)}" r="{n(r)}"/>' for x, y in points)
    return f'<g fill="{esc(fill)}"{extra}>{dots}</g>'


def svg(width: float, height: float, body: Sequence[str]) -> str:
    """The figure: an ``<svg>`` of ``width`` x ``height`` px (its viewBox) around ``body``."""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {n(width)} {n(height)}" '
            f'width="{n(width)}" height="{n(height)}" font-family="{FONT}" fill="#222">'
            f'<rect width="100%" height="100%" fill="#fff"/>{"".join(body)}</svg>')


def finite(xs: Sequence[float], ys: Sequence[float]) -> list[list[tuple[float, float]]]:
    """The runs of points whose x and y are both finite (a NaN or inf breaks a line)."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in zip(xs, ys, strict=False):
        if _ok(x) and _ok(y):
            runs[-1].append((float(x), float(y)))
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def _ok(v: object) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


__all__ = [
    "ASCENT", "DASHES", "DESCENT", "FONT", "axis_ticks", "char_width", "circles", "esc",
    "finite", "fit", "line", "n", "nice_step", "nice_ticks", "polyline", "rect", "stroke",
    "svg", "text", "text_width", "tick_labels", "ticks_at",
]
