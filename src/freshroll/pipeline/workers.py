"""The worker pool: inference workers that are added, retired, stopped and replaced mid-run.

Each worker is one task of the pipeline's task group, running an engine made by the run's
:data:`~freshroll.engines.seams.EngineFactory`. Its life::

    worker_started (epoch e)  ->  factory(name)  ->  worker_ready  ->  serve  ->  ...
        ... retire:  takes no new request, finishes what it runs, worker_fenced "retired"
        ... stop:    worker_fenced "stopped" at once: its running attempts are re-issued
        ... lost / timed out: worker_fenced "lost"/"timeout" (attempts re-issued), then a new
                     epoch and a new engine from the factory (at most MAX_RESTARTS per worker)

``worker_started`` is written when the pool asks for the worker, so a worker's active time
in the ledger (``worker_started`` to its ``worker_fenced``, or the run's close) includes its
start-up. Names are ``w<n>``, unique across the run: a retired or stopped name is never used
again; on ``--resume`` the workers the dead process had running come back under their names
(new epochs), and new ones get the next free ``n``.

Serving: before starting requests a worker loads the newest published weights
(``limits.weights_timeout_s``). A call's requests go to the run's episode workflow
(``rollout.workflow``, :mod:`freshroll.engines.episodes`), which drives the engine and emits
one completion per request (``single_turn``: one generate call); the pool never knows what
an episode is. An engine with ``continuous = True`` keeps up to
``concurrency`` requests in flight, a new generate call starting as soon as slots free
(several calls overlap: the worker's lanes, :mod:`freshroll.pipeline.lanes`); with
``continuous = False`` one call at a time of at most ``concurrency`` requests (unless the
workflow batches its episodes' turns itself, ``BatchesTurns``: then in lanes too, a new
version loading once the live calls ended). One call,
from its start to its end, is :mod:`freshroll.pipeline.calls`'s. Each
completion the engine emits goes to ``buf.complete`` (payload only when it has token ids)
and, if accepted, to the reward stage. A generate call that does not return within
``limits.generate_timeout_s`` is a :class:`~freshroll.errors.WorkerTimeout`; whatever it
emits later is rejected (its epoch is fenced). Any other failure of a call ends its requests
(``generation_error``), counted against the worker's failure budget.

What an engine hands back is checked, never trusted: a malformed completion (not a
``Completion``, a token count that is not a non-negative integer, text that is not a string,
a ``gen_s`` that is not a finite number >= 0: :func:`~freshroll.pipeline.calls.malformed`)
ends its attempt as an ``invalid`` discard naming what was wrong, counted against the
worker's failure budget; the pool goes on. A policy version the ledger never made current
(published out of band) is refused: the workers keep the last version the ledger committed,
and stderr says so once.

Wake-ups are targeted (no broadcast per sample): a worker sleeps on its own event; it is
woken by its own completions, by queued requests (one idle worker at a time, each waking
the next while requests remain), by a new policy version (idle workers), by a settings
change and by retire/stop.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

from freshroll import unsafe
from freshroll.control.breaker import quote
from freshroll.engines.base import SwapsInFlight
from freshroll.engines.episodes import EpisodeWorkflow, HoldsEngines, overlaps_calls
from freshroll.engines.seams import AsyncEngine, EngineNotRestartable, SamplingParams
from freshroll.engines.weights import Weights
from freshroll.envs.registry import workflow_for
from freshroll.errors import Interrupted, RunFailed, WorkerLost, WorkerTimeout
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion, RequestId, SampleId
from freshroll.pipeline.calls import Call, CallRunner, Worker, generation_seed
from freshroll.pipeline.lanes import Lanes

if TYPE_CHECKING:
    from collections.abc import Callable

    from freshroll.engines.seams import EngineFactory
    from freshroll.pipeline.context import Published, PublishedNow, RewardInbox, RunContext

MAX_RESTARTS = 3  # per worker, per run (lost or timed out)


class WorkerPool:
    """The pipeline's inference workers (owned by its task group, :meth:`attach`).

    Ports: the run's context, the reward stage's inbox (accepted completions), the engine
    factory, the version to load (``published_now``) and ``on_stopped`` (a stop at target
    ended running attempts: the over-provisioning task cancels them), and the episode
    ``workflow`` to drive (None: the one ``rollout.workflow`` names)."""

    def __init__(self, ctx: RunContext, inbox: RewardInbox, engine_factory: EngineFactory,
                 published_now: PublishedNow, on_stopped: Callable[[], None],
                 workflow: EpisodeWorkflow | None = None) -> None:
        self.ctx, self.buf, self.engine_factory = ctx, ctx.buf, engine_factory
        self.published_now = published_now
        self._tg: asyncio.TaskGroup | None = None  # the pipeline's (attach)
        self.concurrency = 0  # requests per worker: steering sets it before the first worker
        self.active: dict[str, Worker] = {}  # starting or serving, not retiring
        self.leaving: dict[str, Worker] = {}  # retiring (finishing what they run)
        self._idle: dict[str, Worker] = {}  # waiting for queued requests
        self._swapping: dict[str, Worker] = {}  # lock-step, in a call that takes weights
        self._restarts: dict[str, int] = {}
        self.startups: list[float] = []  # measured engine start-up times (switch cost)
        known = self.buf.worker_names()
        self._reuse = [n for n in known if n not in self.buf.retired]
        self._next = 1 + max((int(n[1:]) for n in known if n[:1] == "w" and n[1:].isdigit()),
                             default=-1)
        ro = ctx.cfg.rollout
        self.params = SamplingParams(ro.max_new_tokens, ro.temperature, ro.top_p, ro.top_k,
                                     ro.min_p, ro.repetition_penalty)
        #: drives the engine for each call (``workflow``: as the pipeline's hooks returned it)
        self.workflow = workflow if workflow is not None else workflow_for(ctx.cfg)
        self.calls = CallRunner(ctx, inbox, on_stopped, self.params, self.workflow,
                                self._slot_freed, self.requests_queued)
        self._trusted: Published | None = None  # the newest published version the ledger has
        self._refused: set[str] = set()  # out-of-band versions refused (written once each)

    # -- membership ----------------------------------------------------------------------
    def _new_name(self) -> str:
        if self._reuse:
            return self._reuse.pop(0)
        name = f"w{self._next}"
        self._next += 1
        return name

    def attach(self, tg: asyncio.TaskGroup) -> None:
        """Workers from now on are tasks of ``tg`` (the pipeline's task group)."""
        self._tg = tg

    def add(self) -> Worker:
        """Start one more worker (its engine from the factory)."""
        assert self._tg is not None, "attach the pool to a task group first"
        w = Worker(self._new_name())
        self.active[w.name] = w
        w.task = self._tg.create_task(self._run(w), name=f"worker {w.name}")
        return w

    def retire(self, name: str) -> None:
        """Stop giving ``name`` requests; it finishes what it runs, then is fenced
        ``retired`` (nothing can land later) and its engine closed."""
        w = self.active.pop(name)
        self.leaving[name] = w
        self._idle.pop(name, None)
        w.retiring = True
        w.wake.set()

    async def stop(self, name: str) -> None:
        """Stop ``name`` hard: fenced ``stopped`` at once, its running attempts re-issued."""
        w = self.active.pop(name, None) or self.leaving.pop(name)
        self._idle.pop(name, None)
        if w.epoch >= 0 and not w.fenced:
            self._fence(w, "stopped")
        assert w.task is not None
        w.task.cancel()
        await asyncio.wait([w.task])

    def resize(self, n: int) -> None:
        """``n`` active workers: add new ones, or retire the newest."""
        while len(self.active) < n:
            self.add()
        while len(self.active) > n:
            self.retire(next(reversed(self.active)))

    def set_concurrency(self, c: int) -> None:
        if c != self.concurrency:
            self.concurrency = c
            for w in self.active.values():
                w.wake.set()

    async def started(self) -> None:
        """Wait until every active worker's engine is up."""
        for w in list(self.active.values()):
            await w.ready.wait()

    async def cancel(self, name: str, epoch: int, samples: list[SampleId]) -> int:
        """Cancel ``samples`` (already ended in the buffer, a group deadline) on worker
        ``name``'s epoch ``epoch``; returns how many slots this freed.

        A continuous engine drops them (:meth:`AsyncEngine.cancel`): their slots are free
        now (the worker's and the calls' counts; a call left with nothing pending returns
        and its lane refills) and the worker may start queued requests. A lock-step engine
        cannot drop members of its batch: they stay in its call, and their late results are
        rejected by the buffer. An epoch that is no longer live (fenced, replaced) is
        skipped: its engine is going away."""
        w = self.active.get(name) or self.leaving.get(name)
        if w is None or w.epoch != epoch or w.fenced or w.engine is None:
            return 0
        engine, freed, partial = w.engine, 0, False
        if w.live is not None:
            want = set(samples)
            for call in w.live:
                if call.over or call.epoch != epoch:
                    continue
                hit = 0
                for i, sid in enumerate(call.sids):
                    if sid in want and not call.emitted[i]:
                        call.emitted[i] = True  # counted now: a late emit is not counted again
                        hit += 1
                call.pending -= hit
                freed += hit
                partial = partial or (hit > 0 and call.pending > 0)
            w.inflight -= freed
        await engine.cancel(samples)
        if partial and w.epoch == epoch and not w.fenced:
            self._slot_freed(w)  # a call with nothing left returns: its lane refills instead
        return freed

    # -- wake-ups ------------------------------------------------------------------------
    def requests_queued(self) -> None:
        """Requests were queued: wake one idle worker (it wakes the next if some remain)."""
        if self._idle:
            name = next(iter(self._idle))
            self._idle.pop(name).wake.set()

    def note_committed(self) -> None:
        """The version published now was just committed: the fallback of a version refused
        later."""
        self._published()

    def version_published(self) -> None:
        """A new policy version: idle workers load it now, and so do lock-step workers whose
        engine takes weights under a running call (:meth:`_swapping_call`)."""
        idle, self._idle = self._idle, {}
        for w in (*idle.values(), *self._swapping.values()):
            w.wake.set()

    # -- a worker's life -----------------------------------------------------------------
    async def _run(self, w: Worker) -> None:
        try:
            await self._start(w)
            while (exc := await self._serve(w)) is not None:
                await self._replace(w, exc)
        finally:
            self._idle.pop(w.name, None)
            self.leaving.pop(w.name, None)
            if self.active.get(w.name) is w:
                del self.active[w.name]
            engine, w.engine = w.engine, None
            if engine is not None:
                await self._close(engine)

    async def _close(self, engine: AsyncEngine) -> None:
        """Close a worker's engine, after the workflow released what it holds for it."""
        try:
            if isinstance(self.workflow, HoldsEngines):
                await self.workflow.release(engine)
        finally:
            await engine.close()

    async def _start(self, w: Worker) -> None:
        buf, lim = self.buf, self.ctx.limits
        w.epoch, w.fenced, w.inflight, w.loaded, w.failure, w.loads = (
            buf.register_worker(w.name), False, 0, None, None, [None])
        w.done, w.blocked_s, w.blocked_since, w.ready_at = 0, 0.0, None, None  # per epoch
        t0 = buf.clock.now()
        try:
            with self.ctx.waits.waiting(f"{w.name} start", lim.worker_start_timeout_s):
                async with asyncio.timeout(unsafe.timeout(lim.worker_start_timeout_s)) as cm:
                    w.engine = await self.engine_factory(w.name)
        except TimeoutError as exc:
            if not cm.expired():
                raise
            raise WorkerTimeout(f"worker {w.name} start did not return within "
                                f"{lim.worker_start_timeout_s:g} s") from exc
        startup = buf.clock.now() - t0
        self.startups.append(startup)
        w.ready_at = buf.clock.now()
        buf.record(ev.WorkerReady(ts=w.ready_at, worker=w.name, epoch=w.epoch,
                                  startup_s=startup))
        w.ready.set()

    def _fence(self, w: Worker, reason: str, detail: str = "") -> None:
        w.fenced = True
        self.buf.fence_worker(w.name, w.epoch, reason, detail)
        self.ctx.notify()
        self.requests_queued()

    async def _replace(self, w: Worker, exc: BaseException) -> None:
        """A worker died or timed out: fence its epoch (running attempts re-issued), then a
        new epoch with a new engine from the factory.

        Gives up (:class:`RunFailed`, ending the run) after ``MAX_RESTARTS`` restarts of one
        worker, at once for an engine that cannot restart, or if the restart fails.
        """
        reason = "timeout" if isinstance(exc, WorkerTimeout) else "lost"
        self._fence(w, reason, quote(f"{type(exc).__name__}: {exc}"))
        n = self._restarts[w.name] = self._restarts.get(w.name, 0) + 1
        what = f"inference worker {w.name!r} {reason}: {type(exc).__name__}: {exc}"
        if n > MAX_RESTARTS:
            raise RunFailed(f"{what}; it was restarted {MAX_RESTARTS} times already") from exc
        engine, w.engine = w.engine, None
        if engine is not None:
            await self._close(engine)
        try:
            await self._start(w)
        except EngineNotRestartable:
            raise RunFailed(f"{what}; its engine cannot be restarted") from exc
        except Interrupted:
            raise
        except Exception as again:
            raise RunFailed(f"{what}; restarting it failed: {type(again).__name__}: {again}") \
                from again

    async def _serve(self, w: Worker) -> BaseException | None:
        """Serve until retired (None) or lost/timed out (the error, to replace it)."""
        assert w.engine is not None
        if not (w.engine.continuous or overlaps_calls(self.workflow)):
            return await self._dispatch(w, w.engine, None)
        timeout_s = unsafe.timeout(self.ctx.limits.generate_timeout_s)
        lanes = Lanes(w, w.engine, timeout_s, self.calls.generate, self._refill)
        try:
            return await self._dispatch(w, w.engine, lanes)
        finally:
            await lanes.close()

    async def _dispatch(self, w: Worker, engine: AsyncEngine,
                        lanes: Lanes | None) -> BaseException | None:
        buf, ctx = self.buf, self.ctx
        w.calls = 0
        while True:
            w.wake.clear()
            self._idle.pop(w.name, None)
            if w.blocked_since is not None:
                w.blocked_s += (buf.clock.now() - w.blocked_since) * w.blocked_share
                w.blocked_since = None
            if lanes is not None and lanes.crashed is not None:
                raise lanes.crashed  # a call task failed unexpectedly (a bug, an interrupt)
            if w.failure is not None:
                return self._end_calls(w, lanes)
            if w.retiring:
                if w.inflight == 0 and w.calls == 0:
                    w.fenced = True
                    buf.fence_worker(w.name, w.epoch, "retired")
                    ctx.notify()
                    return None
                await w.wake.wait()
                continue
            pub = self._published()
            if w.loaded is not pub.version and (w.calls == 0 or engine.continuous
                                                or swaps_in_flight(engine)):
                if pub.weights is not None:
                    w.loads.append(pub.version)  # before the swap: a token of it may come first
                    exc = await self._load(w, engine, pub.version, pub.weights)
                    if exc is not None:
                        return self._end_calls(w, lanes, exc)
                elif w.loads == [None]:  # the engine's own weights are this version
                    w.loads[0] = pub.version
                w.loaded = pub.version
                continue
            if w.loaded is not pub.version and lanes is not None:  # a lock-step engine's
                await w.wake.wait()  # overlapping calls end on the old weights, then it loads
                continue
            free = self.concurrency - w.inflight
            rids = buf.take_requests(free) if free > 0 else []
            if not rids:
                if free > 0:
                    self._idle[w.name] = w
                    if buf.capacity() <= 0:
                        w.blocked_since = buf.clock.now()
                        w.blocked_share = free / self.concurrency
                elif buf.next_request() is not None:
                    self.requests_queued()  # pass the wake-up on: this one has no free slot
                await w.wake.wait()
                continue
            call = self._begin(w, rids)
            if lanes is None:
                exc = await (self._swapping_call(w, engine, call)
                             if swaps_in_flight(engine)
                             else self.calls.generate(w, engine, call))
                if exc is not None:
                    return exc
            else:
                lanes.start(call)

    async def _swapping_call(self, w: Worker, engine: AsyncEngine,
                             call: Call) -> BaseException | None:
        """A lock-step call on an engine that takes weights under it (``rollout.on_update``
        continue / abort on the HF engine): each version published meanwhile is loaded beside
        the call (the engine swaps between two decode steps), then the call's outcome."""
        task = asyncio.ensure_future(self.calls.generate(w, engine, call))
        self._swapping[w.name] = w
        try:
            while not task.done():
                pub = self._published()
                if w.loaded is not pub.version and pub.weights is not None:
                    w.loads.append(pub.version)  # before the swap: a token may come first
                    exc = await self._load(w, engine, pub.version, pub.weights)
                    if exc is not None:
                        return exc  # the finally cancels the call: its worker is lost
                    w.loaded = pub.version
                    continue
                w.wake.clear()
                woken = asyncio.ensure_future(w.wake.wait())
                try:
                    await asyncio.wait([task, woken], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
            return task.result()
        finally:
            self._swapping.pop(w.name, None)
            if not task.done():
                task.cancel()
                await asyncio.wait([task])

    def _begin(self, w: Worker, rids: list[RequestId]) -> Call:
        """Start attempts of ``rids`` on the worker's epoch: one call's worth, named by its
        first sample id, with the sampling seed that id and the run seed fix (both recorded
        on every member's ``started``: generation can be replayed)."""
        buf = self.buf
        assert w.loaded is not None
        first = buf.next_sample(rids[0])
        seed = generation_seed(self.ctx.cfg.run.seed, first)
        name, epoch, loaded, start = w.name, w.epoch, w.loaded, buf.start
        sids = [start(r, name, epoch, loaded, first, seed) for r in rids]
        if buf.next_request() is not None:
            self.requests_queued()
        call = Call(sids, w.epoch, w.loaded, len(sids), [False] * len(sids), seed=seed)
        w.inflight += call.pending
        return call

    def _published(self) -> Published:
        """The version workers load: ``published_now()``, unless the ledger never made it
        current (published out of band: a bug, or a chaos fault). Such a version is refused,
        written to stderr once, and the workers keep the last version the ledger committed;
        without this, ``buf.start`` would raise StateError and end the run."""
        pub = self.published_now()
        assert pub is not None
        if pub is self._trusted:
            return pub
        current = self.buf.version
        if self._trusted is None or (current is not None and str(pub.version) == str(current)):
            self._trusted = pub
            return pub
        text = str(pub.version)
        if text not in self._refused:
            self._refused.add(text)
            sys.stderr.write(f"warning: policy version {text} was published to the workers but "
                             f"never committed to the ledger: refused, the workers keep "
                             f"{self._trusted.version}\n")
        return self._trusted

    def _refill(self, w: Worker) -> Call | None:
        """The next call a lane may start now, or None (the dispatcher decides)."""
        pub = self._published()
        if w.retiring or w.fenced or w.failure is not None or w.loaded is not pub.version:
            return None
        free = self.concurrency - w.inflight
        rids = self.buf.take_requests(free) if free > 0 else []
        return self._begin(w, rids) if rids else None

    def _end_calls(self, w: Worker, lanes: Lanes | None,
                   exc: BaseException | None = None) -> BaseException:
        """The worker is lost: its live calls end (their results will be rejected)."""
        failure = exc if exc is not None else w.failure
        w.failure = None
        if lanes is not None:
            lanes.cancel_calls()
        assert failure is not None
        return failure

    async def _load(self, w: Worker, engine: AsyncEngine, version: PolicyVersion,
                    weights: Weights) -> BaseException | None:
        lim = self.ctx.limits
        try:
            with self.ctx.waits.waiting(f"{w.name} load weights", lim.weights_timeout_s):
                async with asyncio.timeout(unsafe.timeout(lim.weights_timeout_s)) as cm:
                    secs = await engine.load_weights(weights)
        except TimeoutError:
            if not cm.expired():
                raise
            return WorkerTimeout(f"worker {w.name} weight load did not return within "
                                 f"{lim.weights_timeout_s:g} s")
        except (WorkerLost, WorkerTimeout) as exc:
            return exc
        self.buf.record(ev.WeightsLoaded(ts=self.buf.clock.now(), worker=w.name, epoch=w.epoch,
                                         version=str(version), transfer_s=secs))
        return None

    def _slot_freed(self, w: Worker) -> None:
        """A slot freed mid-call: with queued requests, the dispatcher starts one; without,
        the worker just becomes idle (woken when requests are queued), not woken for nothing."""
        buf = self.buf
        if buf.next_request() is not None or w.retiring:
            w.wake.set()
            return
        self._idle[w.name] = w
        now = buf.clock.now()
        if w.blocked_since is not None:  # still blocked, with one more free slot
            w.blocked_s += (now - w.blocked_since) * w.blocked_share
        elif buf.capacity() > 0:
            return
        w.blocked_since = now
        w.blocked_share = (self.concurrency - w.inflight) / self.concurrency

def swaps_in_flight(engine: AsyncEngine) -> bool:
    """The engine takes weights under a running call (:class:`SwapsInFlight`, set)."""
    return isinstance(engine, SwapsInFlight) and engine.swaps_in_flight


__all__ = ["MAX_RESTARTS", "Worker", "WorkerPool", "swaps_in_flight"]
