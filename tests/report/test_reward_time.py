"""Time to reward (freshroll.figures.reward_time): the seconds and steps two runs needed to
reach the same rewards, in summary.json, the report and the terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from freshroll.figures import reward_time as rt
from freshroll.harness.verify import verify_run
from freshroll.report.html import write_report
from freshroll.runtime.endfiles import finish_run_dir, write_summary
from report.test_report import make_run


def _rows(rewards: list[float], dt: float, t0: float = 0.0) -> list[dict[str, float | int]]:
    return [{"step": i + 1, "t": t0 + dt * (i + 1), "reward_mean": r}
            for i, r in enumerate(rewards)]


def test_a_faster_run_that_learns_less_per_step_is_seen_as_such() -> None:
    # async: 1 s a step, reward +0.05 a step; sync: 2 s a step, +0.1 a step
    fast = rt.curve(_rows([0.05 * i for i in range(20)], 1.0))
    slow = rt.curve(_rows([min(0.1 * i, 0.95) for i in range(20)], 2.0))
    cmp = rt.compare(fast, slow)
    assert cmp["window"] == 2 and not cmp["note"]
    lo, hi = 0.0, 0.95  # both start at 0; sync's smoothed reward tops out at 0.95
    half = cmp["levels"][1]
    assert half["frac"] == 0.5 and half["reward"] == pytest.approx(lo + 0.5 * (hi - lo))
    # fast: smoothed (r[i-1]+r[i])/2 = 0.05 i - 0.025 >= 0.475 at i = 10 -> step 11, t 11
    assert half["run"] == {"s": 11.0, "step": 11}
    # slow: 0.1 i - 0.05 >= 0.475 at i = 6 -> step 7, t 14
    assert half["baseline"] == {"s": 14.0, "step": 7}
    assert half["s_ratio"] == pytest.approx(11 / 14) and half["steps_ratio"] == pytest.approx(
        11 / 7)
    top = cmp["levels"][2]  # 0.75 * 0.95 = 0.7125: fast needs 0.05 i - 0.025 >= 0.7125
    assert top["run"] == {"s": 16.0, "step": 16} and top["baseline"] == {"s": 18.0, "step": 9}
    assert cmp["equal_steps"] == {"steps": 20, "run": pytest.approx((0.9 + 0.95) / 2),
                                  "baseline": pytest.approx(0.95)}
    text = rt.render(cmp, "async", "sync")
    assert "50% (reward 0.475): async 11.0 s (step 11), sync 14.0 s (step 7): 0.79x the " \
           "seconds, 1.57x the steps" in text


def test_a_level_one_run_never_reaches_has_no_ratio() -> None:
    run = rt.curve(_rows([0.1] * 10, 1.0))
    base = rt.curve(_rows([0.1 * i for i in range(10)], 1.0))
    cmp = rt.compare(run, base)
    top = cmp["levels"][-1]
    assert top["run"] is None and top["baseline"] is not None and top["s_ratio"] is None
    assert "async not reached, sync" in rt.render(cmp, "async", "sync")


def test_no_progress_and_no_rewards_say_why() -> None:
    flat = rt.curve(_rows([0.3] * 5, 1.0))
    assert rt.compare(flat, flat)["note"].startswith("no progress")
    assert rt.compare([], flat)["note"] == "the run has no step with a reward"
    assert rt.render(rt.compare(flat, []), "a", "b") == \
        "time to reward: not compared: the baseline has no step with a reward"
    # rows without a finite reward are left out, never read as 0
    assert rt.curve([{"step": 1, "t": 1.0, "reward_mean": float("nan")},
                     {"step": 2, "t": 2.0}, {"step": 3, "t": 3.0, "reward_mean": 0.5}]) == \
        [rt.Point(3, 3.0, 0.5)]


def test_the_window_grows_with_the_run_and_stops_at_ten() -> None:
    assert [rt.window(n) for n in (1, 9, 10, 35, 100, 400)] == [1, 1, 1, 3, 10, 10]


def test_summary_report_and_verify_carry_the_comparison(tmp_path: Path) -> None:
    run = make_run(tmp_path / "async_run", max_staleness=1, mode="async", steps=12)
    base = make_run(tmp_path / "sync_run", max_staleness=0, seed=1, mode="sync", steps=12)
    done = finish_run_dir(run, baseline=base)
    block = json.loads((run / "summary.json").read_text())[rt.BLOCK]
    assert block == json.loads(json.dumps(done.summary[rt.BLOCK]))
    assert block["baseline"] == str(base) and len(block["levels"]) == 3
    want = rt.compare_dirs(run, base)
    assert [lv["run"] for lv in block["levels"]] == [lv["run"] for lv in want["levels"]]
    write_summary(run)  # a summary rebuilt later keeps the comparison
    assert json.loads((run / "summary.json").read_text())[rt.BLOCK] == block
    assert verify_run(run).ok  # the block is not a ledger figure: verify leaves it alone
    html = write_report(run, baseline=base, out=tmp_path / "r.html").read_text()
    assert "<h3>Time to reward</h3>" in html and "seconds ratio" in html
    assert "Time to reward" not in write_report(run, out=tmp_path / "alone.html").read_text()
