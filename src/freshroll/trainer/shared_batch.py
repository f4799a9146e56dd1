"""A training batch whose rows share their prompts' positions (:mod:`freshroll.engines.prefix`).

:class:`~freshroll.trainer.grpo.Batch` lays each row out whole, prompt + completion,
right-padded: the forward and the backward run every prompt position once per row. A
:class:`SharedBatch` holds each distinct prompt once (left-padded) and the completions
apart (right-padded), and :func:`completion_logits` runs::

    prompts [U, P]          one forward with a KV cache; keep the last position's logits
    cache[rows]             the cache indexed to the B rows (differentiable)
    completions[:, :T-1]    one forward on that cache, positions p_i + j
    logits [B, T, V]        first-token logits (from the prompt's last position) + the rest

Completion token ``j`` of row ``i`` is predicted by ``logits[i, j]``: the targets, masks,
behaviour log-probs and token lags are ``[B, T]``, aligned with it. The loss, its metrics and
the entropy are computed from these exactly as from the full rows' kept positions; the
numbers agree to float summation order (tests/trainer/test_shared_batch.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from freshroll.engines.prefix import cache_of, can_index, index_cache, left_pad, positions
from freshroll.engines.prefix import unique_rows as _unique_rows

if TYPE_CHECKING:
    from freshroll.trainer.grpo import TrainSample


@dataclass(frozen=True)
class SharedBatch:
    prompt_ids: torch.Tensor   # [U, P] the distinct prompts, left-padded
    prompt_mask: torch.Tensor  # [U, P]
    rows: torch.Tensor         # [B] each row's prompt (an index into prompt_ids)
    targets: torch.Tensor      # [B, T] the completion tokens, right-padded
    mask: torch.Tensor         # [B, T] 1.0 at completion tokens
    behaviour: torch.Tensor    # [B, T] behaviour log-probs
    rewards: torch.Tensor      # [B]
    groups: torch.Tensor       # [B]
    lags: torch.Tensor         # [B, T] each completion token's lag
    #: [B, T] 1.0 at tokens that get loss (a tool's tokens are 0.0; ``mask`` is also the
    #: completions' attention, so it stays 1.0 there); None: every completion token
    trained: torch.Tensor | None = None


def collate_shared(samples: Sequence[TrainSample], pad_id: int) -> SharedBatch | None:
    """The shared layout of ``samples``; None where it saves nothing or does not apply:
    every prompt distinct, or a prompt or every completion empty."""
    unique, rows = _unique_rows([s.prompt_ids for s in samples])
    width = max(len(s.token_ids) for s in samples)
    if len(unique) == len(samples) or width == 0 or any(not p for p in unique):
        return None
    targets, mask, behaviour, lags, trained = [], [], [], [], []
    for s in samples:
        pad = width - len(s.token_ids)
        targets.append([*s.token_ids, *[pad_id] * pad])
        mask.append([1.0] * len(s.token_ids) + [0.0] * pad)
        behaviour.append([*s.logprobs, *[0.0] * pad])
        lags.append([*s.lags(), *[0] * pad])
        trained.append([*s.trained(), *[0.0] * pad])
    ids, attn = left_pad(unique, pad_id)
    return SharedBatch(
        ids, attn, torch.tensor(rows, dtype=torch.long),
        torch.tensor(targets, dtype=torch.long), torch.tensor(mask, dtype=torch.float32),
        torch.tensor(behaviour, dtype=torch.float32),
        torch.tensor([s.reward for s in samples], dtype=torch.float32),
        torch.tensor([s.group for s in samples], dtype=torch.long),
        torch.tensor(lags, dtype=torch.long),
        torch.tensor(trained, dtype=torch.float32) if any(s.loss_mask for s in samples)
        else None,
    )


def completion_logits(model: Any, batch: SharedBatch, *, cache_name: str,
                      keep: bool) -> torch.Tensor | None:
    """``[B, T, V]`` logits predicting each completion token (module docstring), in the
    model's dtype; None when the model's cache cannot be indexed (run the full rows)."""
    device = next(model.parameters()).device
    ids, attn = batch.prompt_ids.to(device), batch.prompt_mask.to(device)
    pos = positions(attn)
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True,
                **({"logits_to_keep": 1} if keep else {}))
    cache = cache_of(out)
    if not can_index(cache):
        return None
    rows = batch.rows.to(device)
    first: torch.Tensor = out.logits[:, -1:, :][rows]  # [B, 1, V]
    steps = batch.targets.shape[1] - 1  # the last completion token predicts nothing
    if steps == 0:
        return first
    index_cache(cache, rows)
    comp_attn = batch.mask[:, :steps].to(device=device, dtype=attn.dtype)
    comp_pos = pos[rows, -1:] + 1 + torch.arange(steps, device=device)
    rest = model(input_ids=batch.targets[:, :steps].to(device),
                 attention_mask=torch.cat([attn[rows], comp_attn], dim=1),
                 position_ids=comp_pos, use_cache=True, **{cache_name: cache})
    return torch.cat([first, rest.logits], dim=1)


__all__ = ["SharedBatch", "collate_shared", "completion_logits"]
