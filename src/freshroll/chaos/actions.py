"""The fault actions: what each fault kind does when it fires, and the faults it leaves armed.

:class:`FaultActions` is the Injector's base (:mod:`freshroll.chaos.inject` decides *when* a
fault fires and records it): ``_do_<kind>`` does it and returns the target and what was done;
a fault that acts later stays armed here, asked by the seam wrappers' queries (``began``,
``load_fault``, ``reward_fault``, ``step_fault``; :mod:`freshroll.chaos.faulty`) and by the
hand-offs of a completion (``_deliveries``), a reward call (``scored``) and its rewards.
The targets, and what each kind does, are tabled in :mod:`freshroll.chaos.inject`'s doc.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from freshroll.chaos.faulty import FaultyEngine, FaultyFactory, FaultyScorer, FaultyTrainer, Gen
from freshroll.chaos.plan import Fault, Scenario
from freshroll.engines.base import Completion
from freshroll.errors import UnknownSampleError
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import SampleId
from freshroll.rewards.scoring import Score

if TYPE_CHECKING:
    from freshroll.kernel.buffer import SampleBuffer
    from freshroll.pipeline.hooks import HookContext


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


class FaultActions:
    """The fault actions of one scenario on one seed, and the faults they armed (see the
    module doc). The Injector sets the run's parts (``buf``, the wrappers) as the run
    starts and the pipeline's :class:`~freshroll.pipeline.hooks.HookContext` (``ctx``) once
    its hooks' task runs; an action before that finds no live worker."""

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.scenario, self.seed = scenario, seed
        self.rngs = {i: random.Random(f"{seed}:{scenario.name}:{i}")
                     for i in range(len(scenario.faults))}
        self.buf: SampleBuffer | None = None
        self.ctx: HookContext | None = None
        self.factory: FaultyFactory | None = None
        self.scorer: FaultyScorer | None = None
        self.trainer: FaultyTrainer | None = None
        self.failed: dict[int, list[str]] = {}  # fail_reward: the sample ids it failed
        self.held: list[str] = []  # hold_group: the sample ids never emitted
        self._stop: str | None = None  # interrupt: the reason
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

    def _now(self) -> float:
        return self.buf.clock.now() if self.buf is not None else 0.0

    # -- targets -----------------------------------------------------------------------------
    def _live(self) -> list[str]:
        if self.ctx is not None:
            return list(self.ctx.workers().live)
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


    def _deliver_again(self, sids: Sequence[SampleId]) -> None:
        """duplicate_reward: rewards just delivered are delivered once more."""
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
        assert self.ctx is not None
        fake = self.ctx.published().child([], f"chaos-version-bump:{self.scenario.name}#{i}")
        self.ctx.publish_out_of_band(fake)
        return "all", f"published {fake} (never committed) to the workers"


def _malformed(comp: Any, turn: int) -> Any:
    """A malformed copy of ``comp`` (``turn`` picks how)."""
    if not isinstance(comp, Completion):
        return comp
    how = turn % 4
    if how == 0:
        return dataclasses.replace(comp, n_tokens=-3)
    if how == 1:
        return dataclasses.replace(comp, text=None)  # type: ignore[arg-type]  # malformed on purpose
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

