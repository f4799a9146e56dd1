"""trainer.lr_schedule / warmup_steps: the lr of each step is transformers' (issue 28, build 4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers.optimization import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from freshroll.config.train import TrainerSection
from freshroll.ledger.lineage import digest_json
from freshroll.trainer.grpo import GRPOLearner, TrainSample
from freshroll.trainer.schedule import Schedule, lr_at

BASE = 3e-4


def _transformers(schedule: Schedule, opt: torch.optim.Optimizer, warmup: int,
                  total: int) -> Any:
    if schedule == "constant":
        return get_constant_schedule_with_warmup(opt, warmup)
    make: Callable[..., Any] = (
        get_linear_schedule_with_warmup if schedule == "linear" else get_cosine_schedule_with_warmup
    )
    return make(opt, warmup, total)


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
@pytest.mark.parametrize(("warmup", "total"), [(0, 12), (1, 12), (4, 12), (5, 5), (9, 6)])
def test_every_step_has_transformers_lr(schedule: Schedule, warmup: int, total: int) -> None:
    """Step n (1-based) runs at the lr LambdaLR gives the n-th optimizer.step()."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=BASE)
    sched = _transformers(schedule, opt, warmup, total)
    for n in range(1, total + 1):
        expected = opt.param_groups[0]["lr"]
        assert lr_at(n, BASE, schedule, warmup, total) == pytest.approx(expected, rel=1e-12,
                                                                        abs=1e-18), n
        opt.step()
        sched.step()


def test_constant_without_warmup_is_exactly_the_configured_lr() -> None:
    assert all(lr_at(n, BASE, "constant", 0, 10) == BASE for n in range(1, 30))


def test_warmup_starts_at_zero_and_decays_end_at_zero() -> None:
    assert lr_at(1, BASE, "cosine", 3, 10) == 0.0
    assert lr_at(4, BASE, "linear", 3, 10) == BASE  # the first step past the warmup
    assert lr_at(11, BASE, "linear", 3, 10) == 0.0  # past run.steps
    assert lr_at(11, BASE, "cosine", 3, 10) == pytest.approx(0.0, abs=1e-20)
    assert lr_at(40, BASE, "cosine", 3, 10) == pytest.approx(0.0, abs=1e-20)  # never rises again
    with pytest.raises(ValueError, match="start at 1"):
        lr_at(0, BASE, "constant", 0, 10)


# -- the learner sets it from the step number ---------------------------------------------------
def _learner(**trainer: Any) -> GRPOLearner:
    from freshroll.engines.tiny import build_tiny

    model, _ = build_tiny(seed=1)
    return GRPOLearner(model, TrainerSection(lr=BASE, **trainer), temperature=1.0, pad_id=0,
                       max_new_tokens=4, total_steps=10)


SAMPLES = [TrainSample([5, 6], [7, 8, 9], [-2.0, -2.0, -2.0], float(i % 2), i // 2, 0)
           for i in range(4)]


def test_the_learner_trains_each_step_at_its_scheduled_lr() -> None:
    learner = _learner(lr_schedule="cosine", warmup_steps=2)
    for n in range(1, 5):
        metrics = learner.step(SAMPLES)  # numbered after the last step it applied
        assert metrics["lr"] == lr_at(n, BASE, "cosine", 2, 10)
        assert learner.optimizer.param_groups[0]["lr"] == metrics["lr"]
    assert learner.steps == 4


def test_a_resumed_learner_takes_the_lr_from_the_step_number_alone() -> None:
    """No scheduler state: a learner that starts at step 7 (a checkpoint) uses step 7's lr."""
    learner = _learner(lr_schedule="linear", warmup_steps=3)
    metrics = learner.step(SAMPLES, 7)
    assert metrics["lr"] == pytest.approx(BASE * 4 / 7)
    assert learner.steps == 7
    assert learner.step(SAMPLES)["lr"] == pytest.approx(BASE * 3 / 7)


def test_a_decaying_schedule_needs_the_run_length() -> None:
    from freshroll.engines.tiny import build_tiny

    with pytest.raises(ValueError, match="total steps"):
        GRPOLearner(build_tiny()[0], TrainerSection(lr_schedule="linear"), temperature=1.0,
                    pad_id=0, max_new_tokens=4)


def test_the_settings_digest() -> None:
    """At the values earlier runs trained with, the new keys leave the digest as before them
    (earlier runs still resume; ``trainer.optim``'s is adamw_torch, its default now fuses); set
    otherwise, they change it; a decaying schedule also digests the run's length."""
    old_style = digest_json({
        "trainer": TrainerSection(lr=BASE).model_dump(
            mode="json", exclude={"on_nonfinite", "lr_schedule", "warmup_steps", "grad_accum",
                                  "bf16", "lora", "optim", "warmup_ratio", "scale_rewards",
                                  "ratio_level", "mask_truncated", "num_iterations",
                                  "gradient_checkpointing", "parallel", "world_size"}),
        "temperature": 1.0,
    })
    assert _learner(optim="adamw_torch").settings_digest == old_style
    # activations recomputed: the same training math, the same digest
    assert _learner(optim="adamw_torch", gradient_checkpointing=True).settings_digest == (
        old_style)
    assert _learner().settings_digest != old_style  # the fused kernel: its own digest
    # the same gradient summed over ranks: a policy version means the same at any world size
    assert _learner(optim="adamw_torch", parallel="ddp", world_size=2).settings_digest == (
        old_style)
    digests = {
        _learner().settings_digest, _learner(warmup_steps=2).settings_digest,
        _learner(grad_accum=2).settings_digest, _learner(lr_schedule="linear").settings_digest,
        _learner(lr_schedule="cosine").settings_digest,
        _learner(warmup_ratio=0.5).settings_digest, _learner(scale_rewards="batch").settings_digest,
        _learner(ratio_level="sequence").settings_digest,
        _learner(mask_truncated=True).settings_digest,
        _learner(num_iterations=2).settings_digest,
    }
    assert len(digests) == 10
    from freshroll.trainer.grpo import settings_digest

    linear = TrainerSection(lr_schedule="linear")
    assert settings_digest(linear, 1.0, 10) != settings_digest(linear, 1.0, 20)
    assert settings_digest(TrainerSection(), 1.0, 10) == settings_digest(TrainerSection(), 1.0, 20)
    ratio = TrainerSection(warmup_ratio=0.1)  # its warmup is a share of the run's length
    assert settings_digest(ratio, 1.0, 10) != settings_digest(ratio, 1.0, 20)
