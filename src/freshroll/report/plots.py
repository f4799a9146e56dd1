"""Small matplotlib figures for the HTML run report, each rendered to PNG bytes.

One function per figure. Each takes plain data (sequences, mappings, :class:`Line`)
and returns the PNG bytes of one figure, drawn with the Agg backend on a fresh
:class:`~matplotlib.figure.Figure` (no pyplot global state: nothing leaks between
calls and nothing opens a window). :mod:`freshroll.report.html` decides what to
plot and embeds the bytes; these functions only draw.

Conventions shared by every figure: the run under report is drawn in solid
colour, a baseline (e.g. the synchronous run) dashed in grey-orange; short
series get point markers so that a 3-step run is still visible.
"""

from __future__ import annotations

import functools
import io
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec

import matplotlib

matplotlib.use("Agg")

from matplotlib.axes import Axes
from matplotlib.figure import Figure

P = ParamSpec("P")
RUN_COLOR = "#1f77b4"
BASELINE_COLOR = "#ff7f0e"
LIMIT_COLOR = "#d62728"
STAGE_COLORS = ("#8c8c8c", "#1f77b4", "#17becf", "#2ca02c", "#ff7f0e", "#9467bd")
WIDTH, HEIGHT, WIDE, DPI = 6.0, 3.3, 11.0, 110
_RC: dict[str, Any] = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
}


@dataclass(frozen=True)
class Line:
    """One labelled series; ``baseline`` lines are drawn dashed in the baseline colour."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    baseline: bool = False
    style: dict[str, object] = field(default_factory=dict)


def _styled(fn: Callable[P, bytes]) -> Callable[P, bytes]:
    """Draw the whole figure under the report's rc style (fonts, grid, spines)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> bytes:
        with matplotlib.rc_context(_RC):  # type: ignore[arg-type]  # rc values: Any by design
            return fn(*args, **kwargs)

    return wrapper


def _figure(height: float = HEIGHT, width: float = WIDTH) -> Figure:
    """A figure without a layout engine: :func:`_fit` sets its margins from its labels."""
    return Figure(figsize=(width, height), dpi=DPI)


#: inches per character of a tick label or legend entry (8 pt DejaVu Sans: digits are 0.64
#: em, lower-case letters 0.5-0.65 em), of one text line at 8-10 pt, and a small pad
CHAR_IN, LINE_IN, PAD_IN = 0.072, 0.2, 0.08


def _labels(ax: Axes, which: str) -> list[str]:
    """The tick labels that ``ax`` will draw on its ``which`` ("x" or "y") axis."""
    axis = ax.yaxis if which == "y" else ax.xaxis
    lo, hi = sorted(ax.get_ylim() if which == "y" else ax.get_xlim())
    locs = [v for v in axis.get_majorticklocs() if lo - 1e-9 * abs(hi - lo) <= v <= hi]
    return [str(t) for t in axis.get_major_formatter().format_ticks(locs)]


def _fit(fig: Figure, axes: Sequence[Axes], *, legend_rows: int = 0, right_in: float = 0.0,
         gap_in: float | None = None) -> None:
    """Margins (and the gap between stacked axes) in inches, from what the figure draws
    outside its axes: the widest y tick label and the y label on the left; tick labels, the
    x label and ``legend_rows`` rows of a figure legend below; a title above; ``right_in``
    for legends to the right of the axes. matplotlib's ``constrained`` layout measures the
    same by drawing every label twice before the figure is drawn (about a third of a
    report's CPU); here each is sized by its characters."""
    width, height = fig.get_size_inches()
    ytext = max((len(t) for ax in axes for t in _labels(ax, "y")), default=1)
    left = 2 * PAD_IN + ytext * CHAR_IN + (LINE_IN if any(ax.get_ylabel() for ax in axes) else 0)
    low = axes[-1]
    bottom = (PAD_IN + (LINE_IN if _labels(low, "x") else 0)
              + (LINE_IN if low.get_xlabel() else 0) + legend_rows * LINE_IN)
    top = PAD_IN + (1.3 * LINE_IN if axes[0].get_title() else 0)
    gap = gap_in if gap_in is not None else PAD_IN
    inner = height - top - bottom
    span = (inner - gap * (len(axes) - 1)) / len(axes)
    fig.subplots_adjust(left=left / width, right=1 - (PAD_IN + right_in) / width,
                        bottom=bottom / height, top=1 - top / height,
                        hspace=gap / max(span, 1e-3))


def _bottom_legend(fig: Figure, ncol: int = 1, **kwargs: Any) -> int:
    """A legend centred under the axes (``_fit`` leaves it room); its rows."""
    fig.legend(loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, frameon=False,
               **kwargs)
    labels = len(fig.axes[0].get_legend_handles_labels()[1]) if fig.axes else 1
    return max(1, -(-labels // max(ncol, 1)))


def _png(fig: Figure) -> bytes:
    """The figure's PNG, the same bytes as ``fig.savefig(buf, format="png", dpi=DPI)``: one
    draw on an Agg canvas, its buffer written as ``savefig`` writes it
    (``FigureCanvasAgg._print_pil``). (``savefig`` draws a figure with a layout engine twice;
    the report's figures have none since :func:`_fit`.)"""
    import matplotlib.image
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # type: ignore[no-untyped-call]  # matplotlib leaves these unannotated
    buf = io.BytesIO()
    rgba = canvas.buffer_rgba()  # type: ignore[no-untyped-call]  # matplotlib: unannotated
    matplotlib.image.imsave(buf, rgba, format="png", origin="upper", dpi=fig.dpi)
    return buf.getvalue()


def _axes(fig: Figure, *args: int) -> Axes:
    return fig.add_subplot(*args)


def _draw(ax: Axes, line: Line, color: str | None = None) -> None:
    few = len(line.x) <= 40
    style: dict[str, object] = {
        "color": color or (BASELINE_COLOR if line.baseline else RUN_COLOR),
        "linestyle": "--" if line.baseline else "-",
        "linewidth": 1.6,
        "marker": "o" if few else None,
        "markersize": 3,
    }
    style.update(line.style)
    kwargs: dict[str, Any] = style  # matplotlib's kwargs are typed per key; ours vary
    ax.plot(list(line.x), list(line.y), label=line.label, **kwargs)


@_styled
def line_chart(
    lines: Sequence[Line], *, title: str, xlabel: str, ylabel: str,
    ylim: tuple[float | None, float | None] | None = None,
) -> bytes:
    """Generic line chart (reward vs step, reward vs wall time, ...); legend if >1 line."""
    fig = _figure()
    ax = _axes(fig)
    for line in lines:
        _draw(ax, line)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if len(lines) > 1:
        ax.legend(loc="best", frameon=False)
    _fit(fig, [ax])
    return _png(fig)


@_styled
def reward_curve(lines: Sequence[Line], *, xlabel: str) -> bytes:
    """Mean reward per trainer step against ``xlabel`` (step or wall time)."""
    by = "step" if "step" in xlabel else "wall time"
    return line_chart(lines, title=f"Reward vs {by}", xlabel=xlabel, ylabel="mean reward")


@_styled
def lag_histogram(lags: Sequence[int] | Mapping[int, int], max_staleness: int | None) -> bytes:
    """Committed samples per integer lag, with the ``max_staleness`` bound marked.

    ``lags``: one lag per sample, or (for a run of any size) the histogram ``lag -> samples``.
    """
    fig = _figure()
    ax = _axes(fig)
    hist = dict(lags) if isinstance(lags, Mapping) else dict(Counter(lags))
    n_samples = sum(hist.values())
    top = max([*hist, -1 if max_staleness is None else max_staleness + 1, 0]) + 1
    counts = [0] * top
    for lag, k in hist.items():
        if 0 <= lag < top:
            counts[lag] += k
    over = [max_staleness is not None and lag > max_staleness for lag in range(top)]
    colors = [LIMIT_COLOR if o else RUN_COLOR for o in over]
    ax.bar(range(top), counts, width=0.8, color=colors, zorder=2)
    for x, n in enumerate(counts):
        if n:
            ax.annotate(f"{n}", (x, n), ha="center", va="bottom", fontsize=8,
                        xytext=(0, 2), textcoords="offset points")
    if max_staleness is not None:
        ax.axvline(max_staleness + 0.5, color=LIMIT_COLOR, linestyle="--", linewidth=1.5,
                   label=f"max_staleness η = {max_staleness} (allowed: lag ≤ η)")
    ax.set_xticks(range(top))
    ax.set_xlim(-0.6, top - 0.4)
    ax.set_ylim(0, max([*counts, 1]) * 1.15)
    ax.set_title(f"Lag of committed samples (n = {n_samples})")
    ax.set_xlabel("lag (trainer steps)")
    ax.set_ylabel("samples")
    ax.grid(axis="x", visible=False)
    _fit(fig, [ax], legend_rows=_bottom_legend(fig) if max_staleness is not None else 0)
    return _png(fig)


@_styled
def stage_bars(means: Mapping[str, Mapping[str, float]]) -> bytes:
    """Horizontal stacked bar per run: mean seconds per stage of an accepted sample."""
    runs = list(means)
    stages = list(dict.fromkeys(s for run in runs for s in means[run]))
    fig = _figure(height=1.6 + 0.5 * len(runs), width=WIDE)
    ax = _axes(fig)
    left = [0.0] * len(runs)
    total = max((sum(means[r].values()) for r in runs), default=0.0) or 1.0
    for i, stage in enumerate(stages):
        widths = [means[r].get(stage, 0.0) for r in runs]
        bars = ax.barh(runs, widths, left=left, height=0.6, label=stage,
                       color=STAGE_COLORS[i % len(STAGE_COLORS)], zorder=2)
        for bar, w in zip(bars, widths, strict=True):
            if w / total > 0.05:
                ax.text(bar.get_x() + w / 2, bar.get_y() + bar.get_height() / 2, f"{w:.3g}",
                        ha="center", va="center", fontsize=8, color="white")
        left = [a + w for a, w in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("mean seconds per accepted sample (request → commit)")
    ax.set_title("Where an accepted sample's time goes")
    ax.grid(axis="y", visible=False)
    _fit(fig, [ax], legend_rows=_bottom_legend(fig, ncol=len(stages), handlelength=1.2))
    return _png(fig)


@_styled
def per_step_chart(
    per_step: Line, cumulative: Line | None, baseline: Line | None, *,
    title: str, ylabel: str, ratio: bool = False,
) -> bytes:
    """Per-step values as faint points, the running (cumulative) value as a solid line."""
    fig = _figure()
    ax = _axes(fig)
    ax.plot(list(per_step.x), list(per_step.y), color=RUN_COLOR, alpha=0.45, linewidth=1,
            marker="o", markersize=3, label=per_step.label)
    _finish_over_time(ax, cumulative, baseline, title, ylabel, ratio)
    return _png(fig)


@_styled
def rate_chart(
    edges: Sequence[float], rates: Sequence[float], cumulative: Line | None,
    baseline: Line | None, *, title: str, ylabel: str,
) -> bytes:
    """A rate per time bin (``edges`` has one more entry than ``rates``) as a filled step plot,
    with the running rate as a solid line; robust to bursts of commits at one instant."""
    fig = _figure()
    ax = _axes(fig)
    if rates:
        ax.stairs(list(rates), list(edges), fill=True, color=RUN_COLOR, alpha=0.25,
                  label=f"per {edges[1] - edges[0]:.3g} s bin", zorder=2)
    _finish_over_time(ax, cumulative, baseline, title, ylabel, ratio=False)
    return _png(fig)


def _finish_over_time(
    ax: Axes, cumulative: Line | None, baseline: Line | None, title: str, ylabel: str,
    ratio: bool,
) -> None:
    if cumulative is not None:
        ax.plot(list(cumulative.x), list(cumulative.y), color=RUN_COLOR, linewidth=2,
                label=cumulative.label)
    if baseline is not None:
        ax.plot(list(baseline.x), list(baseline.y), color=BASELINE_COLOR, linestyle="--",
                linewidth=2, label=baseline.label)
    ax.set_title(title)
    ax.set_xlabel("wall time since run start (s)")
    ax.set_ylabel(ylabel)
    if ratio:
        ax.set_ylim(-0.02, 1.05)
    else:
        ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1e-9) * 1.12)
    ax.set_xlim(left=0)
    fig = ax.get_figure()
    assert isinstance(fig, Figure)
    labels = len(ax.get_legend_handles_labels()[1])
    _fit(fig, [ax], legend_rows=_bottom_legend(fig, ncol=min(3, labels), fontsize=7.5,
                                               handlelength=1.6))


@_styled
def off_policy_panels(panels: Sequence[tuple[str, Sequence[Line]]]) -> bytes:
    """Stacked panels sharing the step axis (IS weights, mismatch KL, clip fraction, ...)."""
    fig = _figure(height=1.0 + 1.55 * len(panels), width=WIDE)
    axes = [_axes(fig, len(panels), 1, i + 1) for i in range(len(panels))]
    for i, (ax, (ylabel, lines)) in enumerate(zip(axes, panels, strict=True)):
        palette = (RUN_COLOR, "#d62728", "#2ca02c", "#9467bd")
        for j, line in enumerate(lines):
            _draw(ax, line, None if line.baseline else palette[j % len(palette)])
        ax.set_ylabel(ylabel)
        if len(lines) > 1:
            ax.legend(loc="upper left", frameon=False, ncol=len(lines), bbox_to_anchor=(1.0, 1.0))
        if i > 0:
            ax.sharex(axes[0])
        if i < len(panels) - 1:
            ax.tick_params(labelbottom=False)
    axes[0].set_title("Off-policy health per trainer step")
    axes[-1].set_xlabel("trainer step")
    # an entry: its handle, the pad and the column spacing (4.8 em of 8 pt), then its label
    legend_in = max((PAD_IN + sum(4.8 * 8 / 72 + CHAR_IN * len(line.label) for line in lines)
                     for _, lines in panels if len(lines) > 1), default=0.0)
    _fit(fig, axes, right_in=legend_in, gap_in=1.5 * PAD_IN)
    return _png(fig)


__all__ = [
    "Line", "lag_histogram", "line_chart", "off_policy_panels", "per_step_chart",
    "rate_chart", "reward_curve", "stage_bars",
]


@_styled
def timeline(lanes: Sequence[str], points: Sequence[tuple[float, str]],
             controls: Sequence[tuple[float, int, int]] = ()) -> bytes:
    """A run's history: one row per lane with a mark at each entry's time (``points``:
    ``(t, lane)``), and below it, when the controller decided, its worker count and
    admission limit over time (``controls``: ``(t, workers, admission_limit)``)."""
    used = [lane for lane in lanes if any(p[1] == lane for p in points)]
    rows = 2 if controls else 1
    fig = _figure(height=1.2 + 0.32 * max(1, len(used)) + (1.8 if controls else 0), width=WIDE)
    ax = _axes(fig, rows, 1, 1)
    palette = ("#1f77b4", "#9467bd", "#ff7f0e", "#d62728", "#8c564b", "#2ca02c", "#e377c2")
    for i, lane in enumerate(used):
        ts = [t for t, name in points if name == lane]
        ax.scatter(ts, [i] * len(ts), s=22, marker="|" if len(ts) > 60 else "o",
                   color=palette[lanes.index(lane) % len(palette)], zorder=3)
    ax.set_yticks(range(len(used)), used)
    ax.set_ylim(-0.6, len(used) - 0.4)
    ax.set_title("Run history")
    ax.set_xlabel("seconds since the run opened")
    if controls:
        cx = _axes(fig, rows, 1, 2)
        xs = [c[0] for c in controls]
        cx.step(xs, [c[1] for c in controls], where="post", color=RUN_COLOR, label="workers")
        cx.step(xs, [c[2] for c in controls], where="post", color=BASELINE_COLOR,
                linestyle="--", label="admission limit (groups)")
        cx.set_title("Controller settings after each decision")
        cx.set_xlabel("seconds since the run opened")
        cx.legend(loc="best", frameon=False)
    _fit(fig, fig.axes, gap_in=PAD_IN + 4 * LINE_IN)  # the upper one's ticks, label; a title
    return _png(fig)
