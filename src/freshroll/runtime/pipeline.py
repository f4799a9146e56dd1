"""The inline orchestrator: one asyncio pipeline that owns every task of a run.

Tasks (all children of one ``asyncio.TaskGroup``; none is fire-and-forget)::

    feeder      admits prompts while the freshness window has capacity
    worker i    takes queued requests, loads the newest published weights,
                generates (in its own thread), reports completions
    rewarder    scores completions with the RewardSet (in a thread), records
                rewards or ``reward_error`` / ``reward_timeout`` discards
    trainer     waits for a lease of ``batch_groups`` fresh groups (the wait is
                the trainer's idle time), runs one GRPO step (in its thread),
                checkpoints, commits durably, publishes the new weights

Blocking compute never runs on the event loop. The only queue (completions
waiting for a reward) is bounded. Every state change goes through the
:class:`~freshroll.buffer.SampleBuffer`, so the ledger sees it. Every task that
changes what another task may do next (admission capacity, queued requests,
ready groups, a new version) wakes the others (``_notify``); a lease attempt
that only discarded stale groups counts, since it frees admission capacity.

Nothing waits forever (``limits`` in the config):

* a generate call or weight load that does not return within
  ``generate_timeout_s`` / ``weights_timeout_s`` is a
  :class:`~freshroll.errors.WorkerTimeout`, handled as a lost worker: its epoch
  is fenced (its attempts re-issued), it is restarted (at most ``MAX_RESTARTS``
  times per worker), and whatever the abandoned call returns later is offered
  to the buffer under the fenced epoch and recorded as ``rejected``;
* a reward call that does not return within ``reward_timeout_s`` discards its
  samples as ``reward_timeout``. A Python thread cannot be killed: the stuck
  call is abandoned on its daemon thread
  (:class:`~freshroll.runtime.threads.AbandonableExecutor`) and the next call
  runs on a fresh one;
* failures are budgeted (:mod:`freshroll.breaker`): per reward function, per
  worker, for reward timeouts and for skipped non-finite trainer steps. A stage
  that keeps failing ends the run with one
  :class:`~freshroll.errors.FailureBudgetExceeded` line naming it and quoting
  its first error.

A trainer step whose loss or gradients are not finite is never committed
(``trainer.on_nonfinite``): ``skip`` discards its batch as ``nonfinite_step``
(event ``step_skipped``; the learner is as before the step), ``stop`` raises
:class:`~freshroll.errors.NonFiniteStep`.

:meth:`Pipeline.run` raises the plain error that ended the run (the first
``FreshrollError`` of the task group, else its first exception), after closing
the buffer (``shutdown("failed")``) so that the ledger ends closed and
verifiable.

``max_staleness = 0`` gives the synchronous baseline with the same code: the
window admits one batch per policy version, so generation, scoring and
training run in lockstep. ``max_staleness >= 1`` lets workers generate the
next batches while the trainer trains.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from freshroll import events as ev
from freshroll.breaker import FailureBudget, Rule
from freshroll.buffer import Outcome, SampleBuffer
from freshroll.config import Config
from freshroll.engines.base import Completion, InferenceEngine
from freshroll.errors import (
    FreshrollError,
    Interrupted,
    NonFiniteStep,
    RunFailed,
    WorkerLost,
    WorkerTimeout,
)
from freshroll.lineage import PolicyVersion, SampleId
from freshroll.rewards.calling import RewardState
from freshroll.rewards.scoring import RewardSet, Score
from freshroll.rewards.tasks import Prompt
from freshroll.runtime import payload as pl
from freshroll.runtime.threads import AbandonableExecutor, CallAborted
from freshroll.trainer.grpo import GRPOLearner, TrainSample
from freshroll.trainer.replay import train_samples, weights_digest

MAX_RESTARTS = 3  # per worker, per run (lost or timed out)
T = TypeVar("T")


class _Stop(Exception):
    """Raised by the trainer task when the run has committed its steps."""


@dataclass
class StepReport:
    step: int
    version: PolicyVersion
    metrics: dict[str, float]
    wait_s: float
    train_s: float


@dataclass
class Published:
    version: PolicyVersion
    weights: dict[str, torch.Tensor] | None  # None: the engines' initial weights


def _warn_skip(step: int, detail: str) -> None:
    sys.stderr.write(f"warning: trainer step {step} skipped, its batch discarded "
                     f"(nonfinite_step): {detail}\n")


@dataclass
class Pipeline:
    buf: SampleBuffer
    engines: Sequence[InferenceEngine]
    learner: GRPOLearner
    rewards: RewardSet
    prompts: dict[str, Prompt]
    prompt_order: list[str]
    cfg: Config
    on_step: Callable[[StepReport], None]
    before_commit: Callable[[PolicyVersion, GRPOLearner], None]
    on_skip: Callable[[int, str], None] = _warn_skip
    published: Published | None = None
    budget: FailureBudget = field(default_factory=FailureBudget)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _restarts: dict[str, int] = field(default_factory=dict)

    # -- plumbing ----------------------------------------------------------------
    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def run(self) -> None:
        """Run until ``cfg.run.steps`` steps are committed in total.

        On a failure, closes the buffer (``shutdown("failed")``) and raises the plain
        error: the first :class:`FreshrollError` raised by a task, else the first error.
        """
        if self.published is None:
            self.published = Published(self.buf.version, None)  # type: ignore[arg-type]
        lim = self.cfg.limits
        self._loop = asyncio.get_running_loop()
        self._reward_q: asyncio.Queue[tuple[SampleId, Completion]] = asyncio.Queue(
            maxsize=max(64, 4 * self.cfg.rollout.worker_batch)
        )
        self._trainer_pool = ThreadPoolExecutor(1, thread_name_prefix="trainer")
        self._reward_pool = AbandonableExecutor("rewards")
        self._pools = [AbandonableExecutor(f"worker{i}") for i in range(len(self.engines))]
        failure: BaseException | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._feeder(), name="feeder")
                for i, engine in enumerate(self.engines):
                    tg.create_task(self._worker(i, engine), name=f"worker{i}")
                tg.create_task(self._rewarder(), name="rewarder")
                tg.create_task(self._trainer(), name="trainer")
        except BaseExceptionGroup as group:
            failure = first_failure(group)
        finally:
            self._trainer_pool.shutdown(wait=True, cancel_futures=True)
            for pool in self._pools:  # a call stuck past its timeout was abandoned already
                pool.shutdown(wait=True, cancel_futures=True, timeout=lim.generate_timeout_s)
            self._reward_pool.shutdown(wait=False, cancel_futures=True)
        if failure is not None:
            self._close_failed(failure)
            raise failure

    def _close_failed(self, failure: BaseException) -> None:
        """End the ledger closed and verifiable: everything unfinished is discarded."""
        reason = "interrupted" if isinstance(failure, Interrupted | KeyboardInterrupt) else "failed"
        try:
            self.buf.shutdown(reason)
        except Exception as exc:  # e.g. the disk is full: the original error says why
            failure.add_note(f"the ledger could not be closed: {type(exc).__name__}: {exc}")

    async def _call(
        self, pool: AbandonableExecutor, timeout_s: float, what: str, fn: Callable[..., T],
        *args: Any, late: Callable[[Future[T]], None] | None = None,
    ) -> T:
        """``fn(*args)`` on ``pool``'s thread, or :class:`WorkerTimeout` after ``timeout_s``
        (the call is abandoned; ``late`` gets its future if it ever finishes)."""
        fut = pool.submit(fn, *args)
        deadline = asyncio.timeout(timeout_s)
        try:
            async with deadline:
                return await asyncio.wrap_future(fut)
        except TimeoutError:
            if not deadline.expired():
                raise
        pool.abandon()
        if late is not None:
            fut.add_done_callback(late)
        raise WorkerTimeout(f"{what} did not return within {timeout_s:g} s")

    # -- feeder ------------------------------------------------------------------
    async def _feeder(self) -> None:
        buf = self.buf
        while True:
            changed = self._changed
            n = buf.capacity()
            for _ in range(n):
                buf.admit(self.prompt_order[buf.groups_admitted % len(self.prompt_order)])
            if n:
                self._notify()
            await changed.wait()

    # -- inference workers --------------------------------------------------------
    async def _worker(self, i: int, engine: InferenceEngine) -> None:
        buf, ro, lim = self.buf, self.cfg.rollout, self.cfg.limits
        name = f"w{i}"
        stage = f"inference worker {name!r}"
        rule = self._sample_rule()
        epoch = buf.register_worker(name)
        loaded: PolicyVersion | None = None
        while True:
            changed = self._changed
            pub = self.published
            assert pub is not None
            if loaded != pub.version:
                if pub.weights is not None:
                    try:
                        secs = await self._call(
                            self._pools[i], lim.weights_timeout_s, f"worker {name} weight load",
                            engine.load_weights, pub.weights,
                        )
                    except (WorkerLost, WorkerTimeout) as exc:
                        epoch, loaded = await self._replace(i, engine, name, epoch, exc), None
                        continue
                    buf.record(ev.WeightsLoaded(
                        ts=buf.clock.now(), worker=name, epoch=epoch, version=str(pub.version),
                        transfer_s=secs,
                    ))
                loaded = pub.version
                continue
            rids = buf.take_requests(ro.worker_batch)
            if not rids:
                await changed.wait()
                continue
            sids = [buf.start(r, name, epoch, loaded) for r in rids]
            texts = [self.prompts[buf.prompt_of(r)].text for r in rids]
            seed = generation_seed(self.cfg.run.seed, sids[0])
            try:
                comps = await self._call(
                    self._pools[i], lim.generate_timeout_s, f"worker {name} generate",
                    self._generate, engine, texts, seed,
                    late=self._late_results_handler(name, epoch, sids),
                )
            except (WorkerLost, WorkerTimeout) as exc:  # fenced, re-issued, restarted
                epoch, loaded = await self._replace(i, engine, name, epoch, exc), None
                continue
            except Interrupted:  # the operator's stop: not a failure of this worker
                raise
            except Exception as exc:  # engine failure: these requests end, the run goes on
                error = f"{type(exc).__name__}: {exc}"[:300]
                for sid in sids:
                    buf.discard(sid, "generation_error", error)
                self._notify()
                self.budget.record(stage, rule, len(sids), len(sids), error)
                continue
            self.budget.record(stage, rule, 0, len(sids))
            for sid, comp in zip(sids, comps, strict=True):
                out = buf.complete(
                    sid, tokens=len(comp.token_ids), gen_s=comp.gen_s, payload=pl.encode(comp),
                    worker=(name, epoch),
                )
                if out is Outcome.ACCEPTED:
                    await self._reward_q.put((sid, comp))

    def _late_results_handler(
        self, name: str, epoch: int, sids: list[SampleId]
    ) -> Callable[[Future[list[Completion]]], None]:
        """For a generate call that timed out: if it returns after all, its completions
        are offered to the buffer under the (fenced) epoch, which records them ``rejected``."""

        def done(fut: Future[list[Completion]]) -> None:  # runs on the abandoned thread
            if fut.cancelled() or fut.exception() is not None:
                return
            with contextlib.suppress(RuntimeError):  # a closed loop: the run is over
                self._loop.call_soon_threadsafe(self._late_results, name, epoch, sids,
                                                fut.result())

        return done

    def _late_results(
        self, name: str, epoch: int, sids: list[SampleId], comps: list[Completion]
    ) -> None:
        if self.buf.closed:
            return
        for sid, comp in zip(sids, comps, strict=False):
            out = self.buf.complete(sid, tokens=len(comp.token_ids), gen_s=comp.gen_s,
                                    worker=(name, epoch))
            if out is Outcome.ACCEPTED:  # cannot happen (the epoch is fenced): never lose it
                self.buf.discard(sid, "invalid", f"late result of timed-out worker {name}")

    async def _replace(
        self, i: int, engine: InferenceEngine, name: str, epoch: int, exc: FreshrollError
    ) -> int:
        """A worker died or timed out: fence its epoch (running attempts re-issued), restart
        it, new epoch.

        Gives up (:class:`RunFailed`, ending the run) after ``MAX_RESTARTS`` restarts of one
        worker, at once for an engine that cannot restart, or if the restart fails.
        """
        reason = "timeout" if isinstance(exc, WorkerTimeout) else "lost"
        self.buf.fence_worker(name, epoch, reason)
        self._notify()
        restart = getattr(engine, "restart", None)
        n = self._restarts[name] = self._restarts.get(name, 0) + 1
        what = f"inference worker {name!r} {reason}: {type(exc).__name__}: {exc}"
        if restart is None:
            raise RunFailed(f"{what}; its engine cannot be restarted") from exc
        if n > MAX_RESTARTS:
            raise RunFailed(f"{what}; it was restarted {MAX_RESTARTS} times already") from exc
        try:
            await self._call(self._pools[i], self.cfg.limits.worker_start_timeout_s,
                             f"worker {name} restart", restart)
        except Exception as again:
            raise RunFailed(f"{what}; restarting it failed: {type(again).__name__}: {again}") \
                from again
        return self.buf.register_worker(name)

    def _generate(self, engine: InferenceEngine, texts: list[str], seed: int) -> list[Completion]:
        ro = self.cfg.rollout
        comps = engine.generate(
            texts, max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p,
            seed=seed,
        )
        if len(comps) != len(texts):
            raise ValueError(f"engine returned {len(comps)} completions for {len(texts)} prompts")
        return comps

    # -- rewards -----------------------------------------------------------------
    def _sample_rule(self) -> Rule:
        lim = self.cfg.limits
        return Rule(lim.max_consecutive_failed_calls, lim.max_consecutive_failures,
                    lim.failure_window, lim.max_failure_ratio)

    async def _rewarder(self) -> None:
        buf, version = self.buf, str(self.rewards.version)
        for sid in buf.unrewarded():  # recovered: generated before a crash, never scored
            data = buf.payload(sid)
            if data is None:
                buf.discard(sid, "invalid", "payload lost")
                continue
            p = pl.decode(data)
            await self._reward_q.put((sid, Completion(
                tuple(p.prompt_ids), tuple(p.token_ids), tuple(p.logprobs), p.text,
                p.finish_reason, 0.0,
            )))
        while True:
            items = [await self._reward_q.get()]
            while not self._reward_q.empty() and len(items) < 256:
                items.append(self._reward_q.get_nowait())
            prompts = [self.prompts[buf.prompt_of(sid)] for sid, _ in items]
            t0 = time.perf_counter()
            scores = await self._score_batch(prompts, [c for _, c in items])
            if scores is None:  # timed out: discarded as reward_timeout
                for sid, _ in items:
                    buf.discard(sid, "reward_timeout", self._timeout_error())
                self._notify()
                self.budget.record(self._reward_label() + " (timeouts)", self._timeout_rule(),
                                   1, 1, self._timeout_error())
                continue
            per_sample = (time.perf_counter() - t0) / len(items)
            errors: list[str | None] = []
            for (sid, _), score in zip(items, scores, strict=True):
                if score.value is not None:
                    buf.reward(sid, score.value, version, per_sample)
                else:
                    buf.discard(sid, "reward_error", score.error or "reward_error")
                errors.append(None if score.value is not None else score.error or "")
            self._notify()
            self._record_rewards(errors)

    def _score(self, prompts: list[Prompt], comps: list[Completion]) -> list[Score]:
        """Score one batch (on the reward thread)."""
        buf = self.buf
        return self.rewards.score_prompts(
            prompts, [c.text for c in comps], [c.token_ids for c in comps],
            RewardState(buf.version.step if buf.version else 0, self.cfg.run.steps),
        )

    async def _score_batch(
        self, prompts: list[Prompt], comps: list[Completion]
    ) -> list[Score] | None:
        """The batch's scores; None if the call timed out. A call that fails as a whole
        (the reward set raised, e.g. KeyboardInterrupt in a reward) fails every sample."""
        timeout_s = self.cfg.limits.reward_timeout_s
        try:
            scores = await self._call(
                self._reward_pool, timeout_s, "reward call", self._score, prompts, comps
            )
        except WorkerTimeout:
            return None
        except Interrupted:  # KeyboardInterrupt in a reward: the run stops (resumable)
            raise
        except CallAborted as exc:  # KeyboardInterrupt, SystemExit, ... from user code
            scores = [Score(None, f"reward_error: {self._reward_label()} {exc}", {})] * len(comps)
        except Exception as exc:
            error = f"reward_error: {self._reward_label()} raised {type(exc).__name__}: {exc}"
            scores = [Score(None, error, {})] * len(comps)
        self.budget.record(self._reward_label() + " (timeouts)", self._timeout_rule(), 0)
        if len(scores) != len(comps):
            error = f"reward_error: the reward set returned {len(scores)} scores for {len(comps)}"
            scores = [Score(None, error, {})] * len(comps)
        return scores

    def _reward_label(self) -> str:
        names = [s.name for s in self.rewards.specs]
        if len(names) == 1:
            return f"reward function {names[0]!r}"
        return f"reward set ({', '.join(names)})"

    def _timeout_rule(self) -> Rule:
        lim = self.cfg.limits
        return Rule(lim.max_consecutive_timeouts, unit="calls",
                    calls_key="limits.max_consecutive_timeouts")

    def _timeout_error(self) -> str:
        return (f"reward call did not return within {self.cfg.limits.reward_timeout_s:g} s "
                "(limits.reward_timeout_s); its thread was abandoned")

    def _record_rewards(self, errors: list[str | None]) -> None:
        """One reward call's outcome, per reward function: a function named in a sample's
        error failed that sample, the others did not; a failure naming no function (e.g. a
        total beyond float32) counts for the set."""
        names = [s.name for s in self.rewards.specs]
        stages = {n: f"reward function {n!r}" for n in names}
        set_stage = self._reward_label()
        failed: dict[str, int] = dict.fromkeys([*stages.values(), set_stage], 0)
        first: dict[str, str] = {}
        for error in errors:
            if error is None:
                continue
            parts = error.removeprefix("reward_error: ").split("; ")
            named = {stages[n]: p for p in parts for n in names if p.startswith(n + " ")}
            for stage, part in (named or {set_stage: "; ".join(parts)}).items():
                failed[stage] += 1
                first.setdefault(stage, part)
        rule = self._sample_rule()
        for stage, n in failed.items():
            self.budget.record(stage, rule, n, len(errors), first.get(stage, ""))

    # -- trainer -----------------------------------------------------------------
    def _train_step(self, samples: list[TrainSample]) -> tuple[dict[str, float], str]:
        """One optimizer step and the digest of the weights it produced (trainer thread)."""
        metrics = self.learner.step(samples)
        return metrics, weights_digest(self.learner.model)

    async def _trainer(self) -> None:
        buf, loop = self.buf, asyncio.get_running_loop()
        lim = self.cfg.limits
        skip_rule = Rule(lim.max_consecutive_skipped_steps, unit="steps",
                         calls_key="limits.max_consecutive_skipped_steps")
        while buf.counts["steps"] < self.cfg.run.steps:
            t0 = buf.clock.now()
            while True:
                changed = self._changed
                wait_s = buf.clock.now() - t0
                seq = buf.ledger.last_seq
                lease = buf.lease(wait_s=wait_s)
                if lease is not None:
                    break
                if buf.ledger.last_seq != seq:  # stale groups discarded: capacity was freed
                    self._notify()
                    changed = self._changed
                await changed.wait()
            self._notify()  # stale discards free admission capacity
            samples = train_samples(buf, lease.samples, lease.version)
            try:
                metrics, digest = await loop.run_in_executor(
                    self._trainer_pool, self._train_step, samples
                )
            except NonFiniteStep as exc:
                self._skip(lease.id, exc, skip_rule)
                continue
            self.budget.record("trainer", skip_rule, 0)
            parent = buf.version
            assert parent is not None
            child = parent.child(lease.samples, self.learner.settings_digest, digest)
            await loop.run_in_executor(self._trainer_pool, self.before_commit, child, self.learner)
            version = buf.commit(
                lease.id, self.learner.settings_digest, weights_digest=digest,
                train_s=metrics["train_s"], metrics=metrics,
            )
            self.published = Published(version, self.learner.weights())
            self.on_step(StepReport(version.step, version, metrics, wait_s, metrics["train_s"]))
            self._notify()
        raise _Stop

    def _skip(self, lease_id: str, exc: NonFiniteStep, rule: Rule) -> None:
        """A non-finite step: never committed. Skip its batch, or stop (trainer.on_nonfinite)."""
        assert self.buf.version is not None
        step = self.buf.version.step + 1
        if not exc.recoverable or self.cfg.trainer.on_nonfinite == "stop":
            why = "" if not exc.recoverable else " (trainer.on_nonfinite: stop)"
            raise NonFiniteStep(f"trainer step {step} (lease {lease_id}) is not finite: {exc}{why}",
                                recoverable=exc.recoverable) from exc
        detail = f"step {step}: {exc}"
        self.buf.skip_step(lease_id, detail)
        self._notify()
        self.on_skip(step, str(exc))
        self.budget.record("trainer", rule, 1, 1, detail)


def first_failure(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The error that ended a task group (:func:`freshroll.boundary.leaf`: an interrupt,
    else its first :class:`FreshrollError`, else its first leaf), leaving out the trainer's
    normal stop; None if the run just finished."""
    from freshroll.boundary import leaf

    _, rest = group.split(_Stop)
    return None if rest is None else leaf(rest)


def generation_seed(run_seed: int, first_sample: str) -> int:
    """A sampling seed fixed by the run seed and the batch's first sample id (replayable)."""
    return (run_seed * 1_000_003) ^ zlib.crc32(first_sample.encode())


def run_pipeline(pipeline: Pipeline) -> None:
    asyncio.run(pipeline.run())
