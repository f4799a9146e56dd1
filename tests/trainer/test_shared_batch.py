"""Rows that share a prompt share its positions, in training and in generation
(freshroll.engines.prefix, freshroll.trainer.shared_batch): the same numbers as the full rows."""

from __future__ import annotations

import pytest
import torch

from freshroll.config.train import LoraSection, TrainerSection
from freshroll.engines.hf import HFEngine
from freshroll.engines.prefix import drops_out, unique_rows
from freshroll.engines.tiny import build_tiny
from freshroll.trainer.grpo import GRPOLearner, TrainSample
from freshroll.trainer.lora import wrap
from freshroll.trainer.shared_batch import SharedBatch, collate_shared

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/trainer/conftest.py


PROMPTS = ["rev 123=", "rev 98765=", "sort 31=", "rev 4="]  # 4 groups, prompts of ragged length


def _group_samples(group_size: int = 4, temperature: float = 1.0,
                   share_engine: bool = True) -> tuple[list[TrainSample], int]:
    model, tok = build_tiny(seed=3)
    engine = HFEngine(model, tok)
    engine.share_prompts = share_engine
    rows = [p for p in PROMPTS for _ in range(group_size)]
    comps = engine.generate(rows, max_new_tokens=6, temperature=temperature, seed=7)
    samples = [
        TrainSample(c.prompt_token_ids, c.token_ids, c.logprobs, float((i * 7) % 3) / 2,
                    i // group_size, i % 2, token_lags=((1, 2),) if i % 3 == 0 else ())
        for i, c in enumerate(comps)
    ]
    return samples, int(tok.pad_token_id)


def _learner(settings: dict, pad_id: int, share: bool) -> GRPOLearner:
    model, _ = build_tiny(seed=3)
    if settings.get("lora"):  # a peft model: the learner trains its adapters alone
        model = wrap(model, LoraSection(**settings["lora"]))
    learner = GRPOLearner(model, TrainerSection(**settings), temperature=1.0, pad_id=pad_id,
                          max_new_tokens=6)
    learner.share_prompts = share
    return learner


def test_the_samples_have_ragged_completions():
    samples, _ = _group_samples()
    lengths = {len(s.token_ids) for s in samples}
    assert len(lengths) > 1, lengths  # some rows end early at eos: right padding is exercised
    assert len({len(s.prompt_ids) for s in samples}) > 1  # and left padding of the prompts


@pytest.mark.parametrize("settings", [
    {}, {"kl_coef": 0.1}, {"grad_accum": 3}, {"aggregation": "dr_grpo"}, {"aggregation": "dapo"},
    {"lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]},
     "lr": 1e-2}])
def test_a_shared_step_trains_as_the_full_rows(settings: dict):
    """Loss, every metric and the weights after two steps (the second off-policy) agree with
    the full rows' to float summation order."""
    samples, pad = _group_samples()
    results = []
    for share in (True, False):
        learner = _learner(settings, pad, share)
        calls: list[bool] = []
        layout = learner._layout
        learner._layout = lambda s, _l=layout, _c=calls: _c.append(  # type: ignore[method-assign]
            isinstance(r := _l(s), SharedBatch)) or r
        m1 = learner.step(samples)
        m2 = learner.step(samples)
        assert calls and all(c == share for c in calls)  # the layout each run claims to use
        results.append((m1, m2, {k: v.clone() for k, v in learner.model.state_dict().items()}))
    (s1, s2, ws), (f1, f2, wf) = results
    for shared, full in ((s1, f1), (s2, f2)):
        assert set(shared) == set(full)
        for k in shared:
            if k != "train_s":
                assert shared[k] == pytest.approx(full[k], rel=1e-4, abs=1e-6), k
    assert s2["mismatch_kl"] > 0  # the second step is off-policy: the weights moved
    for k in ws:
        assert torch.allclose(ws[k], wf[k], atol=1e-5), k


def test_shared_log_probs_are_the_behaviour_log_probs():
    """On-policy: the first step's importance weights are 1, as with the full rows."""
    samples, pad = _group_samples(temperature=0.7)
    model, _ = build_tiny(seed=3)
    learner = GRPOLearner(model, TrainerSection(), temperature=0.7, pad_id=pad, max_new_tokens=6)
    metrics = learner.step(samples)
    assert metrics["is_weight_max"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["is_weight_min"] == pytest.approx(1.0, abs=1e-3)


def test_collate_shared_lays_out_each_prompt_once():
    samples = [
        TrainSample([4, 5, 6], [7, 8], [-0.5, -1.5], 1.0, 0, 1, token_lags=((2, 1),)),
        TrainSample([4], [9, 10, 11, 3], [-0.1, -0.2, -0.3, -0.4], 0.0, 1, 0),
        TrainSample([4, 5, 6], [12], [-2.0], 0.5, 0, 3),
    ]
    b = collate_shared(samples, pad_id=99)
    assert b is not None
    assert b.prompt_ids.tolist() == [[4, 5, 6], [99, 99, 4]]
    assert b.prompt_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert b.rows.tolist() == [0, 1, 0]
    assert b.targets.tolist() == [[7, 8, 99, 99], [9, 10, 11, 3], [12, 99, 99, 99]]
    assert b.mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert b.behaviour[1].tolist() == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    assert b.lags.tolist() == [[2, 1, 0, 0], [0, 0, 0, 0], [3, 0, 0, 0]]
    assert b.rewards.tolist() == [1.0, 0.0, 0.5] and b.groups.tolist() == [0, 1, 0]


def test_nothing_to_share_is_the_full_rows():
    distinct = [TrainSample([4, i], [7], [-0.5], 1.0, i, 0) for i in range(5, 9)]
    assert collate_shared(distinct, pad_id=0) is None
    empty_prompt = [TrainSample([], [7], [-0.5], 1.0, 0, 0)] * 2
    assert collate_shared(empty_prompt, pad_id=0) is None
    assert unique_rows([[1, 2], [3], [1, 2], [3], [4]]) == ([[1, 2], [3], [4]], [0, 1, 0, 1, 2])


class _NoIndexCache:
    """A cache that cannot be indexed along its batch axis (no ``batch_select_indices``)."""

    def __init__(self, cache):
        self.inner = cache


def test_a_cache_that_cannot_be_indexed_falls_back_to_the_full_rows():
    samples, pad = _group_samples()
    reference = _learner({}, pad, share=False)
    expect = reference.step(samples)
    learner = _learner({}, pad, share=True)
    forward = learner.model.forward

    def plain_cache(*args, **kwargs):
        out = forward(*args, **kwargs)
        if kwargs.get("use_cache"):
            out.past_key_values = _NoIndexCache(out.past_key_values)
        return out

    learner.model.forward = plain_cache  # type: ignore[method-assign]
    got = learner.step(samples)
    assert learner.share_prompts is False
    assert got["loss"] == pytest.approx(expect["loss"], rel=1e-5)
    for k, v in reference.model.state_dict().items():
        assert torch.allclose(learner.model.state_dict()[k], v, atol=1e-6), k


def _with_attention_dropout(rate: float):
    model, tok = build_tiny(seed=3)
    for m in model.modules():  # what the forward reads (set from the config at init)
        if hasattr(m, "attention_dropout"):
            m.attention_dropout = rate
    return model, tok


def test_a_model_with_dropout_runs_the_full_rows():
    model, tok = build_tiny(seed=3)
    assert not drops_out(model)
    model, tok = _with_attention_dropout(0.1)
    assert drops_out(model)
    learner = GRPOLearner(model, TrainerSection(disable_dropout=False), temperature=1.0,
                          pad_id=int(tok.pad_token_id), max_new_tokens=6)
    assert learner.share_prompts is False and drops_out(model)
    other, _ = build_tiny(seed=3)
    other.model.layers[0].mlp = torch.nn.Sequential(other.model.layers[0].mlp,
                                                   torch.nn.Dropout(0.2))
    assert drops_out(other)


def test_disable_dropout_trains_as_the_policy_samples():
    """``trainer.disable_dropout`` (the default): every dropout off in training, so a step's
    log-probs are the eval-mode ones (the behaviour policy's at lag 0), the shared rows are
    back, and the model's config (what is saved) is the user's."""
    model, tok = _with_attention_dropout(0.1)
    model.model.layers[0].mlp = torch.nn.Sequential(model.model.layers[0].mlp,
                                                   torch.nn.Dropout(0.3))
    model.config.attention_dropout = 0.1
    ids = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 11]])
    model.eval()
    with torch.no_grad():
        sampled = model(input_ids=ids).logits
    learner = GRPOLearner(model, TrainerSection(), temperature=1.0,
                          pad_id=int(tok.pad_token_id), max_new_tokens=6)
    assert model.training and not drops_out(model) and learner.share_prompts
    with torch.no_grad():
        trained = model(input_ids=ids).logits
    assert torch.equal(trained, sampled)
    assert model.config.attention_dropout == 0.1
    kept, _ = _with_attention_dropout(0.5)
    GRPOLearner(kept, TrainerSection(disable_dropout=False), temperature=1.0,
                pad_id=int(tok.pad_token_id), max_new_tokens=6)
    with torch.no_grad():
        torch.manual_seed(0)
        a = kept(input_ids=ids).logits
        torch.manual_seed(1)
        b = kept(input_ids=ids).logits
    assert not torch.equal(a, b)  # dropout on: two forwards of one row differ


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_a_shared_prefill_samples_as_the_full_rows(temperature: float):
    """The engine's shared prefill gives the full rows' tokens and log-probs (same seed)."""
    shared, _ = _group_samples(temperature=temperature, share_engine=True)
    full, _ = _group_samples(temperature=temperature, share_engine=False)
    assert [s.token_ids for s in shared] == [s.token_ids for s in full]
    for a, b in zip(shared, full, strict=True):
        assert list(a.logprobs) == pytest.approx(list(b.logprobs), abs=1e-5)


def test_an_engine_whose_cache_cannot_be_indexed_runs_the_full_rows():
    model, tok = build_tiny(seed=3)
    engine = HFEngine(model, tok)
    rows = [p for p in PROMPTS for _ in range(3)]
    expect = engine.generate(rows, max_new_tokens=5, temperature=1.0, seed=11)
    forward = model.forward
    seen: list[int] = []

    def plain_cache(*args, **kwargs):
        out = forward(*args, **kwargs)
        seen.append(int(kwargs["input_ids"].shape[0]))
        if len(seen) == 1:  # the shared prefill's cache: not indexable
            out.past_key_values = _NoIndexCache(out.past_key_values)
        return out

    model.forward = plain_cache  # type: ignore[method-assign]
    got = engine.generate(rows, max_new_tokens=5, temperature=1.0, seed=11)
    assert engine.share_prompts is False
    assert seen[0] == len(PROMPTS) and seen[1] == len(rows)  # shared prefill, then the full
    assert [c.token_ids for c in got] == [c.token_ids for c in expect]
