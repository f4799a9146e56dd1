"""The seam wrappers of a chaos session: where an injected fault meets the running pipeline.

:class:`~freshroll.chaos.inject.Injector` wraps a run's parts (``ChaosSession.wrap``)::

    engine factory  -> FaultyFactory   hand-off ``start_worker``; every engine it makes is
                                       wrapped, per worker epoch
    each engine     -> FaultyEngine    hand-offs ``load_weights``, ``generate`` and ``emit``
                                       (each completion); kills, stalls, zombies, held
                                       requests, message faults (:class:`Gen`: one call)
    scorer          -> FaultyScorer    hand-off ``score``; a lost reward worker, slow calls
    trainer         -> FaultyTrainer   hand-offs ``step`` and ``commit`` (``before_commit``,
                                       between the lease and the commit); a stalled or
                                       instant step, a crash at the commit

The wrappers decide nothing: they count hand-offs and ask the injector (the :class:`Control`
protocol) what to do, so every choice is the injector's, seeded and recorded. Without an
armed fault a wrapper forwards the call unchanged, adding no await, task or timer.

How the faults of one generate call work (:class:`Gen`):

* **dies** (``die``): the pool's task awaiting the call is cancelled (on the next loop
  turn), which cancels the engine's call, and the call raises
  :class:`~freshroll.errors.WorkerLost` instead; whatever its engine emits later is dropped
  (a dead worker sends nothing). ``kill_at``: it dies once that many completions were
  emitted.
* **stalls** (``stall``): its completions are held, and the call does not return; when the
  pool's timeout cancels it, the engine's call goes on (a zombie, like a thread the thread
  adapter abandons) and the held completions are delivered ``delay_s`` after the engine was
  closed, i.e. after its worker epoch was fenced: the buffer records them ``rejected``.
* **holds a request** (``drop``): that request is never emitted; the call returns only once
  the pool cancelled it (a group deadline), or the pool's timeout cancels the call.
* **reorders** (``reorder``): its completions are delivered in reverse order when the engine's
  call returns.

An engine with a real fault (``async def kill(self)``, e.g. the Ray adapter's ``ray.kill``)
is killed for real instead of synthetically (:meth:`FaultyEngine.die_now`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol

from freshroll.engines.base import Completion, Killable
from freshroll.engines.seams import AsyncEngine, Emit, EngineFactory, GenRequest, SamplingParams
from freshroll.engines.weights import Weights
from freshroll.errors import WorkerLost
from freshroll.kernel.state import Lease
from freshroll.ledger.lineage import PolicyVersion
from freshroll.ports.seams import AsyncScorer, AsyncTrainer
from freshroll.rewards.calling import RewardState
from freshroll.rewards.scoring import Score
from freshroll.rewards.tasks import Prompt


class Control(Protocol):
    """What the wrappers ask the injector (:class:`~freshroll.chaos.inject.Injector`)."""

    closing: bool
    #: how long a zombie call waits for the rest of its results after its fence
    zombie_s: float

    def handoff(self, name: str, engine: FaultyEngine | None = None,
                gen: Gen | None = None) -> None:
        """Count one hand-off (may fire faults, with this engine / call as their context)."""

    def began(self, engine: FaultyEngine, gen: Gen) -> None:
        """A generate call begins: apply the faults armed for its worker."""

    def emitted(self, engine: FaultyEngine, gen: Gen, comp: Any) -> list[tuple[float, Any]]:
        """One completion emitted by an engine: what to deliver, each ``(delay_s, what)``."""
        ...

    def load_fault(self, engine: FaultyEngine) -> tuple[str | None, float]:
        """The fault of this weight load (``fail``, ``stall`` or None), and its extra delay."""
        ...

    def reward_fault(self) -> tuple[str | None, float]:
        """The fault of this reward call (``lost`` or None), and its slow-down factor."""
        ...

    def step_fault(self) -> tuple[float, bool]:
        """Seconds this trainer step stalls first, and whether it takes no time (a burst)."""
        ...

    def commit_fault(self) -> None:
        """The trainer is between its lease and its commit (a crash fires here)."""

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        """A detached task owned by the injector (cancelled when the run ends)."""
        ...

    def later(self, delay: float, fn: Any, *args: Any) -> None:
        """Call ``fn(*args)`` ``delay`` seconds from now, on the loop (cancelled at the end)."""


class Gen:
    """One generate call through a :class:`FaultyEngine` (see the module docstring)."""

    def __init__(self, engine: FaultyEngine, requests: Sequence[GenRequest], emit: Emit) -> None:
        self.engine, self.requests, self.emit = engine, requests, emit
        self.n = len(requests)
        self.count = 0  # completions emitted by the engine
        self.done: set[int] = set()  # indexes emitted by the engine
        self.owner = asyncio.current_task()  # the pool's task awaiting this call
        self.active = True  # the wrapper is still inside generate
        self.killed = False  # die() cancelled the owner (the CancelledError is ours)
        self.wake = asyncio.Event()
        self.dying: str | None = None  # why it dies (WorkerLost's message)
        self.kill_at: int | None = None
        self.death = ""  # the message of an armed kill
        self.held: list[tuple[int, Any]] | None = None  # stall / reorder: held completions
        self.stalled = False
        self.reorder = False
        self.drop: set[int] = set()  # hold_group: indexes never emitted
        self.freed: set[int] = set()  # dropped indexes the pool cancelled
        self.delayed = 0  # completions on their way (delay_messages)
        self.zombie: asyncio.Task[None] | None = None
        self.late_delay = 0.0

    @property
    def samples(self) -> list[str]:
        return [r.sample for r in self.requests]

    def open_index(self) -> int | None:
        """The first request not yet emitted (None: all were)."""
        return next((i for i in range(self.n) if i not in self.done and i not in self.drop),
                    None)

    def die(self, why: str) -> None:
        """The worker dies during this call: the call raises WorkerLost at its next await
        (the owner is cancelled on the next loop turn, so a die() from inside the call's own
        engine code or from another task acts the same way); nothing more is delivered."""
        if self.dying is not None:
            return
        self.dying = why
        self.engine.dead = self.engine.dead or why
        self.wake.set()
        asyncio.get_running_loop().call_soon(self._cancel_owner)

    def _cancel_owner(self) -> None:
        if self.active and self.owner is not None and not self.owner.done():
            self.killed = True
            self.owner.cancel()

    def own_cancel(self) -> bool:
        """Whether the CancelledError being handled is die()'s (then it is withdrawn)."""
        if not self.killed:
            return False
        self.killed = False
        me = asyncio.current_task()
        return me is not None and me.uncancel() == 0

    def arm_kill(self, why: str) -> None:
        """Die once half of the call was emitted (at once for a call of one request)."""
        self.death = why
        self.kill_at = self.count + (self.n - self.count) // 2
        if self.kill_at <= self.count:
            self.die(why)

    def stall(self, delay_s: float) -> None:
        """Hold every completion from now on; deliver them after the epoch is fenced."""
        self.stalled, self.late_delay = True, delay_s
        if self.held is None:
            self.held = []

    def hold_back(self, i: int) -> None:
        self.drop.add(i)

    def reverse(self) -> None:
        self.reorder = True
        if self.held is None:
            self.held = []

    # -- the emit callback the engine calls --------------------------------------------------
    def on_emit(self, i: int, comp: Any) -> None:
        engine = self.engine
        if self.dying is not None or engine.dead is not None:
            return  # a dead worker sends nothing
        if i in self.done:  # the engine emitted it twice: the buffer decides
            self.emit(i, comp)
            return
        self.done.add(i)
        self.count += 1
        if self.stalled:
            self.wake.set()  # a zombie waits for all of its results
        deliveries = engine.ctl.emitted(engine, self, comp)  # may fire faults on this call
        if self.dying is not None or engine.dead is not None or i in self.drop:
            return
        for delay, what in deliveries:
            if self.held is not None:
                self.held.append((i, what))
            elif delay > 0:
                self.delayed += 1
                engine.ctl.later(delay, self._arrive, i, what)
            else:
                self.emit(i, what)
        if self.kill_at is not None and self.count >= self.kill_at:
            self.die(self.death)

    def _arrive(self, i: int, what: Any) -> None:
        self.delayed -= 1
        self.emit(i, what)
        self.wake.set()

    def cancelled(self, samples: set[str]) -> None:
        """The pool cancelled these samples (a group deadline)."""
        for i in self.drop:
            if self.requests[i].sample in samples:
                self.freed.add(i)
        self.wake.set()

    # -- after the engine's call returned ------------------------------------------------------
    def _blocked(self) -> bool:
        """Whether the call must not return yet."""
        if self.dying is not None:
            return False
        if self.stalled:
            return True
        if self.reorder and self.held is not None:
            held, self.held = self.held, None
            for i, what in reversed(held):
                self.emit(i, what)
        return bool(self.drop - self.freed) or self.delayed > 0

    async def _zombie(self) -> None:
        """The call was abandoned (timed out): its engine goes on (it is closed only after
        this), so the call's results still come (a thread adapter delivers an abandoned
        call's results when its thread returns). They are delivered after the fence (the
        engine closed) and once all came (at most ``ctl.zombie_s`` more), ``late_delay``
        later."""
        try:
            await self.engine.closed.wait()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.engine.ctl.zombie_s):
                    while len(self.done) < self.n:
                        self.wake.clear()
                        await self.wake.wait()
            await asyncio.sleep(self.late_delay)
        finally:
            held, self.held, self.stalled = self.held or [], None, False
            if not self.engine.ctl.closing:
                for i, what in held:
                    self.emit(i, what)


class FaultyEngine:
    """One worker epoch's engine, wrapped (an :class:`~freshroll.engines.seams.AsyncEngine`)."""

    def __init__(self, ctl: Control, name: str, inner: AsyncEngine) -> None:
        self.ctl, self.name, self.inner = ctl, name, inner
        self.continuous = inner.continuous
        self.calls: list[Gen] = []  # live calls, in start order
        self.dead: str | None = None  # why the engine died (synthetic kill)
        self.closed = asyncio.Event()
        self.zombies: list[asyncio.Task[None]] = []

    def __getattr__(self, name: str) -> Any:  # stats(), timeline, ...: the inner engine's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def real_kill(self) -> bool:
        return isinstance(self.inner, Killable)

    def die_now(self, why: str) -> str:
        """The worker dies now: for real if its engine can (``kill()``), else every call
        raises WorkerLost (and so does the next one). Returns what was done."""
        if self.real_kill:
            self.ctl.spawn(self._real_kill())
            return f"killed {self.name} for real ({type(self.inner).__name__}.kill())"
        self.dead = why
        running = [g for g in self.calls if g.dying is None]
        for gen in running:
            gen.die(why)
        emitted = ", ".join(f"{g.count} of {g.n}" for g in running)
        return (f"killed {self.name} with {len(running)} call(s) running"
                + (f" ({emitted} emitted)" if running else ""))

    async def _real_kill(self) -> None:
        await self.inner.kill()  # type: ignore[attr-defined]  # real_kill: it has one

    async def generate(
        self, requests: Sequence[GenRequest], params: SamplingParams, seed: int, emit: Emit,
    ) -> None:
        if self.dead is not None:
            raise WorkerLost(self.dead)
        gen = Gen(self, requests, emit)
        self.calls.append(gen)
        try:
            self.ctl.handoff("generate", self, gen)
            self.ctl.began(self, gen)
            try:
                if gen.dying is None:  # awaited in the pool's task: no task of its own
                    await self.inner.generate(requests, params, seed, gen.on_emit)
                while gen.dying is None and gen._blocked():
                    gen.wake.clear()
                    await gen.wake.wait()
            except asyncio.CancelledError:
                if not gen.own_cancel():
                    self._abandon(gen)
                    raise
            if gen.dying is not None:
                raise WorkerLost(gen.dying)
        finally:
            gen.active = False
            self.calls.remove(gen)

    def _abandon(self, gen: Gen) -> None:
        """The pool cancelled the call (its timeout, a stop, the run's end), which cancelled
        the engine's call: a stalled call becomes a zombie (its engine's work goes on)."""
        if gen.stalled and gen.dying is None and not self.ctl.closing:
            zombie = self.ctl.spawn(gen._zombie())
            if zombie is not None:
                gen.zombie = zombie
                self.zombies.append(zombie)

    async def load_weights(self, weights: Weights) -> float:
        if self.dead is not None:
            raise WorkerLost(self.dead)
        self.ctl.handoff("load_weights", self)
        fault, delay = self.ctl.load_fault(self)
        if fault == "fail":
            raise WorkerLost(f"chaos: worker {self.name}'s weight load failed (its worker is "
                             "lost)")
        secs = await self.inner.load_weights(weights)
        if fault == "stall":
            await asyncio.Event().wait()  # never returns: limits.weights_timeout_s ends it
        if delay > 0:
            await asyncio.sleep(delay)
        return secs + delay

    async def cancel(self, samples: Sequence[str]) -> None:
        want = set(samples)
        for gen in self.calls:
            gen.cancelled(want)
        await self.inner.cancel(samples)

    async def close(self) -> None:
        """Idempotent. An engine with a zombie call is closed once the zombie delivered."""
        if self.closed.is_set():
            return
        self.closed.set()
        live = [z for z in self.zombies if not z.done()]
        if live and not self.ctl.closing and self.ctl.spawn(self._close_later(live)) is not None:
            return
        await self.inner.close()

    async def _close_later(self, zombies: list[asyncio.Task[None]]) -> None:
        try:
            await asyncio.wait(zombies)
        finally:
            await self.inner.close()


class FaultyFactory:
    """The engine factory: every engine it makes is a :class:`FaultyEngine`."""

    def __init__(self, ctl: Control, inner: EngineFactory) -> None:
        self.ctl, self.inner = ctl, inner
        self.engines: dict[str, FaultyEngine] = {}  # the newest engine of each worker

    async def __call__(self, name: str) -> AsyncEngine:
        self.ctl.handoff("start_worker")
        engine = FaultyEngine(self.ctl, name, await self.inner(name))
        self.engines[name] = engine
        return engine


class FaultyScorer:
    """The scorer: a reward worker lost before it answers, slow reward calls."""

    def __init__(self, ctl: Control, inner: AsyncScorer) -> None:
        self.ctl, self.inner = ctl, inner
        self.version, self.names = inner.version, inner.names
        self.concurrency, self.max_batch = inner.concurrency, inner.max_batch

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def score(
        self, prompts: Sequence[Prompt], completions: Sequence[Completion], state: RewardState,
    ) -> list[Score]:
        self.ctl.handoff("score")
        fault, factor = self.ctl.reward_fault()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        scores = await self.inner.score(prompts, completions, state)
        if factor > 1:
            await asyncio.sleep((loop.time() - t0) * (factor - 1))
        if fault == "lost":
            raise WorkerLost(f"chaos: the reward worker of a call of {len(completions)} "
                             "was lost before it answered")
        return scores


class FaultyTrainer:
    """The trainer: a stalled step, steps that take no time (a burst), a crash at commit."""

    def __init__(self, ctl: Control, inner: AsyncTrainer) -> None:
        self.ctl, self.inner = ctl, inner
        self.settings_digest = inner.settings_digest

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def step(self, lease: Lease) -> tuple[dict[str, float], str]:
        self.ctl.handoff("step")
        stall_s, instant = self.ctl.step_fault()
        if stall_s > 0:
            await asyncio.sleep(stall_s)
        if not instant or not hasattr(self.inner, "step_seconds"):
            return await self.inner.step(lease)
        # the simulated trainer's step time comes from step_seconds: zero for this step
        self.inner.step_seconds = _no_time
        try:
            return await self.inner.step(lease)
        finally:
            with contextlib.suppress(AttributeError):
                del self.inner.step_seconds

    async def before_commit(self, version: PolicyVersion) -> None:
        self.ctl.handoff("commit")
        self.ctl.commit_fault()
        await self.inner.before_commit(version)

    def weights(self) -> Weights:
        return self.inner.weights()


def _no_time(step: int, tokens: int) -> float:
    return 0.0


__all__ = ["Control", "FaultyEngine", "FaultyFactory", "FaultyScorer", "FaultyTrainer", "Gen"]
