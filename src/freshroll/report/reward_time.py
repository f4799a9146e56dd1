"""The report's time-to-reward table: a run against its baseline
(:func:`freshroll.figures.reward_time.compare` of the two runs' rows)."""

from __future__ import annotations

from html import escape
from typing import Any

from freshroll.figures import reward_time
from freshroll.report.markup import table
from freshroll.report.rundata import RunData


def time_to_reward(run: RunData, baseline: RunData | None) -> str:
    """The seconds and steps each run needed to reach the same rewards
    (:func:`freshroll.figures.reward_time.compare` of the two runs' rows); empty without a
    baseline."""
    if baseline is None:
        return ""
    cmp = reward_time.compare(reward_time.curve(run.metrics), reward_time.curve(baseline.metrics))
    head = "<h3>Time to reward</h3>"
    if cmp["note"]:
        return head + f"<p class='hint'>Not compared: {escape(cmp['note'])}.</p>"

    def at(x: dict[str, Any] | None) -> str:
        return "not reached" if x is None else f"{x['s']:.1f} s (step {x['step']})"

    def ratio(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}x"

    rows = [(f"{int(lv['frac'] * 100)}%", f"{lv['reward']:.3f}", escape(at(lv["run"])),
             escape(at(lv["baseline"])), ratio(lv["s_ratio"]), ratio(lv["steps_ratio"]))
            for lv in cmp["levels"]]
    eq = cmp["equal_steps"]
    grid = table(("level", "reward", run.label, baseline.label, "seconds ratio",
                    "steps ratio"), rows)
    return (head + grid + "<p class='hint'>The first step whose reward, averaged over the "
            f"last {cmp['window']} steps, reaches each level (25/50/75% of the way from the "
            "lower starting reward to the best either run reached), in measured wall seconds; "
            "a ratio below 1 means this run got there sooner, a steps ratio above 1 that it "
            f"needed more steps. Reward at equal steps ({eq['steps']}, mean of the last "
            f"{cmp['window']}): {escape(run.label)} {eq['run']:.3f}, {escape(baseline.label)} "
            f"{eq['baseline']:.3f}.</p>")


__all__ = ["time_to_reward"]
