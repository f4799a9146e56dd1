"""trainer.optim: AdamW's kernel, by TRL's names. The default fuses every parameter in one
kernel (TRL's default on torch >= 2.8); adamw_torch is the loop earlier runs trained with:
its digest is theirs, and a ledger that recorded no optim is read as it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from small_learner import SAMPLES, small_learner

from freshroll.config.train import TrainerSection
from freshroll.errors import ConfigError
from freshroll.runtime.learner import apply_settings, restore
from freshroll.runtime.resume import diff, flatten, history, with_recorded_defaults
from freshroll.trainer.checkpoint import save_checkpoint
from freshroll.trainer.grpo import GRPOLearner

_learner = small_learner


def _fused(learner: GRPOLearner) -> set[Any]:
    return {g["fused"] for g in learner.optimizer.param_groups}


def test_the_default_fuses_and_adamw_torch_loops() -> None:
    assert TrainerSection().optim == "adamw_torch_fused"
    assert _fused(_learner()) == {True}
    assert _fused(_learner(optim="adamw_torch")) == {None}  # torch's default: the loop


def test_both_kernels_take_the_same_step_up_to_rounding() -> None:
    fused, loop = _learner(), _learner(optim="adamw_torch")
    for _ in range(3):
        fused.step(SAMPLES)
        loop.step(SAMPLES)
    for a, b in zip(fused.model.parameters(), loop.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert fused.settings_digest != loop.settings_digest


def test_an_unknown_kernel_is_refused_with_its_key() -> None:
    with pytest.raises(Exception, match="optim"):
        TrainerSection(optim="sgd")  # type: ignore[arg-type]  # the point of the test


def test_trls_name_for_the_key_is_answered() -> None:
    from freshroll.config import load_config

    with pytest.raises(ConfigError, match=r"trainer\.optim"):
        load_config(None, ["trainer.optim_name=adamw_torch", "optim=adamw_torch"])


def test_a_loaded_optimizer_state_runs_on_the_learners_own_kernel(tmp_path: Path) -> None:
    """An optimizer state carries its kernel in its param groups: a fused learner that
    restores a checkpoint saved by a looping one keeps fusing (and the other way round)."""
    loop, fused = _learner(optim="adamw_torch"), _learner()
    loop.step(SAMPLES)
    fused.step(SAMPLES)
    save_checkpoint(tmp_path / "loop", model_state=loop.model_state(), optimizer=loop.optimizer,
                    meta={"step": 1})
    save_checkpoint(tmp_path / "fused", model_state=fused.model_state(), optimizer=fused.optimizer,
                    meta={"step": 1})
    a, b = _learner(), _learner(optim="adamw_torch")
    restore(a, tmp_path / "loop", 1)
    restore(b, tmp_path / "fused", 1)
    assert _fused(a) == {True} and _fused(b) == {None}
    a.step(SAMPLES)  # the loaded state steps on the fused kernel
    b.step(SAMPLES)


def test_replay_puts_the_recorded_kernel_in_force() -> None:
    from freshroll.config import validate

    learner = _learner()
    apply_settings(learner, validate({"trainer": {"lr": 1e-2, "optim": "adamw_torch"}}))
    assert _fused(learner) == {None}
    assert learner.settings_digest == _learner(optim="adamw_torch").settings_digest


def test_a_recorded_config_without_optim_trained_with_the_loop() -> None:
    """An earlier freshroll recorded no trainer.optim: it looped. Resuming such a run under
    today's default is an explicit change of training, not a silent one."""
    from freshroll.config import Config
    from freshroll.ledger import events as ev

    recorded = Config().model_dump(mode="json")
    del recorded["trainer"]["optim"]
    event = ev.RunConfig(ts=0.0, step=0, config=json.dumps(recorded), config_digest="d",
                         model_digest="m")
    h = history([event])
    assert h.config is not None and h.config["trainer"]["optim"] == "adamw_torch"
    changes = diff(h.recorded(), flatten(Config().model_dump(mode="json")))
    assert [(c.key, c.old, c.new, c.rule) for c in changes] == [
        ("trainer.optim", "adamw_torch", "adamw_torch_fused", "explicit")]
    kept = with_recorded_defaults({"trainer": {"optim": "adamw_torch_fused"}})
    assert kept["trainer"]["optim"] == "adamw_torch_fused"  # a recorded value is kept
