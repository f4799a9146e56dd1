"""The Injector: fires one scenario's faults in a run and records each one in the ledger.

An :class:`Injector` is a :class:`~freshroll.runtime.placements.ChaosSession`: ``run(cfg, out,
chaos=Injector(scenario, seed))`` wraps the run's parts (:mod:`freshroll.chaos.faulty`) and
hooks the pipeline's hand-offs (it is its own :class:`~freshroll.pipeline.hooks.Hooks`).
Each fault of the scenario fires once, when its trigger is met::

    s        seconds of run time since the run started (the ledger's first event), on the
             run's clock: a timer of the hooks' task
    step     once step n is committed (Injector.committed)
    samples  once n completions were emitted by the engines (this incarnation's count,
             started from the ledger's generated count on a resume)
    handoff  the nth time the named hand-off happens in this incarnation: start_worker,
             load_weights, generate, emit (one completion), score (a reward call), reward
             (a call's rewards delivered), step (a trainer step), commit (between the step's
             lease and its commit)

and is recorded as ``fault_injected(fault=<kind>, target=<worker | all | reward | trainer |
process>, detail="#<index> <trigger>: <what was done>")``, the index being the fault's place
in ``scenario.faults`` (a resumed run passes the ones that fired as ``skip``).

Targets: ``w<n>`` that worker, ``all`` every live worker, ``random`` one live worker chosen
by a ``random.Random`` seeded with (seed, scenario name, fault index) among the live workers
sorted by name, except for a hand-off trigger on a worker's hand-off (start_worker aside),
which hits the worker of that hand-off. So the same seed gives the same run, event for event.

What each kind does is :data:`freshroll.chaos.plan.FAULT_KINDS`; here, how (the actions, and
the faults they leave armed, are the Injector's base,
:class:`~freshroll.chaos.actions.FaultActions`; this module decides when a fault fires and
records it):

===================== ===================================================================
stall_worker          the target's running call (the one with most requests open), else
                      its next one, holds its completions and never returns; the pool's
                      generate timeout fences the epoch; the call runs on as a zombie and
                      its completions arrive ``delay_s`` after the engine closed and all of
                      them came (at most ``limits.generate_timeout_s`` more):
                      ``rejected`` fenced
kill_worker           the target dies: its running calls raise WorkerLost now; idle, its
                      next call emits half of its requests, then dies. A hand-off trigger
                      kills the hand-off's call after half of what it has left. An engine
                      with ``async kill()`` (Ray) is killed for real
kill_all_workers      every live worker dies at once (as kill_worker)
kill_reward_worker    the next ``count`` reward calls are lost after the scorer ran
                      (WorkerLost): the reward stage scores them again
slow_rewards          reward calls started within ``duration_s`` take ``factor`` x longer
duplicate_reward      the next ``count`` rewards are delivered again (``rejected`` duplicate)
fail_reward           for ``duration_s``, ``share`` of the samples get Score(None, error
                      naming the first reward function and this fault): ``reward_error``
malformed_reward      the next ``count`` reward calls return NaN, a string, then the wrong
                      count of scores, in turn
kill_process          the event is made durable, then ``on_kill("kill_process")`` (which
                      SIGKILLs the process; an in-process ``on_kill`` that raises instead
                      has its error raised again by the hooks' task, so the run ends even
                      where the trigger's context swallows it)
trainer_crash         at the next ``commit`` hand-off (between the lease and the commit):
                      the event is made durable, then ``on_kill("trainer_crash")``
interrupt             the hooks' task raises Interrupted (the operator's stop; resumable)
version_bump          a child version the ledger never committed is published to the
                      workers (``HookContext.publish_out_of_band``), the pool woken
version_burst         the next ``count`` trainer steps take no time (a trainer with
                      ``step_seconds``: the simulated one)
delay_weights         weight loads of the target within ``duration_s`` take ``delay_s`` more
fail_weights          the next ``count`` weight loads of each target fail (WorkerLost)
stall_weights         the next ``count`` weight loads of each target never return
hold_group            one open request of the target's running call (else its next call)
                      is never emitted: the call ends at the pool's timeout or the group's
                      deadline cancels it
delay_messages        completions of the target within ``duration_s`` arrive ``delay_s`` late
reorder_messages      the target's next ``count`` calls of two or more requests deliver
                      their completions in reverse order, when the call ends
duplicate_messages    the target's next ``count`` completions are delivered twice
malformed_completion  the target's next ``count`` completions are malformed: a negative
                      token count, text None, NaN gen_s, not a Completion, in turn
stall_trainer         the next trainer step sleeps ``duration_s`` first
hang_tool, fail_tool, environment faults, at the tool seam of a tool-using workflow: the
malformed_tool,       Injector's ``workflow`` hook wraps its tool
kill_env              (:mod:`freshroll.chaos.envfaults`, its table)
===================== ===================================================================

Detached work (zombie calls, delayed completions, deferred engine closes) is owned by the
injector and cancelled when the hooks' task ends with the run. The hooks' task is also a
liveness guard: no completion and no step for ``liveness_s`` of run time stops the run
(:class:`~freshroll.errors.RunFailed`, "made no progress"), so a build whose timeouts are
switched off stops instead of ticking its virtual clock on forever.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from freshroll.chaos.actions import FaultActions
from freshroll.chaos.envfaults import EnvFaults
from freshroll.chaos.faulty import FaultyEngine, FaultyFactory, FaultyScorer, FaultyTrainer, Gen
from freshroll.chaos.plan import Fault, Scenario
from freshroll.errors import ConfigError, Interrupted, RunFailed
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion, SampleId
from freshroll.pipeline.hooks import Hooks

if TYPE_CHECKING:
    from freshroll.kernel.buffer import SampleBuffer
    from freshroll.pipeline.hooks import HookContext
    from freshroll.runtime.placements import Components


#: kinds that end the process through ``on_kill``
KILL_KINDS = frozenset({"kill_process", "trainer_crash"})
#: the hand-offs of a worker (a random target is the hand-off's worker)
WORKER_HANDOFFS = frozenset({"load_weights", "generate", "emit"})


class Injector(EnvFaults, FaultActions, Hooks):
    """Fires ``scenario``'s faults (those not in ``skip``) in one run; see the module doc.
    It is its own :class:`~freshroll.pipeline.hooks.Hooks` (``hooks`` is itself).

    ``on_kill(kind)`` ends the process (the chaos runner's child SIGKILLs itself); it is
    called for ``kill_process`` and ``trainer_crash`` once their event is durable.
    ``liveness_s``: the liveness guard: no completion generated and no step committed for
    that long (of run time) stops the run with
    :class:`~freshroll.errors.RunFailed` (a build without timeouts jumps its virtual clock
    to the never-firing timeout); None: 10 x the largest ``limits`` timeout; 0: off.
    """

    def __init__(self, scenario: Scenario, seed: int, *, skip: frozenset[int] = frozenset(),
                 on_kill: Callable[[str], None] | None = None,
                 liveness_s: float | None = None) -> None:
        super().__init__(scenario, seed)
        self.skip, self.on_kill = skip, on_kill
        self.liveness_s = liveness_s
        self.pending: dict[int, Fault] = {
            i: f for i, f in enumerate(scenario.faults) if i not in skip}
        kills = [f"#{i} {f.kind}" for i, f in self.pending.items() if f.kind in KILL_KINDS]
        if kills and on_kill is None:
            raise ConfigError(f"scenario {scenario.name!r}: fault {', '.join(kills)} ends the "
                              "process: the Injector needs on_kill (run it with freshroll chaos, "
                              "which runs such a case in a child process)")
        self.hooks: Hooks = self
        self.closing = False
        self.zombie_s = 60.0  # limits.generate_timeout_s, once the run started
        self.t0 = 0.0
        self.counts: Counter[str] = Counter()
        self.samples = 0
        self.fired: list[int] = []  # fault indexes in firing order
        self._tasks: set[asyncio.Task[None]] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._killed: BaseException | None = None  # what an in-process on_kill raised
        self._seen, self._seen_at = (-1, -1), 0.0  # the liveness guard: progress, since
        self._guard_s = 0.0
        self._stopped = asyncio.Event()
        self._deferred: list[tuple[int, str | None]] = []  # need the context (version_bump)
        self._crash: list[int] = []  # trainer_crash, waiting for the commit hand-off
        by: dict[str, list[int]] = {"step": [], "samples": []}
        for i, f in self.pending.items():
            if f.at.step is not None:
                by["step"].append(i)
            elif f.at.samples is not None:
                by["samples"].append(i)
        self._by_step, self._by_samples = by["step"], by["samples"]

    # -- ChaosSession ------------------------------------------------------------------------
    def wrap(self, parts: Components, buf: SampleBuffer) -> Components:
        from freshroll.runtime.placements import Components

        self.buf = buf
        for _, event in buf.ledger.events():  # the run started at its first event
            self.t0 = event.ts
            break
        self.samples = buf.counts.get("generated", 0)
        self.factory = FaultyFactory(self, parts.engine_factory)
        self.scorer = FaultyScorer(self, parts.scorer)
        self.trainer = FaultyTrainer(self, parts.trainer)
        return Components(self.factory, self.scorer, self.trainer, parts.close)

    # -- triggers ----------------------------------------------------------------------------
    def handoff(self, name: str, engine: FaultyEngine | None = None,
                gen: Gen | None = None) -> None:
        n = self.counts[name] = self.counts[name] + 1
        self._guard()
        for i, f in list(self.pending.items()):
            if f.at.handoff == name and f.at.nth == n:
                self._fire(i, name, engine, gen)

    def emitted(self, engine: FaultyEngine, gen: Gen, comp: Any) -> list[tuple[float, Any]]:
        self.samples += 1
        for i in list(self._by_samples):
            at = self.pending[i].at.samples if i in self.pending else None
            if at is not None and self.samples >= at:
                self._by_samples.remove(i)
                self._fire(i, None)
        self.handoff("emit", engine, gen)
        return self._deliveries(engine.name, comp)

    def committed(self, version: PolicyVersion) -> None:
        for i in list(self._by_step):
            at = self.pending[i].at.step if i in self.pending else None
            if at is not None and version.step >= at:
                self._by_step.remove(i)
                self._fire(i, None)

    # -- firing ------------------------------------------------------------------------------
    def _fire(self, i: int, where: str | None, engine: FaultyEngine | None = None,
              gen: Gen | None = None) -> None:
        buf, fault = self.buf, self.pending.get(i)
        if fault is None or buf is None or buf.closed:
            return
        if fault.kind == "version_bump" and self.ctx is None:
            self._deferred.append((i, where))
            return
        if fault.kind == "trainer_crash" and where != "commit":
            self._crash.append(i)  # fires at the next commit hand-off
            return
        del self.pending[i]
        ctx = engine if where in WORKER_HANDOFFS else None
        target, what = getattr(self, "_do_" + fault.kind)(i, fault, ctx, gen)
        self.fired.append(i)
        buf.record(ev.FaultInjected(
            ts=buf.clock.now(), fault=fault.kind, target=target,
            detail=f"#{i} {fault.at.describe()}: {what}",
        ))
        if fault.kind in KILL_KINDS:
            buf.ledger.flush()  # the event survives the kill
            assert self.on_kill is not None
            try:
                self.on_kill(fault.kind)  # SIGKILL: never returns
            except BaseException as exc:  # in-process (tests): it raises; the hooks' task
                self._killed = exc  # raises it again, should this context swallow it (an
                self._stopped.set()  # engine's emit callback)
                raise
        elif fault.kind == "interrupt":
            self._stopped.set()

    def rewarded(self, sids: Sequence[SampleId]) -> None:
        self.handoff("reward")
        self._deliver_again(sids)

    def commit_fault(self) -> None:
        for i in list(self._crash):
            self._crash.remove(i)
            self._fire(i, "commit")

    # -- detached work -----------------------------------------------------------------------
    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        if self.closing:
            coro.close()
            return None
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a zombie's failure is expected

    def later(self, delay: float, fn: Any, *args: Any) -> None:
        if self.closing:
            return
        handle: asyncio.TimerHandle | None = None

        def call() -> None:
            self._timers.discard(handle)
            fn(*args)

        handle = asyncio.get_running_loop().call_later(delay, call)
        self._timers.add(handle)

    async def close(self) -> None:
        """Cancel every detached task and timer (the run is over)."""
        self.closing = True
        for handle in list(self._timers):
            handle.cancel()
        self._timers.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- the hooks' task ---------------------------------------------------------------------
    async def run(self, ctx: HookContext) -> None:
        self.ctx = ctx
        lim = ctx.limits
        self.zombie_s = lim.generate_timeout_s
        self._guard_s = self.liveness_s if self.liveness_s is not None else 10 * max(
            lim.generate_timeout_s, lim.weights_timeout_s, lim.reward_timeout_s,
            lim.worker_start_timeout_s)
        try:
            deferred, self._deferred = self._deferred, []
            for i, where in deferred:
                self._fire(i, where)
            assert self.buf is not None and self.buf.version is not None
            self.committed(self.buf.version)  # step triggers already reached (step 0)
            timers = sorted((f.at.s, i) for i, f in self.pending.items() if f.at.s is not None)
            for s, i in timers:
                await self._until(self.t0 + s)
                self._fire(i, None)
            await self._until(math.inf)
        finally:
            await self.close()

    def _progress(self) -> tuple[int, int]:
        assert self.buf is not None
        counts = self.buf.counts
        return counts.get("generated", 0), counts.get("steps", 0)

    def _guard(self) -> None:
        """The liveness guard: once the run's clock moved ``liveness_s`` past the last
        progress, the hooks' task stops the run. Checked at every hand-off and by the hooks'
        task's own timer (a hang may have no hand-off: the steering ticks on)."""
        guard = self._guard_s
        if guard <= 0 or self.buf is None or self._killed is not None:
            return
        now, seen = self._now(), self._progress()
        if seen != self._seen:
            self._seen, self._seen_at = seen, now
        elif now - self._seen_at >= guard:
            self._killed = RunFailed(
                f"chaos: the run made no progress for {now - self._seen_at:g} s (no completion "
                f"generated, no step committed since step {seen[1]}; liveness_s {guard:g}): "
                "it hangs")
            self._stopped.set()

    async def _until(self, t: float) -> None:
        """Sleep until run time ``t`` (forever: ``inf``); raise once an interrupt fired, an
        in-process kill raised, or the liveness guard tripped."""
        while self._stop is None and self._killed is None:
            self._guard()
            if self._killed is not None:
                break
            now = self._now()
            if now >= t:
                return
            wake = min(t, self._seen_at + self._guard_s) if self._guard_s > 0 else t
            try:
                async with asyncio.timeout(None if math.isinf(wake) else max(0.0, wake - now)):
                    await self._stopped.wait()
            except TimeoutError:
                continue
        if self._killed is not None:
            raise self._killed
        raise Interrupted(self._stop)


__all__ = ["KILL_KINDS", "Injector"]
