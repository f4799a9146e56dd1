"""The report's smaller findings (issue 48, item 10): the per-reward chart drew every
function in one colour under another section's title ("Reward vs step"), and whole numbers
stored as floats were shown in scientific notation (``1.235e+04``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from freshroll.report import plots
from freshroll.report.html import _reward_fns
from freshroll.report.markup import fmt
from freshroll.report.svg import number


def _rows() -> list[dict[str, Any]]:
    return [{"step": s, "rewards/exact/mean": 0.1 * s, "rewards/exact/std": 0.2,
             "rewards/length/mean": 0.5, "rewards/length/std": 0.1,
             "frac_reward_zero_std": 0.25} for s in range(1, 6)]


def test_each_reward_function_has_its_own_colour_and_the_chart_its_own_title() -> None:
    html = _reward_fns(SimpleNamespace(metrics=_rows()))  # type: ignore[arg-type]  # metrics alone is read
    assert "Reward functions vs step" in html and "Reward vs step" not in html
    lines = [plots.Line(n, [1.0, 2.0], [0.0, 1.0], style={"color": c}) for n, c in
             (("exact", plots.SERIES_COLORS[0]), ("length", plots.SERIES_COLORS[1]))]
    assert plots.SERIES_COLORS[0] != plots.SERIES_COLORS[1]
    for color in plots.SERIES_COLORS[:2]:  # both functions' colours are drawn in the page
        assert f'"{color}"' in html
    assert plots.BASELINE_COLOR not in plots.SERIES_COLORS
    assert "Reward functions vs step" in plots.reward_functions(lines)


@pytest.mark.parametrize(("value", "shown"), [
    (123456.0, "123,456"), (12345.6, "12,346"), (4096.0, "4,096"), (12.0, "12"),
    (0.5, "0.5"), (0.0012345, "0.001234"), (1e-5, "1.00e-05"), (0.0, "0"), (-23456.0, "-23,456"),
])
def test_numbers_are_never_in_scientific_notation_from_a_thousandth_up(value: float,
                                                                       shown: str) -> None:
    assert fmt(value) == shown
    assert "e+" not in number(value, 3)
    assert fmt(7) == "7" and fmt(1234567) == "1,234,567"
