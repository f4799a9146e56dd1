"""The orchestrator's seams: what the pipeline awaits, so every part can run under any clock.

The :class:`~freshroll.runtime.pipeline.Pipeline` never calls a blocking
component directly. It awaits three kinds of parts, each built by the run's
component builder (the real ones for ``rollout.engine: hf``, the latency model of
:mod:`freshroll.sim` for ``rollout.engine: sim``):

* an :class:`AsyncEngine` per inference worker, made by an :data:`EngineFactory`
  (the worker pool calls it to add or replace a worker during a run);
* one :class:`AsyncScorer` for rewards;
* one :class:`AsyncTrainer`.

The real components are blocking (torch, user reward code): their adapters run
them on threads and await the result. The simulated ones await ``asyncio.sleep``
on the run's loop, so on a :class:`~freshroll.clock.VirtualClock` a whole run
takes no real time. Timeouts are applied by the pipeline around every await
(``asyncio.timeout`` follows the loop's clock); an adapter that cannot cancel its
work (a thread) abandons it and keeps the ``emit`` callback, so a late result still
reaches the buffer and is recorded ``rejected`` under its fenced epoch.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from freshroll.engines.base import Completion
from freshroll.lineage import PolicyVersion
from freshroll.rewards.calling import RewardState
from freshroll.rewards.scoring import Score
from freshroll.rewards.tasks import Prompt
from freshroll.state import Lease


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass(frozen=True, slots=True)
class GenRequest:
    """One attempt handed to an engine."""

    sample: str  # the attempt's sample id (``g17.3#1``)
    group: str  # its group id: a simulated length shares a per-prompt component per group
    prompt_id: str
    text: str  # the prompt as the model sees it (chat template applied)
    policy_step: int  # step of the policy version the worker has loaded (length drift)


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

    async def load_weights(self, weights: Any) -> float:
        """Install a published policy's weights (what :meth:`AsyncTrainer.weights` returned);
        return the seconds the transfer took (a stage of the decomposition)."""
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


@runtime_checkable
class AsyncScorer(Protocol):
    """The reward stage."""

    version: str  # the RewardVersion recorded with every reward
    names: tuple[str, ...]  # reward function names (failure attribution, budgets)
    #: calls the reward stage may have in flight at once (parallel reward workers; a hung
    #: call then holds only its own samples), and completions per call at most
    concurrency: int
    max_batch: int

    async def score(
        self, prompts: Sequence[Prompt], completions: Sequence[Completion], state: RewardState,
    ) -> list[Score]:
        """One score per completion (``Score.value`` None: that sample failed, with its error)."""
        ...


#: ``() -> (model state_dict, optimizer state_dict)``: a learner's checkpoint state, asked
#: for only when a checkpoint is due (a trainer actor's is fetched from its process then)
TrainerState = Callable[[], tuple[dict[str, Any], dict[str, Any]]]


@runtime_checkable
class AsyncTrainer(Protocol):
    """The learner."""

    settings_digest: str

    async def step(self, lease: Lease) -> tuple[dict[str, float], str]:
        """Train on a lease; ``(metrics incl. "train_s", digest of the new weights)``.
        Raises :class:`~freshroll.errors.NonFiniteStep` (the step is not applied)."""
        ...

    async def before_commit(self, version: PolicyVersion) -> None:
        """Write-ahead of the commit (a checkpoint every ``checkpoint_every`` steps)."""
        ...

    def weights(self) -> Any:
        """What the workers load for the version just committed (tensors, or a token)."""
        ...


@runtime_checkable
class SaysItsWaits(Protocol):
    """A trainer whose step is several waits of their own bounds (a Ray trainer actor lost
    in a step: kill it, rebuild the learner, start a new actor, train the step again). The
    pipeline hands it its :class:`~freshroll.runtime.waits.Waits` before the run and does
    not wrap its ``step`` and ``before_commit`` in one ``trainer step N`` wait: the trainer
    registers each of its waits with the bound that ends it, so no heartbeat line says a
    limit that a restart lets the wait run past."""

    waits: Any  # freshroll.runtime.waits.Waits, or None until the pipeline sets it


__all__ = [
    "AsyncEngine",
    "AsyncScorer",
    "AsyncTrainer",
    "Emit",
    "EngineFactory",
    "EngineNotRestartable",
    "EngineStats",
    "GenRequest",
    "ReportsStats",
    "SamplingParams",
    "SaysItsWaits",
    "TrainerState",
]
