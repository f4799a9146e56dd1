"""Engine metrics to the controller, in virtual time: the steering meter reads
ReportsStats from the active workers' engines (max KV usage, summed queues, preemptions per
window), a run without such an engine has no engine signal and no engine columns, and a
whole simulated run with a small KV cache under control.mode adaptive ends with the
controller having cut concurrency, the ledger's decisions naming the preemptions, the
metrics rows carrying them, and verify passing."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from async_fakes import BASE, AsyncEngine, AsyncHarness, Factory
from freshroll.config import load_config
from freshroll.control.controller import (
    ControlConfig,
    ControllerState,
    Decision,
    Snapshot,
    StaticController,
)
from freshroll.engines.seams import EngineStats
from freshroll.figures import metrics as m
from freshroll.harness.verify import verify_run
from freshroll.ledger import events as ev
from freshroll.ledger.store import Ledger
from freshroll.pipeline.steering import Meter, control_config
from freshroll.runtime import run as run_mod


class Reporting(AsyncEngine):
    """A fake engine that reports: 4 run, the rest wait; KV = active / 10; one preemption
    per generate call (cumulative)."""

    def stats(self) -> EngineStats | None:
        if not self.calls:
            return None  # no report before the first call
        return EngineStats(running=min(self.active, 4), waiting=max(0, self.active - 4),
                           kv_cache_usage=min(1.0, self.active / 10), preemptions=self.calls)


class Recording:
    """The static controller, checking each snapshot against the engines at that instant."""

    def __init__(self, factory: Factory, config: ControlConfig) -> None:
        self.factory, self.inner = factory, StaticController(config)
        self.snaps: list[Snapshot] = []
        self.expected: list[dict[str, Any]] = []
        self._calls = 0

    def decide(self, snap: Snapshot, state: ControllerState) -> Decision:
        engines = [e for e in self.factory.made if e.calls]
        calls = sum(e.calls for e in self.factory.made)
        self.expected.append({} if not engines else {
            "kv_cache_usage": max(min(1.0, e.active / 10) for e in engines),
            "engine_waiting": sum(max(0, e.active - 4) for e in engines),
            "engine_running": sum(min(e.active, 4) for e in engines),
            "preemptions": calls - self._calls,
        })
        self._calls = calls
        self.snaps.append(snap)
        return self.inner.decide(snap, state)


def harness(tmp: Path, make: Any) -> tuple[AsyncHarness, Recording]:
    factory = Factory(make=make)
    over = ["rollout.workers=2", "run.steps=20", "control.interval_s=2"]
    rec = Recording(factory, control_config(load_config(None, [*BASE, *over])))
    return AsyncHarness(tmp, overrides=over, factory=factory, controller=rec), rec


def all_events(h: AsyncHarness) -> list[ev.Event]:
    h.buf.ledger.flush()
    return [e for _, e in h.buf.ledger.events()]


def engine_total(events: list[ev.Event]) -> int:
    """Preemptions in the decisions up to the last commit (what the last row sums)."""
    last = max(i for i, e in enumerate(events) if isinstance(e, ev.Committed))
    return sum(e.inputs["preemptions"] for e in events[:last]
               if isinstance(e, ev.ControllerDecided))


def test_the_meter_reads_every_active_engine_that_reports(tmp_path: Path):
    h, rec = harness(tmp_path, lambda name: Reporting(name, True, 0.5))
    assert h.run() is None
    assert len(rec.snaps) >= 5
    for snap, want in zip(rec.snaps, rec.expected, strict=True):
        got = {k: getattr(snap, k) for k in want}
        assert got == want
        if not want:  # before the engines' first call
            assert snap.kv_cache_usage is None and snap.preemptions == 0
    assert sum(s.preemptions for s in rec.snaps) > 0
    assert any(s.engine_waiting > 0 for s in rec.snaps)  # 8 in flight per worker, 4 run
    decided = h.events(ev.ControllerDecided)
    assert [d.inputs["preemptions"] for d in decided] == [s.preemptions for s in rec.snaps]
    assert any("preempted" in d.reason for d in decided)
    events = all_events(h)
    reported = [r for r in m.rows(events) if "preemptions" in r]
    assert reported and reported[-1]["preemptions"] == engine_total(events) > 0
    h.buf.shutdown("done")
    assert h.verify().ok


def test_an_engine_without_stats_gives_no_engine_signal_and_no_columns(tmp_path: Path):
    h, rec = harness(tmp_path, lambda name: AsyncEngine(name, True, 0.5))
    assert h.run() is None
    assert all(s.kv_cache_usage is None and s.preemptions == s.engine_waiting == 0
               for s in rec.snaps)
    rows = m.rows(all_events(h))
    assert rows and not any({"kv_cache_usage", "preemptions"} & set(r) for r in rows)
    assert not any("preempted" in d.reason for d in h.events(ev.ControllerDecided))
    h.buf.shutdown("done")


def test_a_restarted_engine_counts_its_preemptions_from_zero():
    class W:  # the two Worker fields the meter reads
        def __init__(self, engine: Any) -> None:
            self.engine = engine

    class Fixed:
        def __init__(self, n: int) -> None:
            self.n = n

        def stats(self) -> EngineStats:
            return EngineStats(running=1, waiting=0, kv_cache_usage=0.5, preemptions=self.n)

    meter = Meter.__new__(Meter)
    meter._preempted, meter._reports = {}, {}
    first = Fixed(5)
    assert meter._engines({"w0": W(first)})["preemptions"] == 5  # type: ignore[dict-item]
    first.n = 7
    assert meter._engines({"w0": W(first)})["preemptions"] == 2  # type: ignore[dict-item]
    assert meter._engines({"w0": W(Fixed(3))})["preemptions"] == 3  # type: ignore[dict-item]
    assert meter._engines({"w0": W(AsyncEngine("x", True, 1.0))}) == {}  # type: ignore[dict-item]


SIM = ["rollout.engine=sim", "sim.clock=virtual", "run.progress=false", "run.steps=30",
       "run.max_staleness=2", "task.n_prompts=64", "rollout.group_size=4",
       "rollout.batch_groups=2", "rollout.workers=1", "rollout.worker_batch=16",
       "control.mode=adaptive", "control.interval_s=2", "control.max_concurrency=32",
       "sim.profile=P1",
       "sim.params={lengths: {median_tokens: 40, cap_multiple: 4, prompt_tokens: 40, "
       "prompt_sigma: 0.0}, server: {kv_capacity_tokens: 600}}"]


def decisions(out: Path) -> tuple[list[ev.Event], list[ev.ControllerDecided]]:
    with Ledger(out / "ledger.sqlite", readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
    return events, [e for e in events if isinstance(e, ev.ControllerDecided)]


@pytest.mark.slow
def test_a_sim_run_with_a_small_kv_cache_cuts_concurrency_on_preemptions(tmp_path: Path):
    # 16 sequences x (40 prompt + ~20 produced) need ~1000 KV tokens of the 600: preemptions
    out = tmp_path / "run"
    result = run_mod.run(load_config(None, SIM), out, stream=io.StringIO())
    assert result.ok, verify_run(out).render()
    assert verify_run(out).ok
    events, decided = decisions(out)
    assert decided and all(d.inputs["kv_cache_usage"] is not None for d in decided)
    cuts = [d for d in decided if "memory cut" in d.reason]
    assert cuts, [d.reason for d in decided]
    first = cuts[0]
    assert first.inputs["preemptions"] > 0 and "preemptions" in first.reason
    assert first.settings.concurrency < first.previous.concurrency
    assert decided[-1].settings.concurrency < 16  # ends below where it started
    assert max(d.inputs["kv_cache_usage"] for d in decided) <= 1.0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows and all({"kv_cache_usage", "engine_waiting", "engine_running", "preemptions"}
                        <= set(r) for r in rows[1:])
    assert rows[-1]["preemptions"] == engine_total(events) > 0
    # --resume: the last decision's settings and state (the cut's ceiling) carry on
    last = decided[-1]
    result = run_mod.run(load_config(None, [*SIM, "run.steps=36"]), out, resume=True,
                         stream=io.StringIO())
    assert result.ok, verify_run(out).render()
    events, after = decisions(out)
    resumed = after[len(decided)]
    assert resumed.previous == last.settings
    assert resumed.state["ceiling"] == last.state["ceiling"] is not None
    assert all(d.inputs["kv_cache_usage"] is not None for d in after)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 36 and rows[-1]["preemptions"] == engine_total(events)
