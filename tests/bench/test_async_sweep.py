"""benchmarks/async_sweep.py: its figures (A, the bounds, the goals, the table) on synthetic
inputs, and one ``--quick`` invocation of the real thing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from bench_scripts import load_script, run_main

sweep = load_script("async_sweep")


def _cell(load: str = "quiet", **rates: float) -> object:
    c = sweep.Cell("1m", 1_050_000, 16, load, 40,
                   stage_times={"gen": 0.10, "reward": 0.01, "train": 0.08, "sync": 0.01},
                   t_alone=2.0, t_concurrent=2.2)
    c.rates = dict(rates)
    c.sync_step_s = 0.20
    return c


def test_bounds_and_attainment():
    assert sweep.stage_bound(0.2, {"gen": 0.1, "train": 0.08, "sync": math.inf}) == 2.0
    assert math.isnan(sweep.stage_bound(0.2, {}))
    assert sweep.parallel_limit(2.0, 2.0) == 2.0  # two processes, no slowdown
    assert sweep.parallel_limit(2.0, 4.0) == 1.0  # they take turns
    # A divides by the lower of the two bounds
    assert sweep.attainment(1.5, 2.0, 1.8) == pytest.approx(1.5 / 1.8)
    assert sweep.attainment(1.5, 1.6, math.nan) == pytest.approx(1.5 / 1.6)
    assert math.isnan(sweep.attainment(math.nan, 2.0, 2.0))
    # a bound below 1 (measured on a busy machine): async must still match sync
    assert sweep.attainment(0.6, 1.4, 0.5) == pytest.approx(0.6)
    assert sweep.choose_steps(0.1, 15.0) == 150
    assert sweep.choose_steps(10.0, 15.0) == 5 and sweep.choose_steps(1e-4, 15.0) == 400
    assert sweep.choose_steps(math.nan, 15.0) == 5


NA = {"floor": "n/a", "floor_median": "n/a", "outside": "n/a"}


def test_cell_figures_and_goals():
    c = _cell(sync=100.0, **{"async-inline": 180.0, "trl-1t": 100.0})
    assert c.bound == pytest.approx(2.0)
    assert c.limit == pytest.approx(2 * 2.0 / 2.2)
    assert c.speedup("async-inline") == pytest.approx(1.8)
    assert c.a("async-inline") == pytest.approx(1.8 / (4.0 / 2.2))
    assert sweep.goal_checks(c, "async-inline") == {"not_slower": "PASS", "A": "PASS",
                                                    "trl": "PASS", "sync_trl": "PASS", **NA}
    slow = _cell(sync=100.0, **{"async-inline": 95.0, "trl-1t": 80.0, "trl-default": 120.0})
    assert sweep.goal_checks(slow, "async-inline") == {"not_slower": "MISS", "A": "MISS",
                                                       "trl": "MISS", "sync_trl": "MISS", **NA}
    slow.verdicts["async-inline"] = ["did not pay"]
    assert sweep.goal_checks(slow, "async-inline")["not_slower"] == "MISS (loss detected)"
    told = _cell("contended", sync=100.0, **{"async-inline": 95.0})
    told.verdicts["async-inline"] = ["did not pay", "did not pay"]
    assert sweep.goal_checks(told, "async-inline") == {
        "not_slower": "PASS (loss detected)", "A": "MISS", "trl": "n/a", **NA}
    told.verdicts["async-inline"] = ["did not pay", "paid"]  # one seed missed it
    assert sweep.goal_checks(told, "async-inline")["not_slower"] == "MISS"
    c.reward = {"trl": {"not_worse": True}, "sync": {"not_worse": None}}
    goals = sweep.goal_checks(c, "async-inline")
    assert goals["reward_vs_trl"] == "PASS" and goals["reward_vs_sync"] == "n/a"


def test_trl_ratios_are_to_the_faster_trl_run():
    # the peer at its best: TRL at one thread and at torch's default, the faster one counts
    c = _cell(sync=100.0, **{"async-auto": 150.0, "trl-1t": 90.0, "trl-default": 120.0})
    assert c.best_trl() == ("trl-default", 120.0)
    assert c.vs_trl("async-auto") == pytest.approx(1.25)
    assert sweep.goal_checks(c, "async-auto")["trl"] == "MISS"  # 1.25 < 1.3 quiet
    assert sweep.goal_checks(c, "async-auto")["sync_trl"] == "MISS"  # 100 < 120
    c.rates["trl-default"] = 60.0
    assert c.best_trl() == ("trl-1t", 90.0)
    assert sweep.goal_checks(c, "async-auto")["trl"] == "PASS"
    busy = _cell("contended", sync=100.0, **{"async-auto": 110.0, "trl-default": 100.0})
    goals = sweep.goal_checks(busy, "async-auto")
    assert goals["trl"] == "PASS" and "sync_trl" not in goals  # 1.0x is the contended goal
    assert _cell(sync=1.0).best_trl() is None


def test_floor_and_outside_wall_goals():
    c = _cell(sync=100.0, **{"async-auto": 150.0})
    c.floor = {1: {"gen_s": 0.1, "train_s": 0.09, "step_s": 0.19},
               2: {"gen_s": 0.07, "train_s": 0.08, "step_s": 0.15}}
    assert c.floor_step() == pytest.approx(0.15)
    assert c.floor_ratio() == pytest.approx(0.20 / 0.15)
    c.costs["async-auto"] = {"outside_wall_s": 4.0}
    goals = sweep.goal_checks(c, "async-auto")
    assert goals["floor"] == "MISS" and goals["outside"] == "PASS"
    c.sync_step_s = 0.17
    c.costs["async-auto"] = {"outside_wall_s": 6.0}
    goals = sweep.goal_checks(c, "async-auto")
    assert goals["floor"] == "PASS" and goals["outside"] == "MISS"
    assert goals["floor_median"] == "n/a"  # the sync run's median step not measured
    c.sync_median_step_s = 0.18  # timed as the floor's is: median after the first step
    assert c.floor_ratio_median() == pytest.approx(0.18 / 0.15)
    assert sweep.goal_checks(c, "async-auto")["floor_median"] == "MISS"


def test_speedup_is_over_the_fastest_sync_run():
    # sync at the default threads and at one thread: the faster one is the baseline
    c = _cell(sync=100.0, **{"sync-1t": 120.0, "async-auto": 150.0})
    assert c.best_sync() == 120.0
    assert c.speedup("async-auto") == pytest.approx(1.25)
    c.rates["sync-1t"] = 80.0
    assert c.speedup("async-auto") == pytest.approx(1.5)
    assert _cell(**{"async-auto": 1.0}).best_sync() is None


def _result(system: str, rewards: list[float], zero: list[float], step_s: list[float]):
    vs_trl = load_script("vs_trl")
    times = [sum(step_s[: i + 1]) for i in range(len(step_s))]
    return vs_trl.Result(system, 0, 1, len(rewards), times[-1], 128 * len(rewards),
                         128 * len(rewards) / times[-1], 0.0, 0.0, 0.0, times[-1], 0.0,
                         rewards, {"zero_std": zero}, times)


def test_a_collapsed_run_is_compared_only_over_the_steps_before_it():
    # the default collapses at step 31 (reward 0, every group zero-std, to the end) and its
    # steps get 4x cheaper; Ray does not collapse
    healthy, dead = [0.3] * 30, [0.0] * 30
    auto = _result("async-auto", healthy + dead, [0.5] * 30 + [1.0] * 30,
                   [0.10] * 30 + [0.025] * 30)
    ray = _result("async-ray", healthy * 2, [0.5] * 60, [0.11] * 60)
    assert sweep.collapse_step(auto.rewards, auto.extra["zero_std"]) == 31
    assert sweep.collapse_step(ray.rewards, ray.extra["zero_std"]) is None
    # a dip shorter than COLLAPSE_MIN_STEPS at the end is not a collapse
    assert sweep.collapse_step([0.3] * 50 + [0.0] * 5, [0.5] * 50 + [1.0] * 5) is None
    assert sweep.collapse_step([0.0] * 30, [0.5] * 30) is None  # zero reward, still a signal
    cell = _cell()
    sweep.healthy_window(cell, {"async-auto": [auto], "async-ray": [ray]})
    assert cell.collapsed == {"async-auto": [31]} and cell.window_steps == 30
    # whole runs: the collapsed default looks 1.76x Ray; over steps 1-30 it is 1.1x
    assert auto.rollouts_per_s / ray.rollouts_per_s == pytest.approx(1.76, abs=0.01)
    assert cell.window_rates["async-auto"] / cell.window_rates["async-ray"] == \
        pytest.approx(1.1)
    text = "\n".join(sweep.collapse_lines(cell))
    assert "COLLAPSED: async-auto at step(s) 31" in text and "over steps 1-30" in text


def test_tokens_per_second_is_the_work_done_whatever_the_lengths():
    # the default's policy learned 1-token answers: more rollouts/s, fewer tokens/s
    auto = _result("async-auto", [0.3] * 10, [0.5] * 10, [0.05] * 10)
    ray = _result("async-ray", [0.3] * 10, [0.5] * 10, [0.10] * 10)
    auto.extra["tokens"], ray.extra["tokens"] = [128] * 10, [512] * 10
    assert sweep.token_rate(auto) == pytest.approx(128 / 0.05)
    assert sweep.token_rate(ray) == pytest.approx(512 / 0.10)
    assert ray.rollouts_per_s / auto.rollouts_per_s == pytest.approx(0.5)
    cell = _cell()
    cell.token_rates = {"async-auto": sweep.token_rate(auto), "async-ray": sweep.token_rate(ray)}
    (line,) = sweep.token_lines(cell)
    assert "async-ray 5120 (2.00x async-auto)" in line
    no_tokens = _result("sync", [0.3] * 3, [0.5] * 3, [0.1] * 3)
    assert math.isnan(sweep.token_rate(no_tokens))  # an older result: no per-step tokens
    assert sweep.token_lines(_cell()) == []


def test_table_has_a_row_per_shape_and_load():
    cells = [_cell(sync=100.0, **{"async-inline": 150.0, "trl-1t": 90.0}),
             _cell("contended", sync=60.0, **{"async-inline": 55.0, "trl-1t": 50.0})]
    cells[1].verdicts["async-inline"] = ["did not pay"]
    table = sweep.render_table(cells, ["sync", "async-inline", "async-ray", "trl-1t"],
                               "async-inline")
    lines = table.splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("| params | new tok | load | steps | stage bound | par. limit")
    assert "async-ray /s" in lines[0]
    assert lines[2].startswith("| 1m (1.05M) | 16 | quiet | 40 | 2.00 | 1.82 | 100.0 | 150.0 "
                               "| - | 90.0 | trl-1t | 1.11 | 1.50 |")
    assert "did not pay" in lines[3] and "PASS (loss detected)" in lines[3]
    details = sweep.render_details(cells, ["sync", "async-inline", "trl-1t"])
    assert "async-inline   speedup 1.50" in details


@pytest.mark.slow
def test_quick_sweep_prints_its_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "sweep.json"
    status, stdout = run_main("async_sweep", ["--quick", "--json", str(out)], capsys)
    assert status == 0
    assert "| tiny (0.085M) | 4 | quiet | 3 |" in stdout
    data = json.loads(out.read_text())
    (cell,) = data["cells"]
    assert set(cell["rates"]) == {"sync", "async-auto", "trl-1t", "trl-default", "floor"}
    assert all(r > 0 for r in cell["rates"].values())
    assert set(cell["floor"]) == {"1", str(data["trl_default_threads"])} or len(cell["floor"]) == 1
    assert "best TRL" in stdout and "sync / floor" in stdout
    assert cell["t_alone"] > 0 and cell["t_concurrent"] > 0
    # a quiet cell checks every goal of issue 25 (sync vs TRL, the floor, the fixed costs)
    assert set(cell["goals"]) == {"not_slower", "A", "trl", "sync_trl", "floor", "floor_median",
                                  "outside"}
    assert cell["sync_median_step_s"] > 0  # the sync run's median step after its first
    assert all(v.split(" ")[0] in ("PASS", "MISS", "n/a") for v in cell["goals"].values())
    assert cell["verdicts"]["async-auto"][0] in ("paid", "did not pay")
    # what the default settled on is read back from the run's summary
    assert cell["placements"]["async-auto"][0].split(" x")[0] in ("inline", "process")


def test_the_ray_systems_train_in_an_actor_and_in_the_driver(tmp_path: Path):
    """``async-ray`` trains where ``ray.trainer``'s default puts it (auto: the driver on a
    private instance), ``async-ray-driver`` in the driver, ``async-ray-actor`` in an actor:
    one invocation compares them."""
    def where(system: str) -> str:
        over = ["rollout.max_new_tokens=4", *sweep.SYSTEM_OVERRIDES.get(system, ())]
        cfg = sweep.vs_trl.freshroll_config(3, 0, sweep.SYSTEMS[system], tmp_path, over)
        assert cfg.run.runtime == "ray"
        return str(cfg.ray.trainer)

    assert where("async-ray") == "auto"
    assert where("async-ray-driver") == "driver"
    assert where("async-ray-actor") == "actor"
    assert set(sweep.SYSTEM_OVERRIDES) <= set(sweep.SYSTEMS)
