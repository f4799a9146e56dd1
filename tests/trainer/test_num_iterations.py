"""trainer.num_iterations (TRL's num_iterations): several optimizer updates on one step's
batch, each clipped against the behaviour log-probs, as TRL clips each of its iterations
against the log-probs of the policy that generated the batch (issue 48)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from freshroll.config.train import TrainerSection
from freshroll.engines.tiny import build_tiny
from freshroll.errors import NonFiniteStep
from freshroll.trainer.grpo import GRPOLearner, TrainSample

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/trainer/conftest.py

SAMPLES = [TrainSample([5, 6, 7], [8 + i, 9, 10 + i], [-3.0, -2.5, -3.5], float(i % 3) / 2,
                       i // 3, 0) for i in range(6)]


def _learner(**trainer: Any) -> GRPOLearner:
    model, _ = build_tiny(seed=2)
    return GRPOLearner(model, TrainerSection(lr=3e-2, **trainer), temperature=1.0, pad_id=0,
                       max_new_tokens=3)


def _weights(learner: GRPOLearner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.model.parameters()]


@pytest.mark.parametrize("correction", ["dual_clip", "none"])
def test_k_iterations_are_k_updates_against_the_behaviour_policy(correction: str) -> None:
    """TRL's loop: every iteration's ratio is to the generating policy's log-probs (ours: the
    behaviour log-probs the batch carries), so k updates in one step are the same as k steps
    on the same batch at the same learning rate, Adam's moments carried over."""
    inner = _learner(num_iterations=3, correction=correction)
    metrics = inner.step(SAMPLES, step=1)
    outer = _learner(correction=correction)
    for _ in range(3):
        outer.step(SAMPLES, step=1)
    for a, b in zip(_weights(inner), _weights(outer), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    once = _learner(correction=correction)
    once.step(SAMPLES, step=1)
    assert any(not torch.allclose(a, b) for a, b in zip(_weights(inner), _weights(once),
                                                       strict=True))
    assert inner.steps == 1 and metrics["clip_frac"] >= 0.0 and metrics["samples"] == 6.0


def test_iterations_need_a_correction_anchored_at_the_behaviour_policy() -> None:
    with pytest.raises(ValueError, match="num_iterations 2 needs correction none or dual_clip"):
        TrainerSection(num_iterations=2, correction="tis")


def test_a_nonfinite_later_iteration_cannot_be_undone() -> None:
    learner = _learner(num_iterations=2)
    calls = {"n": 0}
    real = learner._update

    def second_fails(*args: Any) -> dict[str, float]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise NonFiniteStep("loss is nan")
        return real(*args)

    learner._update = second_fails  # type: ignore[method-assign]  # a fault for the test
    with pytest.raises(NonFiniteStep, match=r"update 2 of trainer\.num_iterations=2") as err:
        learner.step(SAMPLES)
    assert err.value.recoverable is False
