"""The orchestrator: one asyncio pipeline that owns every task of a run, under any clock.

Tasks (all children of one ``asyncio.TaskGroup``; none is fire-and-forget)::

    feeder      admits prompts while the freshness window (and the live admission limit)
                has capacity
    worker i    one per inference worker, added, retired, stopped and replaced by the
                worker pool (:mod:`freshroll.pipeline.workers`): loads the newest published
                weights, generates, hands completions to the reward stage
    rewarder    scores completions in batches (:mod:`freshroll.pipeline.rewarding`)
    trainer     waits for a lease of ``batch_groups`` fresh groups (the wait is the trainer's
                idle time), runs one step, write-ahead checkpoint, commits durably,
                publishes the new weights
    steering    every ``control.interval_s`` measures a window and lets the controller set
                the live settings (:mod:`freshroll.pipeline.steering`)
    tails       with ``tail.deadline``: cuts the stragglers of groups past their deadline
                and frees their slots (:mod:`freshroll.pipeline.tailing`)
    overprovision  cancels on their engines the attempts a stop at target ended (the
                feeder admits each group's extra requests: ``tail.overprovision``,
                :mod:`freshroll.pipeline.overprovision`)
    watch       the heartbeat and the no-progress guard over the waits in flight
                (:mod:`freshroll.ports.waits`)

Each stage is built outside the task group (:meth:`Pipeline.run`, once per run) on one
:class:`~freshroll.pipeline.context.RunContext` (config, buffer, clock, limits, prompts,
waits, failure budget, :meth:`notify`) and only the ports it uses
(:mod:`freshroll.pipeline.context`: the pool emits into the reward stage's inbox, steering
reads a view of the pool, the tails task cancels through the pool); no stage sees the
``Pipeline``. Hooks and the over-provisioning task get a
:class:`~freshroll.pipeline.hooks.HookContext`. The stages' tasks then start in the task
group, in the order above.

The pipeline awaits only the seams of :mod:`freshroll.ports.seams`: engines come from an
:data:`~freshroll.engines.seams.EngineFactory`, rewards from an
:class:`~freshroll.ports.seams.AsyncScorer`, steps from an
:class:`~freshroll.ports.seams.AsyncTrainer` (thread adapters of the real components in
:mod:`freshroll.placement.adapters`; the latency model of :mod:`freshroll.sim`). Every duration
comes from the buffer's clock and every sleep or timeout from the event loop, so the same
pipeline runs under :class:`~freshroll.clock.RealClock` (``asyncio.run``) and under
:class:`~freshroll.clock.VirtualClock` (``clock.run(pipeline.run())``, fully-async parts only:
a blocking thread under a virtual clock would see its timeouts fire at once).

Every state change goes through the :class:`~freshroll.kernel.buffer.SampleBuffer`, so the ledger
sees it. Every task that changes what another task may do next wakes it: :meth:`notify`
wakes the feeder and the trainer (admission capacity, ready groups, a new version); a lease
attempt that only discarded stale groups counts, since it frees admission capacity; workers
are woken by the pool (queued requests, a new version).

Nothing waits forever (``limits`` in the config): a generate call, weight load or worker
start past its timeout is a :class:`~freshroll.errors.WorkerTimeout`, handled as a lost
worker (fenced, attempts re-issued, replaced at most ``MAX_RESTARTS`` times; whatever the
abandoned call returns later is recorded ``rejected``); a reward call past
``reward_timeout_s`` discards its samples as ``reward_timeout``; a trainer step past
``train_timeout_s`` is the trainer's (a Ray actor is rebuilt, an in-process one stops the
run). Every such wait is registered in :attr:`Pipeline.waits` while it lasts: one older than
``limits.heartbeat_s`` is said to the observers' ``on_wait`` ("waiting 60 s on w0 generate,
limit 600 s"; real clock only), and a run that commits no step for
``limits.max_no_progress_s`` stops with :class:`~freshroll.errors.NoProgress` naming the
oldest wait in flight. Failures are budgeted (:mod:`freshroll.control.breaker`): per reward
function, per worker, for reward timeouts and for skipped non-finite trainer steps; a stage
that keeps failing ends the run with one :class:`~freshroll.errors.FailureBudgetExceeded`
line naming it.

A trainer step whose loss or gradients are not finite is never committed
(``trainer.on_nonfinite``): ``skip`` discards its batch as ``nonfinite_step`` (event
``step_skipped``), ``stop`` raises :class:`~freshroll.errors.NonFiniteStep`.

:meth:`Pipeline.run` raises the plain error that ended the run (the first ``FreshrollError``
of the task group, else its first exception), after closing the buffer
(``shutdown("failed")``) so that the ledger ends closed and verifiable.

Observers (:mod:`freshroll.pipeline.observers`) watch the run: each one's ``checkpointed``
before a commit (the checkpoint's record, durable with it), ``on_step`` after it,
``on_skip``, ``on_mode`` and ``on_wait``, on the loop, in the list's order.

``max_staleness = 0`` gives the synchronous baseline with the same code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from freshroll import crashpoints, unsafe
from freshroll.clock import VirtualClock
from freshroll.config import Config
from freshroll.control.breaker import FailureBudget, Rule
from freshroll.control.controller import Controller, Settings
from freshroll.engines.seams import EngineFactory
from freshroll.envs.registry import workflow_for
from freshroll.errors import Interrupted, NonFiniteStep, NoProgress
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.state import Lease
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion
from freshroll.pipeline.calls import generation_seed
from freshroll.pipeline.context import Published, RunContext
from freshroll.pipeline.fallback import EarlierChoice, FallbackProbe, Switch, probe_for
from freshroll.pipeline.hooks import HookContext, Hooks
from freshroll.pipeline.observers import RunObserver, StepReport, default_observers
from freshroll.pipeline.overprovision import Overprovision
from freshroll.pipeline.rewarding import RewardStage
from freshroll.pipeline.steering import Steering, tail_levers_on
from freshroll.pipeline.tailing import Tailing
from freshroll.pipeline.workers import MAX_RESTARTS, WorkerPool
from freshroll.ports.seams import AsyncScorer, AsyncTrainer, SaysItsWaits
from freshroll.ports.waits import Waits, heartbeat, stall_message
from freshroll.rewards.tasks import Prompt


class _Stop(Exception):
    """Raised by the trainer task when the run has committed its steps."""


@dataclass
class Pipeline:
    """One run's orchestrator. ``controller``: None builds the one ``cfg.control`` names."""

    buf: SampleBuffer
    engine_factory: EngineFactory
    scorer: AsyncScorer
    trainer: AsyncTrainer
    prompts: Mapping[str, Prompt]
    prompt_order: Sequence[str]
    cfg: Config
    #: who watches the run (:mod:`freshroll.pipeline.observers`: the contract), called in
    #: this order; default: the stderr notes of a skipped step, a mode switch and a heartbeat
    observers: list[RunObserver] = field(default_factory=default_observers)
    controller: Controller | None = None
    published: Published | None = None
    budget: FailureBudget = field(default_factory=FailureBudget)
    #: hand-off hooks (:mod:`freshroll.pipeline.hooks`): a chaos session's; no-ops by default
    hooks: Hooks = field(default_factory=Hooks)
    #: an earlier run's sync-fallback choice for the same work, to start in
    #: (:class:`~freshroll.pipeline.fallback.EarlierChoice`; the runtime reads the cache)
    earlier: EarlierChoice | None = None
    _feed: asyncio.Event = field(default_factory=asyncio.Event)
    _train: asyncio.Event = field(default_factory=asyncio.Event)

    # -- plumbing ----------------------------------------------------------------------------
    def notify(self) -> None:
        """Something changed that the feeder or the trainer may act on."""
        self._feed.set()
        self._train.set()

    async def run(self) -> None:
        """Run until ``cfg.run.steps`` steps are committed in total.

        On a failure, closes the buffer (``shutdown("failed")``) and raises the plain
        error: the first :class:`FreshrollError` raised by a task, else the first error.
        """
        buf = self.buf
        assert buf.version is not None
        if self.published is None:  # a resumed run's workers load the trainer's weights first
            weights = self.trainer.weights() if buf.version.step > 0 else None
            self.published = Published(buf.version, weights)
        self._feed, self._train = asyncio.Event(), asyncio.Event()
        self.waits = Waits(buf.clock, self.cfg.limits.heartbeat_s)
        self._trainer_says_waits = isinstance(self.trainer, SaysItsWaits)
        if isinstance(self.trainer, SaysItsWaits):
            self.trainer.waits = self.waits
        self.ctx = RunContext(self.cfg, buf, self.prompts, self.waits, self.budget, self.notify)
        self.rewarder = RewardStage(self.ctx, self.scorer, self.hooks)
        self.overprov = Overprovision(self.cfg.tail, self.cfg.rollout.group_size)
        self.fallback: FallbackProbe | None = probe_for(self.cfg)
        start = (self.fallback.reuse(self.earlier, buf.version.step if buf.version else 0)
                 if self.fallback is not None and self.earlier is not None else None)
        failure: BaseException | None = None
        try:
            settings = self._build_stages()
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._watch(), name="watch")
                self.pool.attach(tg)
                self.steering.apply(settings)
                await self.pool.started()  # every engine up before the clock counts waits
                self.waits.progressed()  # and before the no-progress guard's (a start has its own)
                if start is not None:  # an earlier run's choice, before the first admission
                    self._switch_mode(start)
                for name, task in self._stage_tasks():
                    tg.create_task(task, name=name)
        except BaseExceptionGroup as group:
            failure = first_failure(group)
        except Exception as exc:  # a stage could not be built
            failure = exc
        if failure is not None:
            self._close_failed(failure)
            raise failure

    def _build_stages(self) -> Settings:
        """The worker pool, steering and the tails task, each on the run's context and the
        ports it uses (:mod:`freshroll.pipeline.context`); returns the settings to start
        from."""
        self.pool = WorkerPool(self.ctx, self.rewarder, self.engine_factory,
                               self._published_now, self.overprov.wake,
                               self.hooks.workflow(workflow_for(self.cfg)))
        levers = tail_levers_on(self.cfg)  # the controller may turn deadlines on
        self.tailing = Tailing(self.ctx, self.pool) if self.cfg.tail.deadline or levers else None
        self.steering = Steering(self.ctx, self.pool, self.rewarder, self.overprov,
                                 self.tailing.watch if self.tailing is not None else None,
                                 self.controller)
        return self.steering.initial()

    def _stage_tasks(self) -> list[tuple[str, Coroutine[Any, Any, None]]]:
        """The stages' tasks, in the order they start (once every engine is up)."""
        hooks = self._hook_context()
        tasks = [("feeder", self._feeder()), ("rewarder", self.rewarder.run()),
                 ("trainer", self._trainer()), ("steering", self.steering.run())]
        if self.tailing is not None:
            tasks.append(("tails", self.tailing.run()))
        return [*tasks, ("overprovision", self.overprov.run(hooks)),
                ("hooks", self.hooks.run(hooks))]

    def _published_now(self) -> Published | None:
        return self.published

    def _hook_context(self) -> HookContext:
        """The ports the hooks' task and the over-provisioning task get (never ``self``)."""
        return HookContext(self.buf, self.pool, self.cfg.limits, self.cfg.run.steps,
                           published=self._published_version,
                           publish=self._publish_out_of_band, notify=self.notify)

    def _published_version(self) -> PolicyVersion:
        assert self.published is not None
        return self.published.version

    def _publish_out_of_band(self, version: PolicyVersion) -> None:
        """``version`` to the workers with the weights published now, never committed."""
        assert self.published is not None
        self.published = Published(version, self.published.weights)
        self.pool.version_published()

    def _close_failed(self, failure: BaseException) -> None:
        """End the ledger closed and verifiable: everything unfinished is discarded."""
        reason = "interrupted" if isinstance(failure, Interrupted | KeyboardInterrupt) else "failed"
        try:
            self.buf.shutdown(reason)
        except Exception as exc:  # e.g. the disk is full: the original error says why
            failure.add_note(f"the ledger could not be closed: {type(exc).__name__}: {exc}")

    # -- watch -------------------------------------------------------------------------------
    async def _watch(self) -> None:
        """Every quarter of the shorter of the two periods: say the waits past the heartbeat
        (real clock only: a virtual clock's waits are the simulator's), and stop a run that
        committed nothing for ``limits.max_no_progress_s`` (:mod:`freshroll.ports.waits`)."""
        lim, waits, clock = self.cfg.limits, self.waits, self.buf.clock
        say = not isinstance(clock, VirtualClock)
        guard = unsafe.timeout(lim.max_no_progress_s)
        tick = min(lim.heartbeat_s, lim.max_no_progress_s) / 4
        while True:
            await asyncio.sleep(tick)
            now = clock.now()
            if waits.stalled(now, guard):
                step = self.buf.version.step if self.buf.version is not None else 0
                raise NoProgress(stall_message(waits, now, lim.max_no_progress_s, step))
            due = waits.due(now) if say else []
            if due:
                line = heartbeat(due, now)
                for o in self.observers:
                    o.on_wait(line)

    # -- feeder ------------------------------------------------------------------------------
    async def _feeder(self) -> None:
        buf, order = self.buf, self.prompt_order
        while True:
            self._feed.clear()
            n = buf.capacity()
            for _ in range(n):
                buf.admit(order[buf.groups_admitted % len(order)], self.overprov.extra(buf))
            if n:
                self.pool.requests_queued()
                self._train.set()
            await self._feed.wait()

    # -- trainer -----------------------------------------------------------------------------
    async def _trainer(self) -> None:
        buf, trainer = self.buf, self.trainer
        lim = self.cfg.limits
        skip_rule = Rule(lim.max_consecutive_skipped_steps, unit="steps",
                         calls_key="limits.max_consecutive_skipped_steps")
        while buf.counts["steps"] < self.cfg.run.steps:
            lease, wait_s = await self._leased()
            step = (buf.version.step if buf.version is not None else 0) + 1
            try:
                with self._trainer_wait(f"trainer step {step}"):
                    metrics, digest = await trainer.step(lease)
            except NonFiniteStep as exc:
                self._skip(lease.id, exc, skip_rule)
                self.waits.progressed()
                continue
            self.budget.record("trainer", skip_rule, 0)
            version = await self._committed(lease, step, metrics, digest)
            if buf.counts["steps"] < self.cfg.run.steps:
                # the feeder and the pool first: the next step's generation starts before the
                # observers' bookkeeping (metrics rows, progress line), which then runs beside
                # it instead of in front of it (in a sync run it was on every step's path)
                await asyncio.sleep(0)
            report = StepReport(version.step, version, metrics, wait_s, metrics["train_s"])
            for o in self.observers:
                o.on_step(report)
        raise _Stop

    async def _leased(self) -> tuple[Lease, float]:
        """The next step's lease, waited for (the trainer's wait, told to the meter), and
        the seconds waited."""
        buf, clock, meter = self.buf, self.buf.clock, self.steering.meter
        need = self.cfg.rollout.batch_groups * self.cfg.rollout.group_size
        t0 = clock.now()
        first = True
        while True:
            self._train.clear()
            seq = buf.ledger.last_seq
            lease = buf.lease(wait_s=clock.now() - t0)
            if buf.refreshed:  # stale members of ready groups re-issued: wake a worker
                buf.refreshed.clear()
                self.pool.requests_queued()
            if lease is not None:
                break
            if buf.ledger.last_seq != seq:  # stale groups discarded: capacity was freed
                self._feed.set()
            if first:
                meter.trainer_waits(t0, need - buf.ready_groups() * self.cfg.rollout.group_size)
                first = False
            await self._train.wait()
        wait_s = clock.now() - t0
        meter.trainer_fed(wait_s)
        self._feed.set()  # stale discards free admission capacity
        return lease, wait_s

    async def _committed(self, lease: Lease, step: int, metrics: Mapping[str, float],
                         digest: str | None) -> PolicyVersion:
        """Checkpoint, commit (durable) and publish a trained step; the new version."""
        buf, trainer = self.buf, self.trainer
        parent = buf.version
        assert parent is not None
        child = parent.child(lease.samples, trainer.settings_digest, digest)
        with self._trainer_wait(f"evaluation and checkpoint of step {step}"):
            await trainer.before_commit(child)
        for o in self.observers:  # a checkpoint's record: durable with the commit
            saved = o.checkpointed(child.step)
            if saved is not None:
                buf.record(saved)
        version = buf.commit(
            lease.id, trainer.settings_digest, weights_digest=digest,
            train_s=metrics["train_s"], metrics=metrics,
        )
        crashpoints.reach("commit")
        self.steering.meter.committed(lease)
        self.waits.progressed()
        self.published = Published(version, trainer.weights())
        self.pool.note_committed()  # before the hooks: a chaos session may bump it
        self.hooks.committed(version)
        if self.fallback is not None:
            switch = self.fallback.committed(version.step, buf.clock.now(), metrics)
            if switch is not None:
                self._switch_mode(switch)
        buf.refreshed.clear()  # re-issued by the commit: the workers are woken below
        if self.cfg.tail.drop_doomed and buf.drop_doomed():  # groups that can only go stale
            self.overprov.wake()  # their running attempts cancelled on their engines
        self.notify()
        self.pool.version_published()
        return version

    def _trainer_wait(self, what: str) -> AbstractContextManager[None]:
        """The trainer's wait, bounded by ``limits.train_timeout_s``; none where the trainer
        says its own waits (:class:`~freshroll.ports.seams.SaysItsWaits`)."""
        if self._trainer_says_waits:  # decided once, in run()
            return contextlib.nullcontext()
        return self.waits.waiting(what, self.cfg.limits.train_timeout_s)

    def _switch_mode(self, s: Switch) -> None:
        """Apply the sync fallback's look-ahead and record why (``mode_decided``)."""
        self.buf.lookahead = s.lookahead
        self.buf.record(ev.ModeDecided(
            ts=self.buf.clock.now(), step=s.step, mode=s.mode, lookahead=s.lookahead,
            phase=s.phase, reason=s.reason, async_per_s=s.async_per_s, sync_per_s=s.sync_per_s,
        ))
        for o in self.observers:
            o.on_mode(s)

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
        self.notify()
        for o in self.observers:
            o.on_skip(step, str(exc))
        self.budget.record("trainer", rule, 1, 1, detail)


def first_failure(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The error that ended a task group (:func:`freshroll.boundary.leaf`: an interrupt,
    else its first :class:`FreshrollError`, else its first leaf), leaving out the trainer's
    normal stop; None if the run just finished."""
    from freshroll.boundary import leaf

    _, rest = group.split(_Stop)
    return None if rest is None else leaf(rest)


def run_pipeline(pipeline: Pipeline) -> None:
    """Run under the real clock."""
    asyncio.run(pipeline.run())


__all__ = ["MAX_RESTARTS", "Pipeline", "Published", "StepReport", "first_failure",
           "generation_seed", "run_pipeline"]
