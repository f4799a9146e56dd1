"""The inference-engine protocol: what a rollout worker needs from a generator.

An engine turns prompts into :class:`Completion` records and accepts new weights. It knows
nothing about policy versions: the caller records which version's weights it loaded before a
``generate`` call, so every completion can be attributed to exactly one set of weights.

Guarantees every implementation must give:

* ``generate`` returns one completion per prompt, in prompt order, and blocks until all are done.
* ``Completion.logprobs[i]`` is the log-probability of ``token_ids[i]`` under the distribution it
  was actually sampled from (the *behaviour* policy), so importance ratios can be computed later.
* ``len(token_ids) == len(logprobs) <= max_new_tokens``; ``finish_reason`` is ``"stop"`` exactly
  when the last token is the end-of-sequence token, else ``"length"``.
* ``load_weights`` replaces the weights in place before it returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # a reward actor imports this module: no torch for it (seconds of import)
    import torch

from freshroll.errors import ConfigError

FINISH_STOP = "stop"
FINISH_LENGTH = "length"


@dataclass(frozen=True, slots=True)
class Completion:
    """One generated completion and how it was produced."""

    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]  # generated tokens, including the final eos if one was generated
    logprobs: tuple[float, ...]  # behaviour log-prob of each generated token
    text: str  # decoded completion, without special tokens (eos/pad stripped)
    finish_reason: str  # "stop" (eos) or "length"
    gen_s: float  # seconds this sequence's batch took to generate
    #: token count when ``token_ids`` is not materialized (the simulated engine); else None
    n_tokens: int | None = None
    #: the weights each token came from, as run-length ``(load ordinal, tokens)`` ranges,
    #: oldest first: ordinal ``k`` is the engine's ``k``-th ``load_weights`` (0: the weights
    #: it started with). Empty: not reported (every token of the weights the request started
    #: under). An engine that swaps weights under running requests reports it.
    version_spans: tuple[tuple[int, int], ...] = ()
    #: which tokens the trainer trains on, as run-length ``(trained, tokens)`` ranges
    #: (1: sampled by the policy, 0: written by a tool or environment); empty: every token
    #: (a single-turn completion). :mod:`freshroll.engines.trajectory` builds it.
    loss_mask: tuple[tuple[int, int], ...] = ()
    #: a multi-turn episode's turns, one ``(kind, tokens, seconds, call, outcome)`` per
    #: segment (:class:`freshroll.engines.trajectory.Turn`); empty: one model turn
    turns: tuple[tuple[str, int, float, str, str], ...] = ()

    @property
    def tokens(self) -> int:
        """Generated tokens: ``n_tokens`` if set, else ``len(token_ids)``."""
        return len(self.token_ids) if self.n_tokens is None else self.n_tokens


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """``text`` as token ids with the tokenizer's default special tokens; a prompt that
    encodes to nothing is given the ``bos`` token (a ConfigError if there is none). The HF
    and vLLM engines encode prompts alike, so their completions are comparable."""
    ids = [int(i) for i in tokenizer.encode(text)]
    if not ids:
        bos = tokenizer.bos_token_id
        if bos is None:
            raise ConfigError(f"prompt {text!r} encodes to no tokens and there is no bos")
        ids = [int(bos)]
    return ids


@runtime_checkable
class InferenceEngine(Protocol):
    """A blocking generator whose weights can be swapped in place."""

    def generate(
        self,
        prompts: Sequence[str],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> list[Completion]:
        """Sample one completion per prompt (blocking)."""
        ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> float:
        """Copy ``state_dict`` into the model in place; return the seconds it took."""
        ...

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A detached copy of the current weights."""
        ...


# Optional capabilities of an engine in a process of its own (a child process, a Ray actor),
# declared so that the pool and the adapters ask ``isinstance`` rather than probe attributes.

@runtime_checkable
class Killable(Protocol):
    """Can die now, as a crash would (the chaos harness, a worker's loss): the call in flight
    and every later one fail with WorkerLost until a restart."""

    def kill(self) -> None: ...


@runtime_checkable
class Restartable(Protocol):
    """Can be replaced in place after a loss (a fresh process, the same proxy)."""

    def restart(self) -> None: ...


@runtime_checkable
class Stoppable(Protocol):
    """Holds a process of its own that must be ended (a retired worker frees its CPUs)."""

    def stop(self) -> None: ...


@runtime_checkable
class SwapsInFlight(Protocol):
    """May take weights while a call runs (``rollout.on_update`` continue / abort: the HF
    engine and its thread adapter): ``load_weights`` may come beside ``generate``, so the
    worker pool loads each new version under a running lock-step call."""

    @property
    def swaps_in_flight(self) -> bool: ...
