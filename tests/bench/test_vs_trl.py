"""benchmarks/vs_trl.py: time to reward and the goals against the best TRL on synthetic
results, and one ``--quick`` invocation of the real thing (TRL at one thread and at its
default, freshroll sync and default)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from bench_scripts import load_script, run_main

vs = load_script("vs_trl")


def test_time_to_reward_reads_the_trailing_mean():
    rewards = [0.0] * 10 + [1.0] * 10
    times = [float(i + 1) for i in range(20)]
    # the trailing mean of 10 steps reaches 0.5 at the 15th step (5 ones of 10)
    assert vs.time_to_reward(rewards, times, 0.5) == 15.0
    assert vs.time_to_reward(rewards, times, 1.0) == 20.0
    assert math.isnan(vs.time_to_reward(rewards, times, 1.1))  # never reached
    assert math.isnan(vs.time_to_reward(rewards, times[:-1], 0.5))  # no time per step
    assert vs.time_to_reward([0.9, 0.1], [1.0, 2.0], 0.5) == 2.0  # short runs: the whole mean


def _result(system: str, seed: int, rate: float, reward_last: float, t_half: float):
    rewards = [0.0] * 10 + [1.0] * 10
    times = [t_half * (i + 1) / 15 for i in range(20)]  # reaches 0.5 at step 15: t_half
    return vs.Result(system, seed, 1, 20, 20 * 128 / rate, 20 * 128, rate, 0.0, reward_last,
                     0.5, 1.0, 1.0, rewards, {}, times)


def test_goals_are_taken_against_the_faster_trl():
    results = []
    for seed in (0, 1):
        results += [_result("trl-1t", seed, 100.0, 0.60, 30.0),
                    _result("trl-default", seed, 160.0, 0.60, 20.0),
                    _result("freshroll-sync", seed, 170.0, 0.61, 18.0),
                    _result("freshroll-default", seed, 200.0, 0.59 + 0.01 * seed, 16.0)]
    agg = vs.aggregate(results, 0.5)
    assert agg["trl-default"]["time_to_reward_mean"] == pytest.approx(20.0)
    g = vs.goals(agg, 0.5)
    assert g["best_trl"] == "trl-default"
    assert g["default_vs_best_trl"]["value"] == pytest.approx(1.25)
    assert g["default_vs_best_trl"]["verdict"] == "MISS"  # 1.25 < 1.3
    assert g["sync_vs_best_trl"]["verdict"] == "PASS"
    assert g["default_time_vs_best_trl"]["value"] == pytest.approx(0.8)
    assert g["default_time_vs_best_trl"]["verdict"] == "MISS"  # 0.8 > 0.77
    assert g["default_time_vs_sync"]["verdict"] == "PASS"  # 16 <= 18
    assert g["default_reward_vs_sync"]["not_worse"] is not None
    ratios = vs.ratios(results, agg)
    assert ratios["freshroll-default / trl-default"]["ratio_of_means"] == pytest.approx(1.25)


def test_the_headline_is_time_to_90pct_of_syncs_reward_beside_the_rate(capsys):
    results = []
    for seed in (0, 1):  # every system reaches 0.9 x 1.0 when its trailing mean hits 0.9
        results += [_result("trl-default", seed, 160.0, 1.0, 20.0),
                    _result("freshroll-sync", seed, 170.0, 1.0, 18.0),
                    _result("freshroll-default", seed, 200.0, 1.0, 9.0)]
    head = vs.headline(results, vs.aggregate(results, 0.5))
    assert head is not None and head["level"] == pytest.approx(0.9)
    assert head["best_trl"] == "trl-default"
    d = head["systems"]["freshroll-default"]
    assert (d["reached"], d["n"]) == (2, 2)
    # 0.9 is reached at step 19 of 20: 19/15 of t_half
    assert d["time_s"] == pytest.approx(9.0 * 19 / 15)
    assert d["vs_sync"]["time"] == pytest.approx(0.5)
    assert d["vs_best_trl"]["time"] == pytest.approx(9.0 / 20.0)
    assert d["vs_best_trl"]["rollouts_per_s"] == pytest.approx(200 / 160)
    vs.print_report(results, vs.aggregate(results, 0.5), {}, {"reward_level": 0.5})
    first = capsys.readouterr().out.strip().splitlines()[0]
    assert first.startswith("time to 90% of freshroll-sync's last-10% reward (0.900)")
    never = [_result("freshroll-sync", 0, 170.0, 2.0, 18.0),
             _result("freshroll-default", 0, 200.0, 1.0, 9.0)]
    late = vs.headline(never, vs.aggregate(never, 0.5))
    assert late is not None and late["systems"]["freshroll-default"]["reached"] == 0
    assert math.isnan(late["systems"]["freshroll-default"]["time_s"])
    assert vs.headline(results[:1], vs.aggregate(results[:1], 0.5)) is None


@pytest.mark.slow
def test_quick_run_compares_with_trl_at_both_thread_counts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "vs.json"
    status, stdout = run_main("vs_trl", ["--quick", "--warmup", "0", "--json", str(out),
                                         "--workdir", str(tmp_path / "work")], capsys)
    assert status == 0
    data = json.loads(out.read_text())
    assert data["systems"] == ["trl-1t", "trl-default", "freshroll-sync", "freshroll-default"]
    assert {r["system"] for r in data["results"]} == set(data["systems"])
    assert all(r["rollouts_per_s"] > 0 and len(r["times"]) == r["steps"]
               for r in data["results"])
    assert data["goals"]["best_trl"] in ("trl-1t", "trl-default")
    assert data["goals"]["sync_vs_best_trl"]["verdict"] in ("PASS", "MISS")
    assert "against the best TRL" in stdout
    assert data["headline"]["best_trl"] == data["goals"]["best_trl"]
    assert stdout.index("time to 90% of freshroll-sync") < stdout.index("means over")
