"""The hooks' context (:class:`freshroll.pipeline.hooks.HookContext`): a hook's ``run`` task
gets the run's clock, a read view of the buffer, the config it reads, the live workers and
their number, and an out-of-band publication: never the pipeline (issue 24, item 2)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from async_fakes import AsyncHarness
from freshroll.clock import RealClock
from freshroll.config import load_config
from freshroll.harness.verify import verify_run
from freshroll.kernel.buffer import SampleBuffer
from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger
from freshroll.pipeline.hooks import BufferView, HookContext, Hooks, WorkerCensus
from freshroll.pipeline.pipeline import Pipeline
from freshroll.runtime.placements import Components
from freshroll.runtime.run import run

#: everything a hook may touch (a new port is a decision: add it here and to the docstring)
PORTS = {"clock", "buffer", "limits", "steps", "workers", "resize", "cancel", "published",
         "publish_out_of_band", "take_stopped", "notify"}


async def _until(cond: Any) -> None:
    while not cond():
        await asyncio.sleep(0.05)


class Probe(Hooks):
    """Checks each port of its context against the pipeline it came from, mid-run."""

    def __init__(self, h: AsyncHarness) -> None:
        self.h, self.done, self.ctx = h, False, None

    async def run(self, ctx: HookContext) -> None:
        h, pipe = self.h, self.h.pipe
        self.ctx = ctx
        assert not isinstance(ctx, Pipeline)
        assert {n for n in dir(ctx) if not n.startswith("_")} == PORTS
        assert ctx.clock is h.buf.clock
        assert ctx.limits is h.cfg.limits and ctx.steps == h.cfg.run.steps == 8
        # the buffer view reads the live buffer
        assert isinstance(ctx.buffer, BufferView)
        await _until(lambda: ctx.buffer.step >= 2)
        assert ctx.buffer.version is h.buf.version
        assert dict(ctx.buffer.counts) == dict(h.buf.counts)
        assert ctx.buffer.counts["steps"] >= 2 and ctx.buffer.counts["no such key"] == 0
        with pytest.raises(TypeError):
            ctx.buffer.counts["steps"] = 0  # type: ignore[index]  # a read view
        step = ctx.buffer.step
        await _until(lambda: ctx.buffer.step > step)  # the same view, later: it moved on
        assert ctx.buffer.version is h.buf.version
        # resize reaches the pool
        assert ctx.workers() == WorkerCensus(("w0", "w1"), ("w0", "w1"), ())
        ctx.resize(3)
        assert ctx.workers().live == ("w0", "w1", "w2") == tuple(sorted(pipe.pool.active))
        await _until(lambda: ctx.workers().ready == ("w0", "w1", "w2"))
        ctx.resize(2)  # the newest retires
        assert ctx.workers().live == ("w0", "w1") and ctx.workers().leaving == ("w2",)
        assert tuple(pipe.pool.leaving) == ("w2",)
        await _until(lambda: not ctx.workers().leaving)
        # publish reaches the published versions (and the pool refuses what was never
        # committed: the run goes on)
        pub = pipe.published
        assert pub is not None and ctx.published() is pub.version
        fake = ctx.published().child([], "test:out-of-band")
        ctx.publish_out_of_band(fake)
        assert pipe.published is not None and pipe.published.version is fake
        assert pipe.published.weights is pub.weights and ctx.published() is fake
        self.done = True


def test_a_hook_gets_its_ports_and_they_reach_the_live_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    h = AsyncHarness(tmp_path, overrides=["rollout.workers=2", "run.steps=8",
                                          "control.interval_s=1000"])
    probe = Probe(h)
    h.pipe.hooks = probe
    assert h.run() is None
    assert probe.done and len(h.steps) == 8
    err = capsys.readouterr().err
    assert err.count("never committed to the ledger: refused") == 1
    assert probe.ctx is not None and probe.ctx.buffer.step == 8  # the view outlives the run
    h.buf.shutdown("done")
    report = h.verify()
    assert report.ok, report.render()


class _Pool:
    """A worker pool's surface, recorded."""

    def __init__(self) -> None:
        ready = asyncio.Event()
        ready.set()
        self.active = {"w1": SimpleNamespace(ready=asyncio.Event()),
                       "w0": SimpleNamespace(ready=ready)}
        self.leaving = {"w2": SimpleNamespace(ready=ready)}
        self.sizes: list[int] = []
        self.cancels: list[tuple[str, int, list[str]]] = []

    def resize(self, n: int) -> None:
        self.sizes.append(n)

    async def cancel(self, worker: str, epoch: int, samples: list[str]) -> int:
        self.cancels.append((worker, epoch, samples))
        return len(samples)


def test_each_port_reaches_what_it_names() -> None:
    buf = SimpleNamespace(clock=RealClock(), stopped=[("g0-0", "w0", 1)], version=None,
                          counts={})
    pool, published, woken = _Pool(), ["v0"], []
    ctx = HookContext(buf, pool, SimpleNamespace(), 5,  # type: ignore[arg-type]
                      published=lambda: published[-1],  # type: ignore[arg-type,return-value]
                      publish=published.append,  # type: ignore[arg-type]
                      notify=lambda: woken.append(1))
    assert ctx.workers() == WorkerCensus(("w0", "w1"), ("w0",), ("w2",))  # sorted by name
    ctx.resize(4)
    assert pool.sizes == [4]
    assert ctx.take_stopped() == [("g0-0", "w0", 1)] and buf.stopped == []  # taken once
    assert ctx.take_stopped() == []
    assert asyncio.run(ctx.cancel("w0", 1, ["g0-0"])) == 1  # type: ignore[list-item]
    assert pool.cancels == [("w0", 1, ["g0-0"])]
    ctx.notify()
    assert woken == [1]
    ctx.publish_out_of_band("v1")  # type: ignore[arg-type]
    assert published == ["v0", "v1"] and ctx.published() == "v1"


class GrowAtStep(Hooks):
    """One more worker once step ``step`` is committed (docs/architecture.md's example)."""

    def __init__(self, step: int) -> None:
        self.step = step

    async def run(self, ctx: HookContext) -> None:
        while ctx.buffer.step < self.step:
            await asyncio.sleep(1.0)  # of the run's clock: virtual time in a simulated run
        ctx.resize(len(ctx.workers().live) + 1)


class Grow:  # a ChaosSession (runtime/placements.py): wraps no part, hooks the pipeline
    hooks = GrowAtStep(2)

    def wrap(self, parts: Components, buf: SampleBuffer) -> Components:
        return parts


def test_the_documented_hook_adds_a_worker_mid_run(tmp_path: Path) -> None:
    """docs/architecture.md's example, registered as there: a simulated run of one worker
    gets a second once step 2 is committed, and verifies."""
    cfg = load_config(None, ["rollout.engine=sim", "sim.clock=virtual", "run.progress=false",
                             "task.n_prompts=64", "rollout.group_size=4",
                             "rollout.batch_groups=2", "run.steps=5", "rollout.workers=1"])
    out = tmp_path / "a"
    result = run(cfg, out, chaos=Grow(), stream=io.StringIO(), report=False)
    assert result.ok and result.summary["steps"] == 5
    with Ledger(out / LEDGER_FILE, readonly=True) as ledger:
        ready = [e for _, e in ledger.events() if isinstance(e, ev.WorkerReady)]
    assert [e.worker for e in ready] == ["w0", "w1"]
    assert verify_run(out).ok, verify_run(out).render()
