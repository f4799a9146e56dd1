"""Group deadlines in the pipeline (pipeline/tailing.py, WorkerPool.cancel): simulated engines
in virtual time (P3 and a long-tailed P2, small shapes), a scripted continuous engine that
honours cancel, and a real-clock smoke through the thread adapter of real engines."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from async_fakes import AsyncHarness, Scorer, Trainer
from freshroll.clock import VirtualClock
from freshroll.config import Config, load_config
from freshroll.engines.base import Completion
from freshroll.engines.seams import Emit, GenRequest, SamplingParams
from freshroll.harness.verify import verify_ledger
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.results import KernelConfig
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion, request_of
from freshroll.ledger.store import Ledger
from freshroll.pipeline.observers import Callbacks
from freshroll.pipeline.pipeline import Pipeline, StepReport
from freshroll.rewards.tasks import make_prompts
from freshroll.sim.components import build_sim, sim_model_digest
from freshroll.sim.engine import SimEngine
from pipeline_fakes import FakeEngine, Harness

SIM = ["rollout.engine=sim", "sim.clock=virtual", "run.progress=false", "run.steps=12",
       "run.max_staleness=2", "rollout.group_size=8", "rollout.batch_groups=2",
       "rollout.workers=2", "rollout.worker_batch=16", "limits.reward_timeout_s=30"]


class CheckedSimEngine(SimEngine):
    """A simulated engine that fails a call that would hold more than ``limit`` requests (a
    slot counted free by the pool while the engine still runs it)."""

    limit = 0
    peak = 0

    async def generate(self, requests: Sequence[GenRequest], params: SamplingParams, seed: int,
                       emit: Emit) -> None:
        held = len(self._jobs) + len(requests)
        self.peak = max(self.peak, held)
        assert held <= self.limit, f"{self.name}: {held} requests > {self.limit} slots"
        await super().generate(requests, params, seed, emit)


class SimRun:
    """The real pipeline on simulated engines (build_sim's draws, scorer and trainer)."""

    def __init__(self, tmp: Path, overrides: Sequence[str]) -> None:
        self.cfg: Config = load_config(None, [*SIM, *overrides])
        c = self.cfg
        self.clock = VirtualClock()
        self.path = tmp / "ledger.sqlite"
        self.buf = SampleBuffer.open(
            Ledger(self.path, sync="off"),
            KernelConfig(c.run.max_staleness, c.rollout.batch_groups, c.rollout.group_size),
            self.clock, run_id="tails", initial_version=PolicyVersion.initial(sim_model_digest(c)),
        )
        parts = build_sim(c, self.clock, self.buf)
        self.engines: list[CheckedSimEngine] = []

        async def factory(name: str) -> CheckedSimEngine:
            await asyncio.sleep(c.sim.worker_start_s)
            engine = CheckedSimEngine(name, parts.draws)
            engine.limit = c.rollout.worker_batch
            self.engines.append(engine)
            return engine

        prompts = make_prompts(c.task.name, c.task.n_prompts, c.run.seed, **c.task.params)
        self.steps: list[StepReport] = []
        self.pipe = Pipeline(self.buf, factory, parts.scorer, parts.trainer,
                             {p.prompt_id: p for p in prompts}, [p.prompt_id for p in prompts],
                             c, observers=[Callbacks(on_step=self.check_slots)])

    def check_slots(self, report: StepReport) -> None:
        """At every step: no worker counts more requests in flight than it may hold, nor
        fewer than its engine runs, and every request it counts pending in a call the
        engine took is one the engine still runs (a cut one's slot is free)."""
        self.steps.append(report)
        engines = {e.name: e for e in self.engines}
        for w in self.pipe.pool.active.values():
            if w.engine is None:
                continue
            assert 0 <= w.inflight <= self.cfg.rollout.worker_batch
            engine = engines[w.name]
            assert w.inflight >= engine.counters()["open"]
            assert w.live is not None
            live = [c for c in w.live if not c.over]
            assert w.inflight == sum(c.pending for c in live)
            for c in live:  # a submitted call: what the pool counts pending, the engine runs
                if any(s in engine._jobs for s in c.sids):
                    assert {s for s, e in zip(c.sids, c.emitted, strict=True) if not e} <= set(
                        engine._jobs), "a cut request still holds its slot in the pool"

    def run(self) -> None:
        async def main() -> None:
            async with asyncio.timeout(100_000):  # virtual seconds: a hang fails the test
                await self.pipe.run()

        self.clock.run(main())
        self.buf.shutdown("done")

    def events(self) -> list[ev.Event]:
        self.buf.ledger.flush()
        return [e for _, e in self.buf.ledger.events()]


def committed_group_sizes(events: list[ev.Event]) -> Counter[str]:
    sizes: Counter[str] = Counter()
    for e in events:
        if isinstance(e, ev.Committed):
            for s in e.samples:
                sizes[request_of(s).partition(".")[0]] += 1
    return sizes


P2_LONG_TAIL = ["sim.profile=P2", "sim.params={lengths: {sigma: 1.6}}"]


@pytest.mark.parametrize("profile", [["sim.profile=P3"], P2_LONG_TAIL], ids=["P3", "P2-long-tail"])
def test_deadlines_cut_stragglers_and_their_slots_are_reused(tmp_path: Path,
                                                             profile: list[str]) -> None:
    run = SimRun(tmp_path, [*profile, "tail.deadline=true"])
    run.run()
    events = run.events()
    assert len(run.steps) == run.cfg.run.steps  # no hang
    report = verify_ledger(run.buf.ledger, dict(run.buf.counts))
    assert report.ok, report.render()
    deadline = [e for e in events if isinstance(e, ev.Discarded) and e.reason == "deadline"]
    assert deadline, "no straggler was cut"
    assert all("deadline_factor 3" in e.detail for e in deadline)
    sizes = committed_group_sizes(events)
    assert min(sizes.values()) >= run.cfg.tail.min_keep  # no group trained below min_keep
    assert any(n < run.cfg.rollout.group_size for n in sizes.values())  # some were cut short
    tailing = run.pipe.tailing
    assert tailing is not None and tailing.ended["deadline"] == len(deadline)
    cancelled = sum(e.counters()["cancelled"] for e in run.engines)
    assert cancelled > 0 and tailing.freed == cancelled  # the engines dropped what the pool freed
    # slots freed by a cut were reused: a worker started requests after its first cut,
    # never holding more than worker_batch (CheckedSimEngine)
    first_cut = min(e.ts for e in deadline)
    assert any(isinstance(e, ev.Started) and e.ts > first_cut for e in events)
    assert max(e.peak for e in run.engines) <= run.cfg.rollout.worker_batch


def test_without_deadlines_nothing_is_cut(tmp_path: Path) -> None:
    run = SimRun(tmp_path, ["sim.profile=P3"])
    run.run()
    assert run.pipe.tailing is None
    events = run.events()
    assert not [e for e in events if isinstance(e, ev.Discarded)
                and e.reason in ("deadline", "cancelled")]
    assert sum(e.counters()["cancelled"] for e in run.engines) == 0
    assert min(committed_group_sizes(events).values()) >= 2
    report = verify_ledger(run.buf.ledger, dict(run.buf.counts))
    assert report.ok, report.render()


class Stragglers:
    """A continuous engine that honours cancel: members 2 and 3 of every group from g3 on
    take ``slow_s``, the others 1 s; ``generate`` returns once each request was emitted or
    cancelled."""

    continuous = True

    def __init__(self, name: str, slow_s: float) -> None:
        self.name, self.slow_s = name, slow_s
        self.open: dict[str, asyncio.Future[None]] = {}
        self.peak = 0
        self.calls: list[list[str]] = []  # the samples of each call
        self.returned: list[bool] = []
        self.cancelled: list[str] = []
        self.open_at_close: set[str] = set()

    def latency(self, sample: str) -> float:
        group, _, member = request_of(sample).partition(".")
        return self.slow_s if int(group[1:]) >= 3 and int(member) >= 2 else 1.0

    async def generate(self, requests: Sequence[GenRequest], params: SamplingParams, seed: int,
                       emit: Emit) -> None:
        n = len(self.calls)
        self.calls.append([r.sample for r in requests])
        self.returned.append(False)
        loop = asyncio.get_running_loop()
        futs = []
        for i, r in enumerate(requests):
            fut = self.open[r.sample] = loop.create_future()
            futs.append(fut)

            def done(i: int = i, r: GenRequest = r, fut: asyncio.Future[None] = fut) -> None:
                if not fut.done():
                    del self.open[r.sample]
                    fut.set_result(None)
                    emit(i, Completion((), (), (), r.sample, "stop", 0.0, n_tokens=8))

            loop.call_later(self.latency(r.sample), done)
        self.peak = max(self.peak, len(self.open))
        await asyncio.gather(*futs)
        self.returned[n] = True

    async def cancel(self, samples: Sequence[str]) -> None:
        for s in samples:
            fut = self.open.pop(s, None)
            if fut is not None:
                self.cancelled.append(s)
                fut.set_result(None)

    async def load_weights(self, weights: Any) -> float:
        return 0.0

    async def close(self) -> None:
        self.open_at_close = set(self.open)
        for fut in self.open.values():
            fut.cancel()


def test_a_call_whose_last_members_are_cut_returns_and_the_worker_refills(tmp_path: Path):
    """One worker, 4 slots, groups of 4: from g3 on each group's first call keeps two
    stragglers of 1000 s. The cut frees both slots, the call returns (no watchdog timeout at
    limits.generate_timeout_s = 50 s) and the worker goes on with the next groups."""
    engines: list[Stragglers] = []

    async def factory(name: str) -> Stragglers:
        engines.append(Stragglers(name, 1000.0))
        return engines[-1]

    h = AsyncHarness(tmp_path, overrides=[
        "rollout.workers=1", "rollout.worker_batch=4", "rollout.batch_groups=1",
        "run.steps=12", "tail.deadline=true", "limits.generate_timeout_s=50",
        "control.interval_s=1"], factory=factory, scorer=Scorer(0.01), trainer=Trainer(0.1))
    assert h.run(timeout_s=5_000) is None
    assert len(h.steps) == 12
    (engine,) = engines
    assert engine.cancelled and engine.peak <= 4
    # every call returned, the cut ones too, but those still running when the run ended
    for samples, returned in zip(engine.calls, engine.returned, strict=True):
        assert returned or set(samples) & engine.open_at_close, samples
    assert any(set(c) & set(engine.cancelled) for c, r in zip(engine.calls, engine.returned,
                                                              strict=True) if r)
    assert not [e for e in h.events(ev.WorkerFenced) if e.reason == "timeout"]
    cut = [e for e in h.events(ev.Discarded) if e.reason == "deadline"]
    assert {e.sample for e in cut} == set(engine.cancelled)
    assert h.clock.now() < 1000  # nobody waited for a straggler
    h.buf.shutdown("done")
    report = h.verify()
    assert report.ok, report.render()


def test_real_clock_deadlines_through_the_thread_adapter_do_not_break(tmp_path: Path) -> None:
    """Lock-step calls cannot be cut: a cut straggler's result comes with its batch and is
    rejected; the run ends and verifies."""
    def behaviour(call: int) -> None:
        time.sleep(0.15 if call % 3 == 0 else 0.01)

    h = Harness(tmp_path, engines=[FakeEngine(behaviour), FakeEngine(behaviour)], overrides=[
        "rollout.group_size=4", "rollout.worker_batch=3", "run.steps=8",
        "tail.deadline=true", "tail.deadline_factor=1.5", "tail.drop_factor=3",
        "control.interval_s=0.05"])
    assert h.run(timeout_s=60) is None
    assert len(h.steps) == 8
    h.buf.shutdown("done")
    report = h.verify()
    assert report.ok, report.render()
    assert h.pipe.tailing is not None and h.pipe.tailing.freed == 0  # nothing to free
    cut = {e.sample for e in h.events(ev.Discarded) if e.reason in ("deadline", "cancelled")}
    late = {e.sample for e in h.events(ev.Rejected)}
    assert cut  # slow batches (15 x) leave stragglers past 1.5 x the median
    assert late <= cut  # every rejected result is a cut straggler's, arrived with its batch
