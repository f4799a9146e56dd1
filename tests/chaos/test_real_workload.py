"""The real placements' workload (chaos/real.py): layering, what applies, what is skipped."""

from __future__ import annotations

import pytest

from freshroll.chaos.plan import Plan, Scenario
from freshroll.chaos.real import REAL_WORKLOAD, STALL_STEPS, real_workload, skip_reason
from freshroll.config import validate


def _scenario(kind: str, step: int = 1, **workload: object) -> Scenario:
    return Scenario(name="s", faults=[{"kind": kind, "at": {"step": step}}], workload=workload,
                    real=True)


def test_each_placement_is_the_tiny_model_on_hf():
    plan = Plan(scenarios=[_scenario("kill_process")])
    for placement, workers in (("inline", 1), ("ray", 2)):
        cfg = validate(real_workload(plan, plan.scenarios[0], 5, placement), "t")
        assert cfg.rollout.engine == "hf" and cfg.run.runtime == placement
        assert cfg.rollout.workers == workers and cfg.run.seed == 5
        assert (cfg.task.name, cfg.rollout.group_size, cfg.rollout.batch_groups,
                cfg.rollout.max_new_tokens) == ("reverse", 4, 4, 6)
        assert cfg.model.path is None  # the tiny local model


def test_only_the_scenario_keys_that_mean_the_same_on_a_real_model_apply():
    s = _scenario("stall_worker", run={"max_staleness": 3, "steps": 500},
                  sim={"profile": "P3"}, limits={"generate_timeout_s": 600.0},
                  rollout={"workers": 9}, trainer={"lr": 0.01})
    data = real_workload(Plan(scenarios=[s]), s, 0, "ray")
    cfg = validate(data, "t")
    assert cfg.run.max_staleness == 3 and cfg.trainer.lr == 0.01
    own = REAL_WORKLOAD
    # its own size: one worker, so the run waits for the stalled one's replacement (real.py)
    assert cfg.run.steps == STALL_STEPS and cfg.rollout.workers == 1
    assert cfg.limits.generate_timeout_s == own["limits"]["generate_timeout_s"]
    assert "sim" not in data


def test_the_plan_real_workload_comes_last_and_steps_outlast_the_latest_trigger():
    s = _scenario("kill_worker", step=40)
    plan = Plan(real_workload={"run": {"steps": 10}, "limits": {"generate_timeout_s": 4.0}},
                scenarios=[s])
    cfg = validate(real_workload(plan, s, 0, "ray"), "t")
    assert cfg.limits.generate_timeout_s == 4.0 and cfg.run.steps == 43


def test_an_unknown_placement_is_an_error():
    s = _scenario("kill_process")
    with pytest.raises(ValueError, match="placement 'gpu'"):
        real_workload(Plan(scenarios=[s]), s, 0, "gpu")


@pytest.mark.parametrize("kind", ["kill_worker", "kill_all_workers", "stall_worker"])
def test_faults_that_need_an_engine_restart_are_skipped_inline_only(kind: str):
    s = _scenario(kind)
    assert "cannot be restarted" in (skip_reason(s, "inline") or "")
    assert skip_reason(s, "ray") is None and skip_reason(s, "sim") is None


def test_process_kills_run_on_both_real_placements_and_unmarked_scenarios_on_neither():
    s = _scenario("kill_process")
    assert skip_reason(s, "inline") is None and skip_reason(s, "ray") is None
    plain = Scenario(name="p", faults=[{"kind": "kill_process", "at": {"step": 1}}])
    assert skip_reason(plain, "inline") == "not marked real"


def test_a_run_lasts_3_steps_past_its_trigger_and_a_stalls_run_outlasts_the_timeout():
    """A kill needs the run to go on past it; a stall needs it to go on past the generate
    timeout and the late results (STALL_STEPS), unless the plan sets the steps itself."""
    for kind, steps in (("kill_process", 5), ("kill_worker", 5), ("stall_worker", STALL_STEPS),
                        ("stall_weights", STALL_STEPS)):
        s = _scenario(kind, step=2)
        assert validate(real_workload(Plan(scenarios=[s]), s, 0, "ray"), "t").run.steps == steps
    s = _scenario("stall_worker", step=2)
    plan = Plan(real_workload={"run": {"steps": 30}}, scenarios=[s])
    assert validate(real_workload(plan, s, 0, "ray"), "t").run.steps == 30
