"""trainer.grad_accum: micro-batches give the whole batch's gradient, for every aggregation
(issue 28, build 4)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from freshroll.config.train import TrainerSection
from freshroll.engines.tiny import build_tiny
from freshroll.trainer.accum import combine_metrics, micro_slices, micro_weight
from freshroll.trainer.grpo import GRPOLearner, TrainSample

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/trainer/conftest.py


def _samples(n: int = 6, seed: int = 0) -> list[TrainSample]:
    """Off-policy samples of uneven prompt and completion lengths, in groups of two."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(4, 40) for _ in range(rng.randint(2, 6))]
        comp = [rng.randrange(4, 40) for _ in range(rng.randint(1, 7))]
        behaviour = [rng.uniform(-5.0, -2.0) for _ in comp]
        lag, older = i % 3, len(comp) // 2  # tokens of two versions: lags spread over buckets
        out.append(TrainSample(prompt, comp, behaviour, rng.uniform(0, 1), i // 2, lag + 2,
                               token_lags=((lag + 2, older), (lag, len(comp) - older))))
    return out


def _learner(accum: int, **trainer: Any) -> GRPOLearner:
    model, _ = build_tiny(seed=5)
    cfg = TrainerSection(grad_accum=accum, max_grad_norm=1e6, **trainer)
    return GRPOLearner(model, cfg, temperature=0.9, pad_id=0, max_new_tokens=7)


SETTINGS = [
    {"aggregation": "grpo"},
    {"aggregation": "dr_grpo"},
    {"aggregation": "dapo"},
    {"aggregation": "dapo", "correction": "decoupled", "kl_coef": 0.1},
    {"aggregation": "grpo", "correction": "none", "clip_high": 0.1},
    {"aggregation": "dr_grpo", "correction": "dual_clip"},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(map(str, s.values())))
def test_accumulated_gradients_and_step_equal_the_whole_batch(settings: dict[str, Any]) -> None:
    samples = _samples()
    runs = {}
    for accum in (1, 2, 3, 4, 6, 50):  # 4: micro-batches cut through groups; 50 > B
        learner = _learner(accum, **settings)
        metrics = learner.step(samples)
        trained = [p for p in learner.model.parameters() if p.grad is not None]
        grads = [p.grad.clone() for p in trained]
        weights = [p.detach().clone() for p in trained]
        runs[accum] = (metrics, grads, weights)
    whole, whole_grads, whole_weights = runs[1]
    assert whole["loss"] != 0.0 and whole["mismatch_kl"] > 0.0  # off-policy, not trivial
    buckets = [f"tokens/lag_{b}" for b in ("0", "1", "2", "3+")]
    assert all(k in whole for k in buckets) and sum(whole[k] for k in buckets) == whole["tokens"]
    for accum, (metrics, grads, weights) in runs.items():
        assert len(grads) == len(whole_grads) > 0
        for g, w in zip(grads, whole_grads, strict=True):
            assert torch.allclose(g, w, atol=1e-6, rtol=1e-5), accum
        # AdamW's first step moves a weight by lr * g / (|g| + 1e-8): float noise on a
        # gradient near 1e-8 (attention weights of a tiny model) moves it by up to lr, so the
        # steps are compared where the whole batch's gradient is well above that epsilon
        for g, p, q in zip(whole_grads, weights, whole_weights, strict=True):
            firm = g.abs() > 1e-5
            assert torch.allclose(p[firm], q[firm], atol=1e-3 * learner.cfg.lr), accum
        assert sum(int((g.abs() > 1e-5).sum()) for g in whole_grads) > 1000
        assert set(metrics) == set(whole), accum  # every lag bucket, whatever the cut
        for key, value in whole.items():
            if key != "train_s":
                assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (accum, key)


def test_an_accumulated_nonfinite_loss_changes_nothing() -> None:
    from freshroll.errors import NonFiniteStep

    learner = _learner(3)
    before = [p.detach().clone() for p in learner.model.parameters()]
    samples = _samples()
    last = samples[5]
    nan = [float("nan")] * len(last.token_ids)
    bad = [*samples[:5], TrainSample(last.prompt_ids, last.token_ids, nan, 0.5, 2, 0)]
    with pytest.raises(NonFiniteStep, match="loss is nan"):
        learner.step(bad)
    assert all(p.grad is None for p in learner.model.parameters())
    assert all(torch.equal(p, q) for p, q in zip(learner.model.parameters(), before, strict=True))
    assert learner.steps == 0


def test_micro_slices() -> None:
    assert micro_slices(6, 1) == [slice(0, 6)]
    assert micro_slices(7, 3) == [slice(0, 3), slice(3, 5), slice(5, 7)]
    assert micro_slices(2, 5) == [slice(0, 1), slice(1, 2)]
    with pytest.raises(ValueError):
        micro_slices(0, 2)


def test_micro_weights_add_up_to_one() -> None:
    for agg in ("grpo", "dr_grpo", "dapo"):
        total = micro_weight(agg, 3, 10.0, 7, 24.0) + micro_weight(agg, 4, 14.0, 7, 24.0)
        assert total == pytest.approx(1.0)


def test_combine_metrics_weighs_by_tokens_and_keeps_extremes() -> None:
    parts = [({"clip_frac": 0.5, "is_weight_max": 2.0, "is_weight_min": 0.5}, 2.0),
             ({"clip_frac": 0.0, "is_weight_max": 1.0, "is_weight_min": 1.0}, 6.0),
             ({"clip_frac": 1.0, "is_weight_max": 1.0, "is_weight_min": 1.0}, 0.0)]
    out = combine_metrics(parts, 8.0)
    assert out == {"clip_frac": 0.125, "is_weight_max": 2.0, "is_weight_min": 0.5}


def test_combine_metrics_weighs_each_lag_bucket_by_its_own_tokens() -> None:
    base = {"loss": 0.0, "mismatch_kl": 0.1, "is_weight_max": 1.0, "is_weight_min": 1.0}
    a = {**base, "tokens/lag_0": 3.0, "mismatch_kl/lag_0": 0.01, "is_weight_mean/lag_0": 1.0,
         "is_weight_max/lag_0": 1.2}
    b = {**base, "tokens/lag_0": 1.0, "mismatch_kl/lag_0": 0.05, "is_weight_mean/lag_0": 2.0,
         "is_weight_max/lag_0": 3.0, "tokens/lag_1": 5.0, "mismatch_kl/lag_1": 0.2,
         "is_weight_mean/lag_1": 1.5, "is_weight_max/lag_1": 2.0}
    out = combine_metrics([(a, 4.0), (b, 6.0)], 10.0)
    assert out["tokens/lag_0"] == 4.0
    assert out["mismatch_kl/lag_0"] == pytest.approx((3 * 0.01 + 0.05) / 4)
    assert out["is_weight_mean/lag_0"] == pytest.approx((3 * 1.0 + 2.0) / 4)
    assert out["is_weight_max/lag_0"] == 3.0
    assert out["tokens/lag_1"] == 5.0 and out["mismatch_kl/lag_1"] == pytest.approx(0.2)
    assert "tokens/lag_2" not in out
