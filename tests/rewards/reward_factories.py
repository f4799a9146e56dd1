"""Reward factories for tests/rewards (loaded by file path)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def make_threshold(at: int) -> Callable[..., list[float]]:
    """A reward factory: 1.0 for completions longer than ``at`` characters."""

    def threshold_reward(completions: list[str], **kwargs: Any) -> list[float]:
        return [float(len(c) > at) for c in completions]

    return threshold_reward


def make_number() -> int:
    return 3


class Penalty:
    """A callable reward object; its attributes are part of its reward version."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(self, completions: list[str], **kwargs: Any) -> list[float]:
        return [-self.scale * len(c) for c in completions]


small_penalty = Penalty(0.1)
big_penalty = Penalty(1.0)
