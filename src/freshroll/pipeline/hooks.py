"""Hand-off hooks: where a chaos session sees (and perturbs) what passes between stages.

Faults are injected at the pipeline's hand-offs. Most of them are seams already
(:mod:`freshroll.ports.seams`): a chaos session wraps the engine factory, the engines, the
scorer and the trainer (:meth:`freshroll.runtime.placements.ChaosSession.wrap`) and so sees
every ``generate``, ``emit``, ``load_weights``, ``score``, ``step`` and ``before_commit``.
The hand-offs that happen inside the pipeline, between a stage and the sample buffer, call
a :class:`Hooks` object instead:

* ``scored(sids, scores)``: a reward call returned, before its scores reach the buffer (a
  session may fail or corrupt some: the reward stage must discard them, never record 0);
* ``rewarded(sids)``: those rewards were delivered to the buffer (a session may deliver one
  again: the buffer must reject the duplicate);
* ``committed(version)``: a trainer step was committed durably;
* ``run(ctx)``: a task of the pipeline's task group for the whole run (time triggers, a
  liveness guard); it is cancelled when the run ends.

``run`` is handed a :class:`HookContext`, never the pipeline: the run's clock, a read view of
the sample buffer (:class:`BufferView`), the config a hook reads (``limits``, the steps
asked), the live workers (:meth:`HookContext.workers`) and their number
(:meth:`HookContext.resize`), and an out-of-band publication
(:meth:`HookContext.publish_out_of_band`: a version the ledger never committed, which the
workers must refuse). The pipeline's over-provisioning task runs on the same context: it
takes the attempts a stop at target ended (:meth:`HookContext.take_stopped`) and cancels
them on their engines (:meth:`HookContext.cancel`).

The default :class:`Hooks` does nothing; a run without a chaos session pays one no-op method
call per reward call and per step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from freshroll.ledger.lineage import PolicyVersion, SampleId
from freshroll.rewards.scoring import Score

if TYPE_CHECKING:
    from freshroll.clock import Clock
    from freshroll.config.ops import LimitsSection
    from freshroll.engines.episodes import EpisodeWorkflow
    from freshroll.kernel.buffer import SampleBuffer
    from freshroll.pipeline.workers import WorkerPool


class BufferView:
    """A read view of the run's sample buffer: every read is of the buffer now."""

    __slots__ = ("_buf",)

    def __init__(self, buf: SampleBuffer) -> None:
        self._buf = buf

    @property
    def version(self) -> PolicyVersion:
        """The newest committed policy version."""
        assert self._buf.version is not None
        return self._buf.version

    @property
    def step(self) -> int:
        """The newest committed version's step (0: none yet)."""
        return self.version.step

    @property
    def counts(self) -> Mapping[str, int]:
        """The accounting counters (:attr:`freshroll.kernel.state.BufferState.counts`; a key absent
        reads 0), read-only."""
        return MappingProxyType(self._buf.counts)


@dataclass(frozen=True)
class WorkerCensus:
    """The pool's workers at one moment, each tuple sorted by name."""

    live: tuple[str, ...]  # starting or serving, not retiring
    ready: tuple[str, ...]  # of the live ones, those whose engine is up
    leaving: tuple[str, ...]  # retiring: finishing what they run


class HookContext:
    """What a hook's ``run`` task (and the over-provisioning task) may see and do, built by
    the pipeline once its worker pool is up. Nothing else of the pipeline is reachable."""

    def __init__(self, buf: SampleBuffer, pool: WorkerPool, limits: LimitsSection, steps: int,
                 *, published: Callable[[], PolicyVersion],
                 publish: Callable[[PolicyVersion], None],
                 notify: Callable[[], None]) -> None:
        self.clock: Clock = buf.clock
        self.buffer = BufferView(buf)
        self.limits = limits  # the run's timeouts and failure budgets (config ``limits``)
        self.steps = steps  # the steps the run commits in all (``run.steps``)
        self._buf, self._pool = buf, pool
        self._published, self._publish, self._notify = published, publish, notify

    # -- workers -----------------------------------------------------------------------------
    def workers(self) -> WorkerCensus:
        """The pool's workers now."""
        active, leaving = self._pool.active, self._pool.leaving
        return WorkerCensus(tuple(sorted(active)),
                            tuple(sorted(n for n, w in active.items() if w.ready.is_set())),
                            tuple(sorted(leaving)))

    def resize(self, n: int) -> None:
        """``n`` live workers: new ones added, else the newest retired."""
        self._pool.resize(n)

    async def cancel(self, worker: str, epoch: int, samples: list[SampleId]) -> int:
        """Cancel ``samples`` (already ended in the buffer) on ``worker``'s epoch ``epoch``;
        returns the slots freed (:meth:`~freshroll.pipeline.workers.WorkerPool.cancel`)."""
        return await self._pool.cancel(worker, epoch, samples)

    # -- versions ----------------------------------------------------------------------------
    def published(self) -> PolicyVersion:
        """The version the workers are told to load (the newest commit's, unless a version
        was published out of band since)."""
        return self._published()

    def publish_out_of_band(self, version: PolicyVersion) -> None:
        """Publish ``version`` to the workers, with the weights published now, though the
        ledger never committed it (a buggy trainer, a chaos fault): the pool must refuse it
        and keep the last committed version."""
        self._publish(version)

    # -- the buffer's hand-offs --------------------------------------------------------------
    def take_stopped(self) -> list[tuple[SampleId, str, int]]:
        """The running attempts a stop at target ended since the last call, as
        ``(sample, worker, epoch)`` (:mod:`freshroll.kernel.stop_at_target`); the list is
        emptied."""
        stopped, self._buf.stopped = self._buf.stopped, []
        return stopped

    def notify(self) -> None:
        """Something changed that the feeder or the trainer may act on: wake them."""
        self._notify()


class Hooks:
    """No-op hand-off hooks (the default of every pipeline)."""

    async def run(self, ctx: HookContext) -> None:
        """A task for the whole run; returning early is fine."""

    def scored(self, sids: Sequence[SampleId], scores: list[Score]) -> list[Score]:
        """A reward call's scores, before they reach the buffer; returns what is delivered."""
        return scores

    def rewarded(self, sids: Sequence[SampleId]) -> None:
        """A reward call's results were delivered to the buffer."""

    def committed(self, version: PolicyVersion) -> None:
        """A trainer step was committed (durably) and its version published."""

    def workflow(self, workflow: EpisodeWorkflow) -> EpisodeWorkflow:
        """The run's episode workflow, once, before any worker starts; returns the one the
        worker pool drives (a chaos session wraps its tools here)."""
        return workflow


__all__ = ["BufferView", "HookContext", "Hooks", "WorkerCensus"]
