"""Over-provisioning in the pipeline (``tail.overprovision``): how many extra requests the
feeder admits with each group, and the task that cancels, on their engines, the attempts a
stop at target ended.

The amount per admitted group (:meth:`Overprovision.extra`)::

    controller's live amount             when the controller set one (bounded by max_extra)
    N                                    tail.overprovision: N
    extra_requests(G, π, policy)         tail.overprovision: auto (freshroll.control.tail):
        π = on_time_share(latencies, deadline_factor × p50)   of the buffer's recent window
        0 while the window holds fewer than MIN_LATENCIES

(The window holds the attempts that were generated: an attempt cancelled at stop at target
is censored, so π is an upper bound and ``auto`` errs towards fewer extras.)

The stop itself is the buffer's (:mod:`freshroll.kernel.stop_at_target`): the ledger first, in
the same command that accepted the ``G``-th result. The buffer lists the running attempts it
ended in ``buf.stopped``; the worker's emit wakes :meth:`Overprovision.run`, which takes the
list and cancels them on their engines, both through the pipeline's
:class:`~freshroll.pipeline.hooks.HookContext` (``take_stopped``, then ``cancel``: their
slots freed; a lock-step engine finishes its batch and its late results are rejected). It
is engine-agnostic: the sim engine (virtual clock) and the real ones alike.
"""

from __future__ import annotations

import asyncio
import statistics
from typing import TYPE_CHECKING

from freshroll.config.run import TailSection
from freshroll.control.tail import TailPolicy, extra_requests, on_time_share
from freshroll.kernel.buffer import SampleBuffer
from freshroll.ledger.lineage import SampleId

if TYPE_CHECKING:
    from freshroll.pipeline.hooks import HookContext

MIN_LATENCIES = 8  # measured requests before ``auto`` admits extras


class Overprovision:
    """The extra requests per group, and the cancels of a stop at target."""

    def __init__(self, cfg: TailSection, group_size: int) -> None:
        self.setting = cfg.overprovision
        self.group_size = group_size
        self.policy = TailPolicy.from_section(cfg)
        self.live: int | None = None  # the controller's amount (steering), when it set one
        self.admitted = 0  # extra requests admitted so far
        self.cancelled = 0  # running attempts cancelled on their engines
        self._wake = asyncio.Event()

    def extra(self, buf: SampleBuffer) -> int:
        """Extra requests for the next admitted group (module docstring)."""
        if self.live is not None:
            m = min(self.live, self.policy.max_extra)
        elif self.setting == "auto":
            m = self.auto(buf.recent_latencies())
        else:
            m = self.setting
        self.admitted += m
        return m

    def auto(self, latencies: list[float]) -> int:
        if len(latencies) < MIN_LATENCIES:
            return 0
        limit = self.policy.deadline_factor * statistics.median(latencies)
        return extra_requests(self.group_size, on_time_share(latencies, limit), self.policy)

    def wake(self) -> None:
        """A stop at target ended running attempts (``buf.stopped``): cancel them soon."""
        self._wake.set()

    async def run(self, ctx: HookContext) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.cancel_stopped(ctx)

    async def cancel_stopped(self, ctx: HookContext) -> int:
        """Cancel the attempts a stop at target ended (``buf.stopped``) on their engines;
        returns the slots freed."""
        stopped = ctx.take_stopped()
        if not stopped:
            return 0
        work: dict[tuple[str, int], list[SampleId]] = {}
        for sid, worker, epoch in stopped:
            work.setdefault((worker, epoch), []).append(sid)
        self.cancelled += len(stopped)
        ctx.notify()
        freed = 0
        for (worker, epoch), samples in work.items():
            freed += await ctx.cancel(worker, epoch, samples)
        return freed


__all__ = ["MIN_LATENCIES", "Overprovision"]
