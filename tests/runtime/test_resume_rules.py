"""The resume rules table (freshroll.runtime.resume) and applying settings to a learner."""

from __future__ import annotations

import json

import pytest
import torch

from freshroll.config import Config, validate
from freshroll.errors import ResumeError
from freshroll.ledger import events as ev
from freshroll.runtime.resume import (
    RULES,
    Change,
    announce,
    check,
    check_model,
    diff,
    flatten,
    history,
    rule_of,
)

DEFAULTS = flatten(Config().model_dump(mode="json"))


def test_every_config_key_is_classified_by_a_listed_rule():
    """A new config key must be given a class on purpose (not fall to the default)."""
    for key in DEFAULTS:
        parts = key.split(".")
        assert any(".".join(parts[:n]) in RULES for n in range(1, len(parts) + 1)), key


@pytest.mark.parametrize("key,rule", [
    ("run.steps", "free"), ("run.progress", "free"), ("run.torch_threads", "free"),
    ("trainer.checkpoint_every", "free"), ("rollout.workers", "free"),
    ("limits.reward_failures", "free"),
    ("trainer.lr", "explicit"), ("trainer.clip_high", "explicit"),
    ("trainer.lr_schedule", "explicit"), ("trainer.warmup_steps", "explicit"),
    ("trainer.grad_accum", "explicit"),
    ("trainer.on_nonfinite", "explicit"), ("run.max_staleness", "explicit"),
    ("rollout.temperature", "explicit"), ("something.new", "explicit"),
    ("model.path", "never"), ("model.tiny_seed", "never"), ("task.n_prompts", "never"),
    ("task.file", "never"), ("rewards", "never"), ("rollout.group_size", "never"),
    ("rollout.batch_groups", "never"), ("run.seed", "never"),
])
def test_rule_of(key: str, rule: str):
    assert rule_of(key) == rule


def test_flatten_keeps_lists_and_mappings_whole():
    flat = flatten({"run": {"steps": 3}, "task": {"params": {"a": 1}}, "rewards": [{"fn": "x"}]})
    assert flat == {"run.steps": 3, "task.params": {"a": 1}, "rewards": [{"fn": "x"}]}


def test_diff_names_every_differing_key_and_ignores_a_new_default():
    old = {"run.steps": 3, "trainer.lr": 0.001, "rollout.group_size": 4}
    new = {"run.steps": 5, "trainer.lr": 0.001, "rollout.group_size": 8, "limits.x": 7,
           "trainer.on_nonfinite": "stop"}
    got = diff(old, new, {"trainer.on_nonfinite": "stop", "limits.x": 1})
    assert [(c.key, c.old, c.new, c.rule) for c in got] == [
        ("limits.x", "<absent>", 7, "free"),
        ("rollout.group_size", 4, 8, "never"),
        ("run.steps", 3, 5, "free"),
    ]


def _changes(**pairs: tuple[object, object]) -> list[Change]:
    return diff({k.replace("__", "."): v[0] for k, v in pairs.items()},
                {k.replace("__", "."): v[1] for k, v in pairs.items()})


def test_check_accepts_free_changes():
    ch = _changes(run__steps=(3, 5), run__progress=(True, False))
    assert check(ch, (), known=DEFAULTS, step=3, where="d") == ch


def test_check_refuses_explicit_changes_without_the_flag_naming_it():
    ch = _changes(run__steps=(3, 5), trainer__lr=(0.001, 0.002), trainer__is_cap=(2.0, 3.0))
    with pytest.raises(ResumeError) as err:
        check(ch, (), known=DEFAULTS, step=3, where="runs/x")
    msg = str(err.value)
    assert msg.startswith("runs/x: resume refused: ")
    assert "trainer.is_cap 2.0 -> 3.0, trainer.lr 0.001 -> 0.002" in msg
    assert "from step 3 on" in msg
    assert "--allow-change trainer.is_cap --allow-change trainer.lr" in msg
    assert "run.steps" not in msg
    assert check(ch, ("trainer.lr", "trainer.is_cap"), known=DEFAULTS, step=3, where="d") == ch


def test_check_refuses_never_keys_even_when_allowed():
    ch = _changes(rollout__group_size=(4, 8), model__path=(None, "/m"))
    with pytest.raises(ResumeError, match=r"model\.path, rollout\.group_size cannot change"):
        check(ch, ("rollout.group_size",), known=DEFAULTS, step=3, where="d")


@pytest.mark.parametrize("allow,msg", [
    ("trainer.lr_rate", "not a config key"),
    ("run.steps", "may change on resume without it"),
    ("trainer.lr", "trainer.lr is unchanged"),
    ("rollout.group_size", "can never change within a run"),
])
def test_allow_change_must_name_a_key_that_needs_it(allow: str, msg: str):
    with pytest.raises(ResumeError, match=msg):
        check([], (allow,), known=DEFAULTS, step=0, where="d")


def test_check_steps_refuses_fewer_steps_than_the_run_committed():
    """Issue 23, 5c: run.steps is free, but can only grow."""
    from freshroll.runtime.resume import check_steps

    check_steps(80, 80, "r")  # nothing more to train: accepted (the run ends at once)
    check_steps(100, 80, "r")
    with pytest.raises(ResumeError, match=r"^r: resume refused: run\.steps=40, but the run "
                                          r"already has 80 committed steps; steps can only grow"):
        check_steps(40, 80, "r")


def test_check_model_refuses_another_step0_version():
    check_model(None, "p0-b", "m", "d")  # an older ledger without one: nothing to compare
    check_model("p0-a", "p0-a", "m", "d")
    with pytest.raises(ResumeError, match="model: /m gives step-0 policy version p0-b"):
        check_model("p0-a", "p0-b", "/m", "d")


def _run_config(step: int, cfg: dict[str, object]) -> ev.RunConfig:
    return ev.RunConfig(ts=0.0, step=step, config=json.dumps(cfg), config_digest="",
                        model_digest="m")


def _committed(step: int, digest: str) -> ev.Committed:
    return ev.Committed(ts=0.0, lease="l", version=f"p{step}-{'a' * 32}", parent="p0-x",
                        settings_digest=digest, samples=[])


def test_history_maps_each_committed_step_to_the_config_it_was_trained_under():
    fused = "adamw_torch_fused"  # recorded, as today's freshroll records every key
    a = {"trainer": {"lr": 1, "optim": fused, "disable_dropout": True}}
    b = {"trainer": {"lr": 2, "optim": fused, "disable_dropout": True}}
    h = history([
        ev.Opened(ts=0.0, run_id="r", incarnation=0, max_staleness=1, batch_groups=2,
                  group_size=4),
        ev.PolicyPublished(ts=0.0, version="p0-" + "0" * 32), _run_config(0, a),
        _committed(1, "d1"), _committed(2, "d1"), _run_config(2, b), _committed(3, "d2"),
    ])
    assert h.initial_version == "p0-" + "0" * 32 and h.step == 3
    assert h.config == b and h.recorded() == {"trainer.lr": 2, "trainer.optim": fused,
                                              "trainer.disable_dropout": True}
    assert h.steps == {1: (a, "d1"), 2: (a, "d1"), 3: (b, "d2")}


def test_history_of_an_older_ledger_recorded_only_what_opened_names():
    h = history([ev.Opened(ts=0.0, run_id="r", incarnation=0, max_staleness=1,
                           batch_groups=2, group_size=4)])
    assert h.config is None and h.steps == {}
    assert h.recorded() == {"run.max_staleness": 1, "rollout.batch_groups": 2,
                            "rollout.group_size": 4, "rollout.max_inflight_groups": None}


def test_announce_writes_the_changes_then_the_config():
    ch = _changes(run__steps=(3, 5), trainer__lr=(0.001, 0.002))
    config = Config().model_dump(mode="json")
    changed, rc = announce(config, ch, ("trainer.lr",), step=3, model_digest="md", ts=1.0)
    assert isinstance(changed, ev.SettingsChanged) and isinstance(rc, ev.RunConfig)
    assert changed.keys == ["run.steps", "trainer.lr"] and changed.allowed == ["trainer.lr"]
    assert json.loads(changed.old) == {"run.steps": 3, "trainer.lr": 0.001}
    assert json.loads(rc.config) == config and rc.step == 3 and rc.model_digest == "md"
    (only,) = announce(config, [], (), step=0, model_digest="md", ts=1.0)
    assert isinstance(only, ev.RunConfig)
    assert ev.DECODER.decode(ev.ENCODER.encode(rc)) == rc  # a ledger event like any other


def test_apply_settings_puts_a_config_in_force_as_a_fresh_learner_would():
    """Before: a resumed learner kept the lr its checkpoint's optimizer was saved with."""
    from freshroll.runtime.learner import apply_settings
    from freshroll.trainer.grpo import GRPOLearner

    old = validate({})
    new = validate({"trainer": {"lr": 0.01, "weight_decay": 0.1, "clip_high": 0.5,
                                "aggregation": "dr_grpo"}, "rollout": {"temperature": 0.7,
                                                                       "max_new_tokens": 9}})
    model = torch.nn.Linear(2, 2)
    learner = GRPOLearner(model, old.trainer, temperature=1.0, pad_id=0, max_new_tokens=4)
    learner.optimizer.load_state_dict(learner.optimizer.state_dict())  # as from a checkpoint
    apply_settings(learner, new)
    fresh = GRPOLearner(torch.nn.Linear(2, 2), new.trainer, temperature=0.7, pad_id=0,
                        max_new_tokens=9)
    assert learner.settings_digest == fresh.settings_digest
    assert learner.loss_cfg == fresh.loss_cfg and learner.cfg == fresh.cfg
    assert learner.temperature == fresh.temperature
    assert [(g["lr"], g["weight_decay"]) for g in learner.optimizer.param_groups] == [
        (0.01, 0.1)]


@pytest.mark.parametrize("key,old,new", [
    ("trainer.lr_schedule", "constant", "cosine"), ("trainer.warmup_steps", 0, 10),
    ("trainer.grad_accum", 1, 4),
])
def test_schedule_and_accumulation_change_on_resume_only_when_named(key: str, old: object,
                                                                   new: object):
    """Issue 28, build 4: as trainer.lr, they change training from the resume on."""
    ch = diff({key: old, "run.steps": 3}, {key: new, "run.steps": 5})
    with pytest.raises(ResumeError, match=rf"{key} .* --allow-change {key}"):
        check(ch, (), known=DEFAULTS, step=3, where="d")
    assert check(ch, (key,), known=DEFAULTS, step=3, where="d") == ch
    with pytest.raises(ResumeError, match=f"{key} is unchanged"):
        check([], (key,), known=DEFAULTS, step=3, where="d")


def test_a_ledger_recorded_before_the_schedule_keys_resumes_at_their_defaults():
    recorded = flatten(Config().model_dump(mode="json"))
    for key in ("trainer.lr_schedule", "trainer.warmup_steps", "trainer.grad_accum"):
        del recorded[key]
    assert diff(recorded, DEFAULTS, DEFAULTS) == []
    changed = diff(recorded, {**DEFAULTS, "trainer.grad_accum": 2}, DEFAULTS)
    assert [(c.key, c.rule) for c in changed] == [("trainer.grad_accum", "explicit")]


def test_apply_settings_puts_a_schedule_and_its_run_length_in_force():
    from freshroll.runtime.learner import apply_settings
    from freshroll.trainer.grpo import GRPOLearner

    old = validate({"run": {"steps": 10}})
    new = validate({"run": {"steps": 20}, "trainer": {"lr_schedule": "linear",
                                                       "warmup_steps": 2, "grad_accum": 2}})
    learner = GRPOLearner(torch.nn.Linear(2, 2), old.trainer, temperature=1.0, pad_id=0,
                          max_new_tokens=4, total_steps=10)
    apply_settings(learner, new)
    fresh = GRPOLearner(torch.nn.Linear(2, 2), new.trainer, temperature=1.0, pad_id=0,
                        max_new_tokens=4, total_steps=20)
    assert learner.settings_digest == fresh.settings_digest != GRPOLearner(
        torch.nn.Linear(2, 2), new.trainer, temperature=1.0, pad_id=0, max_new_tokens=4,
        total_steps=10).settings_digest  # a decaying schedule's digest holds the run's length
    assert learner.cfg == fresh.cfg and learner.total_steps == 20
    assert learner.lr(12) == fresh.lr(12) == pytest.approx(1e-3 * 9 / 18)
