"""trainer.mask_truncated (TRL's mask_truncated_completions): a completion that ended at
max_new_tokens gets no loss, as TRL's zeroed completion mask gives it none, while its
reward still counts in its group's mean (issue 48, "TRL features")."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
import torch

from freshroll.config.train import TrainerSection
from freshroll.engines import payload as pl
from freshroll.engines.base import Completion
from freshroll.engines.tiny import build_tiny
from freshroll.trainer.grpo import GRPOLearner, TrainSample
from freshroll.trainer.replay import train_samples

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/trainer/conftest.py


def _samples(seed: int = 0) -> list[TrainSample]:
    rng = random.Random(seed)
    out = []
    for i in range(6):
        comp = [rng.randrange(4, 40) for _ in range(rng.randint(2, 6))]
        out.append(TrainSample([5, 6, 7], comp, [rng.uniform(-4.0, -2.0) for _ in comp],
                               rng.uniform(0, 1), i // 3, 1, truncated=i in (1, 4)))
    return out


def _grads(samples: list[TrainSample], accum: int = 1, **trainer: Any) -> list[torch.Tensor]:
    model, _ = build_tiny(seed=5)
    learner = GRPOLearner(model, TrainerSection(grad_accum=accum, max_grad_norm=1e6, **trainer),
                          temperature=1.0, pad_id=0, max_new_tokens=6)
    learner.step(samples)
    return [p.grad.clone() for p in learner.model.parameters() if p.grad is not None]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.allclose(x, y, atol=1e-7, rtol=1e-5)
                                    for x, y in zip(a, b, strict=True))


def _other_tokens(samples: list[TrainSample]) -> list[TrainSample]:
    """The truncated samples' completions replaced (their rewards kept)."""
    return [replace(s, token_ids=[9] * len(s.token_ids), logprobs=[-1.0] * len(s.token_ids))
            if s.truncated else s for s in samples]


@pytest.mark.parametrize("aggregation", ["grpo", "dapo", "dr_grpo"])
def test_a_truncated_completion_gets_no_loss(aggregation: str) -> None:
    samples = _samples()
    masked = _grads(samples, aggregation=aggregation, mask_truncated=True)
    assert _same(masked, _grads(_other_tokens(samples), aggregation=aggregation,
                                mask_truncated=True))
    # load-bearing: without the setting, the same change moves the gradient
    assert not _same(_grads(samples, aggregation=aggregation),
                     _grads(_other_tokens(samples), aggregation=aggregation))
    # its reward still sets its group's mean, so the other samples' advantages
    moved = [replace(s, reward=s.reward + 1.0) if s.truncated else s for s in samples]
    assert not _same(masked, _grads(moved, aggregation=aggregation, mask_truncated=True))


@pytest.mark.parametrize("aggregation", ["grpo", "dapo", "dr_grpo"])
def test_micro_batches_give_the_whole_batchs_masked_gradient(aggregation: str) -> None:
    """dapo's token mean over the loss tokens only: accumulating keeps its denominator."""
    samples = _samples(1)
    whole = _grads(samples, aggregation=aggregation, mask_truncated=True)
    for accum in (2, 3):
        assert _same(whole, _grads(samples, accum, aggregation=aggregation,
                                   mask_truncated=True)), accum


def test_a_payloads_finish_reason_marks_the_sample_truncated() -> None:
    class Buf:
        def __init__(self) -> None:
            self.comps = {"g0.0": Completion((1, 2), (3, 4), (-1.0, -1.0), "x", "length", 0.0),
                          "g0.1": Completion((1, 2), (3, 2), (-1.0, -1.0), "y", "stop", 0.0)}

        def sample_info(self, sid: str) -> tuple[float, int]:
            return 0.5, 0

        def payload(self, sid: str) -> bytes:
            return pl.encode(self.comps[sid])

    got = train_samples(Buf(), ["g0.0", "g0.1"], consumer=1)  # type: ignore[arg-type]  # a fake buffer
    assert [s.truncated for s in got] == [True, False]
