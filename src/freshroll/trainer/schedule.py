"""The learning-rate schedule: the lr of a trainer step, as a function of its number.

Words: step ``n`` is the ``n``-th optimizer step of the run (the first step is 1, as
``metrics.jsonl``'s ``step``); ``s = n - 1`` is how many steps came before it, the
``current_step`` of transformers' ``LambdaLR`` when that step's ``optimizer.step()`` runs.
With ``W`` warmup steps, ``T`` the run's total steps (``run.steps``) and ``base`` the
configured lr (``trainer.lr``)::

    lr(n) = base * f(s),   s = n - 1

    warmup (s < W):   f(s) = s / max(1, W)                        every schedule
    constant:         f(s) = 1
    linear:           f(s) = max(0, (T - s) / max(1, T - W))
    cosine:           f(s) = max(0, 0.5 * (1 + cos(pi * p))),  p = min(1, (s - W) / max(1, T - W))

the factors of transformers' ``get_constant_schedule_with_warmup``,
``get_linear_schedule_with_warmup`` and ``get_cosine_schedule_with_warmup`` (half a cosine,
``num_cycles = 0.5``) with ``num_training_steps = T``: as there, the first step of a warmup
runs at lr 0. The one difference is past ``T`` (a run never trains there): the cosine
stays at 0 instead of rising again.

Pure: the lr is a function of the step number alone, not of a scheduler's state, so a
resumed learner (a checkpoint, then steps replayed from the ledger) sets exactly the lr
each step was trained with.
"""

from __future__ import annotations

import math
from typing import Literal

Schedule = Literal["constant", "linear", "cosine"]

__all__ = ["Schedule", "lr_at", "lr_factor"]


def lr_factor(step: int, schedule: Schedule, warmup_steps: int, total_steps: int) -> float:
    """``f(step - 1)`` of the module docstring: the multiplier of ``base`` at step ``step``."""
    if step < 1:
        raise ValueError(f"step numbers start at 1, got {step}")
    s, w = step - 1, warmup_steps
    if s < w:
        return float(s) / float(max(1, w))
    if schedule == "constant":
        return 1.0
    span = float(max(1, total_steps - w))
    if schedule == "linear":
        return max(0.0, float(total_steps - s) / span)
    if schedule == "cosine":
        progress = min(1.0, float(s - w) / span)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    raise ValueError(f"unknown lr schedule {schedule!r}")


def lr_at(
    step: int, base_lr: float, schedule: Schedule, warmup_steps: int, total_steps: int
) -> float:
    """The learning rate of step ``step`` (1-based): ``base_lr * f(step - 1)`` (``f = 1``,
    exactly ``base_lr``, for ``constant`` past the warmup)."""
    return base_lr * lr_factor(step, schedule, warmup_steps, total_steps)


def warmup_of(warmup_steps: int, warmup_ratio: float, total_steps: int) -> int:
    """The warmup in steps: ``ceil(warmup_ratio x total_steps)`` where a ratio is set (as
    transformers' ``TrainingArguments.get_warmup_steps``), else ``warmup_steps``."""
    return math.ceil(warmup_ratio * total_steps) if warmup_ratio else warmup_steps
