"""Loss masking (issue 49): a multi-turn sample's tool/environment tokens are context, never
trained. Positions are known: every test builds the trajectory by hand."""

from __future__ import annotations

import pytest
import torch

from freshroll.config.train import TrainerSection
from freshroll.engines import payload as pl
from freshroll.engines.base import Completion
from freshroll.engines.tiny import build_tiny
from freshroll.engines.trajectory import (
    Segment,
    assemble,
    env_segment,
    expand_mask,
    mask_ranges,
)
from freshroll.trainer.grpo import GRPOLearner, TrainSample, collate
from freshroll.trainer.losses import LossConfig, policy_loss
from freshroll.trainer.replay import weights_digest
from freshroll.trainer.shared_batch import collate_shared

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/trainer/conftest.py

PROMPT = (5, 6, 7)
MODEL1 = Segment("model", (20, 21, 2), (-0.5, -0.6, -0.7), seconds=0.1)  # "c:.." + eos
TOOL = env_segment((30, 31, 32, 33), 0.05, "calc:3+4", "ok")             # "=7|" tokens
MODEL2 = Segment("model", (11, 2), (-0.2, -0.3), seconds=0.1)            # the answer + eos


def _trajectory() -> Completion:
    return assemble(PROMPT, [MODEL1, TOOL, MODEL2], "7", "stop")


def test_a_trajectory_concatenates_its_segments_and_masks_the_tool_tokens():
    c = _trajectory()
    assert c.token_ids == (20, 21, 2, 30, 31, 32, 33, 11, 2)
    assert c.logprobs == (-0.5, -0.6, -0.7, 0.0, 0.0, 0.0, 0.0, -0.2, -0.3)
    assert c.loss_mask == ((1, 3), (0, 4), (1, 2))
    assert expand_mask(c.loss_mask, 9) == [1, 1, 1, 0, 0, 0, 0, 1, 1]
    assert [t[:2] for t in c.turns] == [("model", 3), ("env", 4), ("model", 2)]
    assert c.turns[1][3:] == ("calc:3+4", "ok")
    assert c.gen_s == pytest.approx(0.25)


def test_one_model_segment_is_the_single_turn_completion_and_its_payload_bytes():
    c = Completion(PROMPT, (20, 2), (-0.1, -0.2), "x", "stop", 0.3)
    assert assemble(PROMPT, [Segment("model", (20, 2), (-0.1, -0.2), seconds=0.3)],
                    "x", "stop") == c
    assert mask_ranges([Segment("model", (1, 2))]) == ((1, 2),)
    # the bytes a single-turn payload always had: five fields and the versions, no more
    legacy = pl.msgspec.msgpack.encode([list(PROMPT), [20, 2], [-0.1, -0.2], "x", "stop", []])
    assert pl.encode(c) == legacy
    p = pl.decode(legacy)
    assert p.mask == [] and p.turns == []


def test_a_multi_turn_payload_round_trips_its_mask_and_turns():
    p = pl.decode(pl.encode(_trajectory()))
    assert p.mask == [(1, 3), (0, 4), (1, 2)]
    assert p.turns[1] == ("env", 4, 0.05, "calc:3+4", "ok")


def _sample(c: Completion, reward: float, group: int = 0) -> TrainSample:
    return TrainSample(c.prompt_token_ids, c.token_ids, c.logprobs, reward, group, 0,
                       loss_mask=c.loss_mask)


def test_collate_puts_the_mask_at_the_known_positions():
    batch = collate([_sample(_trajectory(), 1.0)], pad_id=0)
    # completion token j sits at target index len(prompt) - 1 + j
    assert batch.mask[0].tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1]
    shared = collate_shared([_sample(_trajectory(), 1.0), _sample(_trajectory(), 0.0)], 0)
    assert shared is not None and shared.trained is not None
    assert shared.mask[0].tolist() == [1.0] * 9  # still the completions' attention
    assert shared.trained[0].tolist() == [1, 1, 1, 0, 0, 0, 0, 1, 1]


def test_tool_tokens_get_no_gradient():
    """The loss's gradient with respect to each token's log-prob is zero exactly at the tool's
    positions and not zero at the model's."""
    batch = collate([_sample(_trajectory(), 1.0), _sample(_trajectory(), 0.0)], pad_id=0)
    logp = batch.behaviour.clone().requires_grad_()  # on-policy: ratio 1, nothing clipped
    adv = torch.tensor([1.0, -1.0])
    loss, _ = policy_loss(logp, batch.behaviour, adv, batch.mask, LossConfig())
    loss.backward()
    grad = logp.grad
    assert grad is not None
    tool = [5, 6, 7, 8]  # targets of the four tool tokens
    model = [2, 3, 4, 9, 10]
    assert torch.all(grad[:, tool] == 0)
    assert torch.all(grad[:, model] != 0)


@pytest.mark.parametrize("share", [False, True])
def test_a_tool_tokens_behaviour_logprobs_do_not_change_the_step(share: bool):
    """A learner step is the same, to the bit, whatever log-probs the tool tokens carry: they
    are not in the loss (a huge ratio there would otherwise be clipped into the gradient)."""
    def run(tool_logprob: float) -> tuple[str, dict[str, float]]:
        model, tok = build_tiny(seed=3)
        learner = GRPOLearner(model, TrainerSection(), temperature=1.0,
                              pad_id=int(tok.pad_token_id), max_new_tokens=9)
        learner.share_prompts = share
        base = _trajectory()
        lps = tuple(tool_logprob if bit == 0 else lp
                    for lp, bit in zip(base.logprobs, expand_mask(base.loss_mask, 9), strict=True))
        c = Completion(base.prompt_token_ids, base.token_ids, lps, base.text, "stop", 0.0,
                       loss_mask=base.loss_mask)
        plain = Completion(PROMPT, (20, 2), (-1.0, -1.0), "x", "stop", 0.0)
        metrics = learner.step([_sample(c, 1.0), _sample(plain, 0.0)])
        return weights_digest(learner.model), metrics

    d0, m0 = run(0.0)
    d1, m1 = run(-50.0)
    assert d0 == d1
    assert m0["loss"] == m1["loss"]
