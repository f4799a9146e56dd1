"""The HTML run report's figures, each returned as the SVG markup of one figure.

One function per figure. Each takes plain data (sequences, mappings, :class:`Line`) and
returns a string: an ``<svg>`` drawn with the report's own kit (:mod:`freshroll.report.svg`,
:mod:`freshroll.report.svg_axes`; no plotting library, nothing imported beyond the standard
library). :mod:`freshroll.report.html` decides what to plot and embeds the markup inline
(:func:`freshroll.report.markup.img`); these functions only draw. Every text that comes
from data (labels, lane and metric names) is escaped; NaN and inf points are left out (a
line breaks there), and empty, one-point or constant series draw without error.

Conventions shared by every figure: the run under report is drawn in solid colour, a
baseline (e.g. the synchronous run) dashed in grey-orange, a limit in red; short series
(40 points or fewer) get point markers so that a 3-step run is still visible.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from freshroll.report import svg
from freshroll.report.svg_axes import LEGEND, Axis, Entry, Frame, Mark, Panel, figure, series
from freshroll.report.svg_axes import steps as _steps
from freshroll.report.svg_axes import vline as _vline

RUN_COLOR = "#1f77b4"
BASELINE_COLOR = "#ff7f0e"
LIMIT_COLOR = "#d62728"
STAGE_COLORS = ("#8c8c8c", "#1f77b4", "#17becf", "#2ca02c", "#ff7f0e", "#9467bd")
PALETTE = (RUN_COLOR, "#d62728", "#2ca02c", "#9467bd")
LANE_COLORS = ("#1f77b4", "#9467bd", "#ff7f0e", "#d62728", "#8c564b", "#2ca02c", "#e377c2")
#: one colour per series where a chart draws several of the run's own (none is the
#: baseline's grey-orange, which a dashed reference line keeps)
SERIES_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#d62728", "#8c564b", "#e377c2", "#17becf",
                 "#bcbd22")
#: canvas widths and the plot area's height of a single figure, px
WIDTH, WIDE, PLOT_HEIGHT = 660.0, 1210.0, 250.0
FEW = 40  # a series of at most this many points gets markers


@dataclass(frozen=True)
class Line:
    """One labelled series; ``baseline`` lines are drawn dashed in the baseline colour.
    ``style`` may set ``color``, ``linestyle`` (``-``, ``--``, ``:``, ``-.``), ``linewidth``,
    ``marker`` (None: no markers; anything else: point markers) and ``alpha``."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    baseline: bool = False
    style: dict[str, object] = field(default_factory=dict)

    def look(self, color: str | None = None) -> Entry:
        """The line's colour, dash, width and markers, as its legend entry."""
        s = self.style
        width = s.get("linewidth", 1.6)
        alpha = s.get("alpha", 1.0)
        dot = s["marker"] is not None if "marker" in s else len(self.x) <= FEW
        return Entry(self.label,
                     str(s.get("color") or color or (BASELINE_COLOR if self.baseline
                                                     else RUN_COLOR)),
                     str(s.get("linestyle", "--" if self.baseline else "-")),
                     float(width) if isinstance(width, int | float) else 1.6, dot,
                     opacity=float(alpha) if isinstance(alpha, int | float) else 1.0)


def _mark(line: Line, look: Entry) -> Mark:
    return series(line.x, line.y, look.color, width=look.width, dash=look.dash,
                  dot=look.dot, opacity=look.opacity)


def _xs(lines: Sequence[Line | None]) -> list[float]:
    return [v for line in lines if line is not None for v in line.x]


def _ys(lines: Sequence[Line | None]) -> list[float]:
    return [v for line in lines if line is not None for v in line.y]


def line_chart(
    lines: Sequence[Line], *, title: str, xlabel: str, ylabel: str,
    ylim: tuple[float | None, float | None] | None = None,
) -> str:
    """Generic line chart (reward vs step, reward vs wall time, ...); legend if >1 line."""
    looks = [line.look() for line in lines]
    lo, hi = ylim if ylim is not None else (None, None)
    panel = Panel(Axis.of(_xs(lines)), Axis.of(_ys(lines), lo=lo, hi=hi), PLOT_HEIGHT,
                  [_mark(line, look) for line, look in zip(lines, looks, strict=True)],
                  title=title, xlabel=xlabel, ylabel=ylabel)
    return figure(WIDTH, [panel], looks if len(lines) > 1 else ())


def reward_curve(lines: Sequence[Line], *, xlabel: str) -> str:
    """Mean reward per trainer step against ``xlabel`` (step or wall time)."""
    by = "step" if "step" in xlabel else "wall time"
    return line_chart(lines, title=f"Reward vs {by}", xlabel=xlabel, ylabel="mean reward")


def reward_functions(lines: Sequence[Line]) -> str:
    """Each reward function's raw (unweighted) mean and std per step: the lines as given (one
    colour per function, :data:`SERIES_COLORS`; the caller pairs each mean with its std)."""
    return line_chart(lines, title="Reward functions vs step", xlabel="trainer step",
                      ylabel="raw reward")


def lag_histogram(lags: Sequence[int] | Mapping[int, int], max_staleness: int | None) -> str:
    """Committed samples per integer lag, with the ``max_staleness`` bound marked.

    ``lags``: one lag per sample, or (for a run of any size) the histogram ``lag -> samples``.
    """
    hist = dict(lags) if isinstance(lags, Mapping) else dict(Counter(lags))
    n_samples = sum(hist.values())
    top = max([*hist, -1 if max_staleness is None else max_staleness + 1, 0]) + 1
    counts = [0] * top
    for lag, k in hist.items():
        if 0 <= lag < top:
            counts[lag] += k

    def bars(f: Frame) -> str:
        out = []
        half = 0.4 * f.width / (f.x.hi - f.x.lo)
        for lag, count in enumerate(counts):
            over = max_staleness is not None and lag > max_staleness
            x, y = f.px(lag), f.py(count)
            out.append(svg.rect(x - half, y, 2 * half, f.py(0) - y,
                                LIMIT_COLOR if over else RUN_COLOR))
            if count and svg.text_width(f"{count}", LEGEND) < 2.5 * half:  # clear of the next
                out.append(svg.text(f"{count}", x, y - 3, LEGEND, cls="value"))
        return "".join(out)

    marks: list[Mark] = [bars]
    legend = []
    if max_staleness is not None:
        marks.append(_vline(max_staleness + 0.5, LIMIT_COLOR))
        legend.append(Entry(f"max_staleness η = {max_staleness} (allowed: lag ≤ η)",
                            LIMIT_COLOR, "--", 1.5))
    panel = Panel(Axis(-0.6, top - 0.4, min_step=1.0), Axis(0, max([*counts, 1]) * 1.15),
                  PLOT_HEIGHT, marks, title=f"Lag of committed samples (n = {n_samples})",
                  xlabel="lag (trainer steps)", ylabel="samples", xgrid=False)
    return figure(WIDTH, [panel], legend)


def stage_bars(means: Mapping[str, Mapping[str, float]]) -> str:
    """Horizontal stacked bar per run: mean seconds per stage of an accepted sample."""
    runs = list(means)
    stages = list(dict.fromkeys(s for run in runs for s in means[run]))
    colors = {s: STAGE_COLORS[i % len(STAGE_COLORS)] for i, s in enumerate(stages)}
    total = max((sum(_finite(means[r].values())) for r in runs), default=0.0) or 1.0

    def bars(f: Frame) -> str:
        out = []
        half = 0.3 * f.height / (f.y.hi - f.y.lo)
        for i, run in enumerate(runs):
            left = 0.0
            for stage in stages:
                w = _finite([means[run].get(stage, 0.0)])[0]
                x0, x1, y = f.px(left), f.px(left + w), f.py(i)
                out.append(svg.rect(x0, y - half, x1 - x0, 2 * half, colors[stage]))
                value = svg.number(w, 3)
                if w / total > 0.05 and svg.text_width(value, LEGEND) < x1 - x0 - 4:
                    out.append(svg.text(value, (x0 + x1) / 2, y + 0.35 * LEGEND, LEGEND,
                                        fill="#fff", cls="value"))
                left += w
        return "".join(out)

    panel = Panel(Axis.of([0.0, total], lo=0.0), Axis.categories(runs), 40.0 * max(1, len(runs)),
                  [bars], title="Where an accepted sample's time goes",
                  xlabel="mean seconds per accepted sample (request → commit)", ygrid=False,
                  flip_y=True)
    return figure(WIDE, [panel], [Entry(s, colors[s], patch=True) for s in stages])


def _finite(values: Iterable[object]) -> list[float]:
    """The values as floats, 0 for what is not a finite number."""
    return [float(v) if isinstance(v, int | float) and math.isfinite(v) else 0.0
            for v in values]


def per_step_chart(
    per_step: Line, cumulative: Line | None, baseline: Line | None, *,
    title: str, ylabel: str, ratio: bool = False,
) -> str:
    """Per-step values as faint points, the running (cumulative) value as a solid line."""
    look = Entry(per_step.label, RUN_COLOR, width=1.0, dot=True, opacity=0.45)
    return _over_time([_mark(per_step, look)], [look], [per_step], cumulative, baseline,
                      title, ylabel, ratio)


def rate_chart(
    edges: Sequence[float], rates: Sequence[float], cumulative: Line | None,
    baseline: Line | None, *, title: str, ylabel: str,
) -> str:
    """A rate per time bin (``edges`` has one more entry than ``rates``) as a filled step plot,
    with the running rate as a solid line; robust to bursts of commits at one instant."""
    marks: list[Mark] = []
    legend = []
    if rates:
        def stairs(f: Frame) -> str:
            pts = [(f.px(edges[0]), f.py(0))]
            for i, r in enumerate(_finite(rates)):
                pts += [(f.px(edges[i]), f.py(r)), (f.px(edges[i + 1]), f.py(r))]
            pts.append((f.px(edges[len(rates)]), f.py(0)))
            d = "M" + " L".join(f"{svg.n(x)},{svg.n(y)}" for x, y in pts) + " Z"
            return f'<path d="{d}" fill="{RUN_COLOR}" fill-opacity="0.25"/>'

        marks.append(stairs)
        legend.append(Entry(f"per {edges[1] - edges[0]:.3g} s bin", RUN_COLOR, patch=True,
                            opacity=0.25))
    bins = Line("", list(edges), [0.0, *_finite(rates)])
    return _over_time(marks, legend, [bins], cumulative, baseline, title, ylabel, ratio=False)


def _over_time(marks: list[Mark], legend: list[Entry], shown: list[Line],
               cumulative: Line | None, baseline: Line | None, title: str, ylabel: str,
               ratio: bool) -> str:
    for line, color, dash in ((cumulative, RUN_COLOR, "-"), (baseline, BASELINE_COLOR, "--")):
        if line is not None:  # the running value, solid; the baseline's, dashed
            marks.append(series(line.x, line.y, color, width=2.0, dash=dash))
            legend.append(Entry(line.label, color, dash, 2.0))
            shown.append(line)
    if ratio:
        y = Axis(-0.02, 1.05)
    else:
        top = max(_finite(_ys(shown)), default=0.0)
        y = Axis(0.0, max(top * 1.05, 1e-9) * 1.12)
    x = Axis.of(_xs(shown), lo=0.0)
    panel = Panel(x, y, PLOT_HEIGHT, marks, title=title,
                  xlabel="wall time since run start (s)", ylabel=ylabel)
    return figure(WIDTH, [panel], legend)


def off_policy_panels(panels: Sequence[tuple[str, Sequence[Line]]]) -> str:
    """Stacked panels sharing the step axis (IS weights, mismatch KL, clip fraction, ...)."""
    x = Axis.of(_xs([line for _, lines in panels for line in lines]))
    drawn = []
    for i, (ylabel, lines) in enumerate(panels):
        looks = [line.look(None if line.baseline else PALETTE[j % len(PALETTE)])
                 for j, line in enumerate(lines)]
        drawn.append(Panel(
            x, Axis.of(_ys(lines)), 120.0,
            [_mark(line, look) for line, look in zip(lines, looks, strict=True)],
            title="Off-policy health per trainer step" if i == 0 else "",
            xlabel="trainer step" if i == len(panels) - 1 else "", ylabel=ylabel,
            xticks=i == len(panels) - 1, legend=looks if len(lines) > 1 else []))
    return figure(WIDE, drawn, gap=12.0)


def timeline(lanes: Sequence[str], points: Sequence[tuple[float, str]],
             controls: Sequence[tuple[float, int, int]] = ()) -> str:
    """A run's history: one row per lane with a mark at each entry's time (``points``:
    ``(t, lane)``), and below it, when the controller decided, its worker count and
    admission limit over time (``controls``: ``(t, workers, admission_limit)``)."""
    used = [lane for lane in lanes if any(p[1] == lane for p in points)]

    def marks(f: Frame) -> str:
        out = []
        for i, lane in enumerate(used):
            color = LANE_COLORS[lanes.index(lane) % len(LANE_COLORS)]
            pts = [(f.px(t), f.py(i)) for t, name in points if name == lane and _ok(t)]
            if len(pts) > 60:
                out.append(f'<g {svg.stroke(color, 1.2)}>' + "".join(
                    svg.line(x, y - 6, x, y + 6, "") for x, y in pts) + "</g>")
            else:
                out.append(svg.circles(pts, 3.0, color))
        return "".join(out)

    times = [t for t, _ in points] + [c[0] for c in controls]
    drawn = [Panel(Axis.of(times), Axis.categories(used), 26.0 * max(1, len(used)), [marks],
                   title="Run history", xlabel="seconds since the run opened", ygrid=False,
                   flip_y=True)]
    legend = []
    if controls:
        xs = [c[0] for c in controls]
        look = (Entry("workers", RUN_COLOR),
                Entry("admission limit (groups)", BASELINE_COLOR, "--"))
        drawn.append(Panel(
            Axis.of(times), Axis.of([v for c in controls for v in c[1:]], min_step=1.0),
            150.0, [_steps(xs, [c[1] for c in controls], RUN_COLOR),
                    _steps(xs, [c[2] for c in controls], BASELINE_COLOR, dash="--")],
            title="Controller settings after each decision",
            xlabel="seconds since the run opened"))
        legend = list(look)
    return figure(WIDE, drawn, legend, gap=14.0)


def _ok(v: object) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


__all__ = [
    "Line", "lag_histogram", "line_chart", "off_policy_panels", "per_step_chart",
    "rate_chart", "reward_curve", "stage_bars", "timeline",
]
