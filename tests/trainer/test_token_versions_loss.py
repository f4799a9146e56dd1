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


@pytest.mark.parametrize("correction", ["tis", "decoupled", "none"])
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
