"""The learner recomputes exactly the behaviour log-probs the engine reported (on-policy)."""

from __future__ import annotations

import pytest
import torch

from freshroll.config import TrainerSection
from freshroll.engines.hf import HFEngine
from freshroll.engines.tiny import build_tiny
from freshroll.trainer.grpo import GRPOLearner, TrainSample, collate
from freshroll.trainer.losses import token_logprobs


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _samples(temperature: float) -> tuple[GRPOLearner, list[TrainSample]]:
    model, tok = build_tiny(seed=3)
    engine = HFEngine(model, tok)
    prompts = ["rev 123=", "rev 98765=", "sort 31=", "rev 4="]
    comps = engine.generate(prompts, max_new_tokens=5, temperature=temperature, seed=7)
    learner_model, _ = build_tiny(seed=3)
    learner = GRPOLearner(
        learner_model, TrainerSection(), temperature=temperature, pad_id=tok.pad_token_id,
        max_new_tokens=5,
    )
    samples = [
        TrainSample(c.prompt_token_ids, c.token_ids, c.logprobs, float(i % 2), i // 2, 0)
        for i, c in enumerate(comps)
    ]
    return learner, samples


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_collated_logprobs_match_behaviour(temperature: float):
    learner, samples = _samples(temperature)
    batch = collate(samples, learner.pad_id)
    with torch.no_grad():
        logits = learner.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        logp = token_logprobs(logits.logits[:, :-1].float(), batch.targets, temperature)
    m = batch.mask.bool()
    assert int(m.sum()) == sum(len(s.token_ids) for s in samples)
    assert torch.allclose(logp[m], batch.behaviour[m], atol=1e-4)


def test_step_is_on_policy_and_moves_the_weights():
    learner, samples = _samples(1.0)
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    metrics = learner.step(samples)
    assert metrics["is_weight_max"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["clip_frac"] == 0.0
    assert metrics["reward_mean"] == pytest.approx(0.5)
    assert metrics["grad_norm"] > 0
    after = learner.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_stale_samples_get_importance_weights():
    learner, samples = _samples(1.0)
    learner.step(samples)  # the policy moves: the same samples are now off-policy
    metrics = learner.step(samples)
    assert metrics["is_weight_max"] != pytest.approx(1.0, abs=1e-6)
    assert metrics["mismatch_kl"] > 0
