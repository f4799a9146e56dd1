"""trainer.bf16: the learner's forward and backward under bfloat16 autocast, weights and
optimizer state float32 (TRL's ``bf16=True``), in the settings digest (omitted at its default,
so earlier runs' digests hold)."""

from __future__ import annotations

import torch
from small_learner import SAMPLES, small_learner

from freshroll.config.train import TrainerSection
from freshroll.trainer.grpo import GRPOLearner, settings_digest

_learner = small_learner


def _linear_dtypes(learner: GRPOLearner) -> set[torch.dtype]:
    seen: set[torch.dtype] = set()
    for m in learner.model.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
    return seen


def test_bf16_computes_in_bfloat16_and_keeps_float32_weights() -> None:
    plain, bf16 = _learner(), _learner(bf16=True)
    seen_plain, seen_bf16 = _linear_dtypes(plain), _linear_dtypes(bf16)
    m_plain, m_bf16 = plain.step(SAMPLES), bf16.step(SAMPLES)
    assert seen_plain == {torch.float32} and seen_bf16 == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    state = bf16.optimizer.state_dict()["state"]
    assert state and all(v["exp_avg"].dtype == torch.float32 for v in state.values())
    assert torch.isfinite(torch.tensor(m_bf16["loss"]))
    assert abs(m_bf16["loss"] - m_plain["loss"]) < 0.05  # the same loss, in less precision
    changed = [not torch.equal(a, b) for a, b in zip(plain.model.parameters(),
                                                     bf16.model.parameters(), strict=True)]
    assert any(changed)  # other arithmetic: other weights


def test_bf16_is_in_the_digest_and_omitted_at_its_default() -> None:
    default = settings_digest(TrainerSection(), 1.0, None)
    assert settings_digest(TrainerSection(bf16=False), 1.0, None) == default
    assert settings_digest(TrainerSection(bf16=True), 1.0, None) != default
