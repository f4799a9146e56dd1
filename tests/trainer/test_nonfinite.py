"""The learner never applies a step whose loss or gradients are not finite.

Before: a reward of 1e308 (inf in float32) gave loss NaN, the step was applied (NaN weights),
then committed and published. The pipeline's policy: tests/pipeline/test_nonfinite_steps.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from freshroll.config.train import TrainerSection
from freshroll.errors import NonFiniteStep
from freshroll.trainer.grpo import GRPOLearner, TrainSample

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/trainer/conftest.py


def _learner(**cfg: Any) -> GRPOLearner:
    from freshroll.engines.tiny import build_tiny

    model, tok = build_tiny(seed=3)
    return GRPOLearner(model, TrainerSection(**cfg), temperature=1.0,
                       pad_id=tok.pad_token_id, max_new_tokens=3)


def _batch(rewards: list[float]) -> list[TrainSample]:
    return [TrainSample((5, 6, 7), (8, 9), (-2.0, -2.0), r, i // 2, 0)
            for i, r in enumerate(rewards)]


def _snapshot(learner: GRPOLearner) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return ({k: v.clone() for k, v in learner.model.state_dict().items()},
            copy.deepcopy(learner.optimizer.state_dict()))


def _assert_unchanged(learner: GRPOLearner, before: tuple[dict[str, Any], dict[str, Any]]):
    weights, opt = before
    after = learner.model.state_dict()
    assert all(torch.equal(weights[k], after[k]) for k in weights)
    now = learner.optimizer.state_dict()
    assert now["param_groups"] == opt["param_groups"]
    assert now["state"].keys() == opt["state"].keys()
    for k, st in opt["state"].items():
        for name, value in st.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(now["state"][k][name]))
    assert all(p.grad is None for p in learner.model.parameters())


def test_a_reward_infinite_in_float32_raises_before_any_change():
    learner = _learner()
    learner.step(_batch([0.0, 1.0, 1.0, 0.0]))  # the optimizer has state now
    before = _snapshot(learner)
    with pytest.raises(NonFiniteStep, match=r"loss is nan .*rewards not finite in float32"):
        learner.step(_batch([1e308, 0.0, 1.0, 0.0]))
    _assert_unchanged(learner, before)
    learner.step(_batch([0.0, 1.0, 1.0, 0.0]))  # and it still trains


def test_non_finite_gradients_raise_before_the_optimizer_step():
    learner = _learner()
    learner.step(_batch([0.0, 1.0, 1.0, 0.0]))
    before = _snapshot(learner)
    param = next(learner.model.parameters())
    hook = param.register_hook(lambda g: g * float("inf"))
    with pytest.raises(NonFiniteStep, match=r"gradient norm is (inf|nan)") as info:
        learner.step(_batch([0.0, 1.0, 1.0, 0.0]))
    hook.remove()
    assert info.value.recoverable
    _assert_unchanged(learner, before)


def test_weights_that_overflow_after_the_step_cannot_be_skipped():
    learner = _learner()
    param = next(learner.model.parameters())
    real_step = learner.optimizer.step

    def overflowing_step() -> None:  # as an extreme lr would (torch refuses one outright)
        real_step()
        with torch.no_grad():
            param.view(-1)[0] = float("inf")

    learner.optimizer.step = overflowing_step  # type: ignore[method-assign]
    with pytest.raises(NonFiniteStep, match="weights are not finite") as info:
        learner.step(_batch([0.0, 1.0, 1.0, 0.0]))
    assert info.value.recoverable is False


def test_on_nonfinite_is_not_part_of_the_settings_digest():
    assert _learner().settings_digest == _learner(on_nonfinite="stop").settings_digest
    assert _learner().settings_digest != _learner(lr=2e-3).settings_digest


def test_all_finite_is_exact_for_nan_inf_and_large_finite_values():
    """The fast L2-norm check: a NaN or an inf anywhere is found; finite values whose squares
    overflow the norm (1e30 ** 2 > float32's max) are still finite."""
    from freshroll.trainer.grpo import all_finite

    ok = [torch.randn(50), torch.zeros(3, 4), torch.empty(0)]
    assert all_finite(ok)
    assert all_finite([torch.full((8,), 1e30), torch.full((2, 2), -3e38)])  # norms overflow
    for bad in (float("nan"), float("inf"), float("-inf")):
        t = torch.randn(7, 5)
        t[3, 2] = bad
        assert not all_finite([*ok, t])
        assert not all_finite([torch.full((8,), 1e30), t])  # beside an overflowing norm
    assert all_finite([])
