"""A resumed run scores each recovered sample once, however its workers start.

On resume the attempts the dead process had running are re-issued at once, so a worker that
is up early serves them while another is still starting. The reward stage starts once every
worker is up; it must re-score only what was generated *before the crash*, not the samples
that early worker generated meanwhile (they are queued already). Found on Ray, where actors
come up seconds apart: 16 rewards delivered twice, rejected ``duplicate`` by the buffer.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from async_fakes import AsyncHarness, Factory
from freshroll.ledger import events as ev


class SlowSecond(Factory):
    """Worker w1 takes 30 s longer to start than w0."""

    async def __call__(self, name: str) -> Any:
        if name == "w1":
            await asyncio.sleep(30.0)
        return await super().__call__(name)


def test_a_late_worker_does_not_make_the_reward_stage_score_twice(tmp_path: Path):
    path = tmp_path / "ledger.sqlite"
    over = ["rollout.workers=2", "run.max_staleness=2"]
    first = AsyncHarness(tmp_path, ledger_path=path, overrides=[*over, "run.steps=6"])
    assert first.run() is None
    assert first.buf.running > 0  # attempts in flight when the process "dies"
    end = first.events(ev.Committed)[-1].ts
    first.buf.ledger.flush()
    first.buf.ledger.close()  # no shutdown: the process died here

    again = AsyncHarness(tmp_path, ledger_path=path, overrides=[*over, "run.steps=12"],
                         factory=SlowSecond(), start=end + 1.0)
    assert again.run() is None
    early = [s for s in again.events(ev.Started) if s.worker == "w0" and s.epoch == 1]
    ready = {r.worker: r.ts for r in again.events(ev.WorkerReady) if r.epoch == 1}
    assert early and early[0].ts < ready["w1"]  # w0 served before w1 was up
    assert [r for r in again.events(ev.Rejected) if r.reason == "duplicate"] == []
    again.buf.shutdown("done")
    report = again.verify()
    assert report.ok, report.render()
