"""The Injector: fires one scenario's faults in a run and records each one in the ledger.

An :class:`Injector` is a :class:`~freshroll.runtime.hooks.ChaosSession`: ``run(cfg, out,
chaos=Injector(scenario, seed))`` wraps the run's parts (:mod:`freshroll.chaos.faulty`) and
hooks the pipeline's hand-offs (it is its own :class:`~freshroll.runtime.hooks.Hooks`).
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

What each kind does is :data:`freshroll.chaos.plan.FAULT_KINDS`; here, how:

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
                      workers (``pipe.published``), the pool woken
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
===================== ===================================================================

Detached work (zombie calls, delayed completions, deferred engine closes) is owned by the
injector and cancelled when the hooks' task ends with the run. The hooks' task is also a
liveness guard: no completion and no step for ``liveness_s`` of run time stops the run
(:class:`~freshroll.errors.RunFailed`, "made no progress"), so a build whose timeouts are
switched off stops instead of ticking its virtual clock on forever.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from freshroll import events as ev
from freshroll.chaos.faulty import FaultyEngine, FaultyFactory, FaultyScorer, FaultyTrainer, Gen
from freshroll.chaos.plan import Fault, Scenario
from freshroll.engines.base import Completion
from freshroll.errors import ConfigError, Interrupted, RunFailed, UnknownSampleError
from freshroll.lineage import PolicyVersion, SampleId
from freshroll.rewards.scoring import Score
from freshroll.runtime.hooks import Hooks

if TYPE_CHECKING:
    from freshroll.buffer import SampleBuffer
    from freshroll.runtime.pipeline import Pipeline
    from freshroll.runtime.run import Components

#: kinds that end the process through ``on_kill``
KILL_KINDS = frozenset({"kill_process", "trainer_crash"})
#: the hand-offs of a worker (a random target is the hand-off's worker)
WORKER_HANDOFFS = frozenset({"load_weights", "generate", "emit"})


@dataclass
class _MsgFault:
    """A fault on completions: duplicate / malformed (``left`` more), delay (``until``)."""

    index: int
    kind: str
    workers: frozenset[str] | None  # None: every worker
    left: int = 0
    until: float = 0.0
    delay: float = 0.0
    turn: int = 0

    def hits(self, name: str) -> bool:
        return self.workers is None or name in self.workers


@dataclass
class _LoadFault:
    index: int
    kind: str  # fail | stall | delay
    workers: frozenset[str] | None
    left: int = 0
    until: float = 0.0
    delay: float = 0.0


@dataclass
class _Window:
    index: int
    until: float
    share: float = 1.0
    rng: random.Random = field(default_factory=random.Random)
    factor: float = 1.0


class Injector(Hooks):
    """Fires ``scenario``'s faults (those not in ``skip``) in one run; see the module doc.
    It is its own :class:`~freshroll.runtime.hooks.Hooks` (``hooks`` is itself).

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
        self.scenario, self.seed, self.skip, self.on_kill = scenario, seed, skip, on_kill
        self.liveness_s = liveness_s
        self.pending: dict[int, Fault] = {
            i: f for i, f in enumerate(scenario.faults) if i not in skip}
        kills = [f"#{i} {f.kind}" for i, f in self.pending.items() if f.kind in KILL_KINDS]
        if kills and on_kill is None:
            raise ConfigError(f"scenario {scenario.name!r}: fault {', '.join(kills)} ends the "
                              "process: the Injector needs on_kill (run it with freshroll chaos, "
                              "which runs such a case in a child process)")
        self.rngs = {i: random.Random(f"{seed}:{scenario.name}:{i}")
                     for i in range(len(scenario.faults))}
        self.hooks: Hooks = self
        self.buf: SampleBuffer | None = None
        self.pipe: Pipeline | None = None
        self.factory: FaultyFactory | None = None
        self.scorer: FaultyScorer | None = None
        self.trainer: FaultyTrainer | None = None
        self.closing = False
        self.zombie_s = 60.0  # limits.generate_timeout_s, once the run started
        self.t0 = 0.0
        self.counts: Counter[str] = Counter()
        self.samples = 0
        self.fired: list[int] = []  # fault indexes in firing order
        self.failed: dict[int, list[str]] = {}  # fail_reward: the sample ids it failed
        self.held: list[str] = []  # hold_group: the sample ids never emitted
        self._tasks: set[asyncio.Task[None]] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._stop: str | None = None  # interrupt: the reason
        self._killed: BaseException | None = None  # what an in-process on_kill raised
        self._seen, self._seen_at = (-1, -1), 0.0  # the liveness guard: progress, since
        self._guard_s = 0.0
        self._stopped = asyncio.Event()
        self._deferred: list[tuple[int, str | None]] = []  # need the pipeline (version_bump)
        self._crash: list[int] = []  # trainer_crash, waiting for the commit hand-off
        self._next: dict[str, list[tuple[int, str]]] = {}  # worker -> its next call's faults
        self._reorder: list[_MsgFault] = []
        self._msgs: list[_MsgFault] = []
        self._loads: list[_LoadFault] = []
        self._lost_calls = 0
        self._slow: list[_Window] = []
        self._fail: list[_Window] = []
        self._malformed_reward: list[_MsgFault] = []
        self._dup_reward: list[_MsgFault] = []
        self._stall_steps: list[float] = []
        self._burst = 0
        by: dict[str, list[int]] = {"step": [], "samples": []}
        for i, f in self.pending.items():
            if f.at.step is not None:
                by["step"].append(i)
            elif f.at.samples is not None:
                by["samples"].append(i)
        self._by_step, self._by_samples = by["step"], by["samples"]

    # -- ChaosSession ------------------------------------------------------------------------
    def wrap(self, parts: Components, buf: SampleBuffer) -> Components:
        from freshroll.runtime.run import Components

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
        if fault.kind == "version_bump" and self.pipe is None:
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

    def _live(self) -> list[str]:
        if self.pipe is not None and hasattr(self.pipe, "pool"):
            return sorted(self.pipe.pool.active)
        return sorted(self.factory.engines) if self.factory is not None else []

    def _targets(self, i: int, fault: Fault, ctx: FaultyEngine | None) -> list[str]:
        live = self._live()
        if fault.target == "all":
            return live
        if fault.target == "random":
            if ctx is not None:
                return [ctx.name]
            return [self.rngs[i].choice(live)] if live else []
        return [fault.target]

    def _engine(self, name: str) -> FaultyEngine | None:
        eng = self.factory.engines.get(name) if self.factory is not None else None
        return None if eng is None or eng.closed.is_set() else eng

    def _arm(self, name: str, i: int, kind: str) -> None:
        self._next.setdefault(name, []).append((i, kind))

    def _busiest(self, name: str) -> Gen | None:
        """The target's running call with the most requests not yet emitted."""
        eng = self._engine(name)
        calls = [g for g in eng.calls if g.dying is None and g.open_index() is not None] \
            if eng is not None else []
        return max(calls, key=lambda g: g.n - g.count, default=None)

    @staticmethod
    def _who(names: Sequence[str], fault: Fault) -> str:
        if fault.target == "all":
            return "all"
        return names[0] if len(names) == 1 else ",".join(names) or "none"

    def _why(self, i: int, fault: Fault) -> str:
        return f"chaos fault #{i} ({fault.kind}, scenario {self.scenario.name})"

    # -- inference workers -------------------------------------------------------------------
    def _do_stall_worker(self, i: int, f: Fault, ctx: FaultyEngine | None,
                         gen: Gen | None) -> tuple[str, str]:
        names, done = self._targets(i, f, ctx), []
        for name in names:
            call = gen if gen is not None and ctx is not None and ctx.name == name \
                else self._busiest(name)
            if call is None:
                self._arm(name, i, "stall")
                done.append(f"{name}'s next generate call")
            else:
                call.stall(f.delay_s)
                done.append(f"{name}'s call of {call.n} ({call.count} emitted)")
        return self._who(names, f), (
            f"held the completions of {', '.join(done) or 'no worker'} until its epoch is "
            f"fenced, then delivered {f.delay_s:g} s after (a zombie)")

    def _kill(self, i: int, f: Fault, ctx: FaultyEngine | None, gen: Gen | None,
              names: list[str]) -> str:
        done, why = [], self._why(i, f)
        for name in names:
            eng = self._engine(name)
            if eng is not None and eng.real_kill:
                done.append(eng.die_now(why))
            elif gen is not None and ctx is not None and ctx.name == name:
                gen.arm_kill(why)
                done.append(f"{name}'s call of {gen.n} dies after {gen.kill_at} emitted")
            elif eng is not None and any(g.dying is None for g in eng.calls):
                done.append(eng.die_now(why))
            else:
                self._arm(name, i, "kill")
                done.append(f"{name} dies in its next call, after half of it is emitted")
        return "; ".join(done) or "no live worker"

    def _do_kill_worker(self, i: int, f: Fault, ctx: FaultyEngine | None,
                        gen: Gen | None) -> tuple[str, str]:
        names = self._targets(i, f, ctx)
        return self._who(names, f), self._kill(i, f, ctx, gen, names)

    def _do_kill_all_workers(self, i: int, f: Fault, ctx: FaultyEngine | None,
                             gen: Gen | None) -> tuple[str, str]:
        names = self._live()
        return "all", self._kill(i, f, None, None, names)

    def _do_hold_group(self, i: int, f: Fault, ctx: FaultyEngine | None,
                       gen: Gen | None) -> tuple[str, str]:
        names, done = self._targets(i, f, ctx), []
        for name in names:
            call = gen if gen is not None and ctx is not None and ctx.name == name \
                else self._busiest(name)
            k = call.open_index() if call is not None else None
            if call is None or k is None:
                self._arm(name, i, "hold")
                done.append(f"the first request of {name}'s next call")
            else:
                call.hold_back(k)
                self.held.append(call.requests[k].sample)
                done.append(f"request {call.requests[k].sample} on {name}")
        return self._who(names, f), f"{', '.join(done) or 'nothing'} is never emitted"

    def began(self, engine: FaultyEngine, gen: Gen) -> None:
        """A generate call begins: the faults armed for its worker's next call."""
        armed = self._next.get(engine.name)
        if armed:
            self._next[engine.name] = []
            for i, kind in armed:
                if kind == "kill":
                    gen.arm_kill(self._why(i, self.scenario.faults[i]))
                elif kind == "stall":
                    gen.stall(self.scenario.faults[i].delay_s)
                elif kind == "hold":
                    gen.hold_back(0)
                    self.held.append(gen.requests[0].sample)
        if gen.n >= 2:
            for fault in self._reorder:
                if fault.left > 0 and fault.hits(engine.name):
                    fault.left -= 1
                    gen.reverse()
                    break

    # -- messages ----------------------------------------------------------------------------
    def _msg(self, i: int, f: Fault, ctx: FaultyEngine | None, kind: str,
             **kw: Any) -> tuple[str, frozenset[str] | None]:
        names = self._targets(i, f, ctx)
        workers = None if f.target == "all" else frozenset(names)
        fault = _MsgFault(i, kind, workers, **kw)
        (self._reorder if kind == "reorder" else self._msgs).append(fault)
        return self._who(names, f), workers

    def _do_delay_messages(self, i: int, f: Fault, ctx: FaultyEngine | None,
                           gen: Gen | None) -> tuple[str, str]:
        until = self._now() + f.duration_s
        who, _ = self._msg(i, f, ctx, "delay", until=until, delay=f.delay_s)
        return who, f"completions arrive {f.delay_s:g} s late for {f.duration_s:g} s"

    def _do_reorder_messages(self, i: int, f: Fault, ctx: FaultyEngine | None,
                             gen: Gen | None) -> tuple[str, str]:
        who, _ = self._msg(i, f, ctx, "reorder", left=f.count)
        return who, f"the next {f.count} call(s) deliver their completions in reverse order"

    def _do_duplicate_messages(self, i: int, f: Fault, ctx: FaultyEngine | None,
                               gen: Gen | None) -> tuple[str, str]:
        who, _ = self._msg(i, f, ctx, "duplicate", left=f.count)
        return who, f"the next {f.count} completion(s) are delivered twice"

    def _do_malformed_completion(self, i: int, f: Fault, ctx: FaultyEngine | None,
                                 gen: Gen | None) -> tuple[str, str]:
        who, _ = self._msg(i, f, ctx, "malformed", left=f.count)
        return who, (f"the next {f.count} completion(s) are malformed (negative token count, "
                     "text None, NaN gen_s, not a Completion)")

    def _deliveries(self, name: str, comp: Any) -> list[tuple[float, Any]]:
        if not self._msgs:
            return [(0.0, comp)]
        delay, copies, now = 0.0, 1, self._now()
        for fault in self._msgs:
            if not fault.hits(name):
                continue
            if fault.kind == "delay" and now < fault.until:
                delay += fault.delay
            elif fault.kind == "duplicate" and fault.left > 0:
                fault.left -= 1
                copies += 1
            elif fault.kind == "malformed" and fault.left > 0:
                fault.left -= 1
                comp = _malformed(comp, fault.turn)
                fault.turn += 1
        return [(delay, comp)] * copies

    # -- weights -----------------------------------------------------------------------------
    def _load(self, i: int, f: Fault, ctx: FaultyEngine | None, kind: str,
              **kw: Any) -> str:
        names = self._targets(i, f, ctx)
        workers = None if f.target == "all" else frozenset(names)
        if "left" in kw:  # count loads per worker hit
            kw["left"] *= max(1, len(names))
        self._loads.append(_LoadFault(i, kind, workers, **kw))
        return self._who(names, f)

    def _do_delay_weights(self, i: int, f: Fault, ctx: FaultyEngine | None,
                          gen: Gen | None) -> tuple[str, str]:
        who = self._load(i, f, ctx, "delay", until=self._now() + f.duration_s, delay=f.delay_s)
        return who, f"weight loads take {f.delay_s:g} s longer for {f.duration_s:g} s"

    def _do_fail_weights(self, i: int, f: Fault, ctx: FaultyEngine | None,
                         gen: Gen | None) -> tuple[str, str]:
        who = self._load(i, f, ctx, "fail", left=f.count)
        return who, f"the next {f.count} weight load(s) of each worker hit fail (WorkerLost)"

    def _do_stall_weights(self, i: int, f: Fault, ctx: FaultyEngine | None,
                          gen: Gen | None) -> tuple[str, str]:
        who = self._load(i, f, ctx, "stall", left=f.count)
        return who, f"the next {f.count} weight load(s) of each worker hit never return"

    def load_fault(self, engine: FaultyEngine) -> tuple[str | None, float]:
        fault: str | None = None
        delay, now = 0.0, self._now()
        for lf in self._loads:
            if lf.workers is not None and engine.name not in lf.workers:
                continue
            if lf.kind == "delay":
                if now < lf.until:
                    delay += lf.delay
            elif lf.left > 0 and fault is None:
                lf.left -= 1
                fault = lf.kind
        return fault, delay

    # -- rewards -----------------------------------------------------------------------------
    def _do_kill_reward_worker(self, i: int, f: Fault, ctx: FaultyEngine | None,
                               gen: Gen | None) -> tuple[str, str]:
        self._lost_calls += f.count
        return "reward", f"the next {f.count} reward call(s) are lost before they answer"

    def _do_slow_rewards(self, i: int, f: Fault, ctx: FaultyEngine | None,
                         gen: Gen | None) -> tuple[str, str]:
        self._slow.append(_Window(i, self._now() + f.duration_s, factor=f.factor))
        return "reward", f"reward calls take {f.factor:g}x longer for {f.duration_s:g} s"

    def reward_fault(self) -> tuple[str | None, float]:
        now = self._now()
        factor = max((w.factor for w in self._slow if now < w.until), default=1.0)
        if self._lost_calls > 0:
            self._lost_calls -= 1
            return "lost", factor
        return None, factor

    def _do_fail_reward(self, i: int, f: Fault, ctx: FaultyEngine | None,
                        gen: Gen | None) -> tuple[str, str]:
        self._fail.append(_Window(i, self._now() + f.duration_s, f.share, self.rngs[i]))
        self.failed[i] = []
        return "reward", (f"the reward function fails for {f.share:.0%} of the samples for "
                          f"{f.duration_s:g} s (discard detail: {self._fail_tag(i)})")

    @staticmethod
    def _fail_tag(i: int) -> str:
        return f"chaos fault #{i} fail_reward"

    def _do_malformed_reward(self, i: int, f: Fault, ctx: FaultyEngine | None,
                             gen: Gen | None) -> tuple[str, str]:
        self._malformed_reward.append(_MsgFault(i, "malformed", None, left=f.count))
        return "reward", (f"the next {f.count} reward call(s) return malformed payloads (NaN, "
                          "a string, the wrong count)")

    def _do_duplicate_reward(self, i: int, f: Fault, ctx: FaultyEngine | None,
                             gen: Gen | None) -> tuple[str, str]:
        self._dup_reward.append(_MsgFault(i, "duplicate", None, left=f.count))
        return "reward", f"the next {f.count} reward(s) are delivered twice"

    def scored(self, sids: Sequence[SampleId], scores: list[Score]) -> list[Score]:
        now = self._now()
        for w in self._fail:
            if now >= w.until:
                continue
            name = self.scorer.names[0] if self.scorer is not None and self.scorer.names \
                else "reward"
            error = f"reward_error: {name} raised InjectedFailure: {self._fail_tag(w.index)}"
            out, hit = [], []
            for k, score in enumerate(scores):  # a wrong count stays wrong (checked later)
                if k < len(sids) and isinstance(score, Score) and score.value is not None \
                        and (w.share >= 1.0 or w.rng.random() < w.share):
                    self.failed[w.index].append(str(sids[k]))
                    hit.append(str(sids[k]))
                    score = Score(None, error, {})
                out.append(score)
            scores = out
            self._name_failed(w.index, "fail_reward", hit)
        for m in self._malformed_reward:
            if m.left > 0 and scores:
                m.left -= 1
                # a NaN or a string fails the first sample; one score too few, the whole call
                hit = [str(s) for s in (sids if m.turn % 3 == 2 else sids[:1])]
                scores = _bad_scores(scores, m.turn)
                m.turn += 1
                self._name_failed(m.index, "malformed_reward", hit)
                break
        return scores

    def _name_failed(self, i: int, kind: str, sids: list[str]) -> None:
        """A continuation record of fault ``i`` naming the samples it failed (the chaos
        checks' ``reward_failures`` reads them: never committed, discarded reward_error)."""
        if sids and self.buf is not None and not self.buf.closed:
            self.buf.record(ev.FaultInjected(ts=self.buf.clock.now(), fault=kind,
                                             target="reward",
                                             detail=f"#{i} failed {' '.join(sids)}"))

    def rewarded(self, sids: Sequence[SampleId]) -> None:
        self.handoff("reward")
        buf = self.buf
        if buf is None or buf.closed:
            return
        version = self.scorer.version if self.scorer is not None else "chaos"
        for m in self._dup_reward:
            for sid in sids:
                if m.left <= 0:
                    break
                if buf.request_state(sid) != "rewarded":
                    continue
                try:
                    value, _ = buf.sample_info(sid)
                except UnknownSampleError:  # not its current attempt any more
                    continue
                m.left -= 1
                buf.reward(sid, value, version)  # the buffer must reject it: duplicate

    # -- trainer and process -----------------------------------------------------------------
    def _do_stall_trainer(self, i: int, f: Fault, ctx: FaultyEngine | None,
                          gen: Gen | None) -> tuple[str, str]:
        self._stall_steps.append(f.duration_s)
        return "trainer", f"the next trainer step sleeps {f.duration_s:g} s first"

    def _do_version_burst(self, i: int, f: Fault, ctx: FaultyEngine | None,
                          gen: Gen | None) -> tuple[str, str]:
        self._burst += f.count
        inner = self.trainer.inner if self.trainer is not None else None
        how = "" if hasattr(inner, "step_seconds") else \
            f" (asked; {type(inner).__name__} has no step_seconds: its steps take their time)"
        return "trainer", f"the next {f.count} trainer steps take no time{how}"

    def step_fault(self) -> tuple[float, bool]:
        stall = self._stall_steps.pop(0) if self._stall_steps else 0.0
        instant = self._burst > 0
        if instant:
            self._burst -= 1
        return stall, instant

    def commit_fault(self) -> None:
        for i in list(self._crash):
            self._crash.remove(i)
            self._fire(i, "commit")

    def _do_trainer_crash(self, i: int, f: Fault, ctx: FaultyEngine | None,
                          gen: Gen | None) -> tuple[str, str]:
        step = self.buf.version.step + 1 if self.buf and self.buf.version else 0
        return "trainer", f"the trainer crashed between the lease of step {step} and its commit"

    def _do_kill_process(self, i: int, f: Fault, ctx: FaultyEngine | None,
                         gen: Gen | None) -> tuple[str, str]:
        return "process", "SIGKILL of the whole process"

    def _do_interrupt(self, i: int, f: Fault, ctx: FaultyEngine | None,
                      gen: Gen | None) -> tuple[str, str]:
        self._stop = self._why(i, f)
        return "process", "the operator stops the run (Interrupted)"

    def _do_version_bump(self, i: int, f: Fault, ctx: FaultyEngine | None,
                         gen: Gen | None) -> tuple[str, str]:
        from freshroll.runtime.pipeline import Published

        pipe = self.pipe
        assert pipe is not None and pipe.published is not None
        pub = pipe.published
        fake = pub.version.child([], f"chaos-version-bump:{self.scenario.name}#{i}")
        pipe.published = Published(fake, pub.weights)
        pipe.pool.version_published()
        return "all", f"published {fake} (never committed) to the workers"

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

    def _now(self) -> float:
        return self.buf.clock.now() if self.buf is not None else 0.0

    # -- the hooks' task ---------------------------------------------------------------------
    async def run(self, pipe: Pipeline) -> None:
        self.pipe = pipe
        lim = pipe.cfg.limits
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


def _malformed(comp: Any, turn: int) -> Any:
    """A malformed copy of ``comp`` (``turn`` picks how)."""
    if not isinstance(comp, Completion):
        return comp
    how = turn % 4
    if how == 0:
        return dataclasses.replace(comp, n_tokens=-3)
    if how == 1:
        return dataclasses.replace(comp, text=None)  # type: ignore[arg-type]
    if how == 2:
        return dataclasses.replace(comp, gen_s=math.nan)
    return {"text": comp.text, "tokens": comp.tokens}


def _bad_scores(scores: list[Score], turn: int) -> list[Score]:
    """A malformed reward payload: a NaN, a string value, or one score too few."""
    how = turn % 3
    if how == 2:
        return scores[:-1]
    first = scores[0]
    value: Any = math.nan if how == 0 else "0.5"
    return [Score(value, None, dict(first.components)), *scores[1:]]


__all__ = ["KILL_KINDS", "Injector"]
