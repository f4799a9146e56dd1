"""The real Pipeline with fully-async fakes: minutes of virtual time in milliseconds.

Continuous batching and lock-step workers, workers added, retired and stopped mid-run, the
same pipeline under the real clock, and the ledger as the record of every worker's life.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from async_fakes import AsyncEngine, AsyncHarness, Factory
from freshroll.engines.base import Completion
from freshroll.errors import WorkerLost
from freshroll.ledger import events as ev
from freshroll.pipeline.pipeline import Pipeline


async def until_step(pipe: Pipeline, step: int) -> None:
    while pipe.buf.counts["steps"] < step:
        await asyncio.sleep(0.05)


def worker_seconds(events: list[Any]) -> dict[tuple[str, int], float]:
    """Each worker epoch's active time: worker_started to its worker_fenced, or the close."""
    start: dict[tuple[str, int], float] = {}
    end: dict[tuple[str, int], float] = {}
    closed = None
    for e in events:
        if isinstance(e, ev.WorkerStarted):
            start[(e.worker, e.epoch)] = e.ts
        elif isinstance(e, ev.WorkerFenced):
            end.setdefault((e.worker, e.epoch), e.ts)
        elif isinstance(e, ev.Closed):
            closed = e.ts
    assert closed is not None
    return {k: end.get(k, closed) - t for k, t in start.items()}


def test_a_whole_run_in_virtual_time_with_continuous_batching(tmp_path: Path):
    h = AsyncHarness(tmp_path, overrides=["rollout.workers=2", "run.steps=40"])
    t0 = h.clock.now()
    assert h.run() is None
    assert len(h.steps) == 40
    assert h.clock.now() - t0 > 20  # tens of virtual seconds (milliseconds of wall time)
    engines = h.factory.made
    assert len(engines) == 2
    assert all(1 < e.peak <= 8 for e in engines)  # several requests overlap, never > concurrency
    assert all(e.calls > 40 for e in engines)  # new calls start as slots free (continuous)
    assert {e.worker for e in h.events(ev.WorkerReady)} == {"w0", "w1"}
    h.buf.shutdown("done")
    report = h.verify()
    assert report.ok, report.render()


def test_a_lock_step_engine_runs_one_call_at_a_time(tmp_path: Path):
    h = AsyncHarness(tmp_path, factory=Factory(continuous=False),
                     overrides=["rollout.workers=1", "run.steps=10"])
    assert h.run() is None
    [engine] = h.factory.made
    assert engine.peak <= 8  # one call of at most worker_batch requests in flight
    started = h.events(ev.Started)
    assert engine.calls >= len(started) / 8
    h.buf.shutdown("done")
    assert h.verify().ok


def test_workers_added_retired_and_stopped_mid_run_lose_nothing(tmp_path: Path):
    h = AsyncHarness(tmp_path, overrides=["rollout.workers=2", "run.steps=60"])
    retired_at: dict[str, float] = {}

    async def during(pipe: Pipeline) -> None:
        await until_step(pipe, 5)
        pipe.pool.add()
        pipe.pool.add()
        await until_step(pipe, 15)
        retired_at["w1"] = pipe.buf.clock.now()
        pipe.pool.retire("w1")
        await until_step(pipe, 25)
        await pipe.pool.stop("w2")
        await until_step(pipe, 35)
        pipe.pool.add()  # a fresh name: w1 and w2 are never used again

    assert h.run(during=during) is None
    assert len(h.steps) == 60
    h.buf.shutdown("done")
    report = h.verify()
    assert report.ok, report.render()  # nothing lost, duplicated or accepted from a fenced epoch
    started = [(e.worker, e.epoch) for e in h.events(ev.WorkerStarted)]
    assert started == [("w0", 0), ("w1", 0), ("w2", 0), ("w3", 0), ("w4", 0)]
    fenced = {(e.worker, e.epoch): e.reason for e in h.events(ev.WorkerFenced)}
    assert fenced == {("w1", 0): "retired", ("w2", 0): "stopped"}
    # the retired worker finished what it ran: nothing of it was re-issued; the stopped one's
    # running attempts were
    details = [d.detail for d in h.events(ev.Discarded) if d.reason == "fenced"]
    assert not any("w1 epoch 0" in d for d in details)
    last_w1 = max(e.ts for e in h.events(ev.Started) if e.worker == "w1")
    assert last_w1 <= retired_at["w1"]  # no new request after retirement
    assert all(e.closed for e in h.factory.made[:3] if e.name in ("w1", "w2"))
    secs = worker_seconds([e for _, e in h.buf.ledger.events()])
    assert set(secs) == set(started) and all(s > 0 for s in secs.values())
    assert secs[("w0", 0)] > secs[("w1", 0)]


def test_the_same_pipeline_runs_under_the_real_clock(tmp_path: Path):
    factory = Factory(base_s=0.004, startup_s=0.01)
    from async_fakes import Scorer, Trainer

    h = AsyncHarness(tmp_path, real=True, factory=factory, scorer=Scorer(0.001),
                     trainer=Trainer(0.005), overrides=["rollout.workers=2", "run.steps=5"])
    assert h.run(timeout_s=60) is None
    assert len(h.steps) == 5
    assert all(e.peak > 1 for e in factory.made)
    h.buf.shutdown("done")
    assert h.verify().ok


class _HangsOnce(AsyncEngine):
    """Its first call never returns; when cancelled it still emits later (a late result)."""

    async def generate(self, requests: Any, params: Any, seed: int, emit: Any) -> None:
        self.calls += 1
        if self.calls > 1:
            return await super().generate(requests, params, seed, emit)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            loop = asyncio.get_running_loop()
            for i in range(len(requests)):
                loop.call_later(5.0, emit, i, Completion((), (), (), "x", "length", 1.0,
                                                         n_tokens=3))
            raise


def test_a_hung_continuous_call_times_out_in_virtual_time_and_its_late_results_are_rejected(
    tmp_path: Path,
):
    made: list[Any] = []

    def make(name: str) -> Any:
        made.append(_HangsOnce(name, True, 0.5) if not made else AsyncEngine(name, True, 0.5))
        return made[-1]

    h = AsyncHarness(tmp_path, factory=Factory(make=make),
                     overrides=["rollout.workers=1", "run.steps=10",
                                "limits.generate_timeout_s=30"])
    assert h.run() is None
    assert len(h.steps) == 10 and len(made) == 2
    [fenced] = h.events(ev.WorkerFenced)
    assert (fenced.worker, fenced.epoch, fenced.reason) == ("w0", 0, "timeout")
    first = h.events(ev.Started)[0]
    assert fenced.ts - first.ts >= 30  # the watchdog fired at the timeout, not before
    stuck = {s.sample for s in h.events(ev.Started) if s.epoch == 0 and s.ts == first.ts}
    rejected = {r.sample: r.reason for r in h.events(ev.Rejected)}
    assert stuck and {s: rejected.get(s) for s in stuck} == dict.fromkeys(stuck, "fenced")
    h.buf.shutdown("done")
    report = h.verify()
    assert report.ok, report.render()


def test_a_lost_async_worker_is_replaced_by_a_new_engine_from_the_factory(tmp_path: Path):
    dead: set[str] = set()

    class Dies(AsyncEngine):  # each worker's first engine dies on its 5th call
        async def generate(self, requests: Any, params: Any, seed: int, emit: Any) -> None:
            if self.calls == 5 and self.name not in dead:
                dead.add(self.name)
                self.died = True
                raise WorkerLost("simulated node failure")
            return await super().generate(requests, params, seed, emit)

    factory = Factory(make=lambda name: Dies(name, True, 0.5))
    h = AsyncHarness(tmp_path, factory=factory, overrides=["rollout.workers=2", "run.steps=10"])
    assert h.run() is None
    lost = [(f.worker, f.epoch) for f in h.events(ev.WorkerFenced) if f.reason == "lost"]
    assert len(lost) == 2 and len(factory.made) == 4  # each worker died once, was replaced
    assert all(e.closed for e in factory.made if getattr(e, "died", False))
    assert h.buf.counts["discarded_fenced"] > 0
    h.buf.shutdown("done")
    assert h.verify().ok


def test_an_async_scorer_with_concurrent_calls_keeps_scoring_while_one_call_hangs(
    tmp_path: Path,
):
    from async_fakes import Scorer

    class HangsOnce(Scorer):
        concurrency = 4

        async def score(self, prompts: Any, completions: Any, state: Any) -> Any:
            self.calls += 1
            if self.calls == 3:
                await asyncio.sleep(1000)  # far past limits.reward_timeout_s
            return await super().score(prompts, completions, state)

    h = AsyncHarness(tmp_path, scorer=HangsOnce(), overrides=[
        "rollout.workers=2", "run.steps=30", "limits.reward_timeout_s=30"])
    assert h.run() is None
    timeouts = [d for d in h.events(ev.Discarded) if d.reason == "reward_timeout"]
    assert timeouts
    hung_at = min(d.ts for d in timeouts) - 30
    during = [r for r in h.events(ev.Rewarded) if hung_at + 1 < r.ts < hung_at + 29]
    assert during  # the other calls went on scoring while that one hung
    h.buf.shutdown("done")
    report = h.verify()
    assert report.ok, report.render()
