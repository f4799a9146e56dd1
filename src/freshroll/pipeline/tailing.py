"""The group-deadline task of the pipeline (``tail.deadline: true``): long-tail handling.

The rules are :func:`freshroll.control.tail.tail_action`, applied to the buffer's running
groups by :class:`~freshroll.pipeline.tails.TailWatch`. This task makes them act, every
tick of the run's clock::

    tick = min(control.interval_s, p50 / TICKS_PER_P50)     at least control.interval_s
                                                             / MAX_TICKS_PER_INTERVAL
    for cut in watch.due(now, buf): apply_cut(buf, cut)     the ledger first, no await
    pipeline notified                                       ready groups, admission capacity
    for (worker, epoch), samples in cuts:                   then the work stops:
        await pool.cancel(worker, epoch, samples)           slots freed, engine.cancel

(``p50``: the median request latency the watch measures; before it has one, the tick is
``control.interval_s``.) A cut is therefore at most one tick late: with the default
``deadline_factor`` of 3, within a twelfth of the deadline.

Guarantees: ``due`` and every ``apply_cut`` of a tick run with no ``await`` between them,
so no result lands between the decision and the discard; a result that arrives later is
rejected by the buffer. The worker pool frees the slots of the samples a continuous engine
drops (:meth:`~freshroll.pipeline.workers.WorkerPool.cancel`); a lock-step engine finishes
its batch and its late results are rejected. A worker epoch that ended meanwhile (fenced,
replaced) is skipped.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from freshroll.ledger.lineage import SampleId
from freshroll.pipeline.tails import CutReason, TailWatch, apply_cut

if TYPE_CHECKING:
    from freshroll.pipeline.context import PoolCancel, RunContext

TICKS_PER_P50 = 4
MAX_TICKS_PER_INTERVAL = 64


class Tailing:
    """The deadline watch of one pipeline and the task that applies it (ports: the run's
    context and the pool's cancel)."""

    def __init__(self, ctx: RunContext, pool: PoolCancel) -> None:
        self.ctx, self.buf, self.pool = ctx, ctx.buf, pool
        self.watch = TailWatch(ctx.cfg.tail, group_size=ctx.cfg.rollout.group_size)
        self.ended: dict[CutReason, int] = {"deadline": 0, "cancelled": 0}  # requests
        self.freed = 0  # engine slots freed by cancels

    def interval(self) -> float:
        """Seconds (of the run's clock) to the next tick (module docstring)."""
        base = self.ctx.cfg.control.interval_s
        p50 = self.watch.p50(self.buf)
        if p50 is None:
            return base
        return max(base / MAX_TICKS_PER_INTERVAL, min(base, p50 / TICKS_PER_P50))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval())
            await self.tick()

    async def tick(self) -> int:
        """Apply the cuts due now; returns how many requests they ended."""
        buf = self.buf
        cuts = self.watch.due(buf.clock.now(), buf)
        if not cuts:
            return 0
        ended = 0
        work: dict[tuple[str, int], list[SampleId]] = {}
        for cut in cuts:  # no await in this loop: the ledger first
            n = apply_cut(buf, cut)
            self.ended[cut.reason] += n
            ended += n
            for key, samples in cut.by_worker().items():
                work.setdefault(key, []).extend(samples)
        self.ctx.notify()  # groups became ready, dropped ones freed admission capacity
        pool = self.pool
        for (worker, epoch), samples in work.items():
            self.freed += await pool.cancel(worker, epoch, samples)
        return ended


__all__ = ["MAX_TICKS_PER_INTERVAL", "TICKS_PER_P50", "Tailing"]
