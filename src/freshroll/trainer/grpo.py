"""The GRPO learner: one optimizer step on one leased batch of rollouts.

A batch is a list of :class:`TrainSample` (prompt tokens, completion tokens,
the behaviour log-probs the inference worker reported, the reward, the group
index and the lag). :meth:`GRPOLearner.step`:

1. right-pads ``prompt + completion`` into one tensor, runs the policy once and
   takes the log-prob of every completion token under ``softmax(logits / T)``
   (the same temperature the workers sampled with, so on-policy ratios are 1);
2. computes group-normalised advantages (GRPO; Dr. GRPO does not divide by the
   group std);
3. applies :func:`freshroll.trainer.losses.policy_loss` with the configured
   aggregation and off-policy correction (the proximal policy is the policy at
   the start of this step: one optimizer step per batch);
4. clips the gradient norm and steps AdamW.

It returns the loss metrics plus entropy, gradient norm, reward and lag stats.

A step is applied only if it is finite. The loss is checked before the backward
pass and the gradient norm before the optimizer step; if either is NaN/inf the
step raises :class:`~freshroll.errors.NonFiniteStep` having changed neither the
weights nor the optimizer state (the gradients are cleared), so the learner is
exactly as before the step. What to do then (skip the batch or stop) is the
caller's policy (``trainer.on_nonfinite``, applied by the pipeline). Weights that
are not finite after an optimizer step on finite gradients (an extreme learning
rate) cannot be taken back: that raises ``NonFiniteStep`` with ``recoverable =
False`` and the run must stop (``--resume`` goes back to the last checkpoint).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from freshroll.config import TrainerSection
from freshroll.errors import NonFiniteStep
from freshroll.lineage import digest_json
from freshroll.trainer.losses import (
    LossConfig,
    entropy_from_logits,
    group_advantages,
    policy_loss,
    token_logprobs,
)


@dataclass(frozen=True, slots=True)
class TrainSample:
    prompt_ids: Sequence[int]
    token_ids: Sequence[int]
    logprobs: Sequence[float]
    reward: float
    group: int
    lag: int


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor       # [B, L] right-padded prompt+completion
    attention_mask: torch.Tensor  # [B, L]
    targets: torch.Tensor         # [B, L-1] = input_ids[:, 1:]
    mask: torch.Tensor            # [B, L-1] 1 where the target is a completion token
    behaviour: torch.Tensor       # [B, L-1] behaviour log-probs at completion positions
    rewards: torch.Tensor         # [B]
    groups: torch.Tensor          # [B]


def collate(samples: Sequence[TrainSample], pad_id: int) -> Batch:
    """Right-pad prompt+completion; align behaviour log-probs with their targets."""
    lengths = [len(s.prompt_ids) + len(s.token_ids) for s in samples]
    n, width = len(samples), max(lengths)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width - 1))
    behaviour = torch.zeros((n, width - 1))
    for i, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.token_ids)
        ids[i, : p + c] = torch.tensor([*s.prompt_ids, *s.token_ids], dtype=torch.long)
        attn[i, : p + c] = 1
        # completion token j sits at position p + j and is predicted from position p + j - 1
        mask[i, p - 1 : p - 1 + c] = 1.0
        behaviour[i, p - 1 : p - 1 + c] = torch.tensor(list(s.logprobs), dtype=torch.float32)
    return Batch(
        ids, attn, ids[:, 1:], mask, behaviour,
        torch.tensor([s.reward for s in samples], dtype=torch.float32),
        torch.tensor([s.group for s in samples], dtype=torch.long),
    )


_NOT_TRAINING_MATH = {"on_nonfinite"}


def _nonfinite_inputs(batch: Batch) -> str:
    """Where a non-finite loss came from, for the message."""
    r32 = batch.rewards
    if not bool(torch.isfinite(r32).all()):
        return "rewards not finite in float32"
    if not bool(torch.isfinite(batch.behaviour).all()):
        return "behaviour log-probs not finite"
    return "rewards and behaviour log-probs finite: the model's output is not"


class GRPOLearner:
    """Owns the training copy of the policy, its optimizer and the loss settings."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: TrainerSection,
        *,
        temperature: float,
        pad_id: int,
        max_new_tokens: int,
    ) -> None:
        self.model, self.cfg, self.pad_id = model, cfg, pad_id
        self.temperature = temperature if temperature > 0 else 1.0
        self.loss_cfg = LossConfig(
            aggregation=cfg.aggregation, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
            correction=cfg.correction, is_cap=cfg.is_cap, kl_coef=cfg.kl_coef,
            max_completion_len=max_new_tokens,
        )
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay
        )
        self.ref = copy.deepcopy(model).eval() if cfg.kl_coef > 0 else None
        # on_nonfinite decides what happens to a step that is never applied: not a setting
        # of the training math, so not part of the digest that versions every commit
        self.settings_digest = digest_json({
            "trainer": cfg.model_dump(mode="json", exclude=_NOT_TRAINING_MATH),
            "temperature": temperature,
        })
        model.train()

    def step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """One optimizer step on ``samples``; returns metrics (python floats)."""
        t0 = time.perf_counter()
        batch = collate(samples, self.pad_id)
        logits = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        logits = logits[:, :-1].float()
        logp = token_logprobs(logits, batch.targets, self.temperature)
        ref = self._ref_logprobs(batch) if self.ref is not None else None
        adv = group_advantages(
            batch.rewards, batch.groups, scale=self.cfg.aggregation != "dr_grpo"
        )
        loss, metrics = policy_loss(
            logp, batch.behaviour, adv, batch.mask, self.loss_cfg, ref_logprobs=ref
        )
        self.optimizer.zero_grad(set_to_none=True)
        if not torch.isfinite(loss.detach()):
            raise NonFiniteStep(f"loss is {float(loss.detach())} ({_nonfinite_inputs(batch)})")
        loss.backward()  # type: ignore[no-untyped-call]
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        if not torch.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteStep(
                f"gradient norm is {float(grad_norm)} (loss {float(loss.detach()):.4g})"
            )
        self.optimizer.step()
        if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
            raise NonFiniteStep(
                "weights are not finite after an optimizer step on finite gradients "
                f"(trainer.lr={self.cfg.lr}?); the learner cannot be restored: resume from "
                "the last checkpoint", recoverable=False,
            )
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach(), batch.mask, self.temperature)
        lags = [s.lag for s in samples]
        metrics.update(
            entropy=float(entropy), grad_norm=float(grad_norm),
            reward_mean=float(batch.rewards.mean()), reward_std=float(batch.rewards.std()),
            adv_abs_mean=float(adv.abs().mean()), lag_mean=sum(lags) / len(lags),
            lag_max=float(max(lags)), samples=float(len(samples)),
            tokens=float(batch.mask.sum()), train_s=time.perf_counter() - t0,
        )
        return metrics

    def _ref_logprobs(self, batch: Batch) -> torch.Tensor:
        assert self.ref is not None
        with torch.no_grad():
            out = self.ref(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
            return token_logprobs(out.logits[:, :-1].float(), batch.targets, self.temperature)

    def weights(self) -> dict[str, torch.Tensor]:
        """A detached copy of the weights, to publish to inference workers."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def optimizer_state(self) -> dict[str, Any]:
        return self.optimizer.state_dict()
