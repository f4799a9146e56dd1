"""Tests for freshroll.observe.pace: steps/s and the ETA of the progress line."""

from __future__ import annotations

import pytest

from freshroll.observe.pace import Pace, duration


def test_pace_is_unknown_until_two_steps_then_follows_the_formula():
    p = Pace(total=100, window=4)
    assert p.steps_per_s is None and p.eta_s is None
    assert p.render() == "- steps/s  ETA -"
    p.feed(1, 10.0)
    assert p.steps_per_s is None
    p.feed(2, 10.5)
    assert p.steps_per_s == pytest.approx(2.0) and p.eta_s == pytest.approx(49.0)
    assert p.render() == "2.00 steps/s  ETA 49s"


def test_pace_is_the_recent_window_not_the_whole_run():
    p = Pace(total=20, window=4)
    for step in range(1, 6):
        p.feed(step, step * 10.0)  # slow start: 0.1 steps/s
    for step in range(6, 11):
        p.feed(step, 50.0 + (step - 5) * 1.0)  # then 1 step/s
    assert p.steps_per_s == pytest.approx(1.0)  # steps 6..10 only
    assert p.eta_s == pytest.approx(10.0)


def test_equal_times_and_a_finished_run():
    p = Pace(total=3)
    p.feed(1, 5.0)
    p.feed(2, 5.0)
    assert p.steps_per_s is None  # no time passed: no pace rather than infinity
    p.feed(3, 6.0)
    assert p.eta_s == 0.0 and p.render().endswith("ETA 0s")


@pytest.mark.parametrize(("s", "text"), [(0.4, "0s"), (45, "45s"), (725, "12m05s"),
                                         (11_220, "3h07m")])
def test_duration(s: float, text: str):
    assert duration(s) == text
