"""The plan of a bench: which runs, with which settings, from the workload's capacities."""

from __future__ import annotations

import pytest

from freshroll.bench import figures as f
from freshroll.bench.runner import plan_runs, quick_overrides, real_time_scale, with_overrides
from freshroll.config import Config, validate
from freshroll.errors import ConfigError


def _cfg(**sections: dict[str, object]) -> Config:
    return validate({"rollout": {"engine": "sim", "workers": 64, "group_size": 16,
                                 "batch_groups": 32, "worker_batch": 64},
                     "run": {"max_staleness": 2}, **sections})


# B = 512; the trainer takes 256 samples/s, one worker generates 20/s: 13 workers match it
CAPS = f.Capacities(batch=512, gen_per_s=1280.0, reward_per_s=1e4, train_per_s=256.0,
                    transfer_s=0.5, gen_per_worker_per_s=20.0)


def test_the_plan_has_sync_three_statics_and_the_controller() -> None:
    plan = plan_runs(_cfg(), CAPS)
    labels = [s.label for s in plan]
    assert labels[0] == "sync"
    assert labels[-4:] == ["adaptive", "adaptive-deadline", "adaptive-tails", "adaptive-all"]
    statics = [s for s in plan if s.label.startswith("static")]
    assert len(statics) >= 3
    assert plan[0].overrides["run.max_staleness"] == 0
    assert plan[0].overrides["rollout.workers"] == 64
    assert all(s.overrides["control.mode"] == "static" for s in [plan[0], *statics])
    assert all(s.overrides["run.max_staleness"] == 2 for s in statics)
    by = {s.label: s.overrides for s in plan}
    assert by["static-all"]["rollout.workers"] == 64
    assert by["static-matched"]["rollout.workers"] == 13
    assert by["static-tuned"]["rollout.workers"] == 17  # ceil(1.25 x 13)
    assert by["static-lean"]["rollout.workers"] == 6
    assert by["adaptive"]["control.mode"] == "adaptive"
    assert by["adaptive"]["control.max_workers"] == 64
    assert by["adaptive-deadline"] == {**by["adaptive"], "tail.deadline": True}
    assert by["static-overprov"] == {**by["static-all"], "tail.overprovision": "auto"}
    assert by["static-overprov-deadline"] == {**by["static-overprov"], "tail.deadline": True}
    assert by["adaptive-tails"] == {**by["adaptive"], "tail.overprovision": "auto"}
    assert by["static-continue"] == {**by["static-all"], "rollout.on_update": "continue"}
    assert by["static-continue-newest"] == {**by["static-continue"],
                                            "run.staleness_basis": "newest_token"}
    assert by["adaptive-all"] == {**by["adaptive-tails"], "rollout.on_update": "continue",
                                  "run.staleness_basis": "newest_token"}
    for spec in plan:  # every run's settings make a valid config
        with_overrides(_cfg(), spec.overrides)


def test_the_pool_is_control_max_workers() -> None:
    plan = plan_runs(_cfg(control={"max_workers": 128}), CAPS)
    by = {s.label: s.overrides for s in plan}
    assert by["static-all"]["rollout.workers"] == 128
    assert by["sync"]["rollout.workers"] == 128


def test_a_pool_of_one_varies_batch_and_admission() -> None:
    cfg = validate({"rollout": {"workers": 1, "worker_batch": 64, "batch_groups": 8}})
    plan = plan_runs(cfg, CAPS)
    statics = [s for s in plan if s.label.startswith("static")]
    assert len(statics) >= 3 and plan[-1].label == "adaptive"  # hf: no deadline row
    assert len({tuple(sorted(s.overrides.items(), key=str)) for s in statics}) == len(statics)
    by = {s.label: s.overrides for s in statics}
    assert by["static-halfbatch"]["rollout.worker_batch"] == 32
    assert by["static-admit1"]["rollout.max_inflight_groups"] == 8
    assert cfg.run.max_staleness == 1 and by["static-all"]["run.max_staleness"] == 1


def test_a_synchronous_config_still_benches_async_at_eta_1() -> None:
    plan = plan_runs(_cfg(run={"max_staleness": 0}), CAPS)
    assert {s.overrides["run.max_staleness"] for s in plan if s.label != "sync"} == {1}


def test_with_overrides_validates() -> None:
    cfg = with_overrides(_cfg(), {"run.steps": 7, "sim.clock": "real"})
    assert (cfg.run.steps, cfg.sim.clock) == (7, "real")
    with pytest.raises(ConfigError, match=r"sim\.clock"):
        with_overrides(_cfg(), {"sim.clock": "sideways"})


def test_quick_is_small() -> None:
    cfg = with_overrides(_cfg(), quick_overrides(_cfg()))
    assert cfg.run.steps <= 4 and cfg.rollout.workers <= 4
    assert cfg.rollout.batch_groups * cfg.rollout.group_size <= 8


def test_real_time_scale() -> None:
    # stage times 0.4 + 0.0512 + 2 + 0.5 s per batch: 100 sync steps take 295.12 s
    times = f.stage_times(CAPS)
    assert sum(times.values()) == pytest.approx(2.9512)
    scale = real_time_scale(CAPS, 100, target_s=10.0, min_step_s=0.01)
    assert scale == pytest.approx(10.0 / 295.12)
    # but no async step shorter than min_step_s: max t = 2 s -> scale >= 0.25 / 2
    assert real_time_scale(CAPS, 100, target_s=10.0, min_step_s=0.25) == pytest.approx(0.125)
    assert real_time_scale(CAPS, 1, target_s=1e6) == 1.0


def test_real_time_scale_from_the_measured_sync_step() -> None:
    # a tail-bound sync step of 300 virtual seconds: 10 steps scaled to 6 s
    assert real_time_scale(CAPS, 10, 6.0, min_step_s=0.001, sync_step_s=300.0) == \
        pytest.approx(0.002)
    # the async floor still holds: max t = 2 s, 0.2 s of wall time at least
    assert real_time_scale(CAPS, 10, 6.0, min_step_s=0.2, sync_step_s=300.0) == \
        pytest.approx(0.1)


def test_a_real_clock_run_scales_the_model_time_settings() -> None:
    from freshroll.bench.runner import MODEL_TIME_KEYS, scaled_settings

    cfg = _cfg(limits={"reward_timeout_s": 30.0}, control={"interval_s": 4.0})
    over = scaled_settings(cfg, 0.01)
    assert set(over) == set(MODEL_TIME_KEYS)
    assert over["limits.reward_timeout_s"] == pytest.approx(0.3)
    assert over["control.interval_s"] == pytest.approx(0.04)
    scaled = with_overrides(cfg, over)  # still a valid config (cooldown order kept)
    assert scaled.control.up_cooldown_s <= scaled.control.down_cooldown_s


def test_rebalance_delays_count_steps_to_the_first_worker_change_after_each_change() -> None:
    from freshroll.bench.tails import rebalance_delays

    decisions = [(3, 16, 24), (20, 24, 24), (23, 24, 30), (41, 30, 30), (44, 30, 20)]
    assert rebalance_delays(decisions, [20, 40]) == [3, 4]
    assert rebalance_delays(decisions[:3], [20, 40]) == [3, None]  # none after 40
    assert rebalance_delays(decisions, []) == []


def test_tail_rows_over_seeds_average_and_keep_each_seeds_rebalance() -> None:
    from freshroll.bench.tails import aggregate_tails, render_markdown

    def row(stale: float, bias: float | None, rebalance: list[int | None], extra: int
            ) -> dict[str, object]:
        return {"run": "adaptive", "stale": stale, "cancelled": 0.0, "deadline": 0.0,
                "other": 0.0, "refreshed": 0.0, "refreshed_worker_s": 0.0,
                "length_bias": bias, "rebalance": rebalance, "extra_max": extra}

    [agg] = aggregate_tails({0: [row(0.10, -0.2, [3, None], 2)],
                             1: [row(0.20, None, [5, 4], 4)]})
    assert abs(agg["stale"] - 0.15) < 1e-12 and agg["length_bias"] == -0.2  # the seed with one
    assert agg["rebalance"] == [[3, 5], [None, 4]] and agg["extra_max"] == 4
    md = render_markdown([agg])
    assert "| adaptive | 15.0% ± 7.1% |" in md and "| 3/5, -/4 | 4 |" in md
    [none] = aggregate_tails({0: [row(0.1, None, [], 0)], 1: [row(0.1, None, [], 0)]})
    assert none["length_bias"] is None and "| - | n/a | 0 |" in render_markdown([none])


def test_a_real_clock_table_on_a_busy_machine_says_so() -> None:
    from freshroll.bench.runner import busy_warning

    cfg = _cfg(limits={"reward_timeout_s": 0.27})
    line = busy_warning(3.1, 2, cfg)
    assert "load average 3.10 on 2 cores" in line and "reward_timeout_s 0.27 s" in line
    assert busy_warning(0.4, 2, cfg) == ""
    assert busy_warning(float("nan"), 2, cfg) == ""  # no load average known: no warning
