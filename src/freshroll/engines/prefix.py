"""Shared prompt prefixes: the rows of a group share their prompt, so its positions run once.

GRPO samples ``G`` completions of each prompt. Run as ``B = U × G`` full rows, a step
computes every prompt position ``G`` times: in generation (the prefill) and in training (the
forward and the backward over prompt + completion). Here each distinct prompt runs once,
with a KV cache, and the cache is indexed to the rows along its batch axis
(``DynamicCache.batch_select_indices``: an indexing op, differentiable, so each shared
prompt position's gradient is the sum over its rows, as the full rows' would be)::

    unique, rows = unique_rows(prompts)                 # U distinct prompts; row -> prompt
    out = model(left_pad(unique), use_cache=True, logits_to_keep=1)   # U rows, not B
    index_cache(cache_of(out), rows)                    # the cache of all B rows
    out.logits[rows, -1]                                # each row's first-token logits
    (training) model(completion[:, :-1], positions p + j, past = that cache)
                                                        # the logits of tokens 1 .. T-1

The numbers are the full rows' up to the order of float sums (tested: log-probs and
gradients against the full rows, to 1e-5). What it saves: a step of the embedded default
(prompts of 8 tokens, groups of 16, 4 new tokens) runs ``U × 8 + B × 4`` = 576 positions
through the model instead of ``B × 12`` = 1,536 for its forward and backward, and with 16
new tokens 2,112 instead of 3,072; the prefill runs 64 positions instead of 1,024. The time
that saves, and what it does to freshroll against TRL's GRPOTrainer, which runs the full rows
(it repeats each prompt ``G`` times into the batch): docs/benchmarks.md, "Larger models,
quiet, three seeds".

Where it does not apply the callers run the full rows, and nothing else changes: every
row's prompt its own (nothing to share), a model whose cache cannot be indexed (no
``batch_select_indices``: :func:`can_index`), a model that applies dropout in training (a
shared prompt position would share its dropout mask among the rows: :func:`drops_out`).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch


def unique_rows(prompts: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts, in order of first appearance, and each row's index into them."""
    seen: dict[tuple[int, ...], int] = {}
    unique: list[list[int]] = []
    rows: list[int] = []
    for p in prompts:
        key = tuple(p)
        at = seen.get(key)
        if at is None:
            at = seen[key] = len(unique)
            unique.append(list(p))
        rows.append(at)
    return unique, rows


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int,
             device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``prompts`` left-padded into one ``[rows, width]`` tensor, and its attention mask."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts],
                       dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                        dtype=torch.long)
    return ids.to(device), mask.to(device)


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count only the real (unmasked) tokens of left-padded rows."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def cache_kwarg(model: Any) -> str:
    """The name ``model``'s forward takes its KV cache under: recent transformers 5.x renamed
    ``past_key_values`` to ``cache`` (the old name deprecated)."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def cache_of(out: Any) -> Any:
    """The KV cache a forward returned (under either name), or None."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def can_index(cache: Any) -> bool:
    """Whether ``cache`` can be indexed along its batch axis (every ``DynamicCache``)."""
    return callable(getattr(cache, "batch_select_indices", None))


def index_cache(cache: Any, rows: torch.Tensor) -> None:
    """``cache`` (one row per distinct prompt) becomes the cache of ``rows``, in place."""
    cache.batch_select_indices(rows)


def drops_out(model: Any) -> bool:
    """Whether ``model`` applies dropout while training (any ``Dropout`` with ``p > 0``, or a
    module's attention dropout, as Llama's and Qwen2's attention read it at each forward):
    shared prompt positions would share their dropout masks."""
    return any(_dropout_of(m) > 0 for m in model.modules())


def disable_dropout(model: Any) -> None:
    """Every dropout of ``model`` off, in place, for training (``trainer.disable_dropout``):
    each ``Dropout``'s ``p`` and each module's ``attention_dropout`` set to 0. The model's
    config is left as it is, so what is saved and exported is the user's model."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
        elif isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0


def _dropout_of(module: Any) -> float:
    """The dropout probability ``module`` applies itself while training (0.0: none)."""
    if isinstance(module, torch.nn.modules.dropout._DropoutNd):
        return float(module.p)
    rate = getattr(module, "attention_dropout", None)
    return rate if isinstance(rate, float) else 0.0


__all__ = ["cache_kwarg", "cache_of", "can_index", "disable_dropout", "drops_out", "index_cache",
           "left_pad", "positions", "unique_rows"]
