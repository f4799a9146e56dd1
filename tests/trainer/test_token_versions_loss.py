"""The loss uses each token's own behaviour log-prob: a sequence whose tokens came from two
policy versions (rollout.on_update: continue) is corrected token by token, from the payload's
log-probs through collate to the importance weights."""

from __future__ import annotations

import pytest
import torch

from freshroll.engines import payload as pl
from freshroll.engines.base import Completion
from freshroll.trainer.grpo import TrainSample, collate
from freshroll.trainer.losses import LossConfig, policy_loss

# one sequence of 6 completion tokens: the first 4 from version A, the last 2 from version B
LOGP = torch.tensor([[-1.0, -0.5, -2.0, -0.7, -1.2, -0.9]], requires_grad=True)
B_A = [-1.1, -0.6, -1.8, -0.7]  # the behaviour log-probs of the old weights' tokens
B_B = [-1.5, -0.4]  # ... and of the new weights'


@pytest.mark.parametrize("correction", ["tis", "decoupled", "none", "dual_clip"])
def test_each_token_is_corrected_by_its_own_versions_behaviour_logprob(correction: str) -> None:
    cfg = LossConfig(aggregation="dapo", correction=correction, is_cap=2.0)
    adv = torch.tensor([1.0])
    mask = torch.ones_like(LOGP, dtype=torch.bool)
    mixed = torch.tensor([B_A + B_B])
    loss, metrics = policy_loss(LOGP, mixed, adv, mask, cfg)
    # dapo: the mean over tokens; split by version it is the token-weighted mean of the two
    # halves, each computed with its own version's behaviour log-probs alone
    first = torch.tensor([[True] * 4 + [False] * 2])
    loss_a, _ = policy_loss(LOGP, torch.tensor([[*B_A, 0.0, 0.0]]), adv, first, cfg)
    loss_b, _ = policy_loss(LOGP, torch.tensor([[0.0] * 4 + B_B]), adv, ~first, cfg)
    assert loss.item() == pytest.approx((4 * loss_a.item() + 2 * loss_b.item()) / 6)
    weights = torch.exp(LOGP.detach() - mixed)[0]
    assert metrics["is_weight_max"] == pytest.approx(float(weights.max()))
    assert metrics["is_weight_min"] == pytest.approx(float(weights.min()))
    # one behaviour for the whole sequence (the version it started with) is another loss
    single, _ = policy_loss(LOGP, torch.tensor([B_A + B_A[:2]]), adv, mask, cfg)
    assert single.item() != pytest.approx(loss.item())


def test_the_payloads_per_token_logprobs_reach_the_batch_in_order() -> None:
    comp = Completion((5, 6), (1, 2, 3, 4, 7, 8), tuple(B_A + B_B), "x", "stop", 0.1,
                      version_spans=((0, 4), (1, 2)))
    stored = pl.decode(pl.encode(comp, [("p0-a", 4), ("p1-b", 2)]))
    assert stored.versions == [("p0-a", 4), ("p1-b", 2)]
    batch = collate([TrainSample(stored.prompt_ids, stored.token_ids, stored.logprobs,
                                 1.0, 0, 0)], pad_id=0)
    got = batch.behaviour[0][batch.mask[0].bool()].tolist()
    assert got == pytest.approx(B_A + B_B)  # token j keeps the log-prob of its own version


def test_mismatch_kl_and_weights_per_lag_bucket_by_hand() -> None:
    """Tokens 1-4 from the older version (lag 1), 5-6 from the newer (lag 0): each bucket's
    KL is the k3 mean over its own tokens, with the proximal = sg[logp] of LOGP."""
    cfg = LossConfig(aggregation="dapo", correction="tis", is_cap=2.0)
    mask = torch.ones_like(LOGP, dtype=torch.bool)
    lags = torch.tensor([[1, 1, 1, 1, 0, 0]])
    _, metrics = policy_loss(LOGP, torch.tensor([B_A + B_B]), torch.tensor([1.0]), mask, cfg,
                             token_lags=lags)
    # p - b per token: 0.1, 0.1, -0.2, 0.0 | 0.3, -0.5; k3(x) = e^x - x - 1
    # k3: 0.0051709, 0.0051709, 0.0187308, 0 | 0.0498588, 0.1065307
    assert metrics["tokens/lag_1"] == 4.0 and metrics["tokens/lag_0"] == 2.0
    assert metrics["mismatch_kl/lag_1"] == pytest.approx(0.00726815, rel=1e-4)
    assert metrics["mismatch_kl/lag_0"] == pytest.approx(0.07819475, rel=1e-4)
    # e^x: 1.1051709, 1.1051709, 0.8187308, 1 | 1.3498588, 0.6065307
    assert metrics["is_weight_mean/lag_1"] == pytest.approx(1.00726815, rel=1e-5)
    assert metrics["is_weight_max/lag_1"] == pytest.approx(1.1051709, rel=1e-5)
    assert metrics["is_weight_mean/lag_0"] == pytest.approx(0.97819475, rel=1e-5)
    assert metrics["is_weight_max/lag_0"] == pytest.approx(1.3498588, rel=1e-5)
    # the whole-batch figure is the token-weighted mean of the buckets'
    assert metrics["mismatch_kl"] == pytest.approx((4 * 0.00726815 + 2 * 0.07819475) / 6,
                                                   rel=1e-4)
    for empty in ("2", "3+"):  # no token of those lags: absent, not 0
        assert not [k for k in metrics if k.endswith(f"/lag_{empty}")]


def test_lags_of_three_and_more_share_the_last_bucket_and_masked_tokens_count_nowhere() -> None:
    cfg = LossConfig(aggregation="grpo", correction="decoupled")
    logp = torch.zeros((1, 4))
    behaviour = torch.tensor([[-0.1, -0.2, -0.3, -9.0]])
    mask = torch.tensor([[True, True, True, False]])
    _, metrics = policy_loss(logp, behaviour, torch.tensor([0.5]), mask, cfg,
                             token_lags=torch.tensor([[3, 7, 2, 0]]))
    assert metrics["tokens/lag_3+"] == 2.0 and metrics["tokens/lag_2"] == 1.0
    assert "tokens/lag_0" not in metrics  # its only token is masked out
    assert metrics["is_weight_max/lag_3+"] == pytest.approx(float(torch.exp(torch.tensor(0.2))))


def test_each_tokens_lag_reaches_the_batch_from_the_samples_ranges() -> None:
    two = TrainSample((5, 6), (1, 2, 3, 4, 7, 8), tuple(B_A + B_B), 1.0, 0, 2,
                      token_lags=((2, 4), (1, 2)))
    plain = TrainSample((5, 6, 9), (1, 2), (-1.0, -1.0), 0.0, 0, 1)
    batch = collate([two, plain], pad_id=0)
    assert batch.lags[0][batch.mask[0].bool()].tolist() == [2, 2, 2, 2, 1, 1]
    assert batch.lags[1][batch.mask[1].bool()].tolist() == [1, 1]  # the sample's own lag
    # the prefill range of a request whose first token came after a swap holds no token
    assert TrainSample((5,), (1, 2), (0.0, 0.0), 0.0, 0, 3,
                       token_lags=((3, 0), (2, 2))).lags() == [2, 2]
