"""The learner recomputes exactly the behaviour log-probs the engine reported (on-policy)."""

from __future__ import annotations

import pytest
import torch

from freshroll.config.train import TrainerSection
from freshroll.engines.hf import HFEngine
from freshroll.engines.tiny import build_tiny
from freshroll.trainer.grpo import GRPOLearner, TrainSample, collate
from freshroll.trainer.losses import token_logprobs

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/trainer/conftest.py


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


@pytest.mark.parametrize("settings", [{}, {"kl_coef": 0.1}, {"grad_accum": 2},
                                      {"aggregation": "dr_grpo"}])
def test_kept_positions_train_as_the_full_projection(settings: dict):
    """Logits only from the first completion target on (``logits_to_keep``) give the same
    loss, metrics and weights as projecting every position and slicing (prompts of 2-6
    tokens, right-padded: the rows' completions start at different positions)."""
    results = []
    for keep in (True, False):
        learner, samples = _samples(1.0)
        learner.cfg = learner.cfg.model_copy(update=settings)
        if settings.get("kl_coef"):
            learner.ref = __import__("copy").deepcopy(learner.model).eval()
        learner._takes_keep = keep
        metrics = learner.step(samples)
        learner.step(samples)  # off-policy now: the importance weights differ from 1
        results.append((metrics, {k: v.clone() for k, v in learner.model.state_dict().items()}))
    (m_keep, w_keep), (m_full, w_full) = results
    assert set(m_keep) == set(m_full)
    for k in m_keep:
        if k != "train_s":
            assert m_keep[k] == pytest.approx(m_full[k], rel=1e-4, abs=1e-6), k
    for k in w_keep:
        assert torch.allclose(w_keep[k], w_full[k], atol=1e-6), k


def test_the_learner_asks_the_model_for_the_kept_positions_only():
    learner, samples = _samples(1.0)
    seen: list[int] = []
    forward = learner.model.forward

    def spy(*args, **kwargs):
        seen.append(kwargs.get("logits_to_keep"))
        return forward(*args, **kwargs)

    learner.model.forward = spy
    learner.step(samples)
    width = max(len(s.prompt_ids) + len(s.token_ids) for s in samples)
    shortest = min(len(s.prompt_ids) for s in samples)
    assert seen == [width - shortest + 1]


def test_collate_places_every_token_where_its_target_is() -> None:
    """Ragged prompts and completions, per-token lags: each row right-padded, and completion
    token j of a p-token prompt is the target at p + j - 1, with its mask, behaviour log-prob
    and lag there (and zeros elsewhere)."""
    samples = [
        TrainSample([4, 5, 6], [7, 8], [-0.5, -1.5], 1.0, 0, 1, token_lags=((2, 1),)),
        TrainSample([4], [9, 10, 11, 3], [-0.1, -0.2, -0.3, -0.4], 0.0, 0, 0),
        TrainSample([4, 5], [12], [-2.0], 0.5, 1, 3),
    ]
    b = collate(samples, pad_id=99)
    width = max(len(s.prompt_ids) + len(s.token_ids) for s in samples)
    assert b.input_ids.shape == (3, width) and b.mask.shape == (3, width - 1)
    for i, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.token_ids)
        row = [*s.prompt_ids, *s.token_ids]
        assert b.input_ids[i].tolist() == row + [99] * (width - p - c)
        assert b.attention_mask[i].tolist() == [1] * (p + c) + [0] * (width - p - c)
        where = list(range(p - 1, p - 1 + c))
        assert [j for j in range(width - 1) if b.mask[i, j] == 1.0] == where
        assert b.targets[i, where].tolist() == list(s.token_ids)
        assert b.behaviour[i, where].tolist() == pytest.approx(list(s.logprobs))
        assert b.lags[i, where].tolist() == s.lags()
        others = [j for j in range(width - 1) if j not in where]
        assert not b.behaviour[i, others].any() and not b.lags[i, others].any()
    assert b.lags[0, 2:4].tolist() == [2, 1]  # a range list short of the tokens: the rest at lag
    assert (b.mask.dtype, b.behaviour.dtype, b.lags.dtype) == (
        torch.float32, torch.float32, torch.long)
    assert b.rewards.tolist() == [1.0, 0.0, 0.5] and b.groups.tolist() == [0, 0, 1]
