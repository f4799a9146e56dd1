"""The report's figures have no layout engine: ``plots._fit`` sizes their margins from the
labels they draw (issue 22: matplotlib's ``constrained`` layout drew every label twice more
and was about a third of a report's CPU). Every text a figure draws must still land on the
canvas, and a y label must not run into its tick labels, at awkward inputs too: wide
numbers, long legend labels, many lanes, several stacked panels."""

from __future__ import annotations

from typing import Any

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from freshroll.report import plots

WIDE_Y = [0.0, 123456.0, 2.5e5, 98765.4]
X = [1.0, 2.0, 3.0, 4.0]


def _figures(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    drawn: list[Figure] = []

    def keep(fig: Figure) -> bytes:
        drawn.append(fig)
        return b"\x89PNG"

    monkeypatch.setattr(plots, "_png", keep)
    return drawn


CASES: dict[str, Any] = {
    "line chart, wide numbers": lambda: plots.line_chart(
        [plots.Line("run", X, WIDE_Y), plots.Line("baseline (sync run)", X, X, baseline=True)],
        title="Reward vs step", xlabel="trainer step", ylabel="mean reward"),
    "lag histogram with its bound": lambda: plots.lag_histogram({0: 5000, 1: 120000, 3: 7}, 2),
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
}


@pytest.mark.parametrize("case", CASES)
def test_every_text_is_on_the_canvas_and_clear_of_its_neighbours(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    drawn = _figures(monkeypatch)
    CASES[case]()
    (fig,) = drawn
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # type: ignore[no-untyped-call]
    renderer = canvas.get_renderer()
    drawn_box = fig.get_tightbbox(renderer)  # inches: every artist drawn, ticks in view only
    width, height = fig.get_size_inches()
    slack = 1 / fig.dpi
    assert (drawn_box.x0 >= -slack and drawn_box.y0 >= -slack and drawn_box.x1 <= width + slack
            and drawn_box.y1 <= height + slack), f"{case}: {drawn_box} is off {width}x{height}"
    for ax in fig.axes:
        label = ax.yaxis.label
        lo, hi = sorted(ax.get_ylim())
        ticks = [t for loc, t in zip(ax.yaxis.get_majorticklocs(), ax.get_yticklabels(),
                                     strict=True) if lo <= loc <= hi and t.get_text()]
        if label.get_text() and ticks:
            right = label.get_window_extent(renderer).x1
            assert right <= min(t.get_window_extent(renderer).x0 for t in ticks) + 1, case
