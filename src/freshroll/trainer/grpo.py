"""The GRPO learner: one optimizer step on one leased batch of rollouts.

A batch is a list of :class:`TrainSample` (prompt tokens, completion tokens,
the behaviour log-probs the inference worker reported, the reward, the group
index and the lag). :meth:`GRPOLearner.step`:

1. runs the policy once over the batch and takes the log-prob of every completion
   token under ``softmax(logits / T)`` (the same temperature the workers sampled with,
   so on-policy ratios are 1). Rows that share a prompt (a group's) share its positions:
   each distinct prompt runs once and its KV cache is indexed to its rows
   (:mod:`freshroll.trainer.shared_batch`, the same numbers up to float summation order);
   where that does not apply (every prompt distinct, a cache that cannot be indexed, a
   model with dropout) ``prompt + completion`` is right-padded into one tensor;
2. computes group-normalised advantages (GRPO; Dr. GRPO does not divide by the
   group std);
3. applies :func:`freshroll.trainer.losses.policy_loss` with the configured
   aggregation and off-policy correction (the proximal policy is the policy at
   the start of this step: one optimizer step per batch); with ``trainer.grad_accum``
   > 1 steps 1 and 3 run per micro-batch, each loss scaled so that the accumulated
   gradient is the whole batch's (:mod:`freshroll.trainer.accum`);
4. clips the gradient norm, sets the step's learning rate (a function of the step
   number: :func:`freshroll.trainer.schedule.lr_at`) and steps AdamW.

It returns the loss metrics plus entropy, gradient norm, learning rate, reward and lag
stats.

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
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from freshroll.config.train import TrainerSection
from freshroll.engines.lora_merge import adapter_bytes
from freshroll.engines.model_dir import takes_logits_to_keep
from freshroll.engines.prefix import cache_kwarg, disable_dropout, drops_out
from freshroll.engines.trajectory import expand_mask, trained_tokens
from freshroll.errors import ConfigError, NonFiniteStep
from freshroll.trainer.accum import combine_metrics, micro_weight
from freshroll.trainer.lora import (
    adapter_state,
    checkpoint_state,
    is_lora,
    load_checkpoint_state,
)
from freshroll.trainer.losses import (
    LossConfig,
    entropy_from_logits,
    group_advantages,
    policy_loss,
    token_logprobs,
)
from freshroll.trainer.optim import all_finite as all_finite
from freshroll.trainer.optim import use_kernel as use_kernel
from freshroll.trainer.ranks import SOLO, Gloo, Solo
from freshroll.trainer.schedule import lr_at, warmup_of
from freshroll.trainer.settings import scale_of as scale_of
from freshroll.trainer.settings import settings_digest as settings_digest
from freshroll.trainer.shared_batch import SharedBatch, collate_shared, completion_logits


@dataclass(frozen=True, slots=True)
class TrainSample:
    prompt_ids: Sequence[int]
    token_ids: Sequence[int]
    logprobs: Sequence[float]
    reward: float
    group: int
    lag: int
    #: each completion token's lag as run-length ``(lag, tokens)`` ranges (its payload's
    #: ``versions``); empty: every token has the sample's ``lag``
    token_lags: tuple[tuple[int, int], ...] = ()
    #: it ended at max_new_tokens without an end token (its payload's finish reason)
    truncated: bool = False
    #: which completion tokens get loss, run-length ``(trained, tokens)`` (its payload's
    #: ``mask``: a multi-turn episode's tool/environment tokens are 0); empty: all of them
    loss_mask: tuple[tuple[int, int], ...] = ()

    def trained(self) -> list[float]:
        """One loss weight per completion token: 1.0 trained, 0.0 context only."""
        return expand_mask(self.loss_mask, len(self.token_ids))

    def lags(self) -> list[int]:
        """One lag per completion token (a range list short of the tokens: the rest at
        ``lag``)."""
        out = [lag for lag, n in self.token_lags for _ in range(n)][: len(self.token_ids)]
        return out + [self.lag] * (len(self.token_ids) - len(out))


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor       # [B, L] right-padded prompt+completion
    attention_mask: torch.Tensor  # [B, L]
    targets: torch.Tensor         # [B, L-1] = input_ids[:, 1:]
    mask: torch.Tensor            # [B, L-1] 1 where the target is a completion token
    behaviour: torch.Tensor       # [B, L-1] behaviour log-probs at completion positions
    rewards: torch.Tensor         # [B]
    groups: torch.Tensor          # [B]
    lags: torch.Tensor            # [B, L-1] each completion target's token lag (0 elsewhere)

    def from_target(self, first: int) -> Batch:
        """The targets (and their masks and behaviour log-probs) from index ``first`` on; the
        inputs whole (the prompt prefix is context)."""
        if first == 0:
            return self
        return Batch(self.input_ids, self.attention_mask, self.targets[:, first:],
                     self.mask[:, first:], self.behaviour[:, first:], self.rewards, self.groups,
                     self.lags[:, first:])


def collate(samples: Sequence[TrainSample], pad_id: int) -> Batch:
    """Right-pad prompt+completion; align behaviour log-probs with their targets.

    Completion token ``j`` of a row with a ``p``-token prompt sits at position ``p + j`` and
    is predicted from position ``p + j - 1``: its mask, behaviour log-prob and lag sit there.
    Each tensor is built from whole Python rows in one call (no per-row tensor writes)."""
    width = max(len(s.prompt_ids) + len(s.token_ids) for s in samples)
    ids, attn, mask, behaviour, lags = [], [], [], [], []
    for s in samples:
        p, c = len(s.prompt_ids), len(s.token_ids)
        pad, before = width - p - c, p - 1
        ids.append([*s.prompt_ids, *s.token_ids, *[pad_id] * pad])
        attn.append([1] * (p + c) + [0] * pad)
        mask.append([0.0] * before + s.trained() + [0.0] * pad)
        behaviour.append([0.0] * before + list(s.logprobs) + [0.0] * pad)
        lags.append([0] * before + s.lags() + [0] * pad)
    input_ids = torch.tensor(ids, dtype=torch.long)
    return Batch(
        input_ids, torch.tensor(attn, dtype=torch.long), input_ids[:, 1:],
        torch.tensor(mask, dtype=torch.float32), torch.tensor(behaviour, dtype=torch.float32),
        torch.tensor([s.reward for s in samples], dtype=torch.float32),
        torch.tensor([s.group for s in samples], dtype=torch.long),
        torch.tensor(lags, dtype=torch.long),
    )


def loss_rows(samples: Sequence[TrainSample]) -> torch.Tensor:
    """``[B]``: 0.0 for a truncated sample (``trainer.mask_truncated``: no loss, as TRL's
    ``mask_truncated_completions`` zeroes its completion mask), 1.0 for the others."""
    return torch.tensor([0.0 if s.truncated else 1.0 for s in samples])


def _first_target(mask: torch.Tensor) -> int:
    """The first target index any row has a completion token at (0 if none has one)."""
    cols = mask.any(dim=0).nonzero()
    return int(cols[0, 0]) if cols.numel() else 0


def _nonfinite_inputs(batch: Batch | SharedBatch) -> str:
    """Where a non-finite loss came from, for the message."""
    r32 = batch.rewards
    if not bool(torch.isfinite(r32).all()):
        return "rewards not finite in float32"
    if not bool(torch.isfinite(batch.behaviour).all()):
        return "behaviour log-probs not finite"
    return "rewards and behaviour log-probs finite: the model's output is not"


class GRPOLearner:
    """Owns the training copy of the policy, its optimizer and the loss settings.

    ``total_steps`` is the run's ``run.steps``, which a ``linear`` or ``cosine`` lr
    schedule decays to; ``steps`` counts the steps this learner has applied (a caller
    that loads a checkpoint sets it to the checkpoint's step).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: TrainerSection,
        *,
        temperature: float,
        pad_id: int,
        max_new_tokens: int,
        total_steps: int | None = None,
    ) -> None:
        if cfg.lr_schedule != "constant" and total_steps is None:
            raise ValueError(f"trainer.lr_schedule={cfg.lr_schedule} needs the run's total steps")
        if cfg.warmup_ratio and total_steps is None:
            raise ValueError("trainer.warmup_ratio needs the run's total steps")
        self.model, self.cfg, self.pad_id = model, cfg, pad_id
        device = next(model.parameters()).device
        if cfg.bf16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError(f"trainer.bf16: {torch.cuda.get_device_name(device)} has no "
                              "bfloat16 support; set trainer.bf16=false")
        self.total_steps, self.steps = total_steps, 0
        self.temperature = temperature if temperature > 0 else 1.0
        self.loss_cfg = LossConfig(
            aggregation=cfg.aggregation, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
            correction=cfg.correction, is_cap=cfg.is_cap, kl_coef=cfg.kl_coef,
            ratio_level=cfg.ratio_level, max_completion_len=max_new_tokens,
        )
        # every parameter, or a LoRA model's adapters alone (freshroll.trainer.lora.wrap)
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
            weight_decay=cfg.weight_decay,
        )
        use_kernel(self.optimizer, cfg.optim)
        if cfg.disable_dropout:  # trained as sampled: no dropout noise in the ratio
            disable_dropout(model)
        self.ref = copy.deepcopy(model).eval() if cfg.kl_coef > 0 else None
        self._takes_keep = takes_logits_to_keep(model)
        self._cache_name = cache_kwarg(model)
        #: rows share their prompt's positions (shared_batch): off with dropout or checkpointed
        #: activations (no cache in that forward), or for good once the cache is not indexable
        self.share_prompts = not drops_out(model) and not cfg.gradient_checkpointing
        if cfg.gradient_checkpointing:  # the same gradients, activations recomputed
            model.gradient_checkpointing_enable(  # type: ignore[operator]  # a transformers model's
                gradient_checkpointing_kwargs={"use_reentrant": False})
        # the digest that versions every commit: the training math (on_nonfinite is not)
        self.settings_digest = settings_digest(cfg, temperature, total_steps)
        #: the ranks a step is split across (trainer/ranks.py): this process alone by default
        self.ranks: Solo | Gloo = SOLO
        model.train()

    def lr(self, step: int) -> float:
        """The learning rate of step ``step`` (1-based) under the settings in force."""
        c = self.cfg
        total = self.total_steps or 0
        return lr_at(step, c.lr, c.lr_schedule, warmup_of(c.warmup_steps, c.warmup_ratio, total),
                     total)

    def step(self, samples: Sequence[TrainSample], step: int | None = None) -> dict[str, float]:
        """One trainer step on ``samples``: ``trainer.num_iterations`` optimizer updates on
        the batch (TRL's ``num_iterations``; each update's ratio against the behaviour
        log-probs, so a later update is clipped against the policy that sampled); returns
        metrics (python floats; the loss figures are the last update's).

        ``step`` is the number of the step being trained (1-based; default: the one after
        the last this learner applied): it alone sets the learning rate of its updates.
        A non-finite update after the first cannot be undone (the earlier ones were
        applied): it stops the run (``NonFiniteStep``, not recoverable).
        """
        t0 = time.perf_counter()
        number = self.steps + 1 if step is None else step
        self.ranks.begin(self, samples, number)
        rewards, adv, loss_cfg = self._advantages(samples)
        total = self.cfg.num_iterations
        for i in range(total):
            try:
                metrics = self._update(samples, number, adv, loss_cfg)
            except NonFiniteStep as exc:
                if i == 0:
                    raise
                raise NonFiniteStep(f"{exc} (update {i + 1} of trainer.num_iterations={total}; "
                                    "the earlier ones were applied)", recoverable=False) from exc
        self.steps = number
        gather_s = self.ranks.finished(self)  # trainer.parallel: fsdp: the full state gathered
        lags = [s.lag for s in samples]
        metrics.update(
            reward_mean=float(rewards.mean()), reward_std=float(rewards.std()),
            adv_abs_mean=float(adv.abs().mean()), lag_mean=sum(lags) / len(lags),
            lag_max=float(max(lags)), samples=float(len(samples)),
            tokens=float(sum(len(s.token_ids) for s in samples)),
            train_s=time.perf_counter() - t0,
            weights_bytes=float(adapter_bytes(self.published_state())),
        )
        metrics.update({"gather_s": gather_s} if gather_s else {})  # fsdp: the full state's
        return metrics

    def _update(self, samples: Sequence[TrainSample], number: int, adv: torch.Tensor,
                loss_cfg: LossConfig) -> dict[str, float]:
        """One optimizer update on the batch at step ``number``'s learning rate: its
        micro-batches' gradients accumulated, clipped, applied; the loss metrics, entropy,
        gradient norm and lr."""
        slices = self.ranks.slices(len(samples), self.cfg.grad_accum)
        whole = self.ranks.world == 1 and len(slices) == 1  # the batch as one micro-batch
        rows = loss_rows(samples) if self.cfg.mask_truncated else None
        loss_tokens = float(sum(trained_tokens(s.loss_mask, len(s.token_ids))
                                for i, s in enumerate(samples)
                                if rows is None or rows[i]))
        model, optimizer = self.ranks.net(self)
        optimizer.zero_grad(set_to_none=True)
        parts: list[tuple[dict[str, float], float]] = []
        losses: list[torch.Tensor] = []
        entropy, bad = 0.0, None
        for sl in slices:
            if sl.start == sl.stop:  # a filler (trainer/fsdp.py): a zero gradient
                self.ranks.filler(self, samples, adv, loss_cfg)
                continue
            part = None if rows is None else rows[sl]
            micro = self._layout(samples if whole else samples[sl])
            loss, metrics, logits, kept = self._micro_loss(micro, adv[sl], loss_cfg, part)
            if logits is None:  # the model's cache cannot be indexed: the full rows
                micro = self._layout(samples if whole else samples[sl])
                loss, metrics, logits, kept = self._micro_loss(micro, adv[sl], loss_cfg, part)
            assert logits is not None
            tokens = float(kept.sum())  # the micro-batch's loss tokens
            if not whole:
                loss = loss * micro_weight(
                    self.cfg.aggregation, len(micro.rewards), tokens, len(samples), loss_tokens
                )
            if not torch.isfinite(loss.detach()):
                bad = bad or f"loss is {float(loss.detach())} ({_nonfinite_inputs(micro)})"
                if not self.ranks.lockstep:  # fsdp's ranks take part in every micro-batch
                    break
            loss.backward()  # type: ignore[no-untyped-call]  # torch: unannotated
            with torch.no_grad():
                ent = entropy_from_logits(logits, kept, self.temperature)
            share = 1.0 if whole else tokens / max(1.0, loss_tokens)
            entropy += float(ent) * share  # the token mean over the whole batch
            parts.append((metrics, tokens))
            losses.append(loss.detach())
        parts, losses, entropy, bad = self.ranks.gather((parts, losses, entropy, bad))
        if bad is not None:
            optimizer.zero_grad(set_to_none=True)
            raise NonFiniteStep(bad)
        self.ranks.reduce_grads(model)
        total_loss = float(losses[0] if len(losses) == 1 else torch.stack(losses).sum())
        metrics = combine_metrics(parts, loss_tokens)
        grad_norm, lr = self._apply_gradients(number, total_loss)
        metrics.update(loss=total_loss, entropy=entropy, grad_norm=float(grad_norm), lr=lr)
        return metrics

    def _advantages(self, samples: Sequence[TrainSample]
                    ) -> tuple[torch.Tensor, torch.Tensor, LossConfig]:
        """The batch's rewards, their advantages (``trainer.scale_rewards``: :func:`scale_of`)
        and the step's loss settings (dr_grpo's T_max: the whole batch's width)."""
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        scale = scale_of(self.cfg)
        adv = group_advantages(rewards, torch.tensor([s.group for s in samples]),
                               scale=scale != "none", batch_std=scale == "batch")
        loss_cfg = self.loss_cfg
        if loss_cfg.max_completion_len is None:
            width = max(len(s.prompt_ids) + len(s.token_ids) for s in samples) - 1
            loss_cfg = replace(loss_cfg, max_completion_len=width)
        return rewards, adv, loss_cfg

    def _apply_gradients(self, number: int, total_loss: float) -> tuple[torch.Tensor, float]:
        """Clip the accumulated gradients and take the optimizer step at step ``number``'s
        learning rate; returns the gradient norm (before clipping) and that rate. A
        non-finite norm raises NonFiniteStep before any change; non-finite weights after
        the step raise it as not recoverable."""
        model, optimizer = self.ranks.net(self)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.max_grad_norm)
        grad_norm = grad_norm.full_tensor() if isinstance(grad_norm, DTensor) else grad_norm
        if not torch.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)
            raise NonFiniteStep(
                f"gradient norm is {float(grad_norm)} (loss {total_loss:.4g})"
            )
        lr = self.lr(number)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        if not all_finite(list(model.parameters())):
            raise NonFiniteStep(
                "weights are not finite after an optimizer step on finite gradients "
                f"(trainer.lr={self.cfg.lr}, lr {lr:.4g} at step {number}?); the learner cannot "
                "be restored: resume from the last checkpoint", recoverable=False,
            )
        return grad_norm, lr

    def _layout(self, samples: Sequence[TrainSample]) -> Batch | SharedBatch:
        """The rows sharing their prompts' positions where that applies, else whole rows."""
        shared = collate_shared(samples, self.pad_id) if self.share_prompts else None
        return shared if shared is not None else collate(samples, self.pad_id)

    def _micro_loss(
        self, batch: Batch | SharedBatch, adv: torch.Tensor, loss_cfg: LossConfig,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor | None, torch.Tensor]:
        """The policy loss of ``batch`` (unscaled), its metrics, and the detached logits of the
        kept positions with their completion mask (for the entropy). The logits are None
        (and the rest not computed) when a shared batch meets a cache that cannot be indexed:
        sharing is then off, and the caller lays the rows out again.

        Only the positions from the first completion target on are projected to the
        vocabulary (``logits_to_keep``, as TRL does): the prompt prefix that every row shares
        attends as context but needs no logits, no log-softmax and no float32 copy. The
        kept positions' logits are the same numbers a full projection gives. ``rows``: 1.0
        for a row that gets loss, 0.0 for one that does not (``trainer.mask_truncated``);
        the mask returned is the loss's."""
        if isinstance(batch, SharedBatch):
            return self._shared_loss(batch, adv, loss_cfg, rows)
        first = _first_target(batch.mask)
        view = batch.from_target(first)
        keep = batch.input_ids.shape[1] - first  # positions first .. L-1 (L-1 predicts nothing)
        with self._autocast():
            out = self.ranks.net(self)[0](input_ids=batch.input_ids,
                                          attention_mask=batch.attention_mask, **self._keep(keep))
        logits = out.logits[:, -keep:][:, :-1].float()
        logp = token_logprobs(logits, view.targets, self.temperature)
        ref = self._ref_logprobs(batch, keep) if self.ref is not None else None
        mask = view.mask if rows is None else view.mask * rows[:, None]
        loss, metrics = policy_loss(
            logp, view.behaviour, adv, mask, loss_cfg, ref_logprobs=ref, token_lags=view.lags,
        )
        return loss, metrics, logits.detach(), mask

    def _shared_loss(
        self, batch: SharedBatch, adv: torch.Tensor, loss_cfg: LossConfig,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor | None, torch.Tensor]:
        with self._autocast():
            raw = completion_logits(self.ranks.net(self)[0], batch, cache_name=self._cache_name,
                                    keep=self._takes_keep)
        if raw is None:
            self.share_prompts = False
            return torch.zeros(()), {}, None, batch.mask
        logits = raw.float()
        logp = token_logprobs(logits, batch.targets, self.temperature)
        ref = None
        if self.ref is not None:
            with torch.no_grad(), self._autocast():
                ref_raw = completion_logits(self.ref, batch, cache_name=self._cache_name,
                                            keep=self._takes_keep)
            assert ref_raw is not None  # the same model class as the policy's
            ref = token_logprobs(ref_raw.float(), batch.targets, self.temperature)
        mask = batch.mask if batch.trained is None else batch.mask * batch.trained
        mask = mask if rows is None else mask * rows[:, None]
        loss, metrics = policy_loss(
            logp, batch.behaviour, adv, mask, loss_cfg, ref_logprobs=ref, token_lags=batch.lags,
        )
        return loss, metrics, logits.detach(), mask

    def _keep(self, keep: int) -> dict[str, int]:
        """``logits_to_keep`` where the model takes it (every causal LM of transformers >= 4.45;
        a PEFT wrapper passes it on); else nothing (the caller slices the full logits)."""
        return {"logits_to_keep": keep} if self._takes_keep else {}

    def _ref_logprobs(self, batch: Batch, keep: int) -> torch.Tensor:
        assert self.ref is not None
        view = batch.from_target(batch.input_ids.shape[1] - keep)
        with torch.no_grad(), self._autocast():
            out = self.ref(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                           **self._keep(keep))
            logits = out.logits[:, -keep:][:, :-1].float()
            return token_logprobs(logits, view.targets, self.temperature)

    def _autocast(self) -> torch.autocast:
        """``trainer.bf16``: the model's forward (and so its backward) in bfloat16 where
        autocast allows it, on the model's device; off: a no-op context."""
        device = next(self.model.parameters()).device.type
        return torch.autocast(device, dtype=torch.bfloat16, enabled=self.cfg.bf16)

    def published_state(self) -> dict[str, torch.Tensor]:
        """What workers load each version, as detached views: the state dict, or a LoRA
        model's adapters alone (:func:`freshroll.trainer.lora.adapter_state`)."""
        if is_lora(self.model):
            return adapter_state(self.model)
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def weights(self) -> dict[str, torch.Tensor]:
        """A detached copy of :meth:`published_state`, to publish to inference workers."""
        return {k: v.clone() for k, v in self.published_state().items()}

    def model_state(self) -> dict[str, torch.Tensor]:
        """The model tensors a checkpoint stores: all, or a LoRA model's adapters."""
        if is_lora(self.model):
            return checkpoint_state(self.model)
        return self.model.state_dict()

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load a :meth:`model_state` (from a checkpoint)."""
        if is_lora(self.model):
            load_checkpoint_state(self.model, state)
        else:
            self.model.load_state_dict(state)

    def optimizer_state(self) -> dict[str, Any]:
        return self.optimizer.state_dict()
