"""The HF engine's sampling distribution (:mod:`freshroll.engines.hf`'s docstring states it
for temperature and top-p), and TRL's knobs beyond those two: ``top_k``, ``min_p`` and
``repetition_penalty`` (``rollout.*``; vLLM applies its own).

Applied in the order transformers' ``generate`` applies them (TRL's HF path), each on the
distribution the previous step left, so the behaviour log-prob the engine reports is that
of the sampled token under exactly the distribution it was drawn from::

    repetition penalty  on the raw logits z, for every token v already in the row (prompt
                        or completion so far): z_v / penalty if z_v > 0, else z_v x penalty
    temperature         logp = log_softmax(z / temperature)
    top_k (k > 0)       tokens below the k-th largest logp dropped (ties kept)
    top_p (p < 1)       the nucleus (:func:`nucleus_logprobs`)
    min_p (m > 0)       tokens with p_v < m x max_v p_v dropped (the most likely kept)

and renormalised after each cut. Greedy decoding (temperature 0) takes the argmax of the
penalised logits: the cuts cannot change it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from freshroll.errors import ConfigError


@dataclass(frozen=True)
class Cuts:
    """The knobs at their "off" values by default (no cut, no penalty)."""

    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0: off), got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ConfigError(f"min_p must be in [0, 1] (0: off), got {self.min_p}")
        if not self.repetition_penalty > 0.0:
            raise ConfigError(f"repetition_penalty must be > 0 (1: off), got "
                              f"{self.repetition_penalty}")

    @property
    def penalises(self) -> bool:
        return self.repetition_penalty != 1.0


_NO_CUTS = Cuts()


def penalise(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """The repetition penalty (module docstring) on ``logits [B, V]`` where ``seen [B, V]``."""
    scaled = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, scaled, logits)


def top_k_logprobs(logp: torch.Tensor, k: int) -> torch.Tensor:
    """``logp`` cut to its ``k`` most likely tokens per row (ties kept), renormalised."""
    k = min(k, logp.shape[-1])
    kth = logp.topk(k, dim=-1).values[..., -1:]
    kept = logp.masked_fill(logp < kth, float("-inf"))
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)


def min_p_logprobs(logp: torch.Tensor, min_p: float) -> torch.Tensor:
    """``logp`` without the tokens under ``min_p`` x the row's largest probability,
    renormalised (in log space: ``logp_v < log(min_p) + max logp``)."""
    floor = logp.max(dim=-1, keepdim=True).values + math.log(min_p)
    kept = logp.masked_fill(logp < floor, float("-inf"))
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)


def sample_next(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator,
    cuts: Cuts = _NO_CUTS, seen: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of ``logits [batch, vocab]`` and its behaviour log-prob.

    See the module docstring for the exact distribution each setting samples from, and
    :mod:`freshroll.engines.sampling` for ``cuts`` (``seen``: the tokens the repetition
    penalty applies to, ``[batch, vocab]``).
    """
    logits = logits.float()
    if seen is not None:
        logits = penalise(logits, seen, cuts.repetition_penalty)
    if temperature == 0.0:
        tok = logits.argmax(dim=-1)
        logp = torch.log_softmax(logits, dim=-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    if cuts.top_k:
        logp = top_k_logprobs(logp, cuts.top_k)
    if top_p < 1.0:
        logp = nucleus_logprobs(logp, top_p)
    if cuts.min_p:
        logp = min_p_logprobs(logp, cuts.min_p)
    tok = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def nucleus_logprobs(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """``logp`` truncated to the top-``top_p`` nucleus (others ``-inf``) and renormalised.

    The nucleus is the smallest prefix of tokens sorted by probability whose mass reaches
    ``top_p``; the most likely token is always kept.
    """
    sorted_lp, order = logp.sort(dim=-1, descending=True)
    probs = sorted_lp.exp()
    mass_before = probs.cumsum(dim=-1) - probs
    drop_sorted = mass_before >= top_p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    kept = logp.masked_fill(drop, float("-inf"))
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)


@dataclass
class Draw:
    """One generate call's sampling: its settings and generator, and the tokens each row
    holds so far (the repetition penalty's, made at the first draw from the vocabulary's
    size)."""

    temperature: float
    top_p: float
    generator: torch.Generator
    cuts: Cuts
    prompt_ids: list[list[int]]
    seen: torch.Tensor | None = None

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The next token of each row of ``logits [B, V]`` and its log-prob."""
        if self.cuts.penalises and self.seen is None:
            self.seen = seen_tokens(self.prompt_ids, logits.shape[-1], logits.device)
        tok, lp = sample_next(logits, self.temperature, self.top_p, self.generator, self.cuts,
                              self.seen)
        if self.seen is not None:
            self.seen[torch.arange(len(tok), device=tok.device), tok] = True
        return tok, lp


def seen_tokens(prompt_ids: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """``[B, V]``: True where the row's prompt holds the token (the penalty's start)."""
    seen = torch.zeros(len(prompt_ids), vocab, dtype=torch.bool, device=device)
    for i, ids in enumerate(prompt_ids):
        seen[i, torch.tensor(ids, dtype=torch.long, device=device)] = True
    return seen


__all__ = ["Cuts", "Draw", "min_p_logprobs", "nucleus_logprobs", "penalise", "sample_next",
           "seen_tokens", "top_k_logprobs"]
