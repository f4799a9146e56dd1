"""What the pipeline's stages share, and the narrow ports between them.

Every stage of the pipeline (the worker pool and its calls, the reward stage, steering, the
tails task) is built outside the pipeline's task group with a :class:`RunContext` and only
the ports it uses; none of them sees the :class:`~freshroll.pipeline.pipeline.Pipeline`
(``tests/pipeline/test_ports_narrow.py`` holds this). The pipeline builds the context once
per run (:meth:`~freshroll.pipeline.pipeline.Pipeline.run`), then its stages, then starts
their tasks in its task group.

:class:`RunContext` (frozen: the same objects for the whole run)::

    cfg       the run's config (read only)
    buf       the sample buffer: every state change goes through it (the ledger sees it)
    clock     buf.clock: every duration of the run
    limits    cfg.limits: timeouts and failure budgets
    prompts   prompt id -> Prompt (read only)
    waits     the waits in flight (freshroll.ports.waits): a stage registers each wait
              that may never come back, for as long as it lasts
    budget    the failure budget (freshroll.control.breaker): a stage records each outcome in it
    notify()  something changed that the feeder or the trainer may act on: wake them
    sample_rule()  the budget's rule for per-sample failures (limits.max_consecutive_*)

The ports (each a Protocol; a stage is handed the object that implements it)::

    RewardInbox   put(sid, completion, prompt)        the pool emits accepted completions
                                                      into the reward stage (on the loop)
    RewardBacklog pending                             generated, not yet rewarded (the meter)
    PoolView      active, leaving, startups           the workers, read by the meter
    SteeredPool   PoolView + set_concurrency, resize  what steering changes of the pool
    PoolCancel    await cancel(worker, epoch, sids)   the tails task frees slots of cut
                                                      requests (returns the slots freed)
    PublishedNow  () -> Published | None              the version the workers should load

Hooks and chaos get another context, :class:`~freshroll.pipeline.hooks.HookContext`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from freshroll.config import Config
from freshroll.control.breaker import FailureBudget, Rule
from freshroll.engines.weights import Weights
from freshroll.kernel.buffer import SampleBuffer
from freshroll.ledger.lineage import PolicyVersion, SampleId
from freshroll.ports.waits import Waits
from freshroll.rewards.tasks import Prompt

if TYPE_CHECKING:
    from freshroll.clock import Clock
    from freshroll.config.ops import LimitsSection
    from freshroll.engines.base import Completion
    from freshroll.pipeline.calls import Worker


@dataclass(frozen=True, eq=False)
class RunContext:
    """What every stage of one run shares (module docstring)."""

    cfg: Config
    buf: SampleBuffer
    prompts: Mapping[str, Prompt]
    waits: Waits
    budget: FailureBudget
    notify: Callable[[], None]

    @property
    def clock(self) -> Clock:
        return self.buf.clock

    @property
    def limits(self) -> LimitsSection:
        return self.cfg.limits

    def sample_rule(self) -> Rule:
        """The failure budget's rule for per-sample failures."""
        lim = self.cfg.limits
        return Rule(lim.max_consecutive_failed_calls, lim.max_consecutive_failures,
                    lim.failure_window, lim.max_failure_ratio)


@dataclass
class Published:
    """A policy version published to the workers, with its weights."""

    version: PolicyVersion
    weights: Weights | None  # what AsyncTrainer.weights() returned; None: the initial weights


#: the version the workers should load now (None before the run publishes its first)
PublishedNow = Callable[[], Published | None]


class RewardInbox(Protocol):
    """Where the worker pool hands accepted completions (the reward stage)."""

    def put(self, sid: SampleId, comp: Completion, prompt: Prompt) -> None: ...


class RewardBacklog(Protocol):
    """How much the reward stage holds (read by the steering meter)."""

    @property
    def pending(self) -> int: ...


class PoolView(Protocol):
    """The worker pool, read (by the steering meter)."""

    @property
    def active(self) -> Mapping[str, Worker]: ...

    @property
    def leaving(self) -> Mapping[str, Worker]: ...

    @property
    def startups(self) -> Sequence[float]: ...


class SteeredPool(PoolView, Protocol):
    """What steering changes of the worker pool."""

    def set_concurrency(self, c: int) -> None: ...

    def resize(self, n: int) -> None: ...


class PoolCancel(Protocol):
    """Cancel ended samples on their worker's engine (the tails task)."""

    async def cancel(self, name: str, epoch: int, samples: list[SampleId]) -> int: ...


__all__ = ["PoolCancel", "PoolView", "Published", "PublishedNow", "RewardBacklog",
           "RewardInbox", "RunContext", "SteeredPool"]
