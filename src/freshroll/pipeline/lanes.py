"""A continuous worker epoch's lanes: overlapping generate calls, one watchdog for them all.

A worker whose engine is continuous keeps up to ``concurrency`` requests in flight in
several overlapping episode calls. The pool's dispatcher starts each call as a lane
(:meth:`Lanes.start`: a task owned by the epoch's :class:`Lanes`, not a task group: its
bookkeeping costs more per call). When its call ends, a lane starts the next one itself if
the pool gives it one (``refill``: a free slot, a queued request, nothing else to do first),
so a busy worker needs no new task and no dispatcher wake-up per call.

Timeouts: one watchdog per epoch, not one timer per call. The oldest live call past
``limits.generate_timeout_s`` is cancelled as expired (its call returns a WorkerTimeout) and
the watchdog ends: the worker is replaced. A lane's failure (WorkerLost / WorkerTimeout) is
the worker's ``failure``; a lane task that fails unexpectedly (a bug, an interrupt) is kept
in ``crashed`` and raised by the dispatcher. When the epoch ends every task is cancelled and
awaited (:meth:`Lanes.close`); a lost worker's live calls are cancelled at once
(:meth:`Lanes.cancel_calls`: their results will be rejected).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from freshroll.engines.seams import AsyncEngine
from freshroll.pipeline.calls import Call, Worker

#: runs one call on a worker's engine; its failure (replace the worker) or None
Generate = Callable[[Worker, AsyncEngine, Call], Awaitable[BaseException | None]]


class Lanes:
    """The lanes of one continuous epoch of worker ``w`` (see the module doc); the epoch's
    live calls in start order are ``order`` (also ``w.live``: the pool's cancels read it)."""

    def __init__(self, w: Worker, engine: AsyncEngine, timeout_s: float, generate: Generate,
                 refill: Callable[[Worker], Call | None]) -> None:
        self.w, self.engine, self.tasks = w, engine, set[asyncio.Task[None]]()
        self.crashed: BaseException | None = None
        self.order: deque[Call] = deque()  # live calls in start order (the watchdog's queue)
        w.live = self.order
        self._watch = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._timeout_s, self._generate, self._refill = timeout_s, generate, refill
        self._spawn(self._watchdog())

    def start(self, call: Call) -> None:
        """A new lane, running ``call`` first."""
        self._track(call)
        self.w.calls += 1
        call.task = self._spawn(self._lane(call))

    def cancel_calls(self) -> None:
        """The worker is lost: its live calls end (their results will be rejected)."""
        for call in self.order:
            if not call.over and call.task is not None:
                call.task.cancel()
        self.order.clear()

    async def close(self) -> None:
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _lane(self, call: Call) -> None:
        """Runs calls one after another, until a call fails or the pool has no next one."""
        w = self.w
        try:
            while True:
                exc = await self._generate(w, self.engine, call)
                if exc is not None:
                    if w.failure is None:
                        w.failure = exc
                    break
                nxt = self._refill(w)
                if nxt is None:
                    break
                call = nxt
                call.task = asyncio.current_task()
                self._track(call)
        finally:
            w.calls -= 1
        w.wake.set()

    def _track(self, call: Call) -> None:
        order = self.order
        while order and order[0].over:
            order.popleft()
        call.started = self._loop.time()
        order.append(call)
        self._watch.set()

    async def _watchdog(self) -> None:
        """The oldest live call past the timeout is cancelled as expired."""
        order, watch = self.order, self._watch
        while True:
            while order and order[0].over:
                order.popleft()
            if not order:
                watch.clear()
                await watch.wait()
                continue
            head = order[0]
            delay = head.started + self._timeout_s - self._loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            head.expired = True
            assert head.task is not None
            head.task.cancel()
            return

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = self._loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self.crashed is None:
            self.crashed = task.exception()
            self.w.wake.set()


__all__ = ["Generate", "Lanes"]
