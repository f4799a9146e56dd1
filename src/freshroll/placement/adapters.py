"""Thread adapters: the blocking real components behind the async seams.

The pipeline awaits :mod:`freshroll.ports.seams`; the real components block (torch, user
reward code, Ray ``get``). Each adapter runs its component on a thread of its own and awaits
the result, so the event loop never blocks:

* :class:`ThreadEngine` wraps one :class:`~freshroll.engines.base.InferenceEngine` (HF, Ray):
  ``continuous = False`` (one lock-step call at a time). A lock-step batch cannot drop
  members: a cancelled request is still generated with its batch, but not emitted (the
  seam's promise). Its calls run on an
  :class:`~freshroll.ports.threads.AbandonableExecutor`. A Python thread cannot be
  cancelled: when the pipeline's timeout (or the run's end) cancels an awaited call, the
  adapter walks away from the thread (the next call gets a fresh one) and keeps the call's
  ``emit``: if the abandoned call returns after all, its completions are emitted on the loop,
  where the buffer records them ``rejected`` under the fenced epoch. :meth:`ThreadEngine.close`
  waits for a call cancelled by the run's end until that call's own timeout, never longer
  (a call that timed out is not waited for); an engine with a process of its own (``stop()``:
  a Ray actor, a child process) is stopped then, so a retired or replaced worker frees its
  CPUs (a replacement's ``restart()`` starts a new one).
* :class:`KillableThreadEngine`: the same for an engine in a process of its own (a Ray
  actor, whose blocking proxy has ``kill()``), plus ``async kill()``: the chaos harness's
  real ``kill_worker`` fault. The actor really dies; the call in flight (or the next one)
  raises :class:`~freshroll.errors.WorkerLost`, and the pool fences the epoch, re-issues
  its attempts and restarts the worker through the factory. An inline engine has no
  process of its own to kill and gets no ``kill`` (a fault injector then raises a
  synthetic loss, which ends an inline run: its engine cannot be restarted).
* :class:`ThreadEngineFactory` makes the engine of a new worker on a thread (model load,
  one at a time in this process; Ray actors start in parallel); asked again for the same
  name (a replacement after a loss or a timeout) it restarts the worker's blocking engine
  (``restart()``, e.g. a new Ray actor), or raises
  :class:`~freshroll.engines.seams.EngineNotRestartable` for an engine that has none.
* :class:`ThreadScorer` wraps the :class:`~freshroll.rewards.scoring.RewardSet`; a reward call
  stuck past ``limits.reward_timeout_s`` is abandoned the same way.
* :class:`ThreadTrainer` wraps the :class:`~freshroll.trainer.grpo.GRPOLearner`: the batch is
  read from the buffer on the loop (:func:`~freshroll.trainer.replay.train_samples`), the
  step, the weights digest and the publication of the new weights (``transfer``: a copy
  inline, a shared-memory slot or a Ray object for workers in processes of their own) run
  on the trainer thread, and ``before_commit`` (the Checkpointer's checkpoint) runs there too.
  Each is bounded by ``timeout_s`` (``limits.train_timeout_s``): a torch step on a thread
  cannot be interrupted, so one that does not return in time is abandoned (a daemon
  thread: it never holds the process at exit) and the run stops with
  :class:`~freshroll.errors.RunFailed` (resumable: nothing of the step was committed, and
  ``--resume`` trains it again from the last durable commit). :meth:`ThreadTrainer.close`
  waits for a step cancelled by the run's end until that step's own deadline, never longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import torch

from freshroll import unsafe
from freshroll.config.ops import LimitsSection
from freshroll.engines.base import (
    Completion,
    InferenceEngine,
    Killable,
    Restartable,
    Stoppable,
    SwapsInFlight,
)
from freshroll.engines.seams import Emit, EngineNotRestartable, GenRequest, SamplingParams
from freshroll.engines.weights import (
    Publishing,
    StateDict,
    Weights,
    WeightTransfer,
    publication_loader,
    state_dict_of,
)
from freshroll.errors import RunFailed, WorkerTimeout
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.state import Lease
from freshroll.ledger.lineage import PolicyVersion
from freshroll.ports.threads import (
    AbandonableExecutor,
    ModeGroup,
    SharedExecutor,
    StageExecutor,
)
from freshroll.ports.waits import seconds
from freshroll.rewards.calling import RewardState
from freshroll.rewards.scoring import RewardSet, Score
from freshroll.rewards.tasks import Prompt
from freshroll.stage_threads import ThreadCounts
from freshroll.trainer.grpo import GRPOLearner, TrainSample
from freshroll.trainer.replay import train_samples, weights_digest

T = TypeVar("T")


class ThreadEngine:
    """One blocking engine as an :class:`~freshroll.engines.seams.AsyncEngine`."""

    continuous = False

    def __init__(self, engine: InferenceEngine, name: str, limits: LimitsSection,
                 threads: ThreadCounts | None = None, pool: StageExecutor | None = None) -> None:
        self.engine, self.name, self.limits = engine, name, limits
        self.threads = threads  # a sync run's generate threads, settled on its calls
        # its calls' thread: its own, a sync run's one compute thread, or an async inline
        # run's by the fallback's mode (threads.py)
        self._pool: StageExecutor = pool or AbandonableExecutor(f"worker-{name}")
        #: (abandoned call, what it was, when it was abandoned, its deadline)
        self._orphans: list[tuple[Future[Any], str, float, float]] = []
        self._inflight: set[str] = set()  # samples of the calls not yet delivered
        self._dropped: set[str] = set()  # of those, the cancelled: never emitted
        # a restartable engine is one object across restarts (ThreadEngineFactory): this
        # adapter's close stops only the incarnation it was made for
        self._incarnation = getattr(engine, "incarnation", 0)

    async def _run(self, timeout_s: float, what: str, fn: Callable[..., T], *args: Any,
                   late: Callable[[Future[T]], None] | None = None) -> T:
        loop = asyncio.get_running_loop()
        fut = self._pool.submit(fn, *args)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            self._pool.abandon()  # a thread cannot be cancelled: the next call gets a new one
            now = loop.time()
            self._orphans.append((fut, what, now, now + timeout_s))
            if late is not None:
                fut.add_done_callback(late)
            raise

    async def generate(
        self, requests: Sequence[GenRequest], params: SamplingParams, seed: int, emit: Emit,
    ) -> None:
        loop = asyncio.get_running_loop()
        texts = [r.text for r in requests]
        ids = [r.prompt_ids for r in requests]
        samples = [r.sample for r in requests]
        self._inflight.update(samples)

        def release() -> set[str]:
            dropped = self._dropped.intersection(samples)
            self._inflight.difference_update(samples)
            self._dropped.difference_update(samples)
            return dropped

        def deliver(comps: list[Completion]) -> None:
            dropped = release()
            for i, comp in enumerate(comps[:len(texts)]):
                if samples[i] not in dropped:
                    emit(i, comp)

        def late(fut: Future[list[Completion]]) -> None:  # runs on the abandoned thread
            with contextlib.suppress(RuntimeError):  # a closed loop: the run is over
                if fut.cancelled() or fut.exception() is not None:
                    loop.call_soon_threadsafe(release)
                else:
                    loop.call_soon_threadsafe(deliver, fut.result())

        try:
            comps = await self._run(self.limits.generate_timeout_s, "generate", self._generate,
                                    texts, params, seed, ids, late=late)
        except asyncio.CancelledError:
            raise  # abandoned: ``late`` delivers or releases
        except BaseException:
            release()
            raise
        deliver(comps)

    def _generate(self, texts: list[str], params: SamplingParams, seed: int,
                  ids: list[tuple[int, ...] | None] | None = None) -> list[Completion]:
        # token-in (a later turn of an episode) where every request brings its context's ids
        given = {"prompt_ids": ids} if ids and all(i is not None for i in ids) else {}
        with tuned(self.threads, len(texts)):
            comps = self.engine.generate(
                texts, max_new_tokens=params.max_new_tokens, temperature=params.temperature,
                top_p=params.top_p, seed=seed, **params.extras(), **given,
            )
        if len(comps) != len(texts):
            raise ValueError(f"engine returned {len(comps)} completions for {len(texts)} prompts")
        return comps

    @property
    def tokenizer(self) -> Any:
        """The engine's tokenizer where it is in this process (the HF engine), else None."""
        return getattr(self.engine, "tokenizer", None)

    def encode_text(self, text: str) -> tuple[int, ...]:
        """``text`` as token ids with the engine's own tokenizer, no special tokens
        (:class:`~freshroll.engines.seams.Tokenizes`: an environment's output, encoded once);
        a TypeError for an engine with no tokenizer in this process (a process or Ray proxy)."""
        tokenizer = getattr(self.engine, "tokenizer", None)
        if tokenizer is None:
            raise TypeError(f"engine {type(self.engine).__name__} has no tokenizer in this "
                            "process: a tool-using episode needs run.runtime: inline")
        return tuple(int(t) for t in tokenizer.encode(text, add_special_tokens=False))

    @property
    def swaps_in_flight(self) -> bool:
        """The engine takes weights while a call runs (the HF engine under
        ``rollout.on_update`` continue / abort): the pool need not wait for the call."""
        return isinstance(self.engine, SwapsInFlight) and self.engine.swaps_in_flight

    async def load_weights(self, weights: Weights) -> float:
        """Hand ``weights`` to the engine on its thread: as they are to a proxy that takes
        its placement's publication (a process or Ray worker), as a state dict to an engine
        in this process (another publication: :class:`TypeError`)."""
        proxy = publication_loader(self.engine)
        load = (functools.partial(proxy, weights) if proxy is not None else functools.partial(
            self.engine.load_weights, state_dict_of(weights, "an in-process engine")))
        if self.swaps_in_flight:  # beside the call in flight, on a thread of its own
            return float(await asyncio.to_thread(load))
        return float(await self._run(self.limits.weights_timeout_s, "load weights", load))

    async def cancel(self, samples: Sequence[str]) -> None:
        """A lock-step batch cannot drop members: they are generated with the batch, but
        not emitted (samples of no call in flight are ignored)."""
        self._dropped.update(self._inflight.intersection(samples))

    async def close(self) -> None:
        """Stop the executor; a call cancelled by the run's end is waited for until its own
        deadline (its thread may still hold the model), a timed-out one not at all. A wait
        longer than ``limits.heartbeat_s`` is said on stderr, as the pipeline's waits are
        (:mod:`freshroll.ports.waits`)."""
        loop = asyncio.get_running_loop()
        orphans, self._orphans = self._orphans, []
        for fut, what, since, deadline in orphans:
            if fut.done():
                continue
            # one waiter per orphan, its outcome consumed: the call's result or error is
            # `late`'s to deliver, never "Future exception was never retrieved" on stderr
            waiter = asyncio.wrap_future(fut)
            waiter.add_done_callback(_consume)
            while (remaining := deadline - loop.time()) > 0 and not fut.done():
                await asyncio.wait([waiter], timeout=min(remaining, self.limits.heartbeat_s))
                if not fut.done() and deadline > loop.time():
                    sys.stderr.write(f"waiting {seconds(loop.time() - since)} s on {self.name} "
                                     f"{what} to return before its engine closes, limit "
                                     f"{deadline - since:g} s\n")
        self._pool.shutdown(wait=False, cancel_futures=True)
        current = getattr(self.engine, "incarnation", 0) == self._incarnation
        if isinstance(self.engine, Stoppable) and current:  # a process of its own (actor,
            with contextlib.suppress(Exception):  # child): end it now, to free its CPUs
                await asyncio.wait_for(asyncio.to_thread(self.engine.stop), STOP_TIMEOUT_S)


def _consume(fut: asyncio.Future[Any]) -> None:
    """Retrieve a finished future's outcome, so that asyncio does not log it."""
    if not fut.cancelled():
        fut.exception()


#: how long closing an engine with a process of its own waits for its ``stop()``
STOP_TIMEOUT_S = 10.0


class KillableThreadEngine(ThreadEngine):
    """A :class:`ThreadEngine` whose engine runs in a process of its own and can be killed."""

    async def kill(self) -> None:
        """Kill the engine's process (``ray.kill``) without waiting for the call in flight:
        that call, or the next one, fails with :class:`~freshroll.errors.WorkerLost`."""
        await asyncio.to_thread(self.engine.kill)  # type: ignore[attr-defined]  # only a Ray engine (its class checked it) has kill


def adapt(engine: InferenceEngine, name: str, limits: LimitsSection,
          threads: ThreadCounts | None = None, pool: StageExecutor | None = None,
          ) -> ThreadEngine:
    """The adapter of a blocking engine: killable when it has ``kill()`` (a Ray actor)."""
    kind = KillableThreadEngine if isinstance(engine, Killable) else ThreadEngine
    return kind(engine, name, limits, threads, pool)


_current = threading.local()  # the intra-op threads this thread last set


@contextlib.contextmanager
def tuned(threads: ThreadCounts | None, rows: int) -> Iterator[None]:
    """Run the block (a stage's call on its own thread) at the stage's thread count, timing
    it while the stage is still trying counts (:mod:`freshroll.stage_threads`). The count
    is per thread (each thread that computes has its own OpenMP team); set only on a change."""
    if threads is None:
        yield
        return
    n, timed = threads.take()
    if getattr(_current, "n", None) != n:
        torch.set_num_threads(n)
        _current.n = n
    t0 = time.perf_counter()
    yield
    if timed:
        threads.record(n, time.perf_counter() - t0, rows)


class ThreadEngineFactory:
    """Makes workers' blocking engines on a thread; a second call for a name restarts it."""

    def __init__(self, make: Callable[[str], InferenceEngine], limits: LimitsSection,
                 serial: bool = True, threads: ThreadCounts | None = None,
                 pool: SharedExecutor | None = None, modes: ModeGroup | None = None) -> None:
        self.make, self.limits = make, limits
        self.threads = threads  # the generate stage's thread count (a sync run's), shared
        self.pool = pool  # the one compute thread of a sync run, shared with the trainer
        self.modes = modes  # an async inline run's: the compute thread in sync windows
        self.engines: dict[str, InferenceEngine] = {}
        # transformers' model loading is not thread-safe (it patches torch's init globally):
        # in-process engines are made one at a time; Ray actors start in parallel
        self._lock = threading.Lock() if serial else contextlib.nullcontext()

    async def __call__(self, name: str) -> ThreadEngine:
        old = self.engines.get(name)
        if old is None:
            def start() -> InferenceEngine:
                with self._lock:
                    return self.make(name)
        else:
            if not isinstance(old, Restartable):
                raise EngineNotRestartable(f"the engine of worker {name!r} cannot be restarted")
            restart = old.restart

            def start() -> InferenceEngine:
                restart()
                return old
        starter = AbandonableExecutor(f"start-{name}")
        try:
            engine = await asyncio.wrap_future(starter.submit(start))
        except asyncio.CancelledError:
            starter.abandon()
            raise
        finally:
            starter.shutdown(wait=False)
        self.engines[name] = engine
        calls: StageExecutor | None = None
        if self.pool is not None:
            calls = self.pool.attach()
        elif self.modes is not None:
            calls = self.modes.executor(name)
        return adapt(engine, name, self.limits, self.threads, calls)


class ThreadScorer:
    """The :class:`RewardSet` as an :class:`~freshroll.ports.seams.AsyncScorer`."""

    concurrency = 1  # one reward thread: user code need not be thread-safe
    max_batch = 256

    def __init__(self, rewards: RewardSet) -> None:
        self.rewards = rewards
        self.version = str(rewards.version)
        self.names = tuple(s.name for s in rewards.specs)
        self._pool = AbandonableExecutor("rewards")

    async def score(
        self, prompts: Sequence[Prompt], completions: Sequence[Completion], state: RewardState,
    ) -> list[Score]:
        fut = self._pool.submit(
            self.rewards.score_prompts, list(prompts), [c.text for c in completions],
            [c.token_ids for c in completions], state,
        )
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:  # timed out (or the run ended): walk away from it
            self._pool.abandon()
            raise

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def clone_weights(learner: Publishing) -> StateDict:
    """The inline publication: a detached copy of the learner's weights."""
    return learner.weights()


class CloneTransfer:
    """The inline placement's :class:`~freshroll.engines.weights.WeightTransfer`: each version
    a detached copy of the learner's weights, loaded by every thread worker's engine."""

    def publish(self, learner: Publishing) -> StateDict:
        return clone_weights(learner)


#: a placement's publication of the trainer's weights, called on the trainer thread once per
#: version (a copy, a shared-memory slot, a Ray ref): :mod:`freshroll.engines.weights`
Publish = WeightTransfer[Weights]


class ThreadTrainer:
    """The :class:`GRPOLearner` as an :class:`~freshroll.ports.seams.AsyncTrainer`.

    The weights of each new version are published once, by ``transfer`` (the placement's
    :class:`~freshroll.engines.weights.WeightTransfer`; a copy by default), on the trainer
    thread right after its step (never on the event loop); :meth:`weights` hands out that
    publication (the initial one is made on its first call)."""

    def __init__(self, learner: GRPOLearner, buf: SampleBuffer,
                 before_commit: Callable[[PolicyVersion], None] = lambda v: None,
                 transfer: Publish | None = None, timeout_s: float | None = None,
                 threads: ThreadCounts | None = None, pool: SharedExecutor | None = None) -> None:
        self.learner, self.buf, self._before_commit = learner, buf, before_commit
        self.threads = threads  # a sync run's train threads (settled), an async run's by mode
        self.transfer: Publish = transfer if transfer is not None else CloneTransfer()
        self.settings_digest = learner.settings_digest
        self.timeout_s = timeout_s  # limits.train_timeout_s; None: unbounded (tests only)
        self._pool: StageExecutor = (pool.attach() if pool is not None
                                     else AbandonableExecutor("trainer"))
        self._deadline: float | None = None  # of a call cancelled by the run's end
        self._timed_out = False
        self._weights: Weights | None = None
        self.publish_s = 0.0  # seconds spent publishing, in total

    def _publish(self) -> Weights:
        t0 = time.perf_counter()
        self._weights = self.transfer.publish(self.learner)
        self.publish_s += time.perf_counter() - t0
        return self._weights

    def _step(self, samples: list[TrainSample], step: int) -> tuple[dict[str, float], str]:
        with tuned(self.threads, len(samples)):
            metrics = self.learner.step(samples, step)
        digest = weights_digest(self.learner.model)
        self._publish()
        return metrics, digest

    async def step(self, lease: Lease) -> tuple[dict[str, float], str]:
        samples = train_samples(self.buf, lease.samples, lease.version)
        return await self._call("step", self._step, samples, lease.version + 1)

    async def before_commit(self, version: PolicyVersion) -> None:
        await self._call(f"evaluation and checkpoint of step {version.step}",
                         self._before_commit, version)

    async def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn`` on the trainer thread, within ``timeout_s`` (module docstring)."""
        fut = self._pool.submit(fn, *args)
        t0 = time.monotonic()
        try:
            limit = None if self.timeout_s is None else unsafe.timeout(self.timeout_s)
            async with asyncio.timeout(limit) as cm:
                return await asyncio.wrap_future(fut)
        except TimeoutError:
            if not cm.expired():
                raise
            self._pool.abandon()
            self._timed_out = True
            raise RunFailed(
                f"the trainer's {what} did not return within {self.timeout_s:g} s "
                "(limits.train_timeout_s); an in-process step cannot be interrupted, its "
                "thread was abandoned: the run stops, --resume trains the step again"
            ) from WorkerTimeout(f"trainer {what}")
        except asyncio.CancelledError:  # the run ended: close() waits until its deadline
            if self.timeout_s is not None and not fut.done():
                self._deadline = t0 + self.timeout_s
            raise

    def weights(self) -> Weights:
        """The publication of the newest step's weights (of the initial ones before any)."""
        return self._weights if self._weights is not None else self._publish()

    def close(self) -> None:
        """Stop the trainer thread: a call cancelled by the run's end is waited for until its
        own deadline (it may be writing a checkpoint), a timed-out one not at all."""
        wait: float | None = None
        if self._timed_out:
            wait = 0.0
        elif self._deadline is not None:
            wait = max(0.0, self._deadline - time.monotonic())
        self._pool.shutdown(wait=wait != 0.0, cancel_futures=True, timeout=wait)


__all__ = ["CloneTransfer", "KillableThreadEngine", "Publish", "ThreadEngine",
           "ThreadEngineFactory", "ThreadScorer", "ThreadTrainer", "adapt", "clone_weights"]
