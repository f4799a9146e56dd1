"""Model turns of independent episodes, batched by whatever is ready (issue 49, item 5).

A lock-step engine (``continuous = False``: the HF engine's thread adapter) runs one
``generate`` call at a time. A multi-turn workflow that made one ``generate`` per turn for a
whole call would make every episode wait for the slowest tool of each turn, and the call for
its slowest episode. With :class:`TurnBatcher` each episode is a task of its own:
``await batcher.turn(request, params, seed)`` queues one model turn and returns its
completion (None: the engine dropped it, a cancel); a batch takes every turn queued when it
starts, so the episodes that are ready generate together and one waiting on its tool holds
nobody up. One batcher per engine serves every call running on it (the worker pool overlaps
the calls of such a workflow: :class:`~freshroll.engines.episodes.BatchesTurns`), so a new
request's first turn joins the next batch as soon as a finished episode freed its slot.

Who runs a batch (no task of its own, so nothing outlives the calls): the turn that finds no
batch running leads. It yields to the loop :data:`SETTLE` times (turns that became ready in
the same loop iteration join), takes the queued turns that can share its ``generate`` (the
same sampling parameters; first turns, given as text, never mixed with later turns, given as
token ids: token-in), runs it and hands each turn its completion. Then the oldest turn still
queued leads the next batch. A leader cancelled mid-batch puts the batch's other turns back
at the front of the queue; a turn cancelled while queued leaves it, handing the lead on when
it held it. An engine failure fails every turn of its batch with that exception (the engine's
contract: :class:`~freshroll.errors.WorkerLost`, :class:`~freshroll.errors.Superseded`, ...).

Seeds: a batch is generated with its oldest turn's seed (each turn's seed derives from its
call's seed and its index). When every episode is ready at once (tools that answer at once)
the batches, and so the seeds and tokens, are those of one ``generate`` per turn.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Final, cast

from freshroll.engines.base import Completion
from freshroll.engines.seams import AsyncEngine, GenRequest, SamplingParams
from freshroll.errors import Superseded, WorkerLost, WorkerTimeout

#: loop iterations a leader waits for turns that became ready with its own
SETTLE: Final = 2
_LEAD: Final = object()  # a queued turn's future set to this: it leads the next batch


@dataclass(eq=False)
class _Turn:
    request: GenRequest
    params: SamplingParams
    seed: int
    fut: asyncio.Future[object]

    def joins(self, first: _Turn) -> bool:
        """Whether this turn can share ``first``'s generate call."""
        return (self.params == first.params
                and (self.request.prompt_ids is None) == (first.request.prompt_ids is None))


class TurnBatcher:
    """Batches the model turns of one engine's episodes (the module docstring)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._queue: deque[_Turn] = deque()
        self._leading = False
        self.batches: list[int] = []  # each batch's rows, in order (read by tests)

    async def turn(self, request: GenRequest, params: SamplingParams,
                   seed: int) -> Completion | None:
        """One model turn of ``request``'s episode: its completion, or None (dropped)."""
        loop = asyncio.get_running_loop()
        t = _Turn(request, params, seed, loop.create_future())
        self._queue.append(t)
        self._hand_on()
        try:
            while True:
                got = await t.fut
                if got is not _LEAD:
                    return cast(Completion | None, got)
                t.fut = loop.create_future()
                try:
                    await self._batch()
                finally:
                    self._leading = False
                    self._hand_on()
        except BaseException:
            self._drop(t)
            raise

    def _hand_on(self) -> None:
        """With no batch running, the oldest waiting turn leads the next."""
        if self._leading:
            return
        for t in self._queue:
            if not t.fut.done():
                self._leading = True
                t.fut.set_result(_LEAD)
                return

    def _drop(self, t: _Turn) -> None:
        """A turn that ends without a result (cancelled, failed) leaves the queue, and its
        lead, if it held one, goes to the next."""
        if t in self._queue:
            self._queue.remove(t)
        f = t.fut
        if f.done() and not f.cancelled() and f.exception() is None and f.result() is _LEAD:
            self._leading = False
            self._hand_on()

    def _take(self) -> list[_Turn]:
        """The queued turns that can go in one generate call with the oldest."""
        live = [t for t in self._queue if not t.fut.done()]
        if not live:
            return []
        batch = [t for t in live if t.joins(live[0])]
        taken = set(map(id, batch))
        self._queue = deque(t for t in self._queue if id(t) not in taken)
        return batch

    async def _batch(self) -> None:
        """Lead one batch: settle, take, generate, hand out."""
        for _ in range(SETTLE):
            await asyncio.sleep(0)
        batch = self._take()
        if not batch:
            return
        self.batches.append(len(batch))
        got: dict[int, Completion] = {}
        first = batch[0]
        try:
            await self.engine.generate([t.request for t in batch], first.params, first.seed,
                                       got.__setitem__)
        except asyncio.CancelledError:  # this leader's task: the others wait for the next
            self._queue.extendleft(t for t in reversed(batch) if not t.fut.done())
            raise
        except Exception as exc:
            for t in batch:
                if not t.fut.done():
                    t.fut.set_exception(exc)
            return
        for j, t in enumerate(batch):
            if not t.fut.done():
                t.fut.set_result(got.get(j))


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The exception a call of independent episodes raises for their failures: the worker's
    (WorkerLost, WorkerTimeout) first, then a Superseded, else the first."""
    leaves: list[BaseException] = []

    def walk(g: BaseExceptionGroup[BaseException]) -> None:
        for e in g.exceptions:
            if isinstance(e, BaseExceptionGroup):
                walk(e)
            else:
                leaves.append(e)

    walk(group)
    for kind in ((WorkerLost, WorkerTimeout), (Superseded,)):
        for e in leaves:
            if isinstance(e, kind):
                return e
    return leaves[0]


__all__ = ["SETTLE", "TurnBatcher", "first_error"]
