"""GRPO / PPO policy losses with off-policy correction (pure torch, no model, no I/O).

Notation: sequence ``i`` of a batch of ``B``, token ``t`` of ``T``; ``m_it`` the completion
mask; ``A_i`` the sequence advantage; ``logp`` the trainer's log-probabilities (the only
input that carries gradient), ``b`` the behaviour log-probabilities (the sampler's, at the
policy version that generated the tokens), ``p`` the proximal log-probabilities (the
trainer's policy at the start of the optimisation step; ``p = sg[logp]`` when not given),
``ref`` a reference policy. ``sg`` is stop-gradient.

Group advantages (GRPO / Dr. GRPO)::

    A_i = (r_i - mean_g r) / (std_g r + eps)      scale=True  (GRPO)
    A_i =  r_i - mean_g r                         scale=False (Dr. GRPO)
    A_i = (r_i - mean_g r) / (std_B r + eps)      scale=True, batch_std=True (TRL's
                                                  scale_rewards="batch": the batch's std)

where ``g`` is the group of ``i`` and ``std_g`` the *unbiased sample* standard deviation
(``sum (r - mean)^2 / (n_g - 1)``, as ``torch.std`` and TRL use). A group of one sample
gets ``A = 0``.

Token log-probabilities and entropy (``z = logits / temperature``)::

    logp_t = z_t[y_t] - logsumexp(z_t)
    H_t    = -sum_v softmax(z_t)_v * log_softmax(z_t)_v,   entropy = sum(m H) / sum(m)

PPO term with asymmetric clipping (``clip(r) = clamp(r, 1 - clip_low, 1 + clip_high)``)::

    P_t(r) = -min(r A, clip(r) A)

With ``ratio_level="sequence"`` (GSPO; TRL's ``importance_sampling_level="sequence"``) the
ratio is one per sequence, the exponential of its tokens' mean log-ratio, and every token of
the sequence takes it (the gradient still flows through each token's log-prob)::

    r_it = exp( sum_t m_it (logp_it - anchor_it) / max(1, sum_t m_it) )

Off-policy correction (``LossConfig.correction``), with ``w = exp(p - b)`` and cap ``C``:

* ``none``:      ``L_t = P_t(exp(logp - b))``  (plain PPO against the behaviour policy).
* ``tis``:       ``L_t = sg[min(w, C)] * P_t(exp(logp - p))``  (truncated importance
  sampling, verl's TIS / "Your efficient RL framework secretly brings you off-policy RL").
* ``decoupled``: ``L_t = sg[w * 1{w <= C}] * P_t(exp(logp - p))`` (AReaL's decoupled PPO:
  tokens with ``w > C`` are dropped, not truncated; as in AReaL they keep counting in the
  ``grpo`` / ``dapo`` denominators, so dropping a token never rescales the others).
* ``dual_clip``: ``L_t = P_t(r)`` for ``A >= 0`` and ``min(P_t(r), -C A)`` for ``A < 0``, with
  ``r = exp(logp - b)`` (PPO against the behaviour policy, its negative-advantage term
  bounded by dual clipping, Ye et al. 2020 / verl's ``clip_ratio_c``; ``C`` must exceed
  ``1 + clip_high``).

Why the anchor matters: with one optimizer step per batch the proximal policy *is* the
current one, so ``exp(logp - p) = 1`` and the clip of ``tis`` and ``decoupled`` never acts:
a stale batch gets an importance weight but no trust region. ``none`` and ``dual_clip`` clip
the ratio to the policy that sampled the tokens, so a token the policy already moved past
``1 +- clip`` in the advantage's direction gets no further push (docs/benchmarks.md,
"Learning under asynchrony", measures the difference).

Optional KL to a reference (k3 estimator of ``KL(pi || ref)``), added per token when
``ref_logprobs`` is given and ``kl_coef > 0``::

    L_t += kl_coef * (exp(ref - logp) - (ref - logp) - 1)

Aggregation (``LossConfig.aggregation``)::

    grpo:    (1/B) sum_i [ sum_t m_it L_it / max(1, sum_t m_it) ]
    dapo:    sum_it m_it L_it / max(1, sum_it m_it)
    dr_grpo: sum_it m_it L_it / (B * max_completion_len)     (default max_completion_len = T)

Metrics (means over masked tokens; all python floats): ``clip_frac`` (the min picked the
clipped term *strictly*, i.e. ``r`` left the clip range on the side that matters),
``ratio_mean`` (of the PPO ratio ``r``), ``is_weight_mean/max/min`` (of the raw ``w``,
before truncation; 1.0 on an empty mask), ``is_truncated_frac`` (fraction with ``w > C``:
truncated for ``tis``, dropped for ``decoupled``, 0.0 for ``none``), ``mismatch_kl`` and
``kl_ref`` (when ``ref_logprobs`` is given). ``mismatch_kl`` is the k3 estimator of
``KL(behaviour || proximal)`` on tokens sampled from the behaviour policy::

    mismatch_kl = mean_t [exp(p - b) - (p - b) - 1]

(unbiased for that direction because the samples come from ``b``; 0 iff ``p == b``).

Per token lag (``token_lags`` given: each token's consumer step minus its generating step;
buckets of :mod:`freshroll.figures.off_policy`): for each bucket ``g`` with tokens,
``tokens/lag_<g>`` (their count), ``mismatch_kl/lag_<g>`` and ``is_weight_mean/lag_<g>`` (the
same means over those tokens alone), ``is_weight_max/lag_<g>``; a bucket without tokens is
absent from the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from freshroll.errors import ConfigError
from freshroll.figures.off_policy import LAG_BUCKETS, TOP_LAG, bucket_key

Aggregation = Literal["grpo", "dr_grpo", "dapo"]
Correction = Literal["none", "tis", "decoupled", "dual_clip"]
RatioLevel = Literal["token", "sequence"]

__all__ = [
    "Aggregation",
    "Correction",
    "LossConfig",
    "RatioLevel",
    "entropy_from_logits",
    "group_advantages",
    "policy_loss",
    "token_logprobs",
]


def group_advantages(
    rewards: Tensor, groups: Tensor, *, scale: bool = True, eps: float = 1e-6,
    batch_std: bool = False,
) -> Tensor:
    """Group-relative advantages ``r_i - mean_g r`` (divided by ``std_g + eps`` if ``scale``;
    by the whole batch's ``std + eps`` instead with ``batch_std``, TRL's
    ``scale_rewards="batch"``).

    ``std_g`` is the unbiased sample standard deviation (``torch.std``); size-1 groups get 0.
    ``groups`` holds any integer label per sample; labels need not be contiguous or sorted.
    """
    if rewards.dim() != 1 or groups.shape != rewards.shape:
        raise ValueError(
            f"rewards and groups must be 1-D of equal shape, got {tuple(rewards.shape)} "
            f"and {tuple(groups.shape)}"
        )
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=out_dtype, device=rewards.device)
    r = rewards.detach().to(torch.float64)
    _, inverse = torch.unique(groups, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1
    zeros = torch.zeros(n_groups, dtype=r.dtype, device=r.device)
    counts = zeros.index_add(0, inverse, torch.ones_like(r))
    mean = zeros.index_add(0, inverse, r) / counts
    centred = r - mean[inverse]
    if not scale:
        return centred.to(out_dtype)
    if batch_std:
        spread = r.std() if r.numel() > 1 else torch.zeros((), dtype=r.dtype, device=r.device)
        return (centred / (spread + eps)).to(out_dtype)
    sq = zeros.index_add(0, inverse, centred * centred)
    std = (sq / (counts - 1).clamp(min=1)).sqrt()
    return (centred / (std[inverse] + eps)).to(out_dtype)


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """``log_softmax(logits / temperature)`` gathered at ``targets``; shape ``[B, T]``.

    Callers pass logits already shifted so that ``logits[:, t]`` predicts ``targets[:, t]``.
    Computed in float32 as ``z[y] - logsumexp(z)`` (stable; no full log-softmax tensor).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}"
        )
    z = logits.float() / temperature
    picked = z.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(z, dim=-1)


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """``sum(mask * x) / max(1, sum(mask))``; masked-out entries may hold anything finite."""
    m = mask.to(x.dtype)
    return torch.where(mask.bool(), x, torch.zeros_like(x)).sum() / m.sum().clamp(min=1.0)


def entropy_from_logits(logits: Tensor, mask: Tensor, temperature: float = 1.0) -> Tensor:
    """Mean over masked tokens of the entropy of ``softmax(logits / temperature)``."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    ent = -(logp.exp() * logp).sum(dim=-1)
    return _masked_mean(ent, mask)


@dataclass(frozen=True)
class LossConfig:
    """Policy-loss settings; see the module docstring for the formulas."""

    aggregation: Aggregation = "grpo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    correction: Correction = "dual_clip"
    is_cap: float = 2.0
    kl_coef: float = 0.0
    max_completion_len: int | None = None
    ratio_level: RatioLevel = "token"

    def __post_init__(self) -> None:
        if self.ratio_level not in get_args(RatioLevel):
            raise ConfigError(f"loss.ratio_level: unknown value {self.ratio_level!r}")
        if self.aggregation not in get_args(Aggregation):
            raise ConfigError(f"loss.aggregation: unknown value {self.aggregation!r}")
        if self.correction not in get_args(Correction):
            raise ConfigError(f"loss.correction: unknown value {self.correction!r}")
        if not 0.0 <= self.clip_low < 1.0:
            raise ConfigError(f"loss.clip_low must be in [0, 1), got {self.clip_low}")
        if self.clip_high < 0.0:
            raise ConfigError(f"loss.clip_high must be >= 0, got {self.clip_high}")
        if self.is_cap <= 0.0:
            raise ConfigError(f"loss.is_cap must be > 0, got {self.is_cap}")
        if self.correction == "dual_clip" and self.is_cap <= 1.0 + self.clip_high:
            raise ConfigError(f"loss.is_cap must exceed 1 + clip_high = {1.0 + self.clip_high} "
                              f"with correction dual_clip, got {self.is_cap}")
        if self.kl_coef < 0.0:
            raise ConfigError(f"loss.kl_coef must be >= 0, got {self.kl_coef}")
        if self.max_completion_len is not None and self.max_completion_len <= 0:
            raise ConfigError(f"loss.max_completion_len must be > 0, got {self.max_completion_len}")


def _check_shapes(logprobs: Tensor, advantages: Tensor, **others: Tensor | None) -> None:
    """Raise ``ValueError`` unless every ``[B, T]`` input matches and advantages is ``[B]``."""
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got {tuple(logprobs.shape)}")
    for name, value in others.items():
        if value is not None and value.shape != logprobs.shape:
            raise ValueError(f"{name} {tuple(value.shape)} != logprobs {tuple(logprobs.shape)}")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be [B]={logprobs.shape[0]}, got {advantages.shape}")


def _importance_weights(
    proximal: Tensor, behaviour: Tensor, mask: Tensor, cfg: LossConfig
) -> tuple[Tensor, dict[str, float]]:
    """Detached per-token weight applied to the PPO term, plus the ``is_*`` metrics."""
    raw = torch.exp(proximal - behaviour)
    over = raw > cfg.is_cap
    if cfg.correction == "tis":
        weight = raw.clamp(max=cfg.is_cap)
    elif cfg.correction == "decoupled":
        weight = torch.where(over, torch.zeros_like(raw), raw)
    else:
        weight = torch.ones_like(raw)
    valid = raw[mask]
    empty = valid.numel() == 0
    metrics = {
        "is_weight_mean": 1.0 if empty else float(valid.mean()),
        "is_weight_max": 1.0 if empty else float(valid.max()),
        "is_weight_min": 1.0 if empty else float(valid.min()),
        "is_truncated_frac": 0.0
        if cfg.correction in ("none", "dual_clip")
        else float(_masked_mean(over.float(), mask)),
    }
    return weight, metrics


def _ppo_term(
    logprobs: Tensor, anchor: Tensor, adv: Tensor, mask: Tensor, cfg: LossConfig
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token ``-min(r A, clip(r) A)`` with ``r = exp(logprobs - anchor)`` (with
    ``ratio_level`` sequence, every token of a row has its row's ratio, module docstring).

    Returns the term, the detached ratio and the bool "clipped branch strictly active" map.
    """
    log_ratio = logprobs - anchor
    if cfg.ratio_level == "sequence":
        m = mask.to(log_ratio.dtype)
        per_row = (log_ratio * m).sum(dim=1, keepdim=True) / m.sum(dim=1, keepdim=True).clamp(
            min=1.0)
        log_ratio = per_row.expand_as(log_ratio)
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    unclipped_loss = -ratio * adv
    clipped_loss = -clipped * adv
    active = clipped_loss.detach() > unclipped_loss.detach()
    return torch.maximum(unclipped_loss, clipped_loss), ratio.detach(), active


def _aggregate(per_token: Tensor, mask: Tensor, cfg: LossConfig) -> Tensor:
    """Reduce ``[B, T]`` per-token losses to a scalar per ``cfg.aggregation``."""
    m = mask.to(per_token.dtype)
    masked = torch.where(mask, per_token, torch.zeros_like(per_token))
    if cfg.aggregation == "grpo":
        per_seq = masked.sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
        return per_seq.mean()
    if cfg.aggregation == "dapo":
        return masked.sum() / m.sum().clamp(min=1.0)
    batch, width = per_token.shape
    length = cfg.max_completion_len if cfg.max_completion_len is not None else width
    return masked.sum() / float(batch * length)


def _by_lag(raw: Tensor, k3: Tensor, mask: Tensor, lags: Tensor) -> dict[str, float]:
    """The per-lag-bucket metrics (module docstring) of the masked tokens, read back to the
    host in one transfer (a step's hot path: one sync, not four per bucket)."""
    buckets = torch.arange(len(LAG_BUCKETS), device=lags.device).view(-1, 1, 1)
    sel = mask.unsqueeze(0) & (lags.long().clamp(min=0, max=TOP_LAG).unsqueeze(0) == buckets)
    zero = torch.zeros((), dtype=raw.dtype, device=raw.device)
    n = sel.sum(dim=(1, 2)).to(raw.dtype)
    kl = torch.where(sel, k3.unsqueeze(0), zero).sum(dim=(1, 2))
    w = torch.where(sel, raw.unsqueeze(0), zero).sum(dim=(1, 2))
    top = raw.unsqueeze(0).masked_fill(~sel, float("-inf")).amax(dim=(1, 2))
    out: dict[str, float] = {}
    for name, (count, kl_sum, w_sum, w_max) in zip(
            LAG_BUCKETS, torch.stack([n, kl, w, top], dim=1).tolist(), strict=True):
        if not count:
            continue
        out[bucket_key("tokens", name)] = float(count)
        out[bucket_key("mismatch_kl", name)] = kl_sum / count
        out[bucket_key("is_weight_mean", name)] = w_sum / count
        out[bucket_key("is_weight_max", name)] = w_max
    return out


def _corrected(
    logp: Tensor, behaviour: Tensor, proximal: Tensor, adv: Tensor, mask: Tensor,
    cfg: LossConfig,
) -> tuple[Tensor, Tensor, Tensor, dict[str, float]]:
    """The per-token PPO term under ``cfg.correction`` (module docstring), with its detached
    ratio, its "clipped branch active" map and the ``is_*`` metrics."""
    anchor = behaviour if cfg.correction in ("none", "dual_clip") else proximal
    pg, ratio, active = _ppo_term(logp, anchor, adv, mask, cfg)
    weight, metrics = _importance_weights(proximal, behaviour, mask, cfg)
    if cfg.correction == "dual_clip":
        floor = -cfg.is_cap * adv  # the most a negative-advantage token may cost
        capped = (adv < 0) & (pg.detach() > floor)
        pg = torch.where(adv < 0, torch.minimum(pg, floor.expand_as(pg)), pg)
        metrics["is_truncated_frac"] = float(_masked_mean(capped.float(), mask))
    return weight * pg, ratio, active, metrics


def policy_loss(
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: LossConfig,
    *,
    proximal_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    token_lags: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped policy-gradient loss with off-policy correction; see the module docstring.

    Shapes: ``logprobs``, ``behaviour_logprobs``, ``proximal_logprobs``, ``ref_logprobs`` and
    ``mask`` are ``[B, T]``; ``advantages`` is ``[B]``. Gradient flows only through
    ``logprobs``. ``proximal_logprobs`` defaults to ``sg[logprobs]``; with correction
    ``none`` it only feeds the ``is_*`` / ``mismatch_kl`` metrics. Values at masked-out
    positions of the non-differentiable inputs are ignored (replaced by ``sg[logprobs]``).
    ``token_lags`` (``[B, T]`` integers, any value at masked-out positions) adds the
    per-lag-bucket metrics. Returns ``(loss, metrics)`` with metrics as described in the
    module docstring.
    """
    _check_shapes(
        logprobs,
        advantages,
        behaviour_logprobs=behaviour_logprobs,
        mask=mask,
        proximal_logprobs=proximal_logprobs,
        ref_logprobs=ref_logprobs,
        token_lags=token_lags,
    )
    m = mask.bool()
    logp = logprobs.float()
    fill = logp.detach()
    behaviour = torch.where(m, behaviour_logprobs.detach().float(), fill)
    proximal = (
        fill
        if proximal_logprobs is None
        else torch.where(m, proximal_logprobs.detach().float(), fill)
    )
    adv = advantages.detach().float().unsqueeze(1)
    per_token, ratio, active, metrics = _corrected(logp, behaviour, proximal, adv, m, cfg)
    log_mis = proximal - behaviour
    k3 = log_mis.exp() - log_mis - 1.0
    metrics["mismatch_kl"] = float(_masked_mean(k3, m))
    if token_lags is not None:
        metrics.update(_by_lag(log_mis.exp(), k3, m, token_lags))
    if ref_logprobs is not None:
        ref = torch.where(m, ref_logprobs.detach().float(), fill)
        kl = torch.exp(ref - logp) - (ref - logp) - 1.0
        metrics["kl_ref"] = float(_masked_mean(kl.detach(), m))
        if cfg.kl_coef > 0:
            per_token = per_token + cfg.kl_coef * kl
    loss = _aggregate(per_token, m, cfg)
    metrics["loss"] = float(loss.detach())
    metrics["clip_frac"] = float(_masked_mean(active.float(), m))
    metrics["ratio_mean"] = float(_masked_mean(ratio, m))
    return loss, metrics
