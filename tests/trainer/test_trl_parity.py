"""TRL's knobs freshroll now takes, each against TRL's (or transformers') own computation
(issue 48, "TRL features a user reaches for"): ``scale_rewards`` (group / batch / none),
``importance_sampling_level="sequence"`` (GSPO) and ``warmup_ratio``.

TRL computes advantages and the loss inline in ``GRPOTrainer`` (no function to call), so
:func:`_trl_advantages` and :func:`_trl_loss` are its lines transcribed (trl 1.16,
``trl/trainer/grpo_trainer.py``: ``_generate_and_score_completions`` and ``_compute_loss``),
with TRL's own ``nanstd``."""

from __future__ import annotations

import pytest
import torch

from freshroll.config.train import TrainerSection
from freshroll.errors import ConfigError
from freshroll.trainer.grpo import scale_of
from freshroll.trainer.losses import LossConfig, group_advantages, policy_loss
from freshroll.trainer.schedule import warmup_of

trl_utils = pytest.importorskip("trl.trainer.utils")
EPS = 1e-4  # TRL's


def _trl_advantages(rewards: torch.Tensor, n: int, scale: str) -> torch.Tensor:
    mean = torch.nanmean(rewards.view(-1, n), dim=1).repeat_interleave(n, dim=0)
    if scale in ("group", "none"):
        std = trl_utils.nanstd(rewards.view(-1, n), dim=1).repeat_interleave(n, dim=0)
    else:
        std = trl_utils.nanstd(rewards).expand_as(rewards)
    adv = rewards - mean
    return adv / (std + EPS) if scale != "none" else adv


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_scale_rewards_matches_trl(scale: str) -> None:
    torch.manual_seed(0)
    rewards = torch.rand(12)
    groups = torch.arange(3).repeat_interleave(4)
    ours = group_advantages(rewards, groups, scale=scale != "none", batch_std=scale == "batch",
                            eps=EPS)
    assert torch.allclose(ours, _trl_advantages(rewards, 4, scale), atol=1e-6)


def test_scale_rewards_auto_keeps_the_aggregations_rule() -> None:
    assert scale_of(TrainerSection()) == "group"
    assert scale_of(TrainerSection(aggregation="dr_grpo")) == "none"
    assert scale_of(TrainerSection(aggregation="dr_grpo", scale_rewards="group")) == "group"
    assert scale_of(TrainerSection(scale_rewards="batch")) == "batch"


def _trl_loss(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
              eps_low: float, eps_high: float) -> torch.Tensor:
    """TRL's ``_compute_loss`` for loss_type grpo, importance_sampling_level sequence, beta 0."""
    log_ratio = logp - old
    w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(w)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token = -torch.min(coef_1 * adv.unsqueeze(1), coef_2 * adv.unsqueeze(1))
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def test_sequence_level_ratio_matches_trls_gspo_loss_and_gradient() -> None:
    torch.manual_seed(1)
    base = torch.randn(4, 6) - 2.0
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0],
                         [1, 1, 0, 0, 0, 0]], dtype=torch.float32)
    old = base + 0.3 * torch.randn(4, 6)  # far enough off-policy for the clip to act
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    ours_leaf = base.clone().requires_grad_(True)
    theirs_leaf = base.clone().requires_grad_(True)
    cfg = LossConfig(aggregation="grpo", clip_low=0.2, clip_high=0.28, correction="none",
                     ratio_level="sequence")
    ours, metrics = policy_loss(ours_leaf, old, adv, mask.bool(), cfg)
    theirs = _trl_loss(theirs_leaf, old, adv, mask, 0.2, 0.28)
    ours.backward()
    theirs.backward()
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), abs=1e-6)
    assert ours_leaf.grad is not None and theirs_leaf.grad is not None
    assert torch.allclose(ours_leaf.grad, theirs_leaf.grad, atol=1e-6)
    token, _ = policy_loss(base.clone().requires_grad_(True), old, adv, mask.bool(),
                           LossConfig(aggregation="grpo", clip_low=0.2, clip_high=0.28,
                                      correction="none"))
    assert float(token.detach()) != pytest.approx(float(ours.detach()), abs=1e-4)  # load-bearing
    assert metrics["ratio_mean"] > 0


def test_a_bad_ratio_level_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"loss\.ratio_level"):
        LossConfig(ratio_level="row")  # type: ignore[arg-type]  # the bad value under test


@pytest.mark.parametrize(("ratio", "total"), [(0.1, 10), (0.1, 25), (0.05, 7), (0.5, 3)])
def test_warmup_ratio_is_transformers_get_warmup_steps(ratio: float, total: int) -> None:
    from transformers import TrainingArguments

    hf = TrainingArguments(output_dir="unused", use_cpu=True, warmup_steps=ratio)
    assert warmup_of(0, ratio, total) == hf.get_warmup_steps(total)
    assert warmup_of(4, 0.0, total) == 4


def test_warmup_ratio_and_steps_together_are_refused() -> None:
    with pytest.raises(ValueError, match=r"warmup_ratio 0\.1 and warmup_steps 3 both set"):
        TrainerSection(warmup_ratio=0.1, warmup_steps=3)


def test_gradient_checkpointing_gives_the_same_gradients() -> None:
    """trainer.gradient_checkpointing (TRL's): activations recomputed, gradients unchanged."""
    from freshroll.engines.tiny import build_tiny
    from freshroll.trainer.grpo import GRPOLearner, TrainSample

    samples = [TrainSample([5, 6, 7], [8 + i, 9, 10], [-3.0, -2.5, -3.5], float(i % 2), i // 2,
                           0) for i in range(4)]
    grads = []
    for on in (False, True):
        model, _ = build_tiny(seed=3)
        learner = GRPOLearner(model, TrainerSection(gradient_checkpointing=on), temperature=1.0,
                              pad_id=0, max_new_tokens=3)
        assert model.is_gradient_checkpointing is on
        learner.step(samples)
        grads.append([p.grad for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
