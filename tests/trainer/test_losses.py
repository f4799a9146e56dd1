"""Tests for freshroll.trainer.losses: every expected number is computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from freshroll.errors import ConfigError
from freshroll.trainer.losses import (
    Aggregation,
    LossConfig,
    entropy_from_logits,
    group_advantages,
    policy_loss,
    token_logprobs,
)

LN = math.log


def _leaf(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def _behaviour(logp: torch.Tensor, ratios: list[list[float]]) -> torch.Tensor:
    """Behaviour log-probs such that exp(logp - behaviour) == ratios."""
    return logp.detach() - torch.tensor(ratios).log()


# --------------------------------------------------------------------------- advantages


def test_group_advantages_grpo_unbiased_std() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = group_advantages(rewards, groups)
    # group 0: mean 0.5, deviations +-0.5, unbiased var = (4 * 0.25) / 3 = 1/3.
    a = 0.5 / (math.sqrt(1.0 / 3.0) + 1e-6)  # 0.866...
    expected = torch.tensor([a, -a, -a, a, 0.0, 0.0])
    assert a == pytest.approx(0.8660, abs=1e-4)
    assert torch.allclose(adv, expected, atol=1e-6)


def test_group_advantages_dr_grpo_unscaled_and_singletons() -> None:
    rewards = torch.tensor([3.0, 1.0, 5.0, 2.0, 4.0])
    groups = torch.tensor([7, 3, 9, 7, 3])  # non-contiguous labels; group 9 is a singleton
    adv = group_advantages(rewards, groups, scale=False)
    # group 7: mean 2.5 -> +0.5, -0.5; group 3: mean 2.5 -> -1.5, +1.5; group 9 -> 0.
    assert torch.allclose(adv, torch.tensor([0.5, -1.5, 0.0, -0.5, 1.5]))
    scaled = group_advantages(rewards, groups)
    # group 3: unbiased std = sqrt((1.5^2 * 2) / 1) = 2.1213; 1.5 / 2.1213 = 0.7071.
    assert scaled[1].item() == pytest.approx(-1.5 / (math.sqrt(4.5) + 1e-6), abs=1e-6)
    assert scaled[2].item() == 0.0


# --------------------------------------------------------------------------- logprobs


def test_token_logprobs_matches_manual_log_softmax() -> None:
    logits = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]])
    targets = torch.tensor([[2, 1]])
    out = token_logprobs(logits, targets)
    e = math.e
    expected = [3.0 - LN(e + e**2 + e**3), LN(1.0 / 3.0)]
    assert out.shape == (1, 2)
    assert out[0].tolist() == pytest.approx(expected, abs=1e-6)
    hot = token_logprobs(logits, targets, temperature=2.0)
    # logits / 2 = [0.5, 1, 1.5]; target 2.
    assert hot[0, 0].item() == pytest.approx(
        1.5 - LN(math.exp(0.5) + math.exp(1.0) + math.exp(1.5)), abs=1e-6
    )


def test_token_logprobs_is_stable_for_huge_logits() -> None:
    logits = torch.tensor([[[1e4, 0.0]]])
    out = token_logprobs(logits, torch.tensor([[1]]))
    assert out.item() == pytest.approx(-1e4, rel=1e-6)


def test_entropy_masked_mean() -> None:
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0], [9.0, 1.0, 2.0, 3.0]]])
    mask = torch.tensor([[1, 1, 0]])
    # token 0 uniform over 4: ln 4; token 1 near one-hot: ~0; token 2 masked out.
    ent = entropy_from_logits(logits, mask)
    assert ent.item() == pytest.approx(LN(4.0) / 2.0, abs=1e-5)


# --------------------------------------------------------------------------- aggregation

RAGGED_MASK = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
RAGGED_RATIOS = [[1.1, 0.9, 1.0], [1.05, 5.0, 0.1]]  # padded entries must be ignored
RAGGED_ADV = torch.tensor([1.0, -2.0])
# correction none, clip 0.2: seq 0 -> L = [-1.1, -0.9, -1.0]; seq 1 -> L = [-min(-2.1,-2.1)] = [2.1]


@pytest.mark.parametrize(
    ("aggregation", "max_len", "expected"),
    [
        ("grpo", None, ((-3.0 / 3.0) + 2.1) / 2.0),  # 0.55
        ("dapo", None, (-3.0 + 2.1) / 4.0),  # -0.225
        ("dr_grpo", None, (-3.0 + 2.1) / (2 * 3)),  # -0.15
        ("dr_grpo", 5, (-3.0 + 2.1) / (2 * 5)),  # -0.09
    ],
)
def test_aggregations_on_ragged_mask(
    aggregation: Aggregation, max_len: int | None, expected: float
) -> None:
    logp = _leaf([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.2]])
    cfg = LossConfig(aggregation=aggregation, correction="none", max_completion_len=max_len)
    loss, metrics = policy_loss(logp, _behaviour(logp, RAGGED_RATIOS), RAGGED_ADV, RAGGED_MASK, cfg)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["loss"] == pytest.approx(expected, abs=1e-6)
    assert metrics["clip_frac"] == 0.0
    assert metrics["ratio_mean"] == pytest.approx((1.1 + 0.9 + 1.0 + 1.05) / 4.0, abs=1e-6)


# --------------------------------------------------------------------------- clipping


def test_ppo_clipping_activates_and_kills_gradient() -> None:
    logp = _leaf([[-1.0, -1.0, -1.0]])
    behaviour = _behaviour(logp, [[1.5, 0.5, 0.5]])
    adv = torch.tensor([1.0])
    cfg = LossConfig(correction="none")
    loss, metrics = policy_loss(logp, behaviour, adv, torch.ones(1, 3, dtype=torch.bool), cfg)
    # r=1.5, A>0 -> clipped to 1.2 (L=-1.2); r=0.5, A>0 -> min picks 0.5 (L=-0.5), twice.
    assert loss.item() == pytest.approx((-1.2 - 0.5 - 0.5) / 3.0, abs=1e-6)
    assert metrics["clip_frac"] == pytest.approx(1.0 / 3.0)  # only the r=1.5 token
    loss.backward()
    assert logp.grad is not None
    # d/dlogp (-r A) = -r A; divided by 3 tokens; clipped token has zero gradient.
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.5 / 3.0, -0.5 / 3.0], abs=1e-6)


def test_ppo_clipping_negative_advantage_and_clip_higher() -> None:
    logp = _leaf([[-1.0, -1.0]])
    behaviour = _behaviour(logp, [[0.5, 1.25]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    # A=-1: r=0.5 -> -min(-0.5, -0.8) = 0.8 (clipped, zero grad);
    #       r=1.25 with clip_high=0.28 -> inside [0.8, 1.28] -> -min(-1.25, -1.25) = 1.25.
    cfg = LossConfig(correction="none", clip_high=0.28)
    loss, metrics = policy_loss(logp, behaviour, torch.tensor([-1.0]), mask, cfg)
    assert loss.item() == pytest.approx((0.8 + 1.25) / 2.0, abs=1e-6)
    assert metrics["clip_frac"] == pytest.approx(0.5)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([0.0, 1.25 / 2.0], abs=1e-6)
    # the same token with A=+1 and the DAPO clip-higher range is not clipped either:
    logp2 = _leaf([[-1.0]])
    loss2, m2 = policy_loss(
        logp2, _behaviour(logp2, [[1.25]]), torch.tensor([1.0]), mask[:, :1], cfg
    )
    assert loss2.item() == pytest.approx(-1.25, abs=1e-6)
    assert m2["clip_frac"] == 0.0


# --------------------------------------------------------------------------- off-policy


def test_tis_truncates_weights_at_cap() -> None:
    logp = _leaf([[-1.0, -2.0]])
    behaviour = _behaviour(logp, [[3.0, 0.5]])  # w = exp(p - b) with p = sg[logp]
    mask = torch.ones(1, 2, dtype=torch.bool)
    cfg = LossConfig(correction="tis", is_cap=2.0)
    loss, metrics = policy_loss(logp, behaviour, torch.tensor([1.0]), mask, cfg)
    # r = 1 on both tokens; w = [min(3, 2), 0.5] = [2, 0.5]; L = -w A = [-2, -0.5]; mean.
    assert loss.item() == pytest.approx(-1.25, abs=1e-6)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([-2.0 / 2.0, -0.5 / 2.0], abs=1e-6)
    assert metrics["is_truncated_frac"] == pytest.approx(0.5)
    assert metrics["is_weight_max"] == pytest.approx(3.0, rel=1e-6)
    assert metrics["is_weight_min"] == pytest.approx(0.5, rel=1e-6)
    assert metrics["is_weight_mean"] == pytest.approx(1.75, rel=1e-6)
    assert metrics["ratio_mean"] == pytest.approx(1.0)


def test_tis_uses_given_proximal_for_ratio() -> None:
    logp = _leaf([[-1.0]])
    proximal = logp.detach() - LN(1.5)  # r = exp(logp - p) = 1.5 -> clipped to 1.2
    behaviour = proximal - LN(1.5)  # w = exp(p - b) = 1.5 < cap
    cfg = LossConfig(correction="tis", is_cap=2.0)
    loss, metrics = policy_loss(
        logp,
        behaviour,
        torch.tensor([1.0]),
        torch.ones(1, 1, dtype=torch.bool),
        cfg,
        proximal_logprobs=proximal,
    )
    assert loss.item() == pytest.approx(-1.5 * 1.2, abs=1e-5)
    assert metrics["clip_frac"] == 1.0
    assert metrics["ratio_mean"] == pytest.approx(1.5, rel=1e-6)


def test_decoupled_masks_tokens_above_cap() -> None:
    logp = _leaf([[-1.0, -2.0]])
    behaviour = _behaviour(logp, [[3.0, 0.5]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    cfg = LossConfig(correction="decoupled", is_cap=2.0)
    loss, metrics = policy_loss(logp, behaviour, torch.tensor([1.0]), mask, cfg)
    # token 0 (w=3 > 2) dropped, token 1 keeps w=0.5; denominator stays 2 tokens (AReaL).
    assert loss.item() == pytest.approx(-0.5 / 2.0, abs=1e-6)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.5 / 2.0], abs=1e-6)
    assert metrics["is_truncated_frac"] == pytest.approx(0.5)
    # below the cap the weight is applied untruncated, as in TIS:
    logp2 = _leaf([[-1.0]])
    loss2, _ = policy_loss(
        logp2,
        _behaviour(logp2, [[1.8]]),
        torch.tensor([1.0]),
        torch.ones(1, 1, dtype=torch.bool),
        cfg,
    )
    assert loss2.item() == pytest.approx(-1.8, rel=1e-6)


def test_dual_clip_caps_negative_advantage_ratio_and_clips_at_behaviour() -> None:
    # A=-1: r=3 > C=2 -> the loss is C|A| = 2 with no gradient; r=1.25 inside the clip
    # range -> -min(-1.25, -1.25) = 1.25, gradient r|A| as plain PPO against behaviour
    logp = _leaf([[-1.0, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    cfg = LossConfig(correction="dual_clip", is_cap=2.0)
    loss, metrics = policy_loss(logp, _behaviour(logp, [[3.0, 1.25]]), torch.tensor([-1.0]),
                                mask, cfg)
    assert loss.item() == pytest.approx((2.0 + 1.25) / 2.0, abs=1e-6)
    assert metrics["is_truncated_frac"] == pytest.approx(0.5)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([0.0, 1.25 / 2.0], abs=1e-6)
    # A=+1: exactly none's clipped PPO against the behaviour policy, even past the cap
    for ratios in ([[3.0, 0.5]], [[1.1, 0.9]]):
        a, b = _leaf([[-1.0, -1.0]]), _leaf([[-1.0, -1.0]])
        la, _ = policy_loss(a, _behaviour(a, ratios), torch.tensor([1.0]), mask, cfg)
        lb, _ = policy_loss(b, _behaviour(b, ratios), torch.tensor([1.0]), mask,
                            LossConfig(correction="none"))
        la.backward()
        lb.backward()
        assert la.item() == pytest.approx(lb.item(), abs=1e-6)
        assert a.grad is not None and b.grad is not None
        assert a.grad[0].tolist() == pytest.approx(b.grad[0].tolist(), abs=1e-6)


def test_dual_clip_cap_must_exceed_the_clip_range() -> None:
    with pytest.raises(ConfigError, match="is_cap must exceed 1 \\+ clip_high"):
        LossConfig(correction="dual_clip", is_cap=1.2, clip_high=0.28)


def test_on_policy_sanity_loss_and_gradient() -> None:
    logp = _leaf([[-1.0, -2.0, -3.0], [-0.5, -0.25, -4.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, -0.5])
    cfg = LossConfig(correction="none")
    loss, metrics = policy_loss(logp, logp.detach().clone(), adv, mask, cfg)
    assert loss.item() == pytest.approx(-(1.0 - 0.5) / 2.0, abs=1e-6)  # -mean(A)
    loss.backward()
    assert logp.grad is not None
    # dL/dlogp_it = -A_i / (n_i * B) on masked tokens, 0 elsewhere.
    expected = [[-1.0 / 4.0, -1.0 / 4.0, 0.0], [0.5 / 6.0, 0.5 / 6.0, 0.5 / 6.0]]
    assert torch.allclose(logp.grad, torch.tensor(expected), atol=1e-7)
    assert metrics["mismatch_kl"] == 0.0
    assert metrics["clip_frac"] == 0.0
    assert metrics["is_weight_mean"] == pytest.approx(1.0)
    assert metrics["is_truncated_frac"] == 0.0


def test_mismatch_kl_zero_when_equal_positive_otherwise() -> None:
    logp = _leaf([[-1.0, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    adv = torch.tensor([1.0])
    cfg = LossConfig(correction="tis", is_cap=10.0)
    _, same = policy_loss(logp, logp.detach(), adv, mask, cfg, proximal_logprobs=logp.detach())
    assert same["mismatch_kl"] == 0.0
    # p - b = ln 2 on token 0, 0 on token 1: k3 = (2 - ln 2 - 1) / 2 tokens.
    behaviour = _behaviour(logp, [[2.0, 1.0]])
    _, diff = policy_loss(logp, behaviour, adv, mask, cfg)
    assert diff["mismatch_kl"] == pytest.approx((1.0 - LN(2.0)) / 2.0, abs=1e-6)
    assert diff["mismatch_kl"] > 0.0


def test_kl_to_reference_k3() -> None:
    logp = _leaf([[-1.0]])
    ref = logp.detach() + LN(0.5)  # ref - logp = ln 0.5
    mask = torch.ones(1, 1, dtype=torch.bool)
    cfg = LossConfig(correction="none", kl_coef=0.1)
    loss, metrics = policy_loss(
        logp, logp.detach(), torch.tensor([2.0]), mask, cfg, ref_logprobs=ref
    )
    k3 = 0.5 - LN(0.5) - 1.0  # 0.1931...
    assert metrics["kl_ref"] == pytest.approx(k3, abs=1e-6)
    assert loss.item() == pytest.approx(-2.0 + 0.1 * k3, abs=1e-6)
    loss.backward()
    assert logp.grad is not None
    # d/dlogp [-r A] = -2; d/dlogp k3 = 1 - exp(ref - logp) = 0.5.
    assert logp.grad.item() == pytest.approx(-2.0 + 0.1 * 0.5, abs=1e-6)
    _, no_coef = policy_loss(
        logp, logp.detach(), torch.tensor([2.0]), mask, LossConfig(), ref_logprobs=ref
    )
    assert no_coef["loss"] == pytest.approx(-2.0, abs=1e-6)  # reported but not added


def test_gradient_flows_only_through_logprobs() -> None:
    logp = _leaf([[-1.0, -2.0]])
    behaviour = torch.tensor([[-1.2, -1.5]], requires_grad=True)
    proximal = torch.tensor([[-1.1, -1.9]], requires_grad=True)
    ref = torch.tensor([[-0.9, -2.1]], requires_grad=True)
    adv = torch.tensor([1.0], requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    cfg = LossConfig(correction="decoupled", kl_coef=0.1)
    loss, _ = policy_loss(
        logp, behaviour, adv, mask, cfg, proximal_logprobs=proximal, ref_logprobs=ref
    )
    loss.backward()
    assert logp.grad is not None and bool(logp.grad.abs().sum() > 0)
    assert behaviour.grad is None and proximal.grad is None and ref.grad is None
    assert adv.grad is None


def test_bad_config_and_shapes_raise() -> None:
    with pytest.raises(ConfigError, match="aggregation"):
        LossConfig(aggregation="mean")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="clip_low"):
        LossConfig(clip_low=1.5)
    logp = _leaf([[-1.0, -2.0]])
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(
            logp,
            logp.detach(),
            torch.tensor([1.0, 2.0]),
            torch.ones(1, 2, dtype=torch.bool),
            LossConfig(),
        )
