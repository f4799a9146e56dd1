"""A plain ``transformers`` inference engine: batched sampling with a KV cache, on any device.

:class:`HFEngine` implements :class:`freshroll.engines.base.InferenceEngine` with a hand-written
decoding loop (not ``model.generate``) so that it controls, and can vouch for, the behaviour
log-probabilities it reports.

Guarantees:

* Prompts are left-padded into one batch; ``attention_mask`` masks the padding and
  ``position_ids`` count only real tokens, so each row's logits match those of the same prompt run
  alone (tested to 1e-4 against a teacher-forced forward pass without padding).
* Sampling distribution and reported log-probs:

  - ``temperature > 0``: tokens are drawn from ``softmax(logits / temperature)``; with
    ``top_p < 1`` that distribution is first truncated to the smallest set of most likely tokens
    whose mass reaches ``top_p`` and renormalised. The log-prob is that of the sampled token
    under exactly this (tempered, truncated, renormalised) distribution.
  - ``temperature == 0``: greedy (argmax; ``top_p`` is ignored). The log-prob is taken from the
    *untempered* ``softmax(logits)``, i.e. the model's own probability of the chosen token (a
    point mass would always report 0 and carry no information).
  - ``top_k``, ``min_p``, ``repetition_penalty`` (TRL's; off by default) cut or reshape that
    distribution in transformers' order (:mod:`freshroll.engines.sampling`), and the log-prob
    is the sampled token's under the result.

* Rows that share a prompt (a group's) share its prefill: each distinct prompt runs once
  and its KV cache is indexed to its rows (:mod:`freshroll.engines.prefix`); the logits are
  the full rows' up to float summation order. A model whose cache cannot be indexed runs
  the full rows from then on.
* Each row stops independently at an end-of-sequence token (the tokenizer's ``eos_token_id`` and
  the model config's ``eos_token_id``, one or several); the eos is kept in ``token_ids`` and
  stripped from ``text``, as are all special tokens. Finished rows are fed ``pad`` with a zero
  attention mask until the batch ends.
* With ``seed`` given, the same prompt list, settings, weights and device give the same tokens
  (one ``torch.Generator`` per call, so a row's draws depend on the whole batch); with
  ``seed=None`` the generator is seeded non-deterministically.
* Prompts are encoded with the tokenizer's default special tokens (the embedded tiny tokenizer
  adds none); a prompt that encodes to nothing is given the ``bos`` token, if there is one.
  A prompt longer than the model's ``max_position_embeddings`` fails the whole call with
  ``ValueError`` (as vLLM refuses one longer than its ``max_model_len``).
* The engine uses the model object it is given (not a copy), keeps it in eval mode and runs
  generation under ``torch.inference_mode()``.
* In-flight weight updates (``on_update``, set from ``rollout.on_update``): with ``continue``
  or ``abort`` a ``load_weights`` may come while ``generate`` runs on another thread; it waits
  for the decode step under way (one lock holds each forward pass and each load), swaps,
  and the loop goes on. ``continue``: the next tokens are sampled from the new weights (the
  KV cache of the earlier ones is kept, as PipelineRL does), each token's log-prob is that of
  the weights that sampled it, and ``Completion.version_spans`` says how many tokens each
  load made; ``abort``: the call raises :class:`~freshroll.errors.Superseded` at its next
  step (its requests are re-issued). Unset or ``finish``: loads come between calls.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from freshroll.engines.base import FINISH_LENGTH, FINISH_STOP, Completion, encode_prompt
from freshroll.engines.lora_merge import AdapterMerger, is_adapter
from freshroll.engines.model_dir import loading_model, takes_logits_to_keep
from freshroll.engines.prefix import (
    cache_kwarg,
    cache_of,
    can_index,
    index_cache,
    left_pad,
    positions,
    unique_rows,
)
from freshroll.engines.sampling import Cuts, Draw
from freshroll.engines.sampling import nucleus_logprobs as nucleus_logprobs
from freshroll.engines.sampling import sample_next as sample_next
from freshroll.errors import ConfigError, Superseded

_TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])


class HFEngine:
    """:class:`~freshroll.engines.base.InferenceEngine` over a ``transformers`` causal LM."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: Any, device: str | torch.device = "cpu"
    ) -> None:
        self.device = torch.device(device)
        torch.nn.Module.to(model, self.device)  # in place; typed, unlike the HF override
        self.model: PreTrainedModel = model
        torch.nn.Module.eval(self.model)
        self.tokenizer = tokenizer
        self.eos_ids = _eos_ids(model, tokenizer)
        if not self.eos_ids:
            raise ConfigError("model/tokenizer define no eos_token_id; cannot stop generation")
        pad = tokenizer.pad_token_id
        self.pad_id: int = int(pad) if pad is not None else min(self.eos_ids)
        self._cache_kwarg = cache_kwarg(model)
        #: the rows that share a prompt share its prefill (freshroll.engines.prefix); off
        #: for good once the model's cache turns out not to be indexable
        self.share_prompts = True
        self._keep_kwarg = takes_logits_to_keep(model)
        self._merger = AdapterMerger()  # the base weights of a LoRA run's adapter targets
        self.on_update: str | None = None  # rollout.on_update (module docstring)
        self.loads = 0  # weight loads swapped in (the ordinals of Completion.version_spans)
        self._swap = threading.Lock()  # one forward pass or one load at a time
        #: called between two decode steps with the step's index (tests: a load mid-call)
        self.between_steps: Callable[[int], None] | None = None

    @property
    def swaps_in_flight(self) -> bool:
        """A load may come while a call runs (``continue`` / ``abort``)."""
        return self.on_update in ("continue", "abort")

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        on_update: str | None = None,
    ) -> HFEngine:
        """Load a model directory from local disk only (nothing is ever downloaded);
        ``on_update``: ``rollout.on_update`` (the module docstring)."""
        root = Path(path)
        if not root.is_dir():
            raise ConfigError(f"model path {str(root)!r} does not exist or is not a directory")
        if not (root / "config.json").is_file():
            raise ConfigError(f"model path {str(root)!r} has no config.json")
        kwargs: dict[str, Any] = {"local_files_only": True}
        if dtype is not None:
            kwargs["dtype" if _TRANSFORMERS_MAJOR >= 5 else "torch_dtype"] = dtype
        with loading_model(root):
            model = AutoModelForCausalLM.from_pretrained(root, **kwargs)
            tokenizer = AutoTokenizer.from_pretrained(root, local_files_only=True)
        engine = cls(model, tokenizer, device=device)
        engine.on_update = on_update
        return engine

    # --- InferenceEngine ----------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[str],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        prompt_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[Completion]:
        """Sample one completion per prompt, in prompt order (blocking); ``top_k``,
        ``min_p``, ``repetition_penalty``: :mod:`freshroll.engines.sampling`.
        ``prompt_ids``: each prompt's context as token ids (token-in: a later turn of an
        episode), used as given instead of encoding ``prompts``."""
        _check_settings(max_new_tokens, temperature, top_p)
        cuts = Cuts(top_k, min_p, repetition_penalty)
        if isinstance(prompts, str):
            raise TypeError("prompts must be a sequence of strings, not a single string")
        if not prompts:
            return []
        start = time.perf_counter()
        if prompt_ids is not None:
            if len(prompt_ids) != len(prompts) or not all(prompt_ids):
                raise ValueError("prompt_ids must give a non-empty context for each prompt")
            ids = [[int(t) for t in row] for row in prompt_ids]
        else:
            encoded: dict[str, list[int]] = {}  # a group's rows share a prompt: encode once
            ids = [encoded[p] if p in encoded else encoded.setdefault(p, self._encode(p))
                   for p in prompts]
        self._check_lengths(ids)
        generator = torch.Generator(device=self.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        with torch.inference_mode():
            tokens, logprobs, ordinals = self._decode_loop(
                ids, max_new_tokens, Draw(temperature, top_p, generator, cuts, ids)
            )
        self._sync()
        gen_s = time.perf_counter() - start
        return [
            self._completion(p, toks, lps, gen_s, ordinals)
            for p, toks, lps in zip(ids, tokens.tolist(), logprobs.tolist(), strict=True)
        ]

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> float:
        """Copy ``state_dict`` into the model in place (strict names and shapes), or merge a
        LoRA adapter publication into the base weights (:mod:`freshroll.engines.lora_merge`);
        seconds taken."""
        start = time.perf_counter()
        with self._swap, torch.no_grad():
            if is_adapter(state_dict):
                self._merger.apply(self.model, state_dict)
            else:
                self.model.load_state_dict(dict(state_dict), strict=True)
                self._merger.reset()
            self._sync()
            self.loads += 1
        return time.perf_counter() - start

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A detached copy of the weights, on the engine's device."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    # --- internals ----------------------------------------------------------------------

    def _encode(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def _check_lengths(self, prompt_ids: list[list[int]]) -> None:
        limit = getattr(self.model.config, "max_position_embeddings", None)
        for i, ids in enumerate(prompt_ids):
            if isinstance(limit, int) and len(ids) > limit:
                raise ValueError(f"prompt {i} has {len(ids)} tokens, more than the model's "
                                 f"max_position_embeddings ({limit})")

    def _left_pad(self, prompt_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return left_pad(prompt_ids, self.pad_id, self.device)

    def _decode_loop(
        self,
        prompt_ids: list[list[int]],
        max_new_tokens: int,
        draw: Draw,
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Tokens and log-probs, each ``[batch, steps]`` (finished rows hold pad / 0.0), and
        the load ordinal of the weights that sampled each step's token."""
        unique, rows = unique_rows(prompt_ids)
        share = self.share_prompts and len(unique) < len(prompt_ids)
        ids, mask = self._left_pad(unique if share else prompt_ids)
        pos = positions(mask)
        extra = {"logits_to_keep": 1} if self._keep_kwarg else {}
        first = self.loads
        ordinals: list[int] = []
        with self._swap:
            out = self.model(
                input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **extra)
            ordinals.append(self.loads)
        cache = cache_of(out)
        logits = out.logits[:, -1, :]
        if share:  # the prefill ran once per distinct prompt: index it to the rows
            if not can_index(cache):
                self.share_prompts = False
                return self._decode_loop(prompt_ids, max_new_tokens, draw)
            index = torch.tensor(rows, device=self.device)
            index_cache(cache, index)
            logits, mask, pos = logits[index], mask[index], pos[index]
        next_pos = pos[:, -1:] + 1
        eos = torch.tensor(sorted(self.eos_ids), device=self.device)
        finished = torch.zeros(len(prompt_ids), dtype=torch.bool, device=self.device)
        tokens: list[torch.Tensor] = []
        logprobs: list[torch.Tensor] = []
        for step in range(max_new_tokens):
            tok, lp = draw(logits)
            tok = tok.masked_fill(finished, self.pad_id)
            tokens.append(tok)
            logprobs.append(lp.masked_fill(finished, 0.0))
            alive = ~finished
            finished = finished | torch.isin(tok, eos)
            if step == max_new_tokens - 1 or bool(finished.all()):
                break
            mask = torch.cat([mask, alive.long()[:, None]], dim=1)
            if self.between_steps is not None:
                self.between_steps(step)
            with self._swap:
                if self.on_update == "abort" and self.loads != first:
                    raise Superseded("new weights arrived during the call (on_update: abort)")
                out = self.model(input_ids=tok[:, None], attention_mask=mask,
                                 position_ids=next_pos, use_cache=True,
                                 **{self._cache_kwarg: cache})
                ordinals.append(self.loads)
            cache = cache_of(out)
            logits = out.logits[:, -1, :]
            next_pos = next_pos + 1
        return (torch.stack(tokens, dim=1).cpu(), torch.stack(logprobs, dim=1).float().cpu(),
                ordinals)

    def _completion(
        self, prompt: list[int], tokens: list[int], logprobs: list[float], gen_s: float,
        ordinals: Sequence[int] = (),
    ) -> Completion:
        finish, end = FINISH_LENGTH, len(tokens)
        for i, t in enumerate(tokens):
            if t in self.eos_ids:
                finish, end = FINISH_STOP, i + 1
                break
        kept = tuple(tokens[:end])
        # Drop the terminator explicitly: an eos id need not be a "special" token.
        visible = list(kept[:-1] if finish == FINISH_STOP else kept)
        return Completion(
            prompt_token_ids=tuple(prompt),
            token_ids=kept,
            logprobs=tuple(logprobs[:end]),
            text=self.tokenizer.decode(visible, skip_special_tokens=True),
            finish_reason=finish,
            gen_s=gen_s,
            version_spans=_spans(ordinals[:end], self.swaps_in_flight),
        )

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _check_settings(max_new_tokens: int, temperature: float, top_p: float) -> None:
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not temperature >= 0.0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")


def _spans(ordinals: Sequence[int], always: bool) -> tuple[tuple[int, int], ...]:
    """Run-length ``(ordinal, tokens)`` of a row's per-token load ordinals; empty when they
    are all one and not ``always`` (an engine that never swaps under a call)."""
    out: list[tuple[int, int]] = []
    for k in ordinals:
        if out and out[-1][0] == k:
            out[-1] = (k, out[-1][1] + 1)
        else:
            out.append((k, 1))
    return tuple(out) if len(out) > 1 or always else ()


def _eos_ids(model: PreTrainedModel, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(model.config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return frozenset(ids)
