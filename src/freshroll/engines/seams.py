r"""The async engine seam: what an inference worker's engine is to the pipeline that awaits it.

An :class:`AsyncEngine` (the HF engine's thread adapter, a process or Ray worker's proxy,
the vLLM engine, the simulated engine) takes :class:`GenRequest` attempts with
:class:`SamplingParams` and ``emit``\ s one :class:`~freshroll.engines.base.Completion` per
request as it finishes; an engine that reports its load implements :class:`ReportsStats`.
The runtime's own seams (the engine factory, the scorer, the trainer) are in
:mod:`freshroll.ports.seams`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from freshroll.engines.base import Completion
from freshroll.engines.weights import Weights


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # TRL's sampling knobs, off by default (freshroll.engines.sampling)
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def extras(self) -> dict[str, float]:
        """``top_k`` / ``min_p`` / ``repetition_penalty`` where set: the keyword arguments
        an engine's ``generate`` gets beyond temperature and top-p (none when all are off,
        so an engine that takes none of them is called as before)."""
        out: dict[str, float] = {}
        if self.top_k:
            out["top_k"] = self.top_k
        if self.min_p:
            out["min_p"] = self.min_p
        if self.repetition_penalty != 1.0:
            out["repetition_penalty"] = self.repetition_penalty
        return out


@dataclass(frozen=True, slots=True)
class GenRequest:
    """One attempt handed to an engine."""

    sample: str  # the attempt's sample id (``g17.3#1``)
    group: str  # its group id: a simulated length shares a per-prompt component per group
    prompt_id: str
    text: str  # the prompt as the model sees it (chat template applied)
    policy_step: int  # step of the policy version the worker has loaded (length drift)
    #: token-in: the context as token ids (a later turn of an episode: the earlier turns'
    #: tokens as they were sampled or written, never re-tokenised); None: encode ``text``
    prompt_ids: tuple[int, ...] | None = None
    #: the request's dataset row (its prompt's columns: ``answer``, ...), what an environment
    #: may read and the policy never sees (a game's secret); empty where none was given
    row: Mapping[str, Any] = field(default_factory=dict)


#: ``emit(i, completion)``: request ``i`` of the call finished. Called once per request, in
#: any order, on the event loop; it may still be called after the call timed out (late result).
Emit = Callable[[int, Completion], None]


@runtime_checkable
class AsyncEngine(Protocol):
    """One inference worker's engine, awaited by the pipeline."""

    #: True: requests may be added while others run (continuous batching; the worker keeps up
    #: to ``concurrency`` in flight across calls); False: one call at a time, of at most
    #: ``concurrency`` requests, that returns when all are done (lock-step batches).
    continuous: bool

    async def generate(
        self, requests: Sequence[GenRequest], params: SamplingParams, seed: int, emit: Emit,
    ) -> None:
        """Generate one completion per request; ``emit`` each as it finishes; return when
        all were emitted. Raises :class:`~freshroll.errors.WorkerLost` when the engine died;
        any other exception fails these requests (``generation_error``)."""
        ...

    async def load_weights(self, weights: Weights) -> float:
        """Install a published policy's weights (what :meth:`AsyncTrainer.weights` returned:
        the publication of this placement's :class:`~freshroll.engines.weights.WeightTransfer`;
        another kind raises :class:`TypeError`); return the seconds the transfer took (a stage
        of the decomposition)."""
        ...

    async def cancel(self, samples: Sequence[str]) -> None:
        """Stop generating these samples (a group deadline); they will not be emitted."""
        ...

    async def close(self) -> None:
        """Release the engine (worker retired or run over); idempotent."""
        ...


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What a serving engine reports about itself (vLLM's scheduler: the signals a
    concurrency controller needs). Cumulative counters grow over the engine's life; the
    meter takes their differences per window."""

    running: int  # sequences being generated now
    waiting: int  # sequences queued inside the engine (admitted by us, not yet scheduled)
    kv_cache_usage: float  # share of the KV cache in use, 0..1
    preemptions: int  # cumulative: sequences evicted from the KV cache and recomputed


@runtime_checkable
class Tokenizes(Protocol):
    """An engine whose tokenizer the episode workflow may use (the HF engine's thread
    adapter): an environment's text becomes token ids once, with the policy's tokenizer, and
    the engine takes token ids as a request's context (``GenRequest.prompt_ids``)."""

    def encode_text(self, text: str) -> tuple[int, ...]:
        """``text`` as token ids, no special tokens added."""
        ...


@runtime_checkable
class ReportsStats(Protocol):
    """An engine that can say how loaded it is (optional: the HF and sim engines need not)."""

    def stats(self) -> EngineStats | None:
        """The newest figures (cheap, non-blocking; None before the first report)."""
        ...


#: makes (and starts) the engine of worker ``name``; the pool calls it to add or replace a
#: worker. A restart after a loss is a new engine from the factory (called again with the
#: same name); a factory that cannot replace an engine raises :class:`EngineNotRestartable`.
EngineFactory = Callable[[str], Awaitable[AsyncEngine]]


class EngineNotRestartable(Exception):
    """Raised by an :data:`EngineFactory` asked to replace an engine it cannot restart
    (an inline HF engine); the pool then ends the run naming the worker."""


__all__ = [
    "AsyncEngine", "Emit", "EngineFactory", "EngineNotRestartable", "EngineStats", "GenRequest",
    "ReportsStats", "SamplingParams", "Tokenizes",
]
