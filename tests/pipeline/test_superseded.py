"""``Superseded``: a continuous engine that aborts its requests in flight for a new policy
version (``vllm.on_update: abort``). The pool re-issues them as new attempts (discarded
``fenced``), charges nothing to the worker's failure budget and fences no worker."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from async_fakes import AsyncEngine, AsyncHarness, Factory, latency
from freshroll.engines.base import Completion
from freshroll.engines.seams import Emit, GenRequest, SamplingParams
from freshroll.errors import Superseded
from freshroll.ledger import events as ev


class Aborts(AsyncEngine):
    """Continuous; ``load_weights`` aborts every call in flight: each emits what finished
    before, then raises Superseded."""

    def __init__(self, name: str) -> None:
        super().__init__(name, True, 0.5)
        self.live: set[asyncio.Event] = set()
        self.superseded = 0

    async def generate(self, requests: Sequence[GenRequest], params: SamplingParams, seed: int,
                       emit: Emit) -> None:
        self.calls += 1
        abort = asyncio.Event()
        self.live.add(abort)
        try:
            t = 0.0
            for lat, i in sorted((latency(r.sample, self.base_s), i)
                                 for i, r in enumerate(requests)):
                try:
                    await asyncio.wait_for(abort.wait(), lat - t)
                except TimeoutError:
                    t = lat
                    emit(i, Completion((), (), (), "ab", "length", lat, n_tokens=8))
                    continue
                self.superseded += 1
                raise Superseded(f"{len(requests)} request(s) aborted for new weights")
        finally:
            self.live.discard(abort)

    async def load_weights(self, weights: Any) -> float:
        for abort in self.live:
            abort.set()
        return await super().load_weights(weights)


def test_aborted_attempts_are_reissued_without_a_budget_charge(tmp_path: Path) -> None:
    factory = Factory(make=Aborts)
    # one failure charged to the worker would end the run
    h = AsyncHarness(tmp_path, factory=factory, overrides=[
        "rollout.workers=1", "run.steps=10", "limits.max_consecutive_failures=1",
        "limits.max_consecutive_failed_calls=1"])
    assert h.run() is None
    engine = factory.made[0]
    assert len(factory.made) == 1 and engine.superseded > 0
    fenced = [d for d in h.events(ev.Discarded)
              if d.reason == "fenced" and "aborted by the engine" in d.detail]
    assert fenced
    assert not h.events(ev.WorkerFenced) or all(
        f.reason == "retired" for f in h.events(ev.WorkerFenced))
    # each aborted attempt's request was started again as a new attempt
    started: dict[str, list[str]] = {}
    for s in h.events(ev.Started):
        started.setdefault(s.sample.partition("#")[0], []).append(s.sample)
    for d in fenced:
        attempts = started[d.request]
        assert d.sample in attempts and attempts[-1] != d.sample
    assert h.buf.counts["steps"] == 10
    h.buf.shutdown("done")
    report = h.verify()
    assert report.ok, report.render()
