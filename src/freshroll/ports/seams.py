"""The orchestrator's seams: what the pipeline awaits, so every part can run under any clock.

The :class:`~freshroll.pipeline.pipeline.Pipeline` never calls a blocking
component directly. It awaits three kinds of parts, each built by the run's
component builder (the real ones for ``rollout.engine: hf``, the latency model of
:mod:`freshroll.sim` for ``rollout.engine: sim``):

* an :class:`~freshroll.engines.seams.AsyncEngine` per inference worker (its contract is
  :mod:`freshroll.engines.seams`), made by an :data:`~freshroll.engines.seams.EngineFactory`
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

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from freshroll.engines.base import Completion
from freshroll.engines.weights import Weights
from freshroll.kernel.state import Lease
from freshroll.ledger.lineage import PolicyVersion
from freshroll.rewards.calling import RewardState
from freshroll.rewards.scoring import Score
from freshroll.rewards.tasks import Prompt


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

    def weights(self) -> Weights:
        """What the workers load for the version just committed: its placement's publication
        (:mod:`freshroll.engines.weights`: tensors, a shared-memory slot, a Ray object, or
        the simulator's token), made once per version."""
        ...


@runtime_checkable
class SaysItsWaits(Protocol):
    """A trainer whose step is several waits of their own bounds (a Ray trainer actor lost
    in a step: kill it, rebuild the learner, start a new actor, train the step again). The
    pipeline hands it its :class:`~freshroll.ports.waits.Waits` before the run and does
    not wrap its ``step`` and ``before_commit`` in one ``trainer step N`` wait: the trainer
    registers each of its waits with the bound that ends it, so no heartbeat line says a
    limit that a restart lets the wait run past."""

    waits: Any  # freshroll.ports.waits.Waits, or None until the pipeline sets it


__all__ = [
    "AsyncScorer",
    "AsyncTrainer",
    "SaysItsWaits",
    "TrainerState",
]
