"""A learner on the tiny model (seed 1, lr 1e-2) and a batch of four samples in two groups,
shared by the trainer tests that compare learners built with other trainer settings."""

from __future__ import annotations

from typing import Any

from freshroll.config.train import TrainerSection
from freshroll.trainer.grpo import GRPOLearner
from freshroll.trainer.replay import TrainSample

SAMPLES = [TrainSample([5, 6], [7, 8, 9], [-2.0, -2.0, -2.0], float(i % 2), i // 2, 0)
           for i in range(4)]


def small_learner(**trainer: Any) -> GRPOLearner:
    """A learner on a fresh tiny model, with ``trainer`` settings over lr 1e-2."""
    from freshroll.engines.tiny import build_tiny

    model, _ = build_tiny(seed=1)
    return GRPOLearner(model, TrainerSection(lr=1e-2, **trainer), temperature=1.0, pad_id=0,
                       max_new_tokens=4)
