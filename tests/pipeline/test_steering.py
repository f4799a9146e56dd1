"""The steering task: every control.interval_s a decision is measured, recorded and applied;
a resume restores the last decision's settings and controller state, and recomputes the
admission budget from the replayed buffer (never reset). All in virtual time."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

from async_fakes import AsyncHarness, Factory, Trainer
from freshroll.control.controller import ControllerState, Decision, Settings, Snapshot
from freshroll.harness.verify import verify_ledger
from freshroll.ledger import events as ev
from freshroll.pipeline.pipeline import Pipeline


class Scripted:
    """A controller that returns the next settings of its script (then keeps them)."""

    def __init__(self, script: list[Settings]) -> None:
        self.script, self.calls = script, 0
        self.snaps: list[Snapshot] = []

    def decide(self, snap: Snapshot, state: ControllerState) -> Decision:
        self.snaps.append(snap)
        s = self.script[self.calls] if self.calls < len(self.script) else snap.settings
        self.calls += 1
        return Decision(at=snap.now, previous=snap.settings, settings=s,
                        state=ControllerState(last_up_at=snap.now, turnover_mark=self.calls),
                        bottleneck="balanced", reason=f"script {self.calls}", inputs=snap)


def test_static_mode_records_a_decision_every_interval_and_changes_nothing(tmp_path: Path):
    h = AsyncHarness(tmp_path, overrides=["rollout.workers=2", "run.steps=40",
                                          "control.interval_s=5"])
    assert h.run() is None
    decided = h.events(ev.ControllerDecided)
    assert len(decided) >= 4
    gaps = {round(b.ts - a.ts, 6) for a, b in itertools.pairwise(decided)}
    assert gaps == {5.0}
    assert {d.mode for d in decided} == {"static"}
    initial = ev.LiveSettings(admission_limit=0, concurrency=8, workers=2)
    assert all(d.previous == d.settings == initial for d in decided)
    assert all(d.inputs["window_s"] > 0 and "trainer_wait_s" in d.inputs for d in decided)
    assert sum(d.inputs["consumed_samples"] for d in decided) > 0
    for d in decided:  # the meter's figures stay within what the fakes can do
        w = d.inputs["window_s"]
        assert 0 <= d.inputs["blocked_s"] <= 2 * w + 1e-9
        assert 0 <= d.inputs["trainer_wait_s"] <= w + 1e-9
        # 8 slots, a request takes >= 0.25 s: no worker completes more than 32 per second
        assert all(0 <= r <= 32 for r in d.inputs["worker_rates"])
        assert d.inputs["switch_cost_s"] == 2.0  # the factory's start-up time
        assert 0 <= d.inputs["in_flight"] <= 16 + 256
    assert [e.worker for e in h.events(ev.WorkerStarted)] == ["w0", "w1"]
    h.buf.shutdown("done")
    assert h.verify().ok


def test_the_steering_task_applies_each_decision(tmp_path: Path):
    script = [Settings(12, 4, 3), Settings(6, 2, 1)]
    ctl = Scripted(script)
    h = AsyncHarness(tmp_path, controller=ctl, overrides=[
        "rollout.workers=2", "run.steps=60", "control.interval_s=5", "control.mode=adaptive"])
    seen: dict[str, Any] = {}

    async def during(pipe: Pipeline) -> None:
        while ctl.calls < 1:
            await asyncio.sleep(0.1)
        seen["after1"] = (pipe.buf.admission_limit, pipe.pool.concurrency, len(pipe.pool.active))
        while ctl.calls < 2:
            await asyncio.sleep(0.1)
        seen["after2"] = (pipe.buf.admission_limit, pipe.pool.concurrency, len(pipe.pool.active))

    assert h.run(during=during) is None
    assert seen == {"after1": (12, 4, 3), "after2": (6, 2, 1)}
    decided = h.events(ev.ControllerDecided)
    assert [(d.settings.admission_limit, d.settings.concurrency, d.settings.workers)
            for d in decided[:2]] == [(12, 4, 3), (6, 2, 1)]
    assert decided[0].reason == "script 1" and decided[1].state["turnover_mark"] == 2
    assert [e.worker for e in h.events(ev.WorkerStarted)] == ["w0", "w1", "w2"]
    fenced = {(f.worker, f.reason) for f in h.events(ev.WorkerFenced)}
    assert fenced == {("w2", "retired"), ("w1", "retired")}  # the newest go first
    h.buf.shutdown("done")
    report = h.verify()
    assert report.ok, report.render()


def test_the_adaptive_controller_adds_workers_when_the_trainer_starves(tmp_path: Path):
    h = AsyncHarness(tmp_path, factory=Factory(base_s=2.0, startup_s=1.0),
                     trainer=Trainer(0.2), overrides=[
                         "rollout.workers=1", "run.steps=80", "control.mode=adaptive",
                         "control.max_workers=6", "control.interval_s=5",
                         "control.up_cooldown_s=5", "run.max_staleness=2"])
    assert h.run() is None
    decided = h.events(ev.ControllerDecided)
    assert decided[0].bottleneck == "producer"
    ups = [d for d in decided if d.settings.workers > d.previous.workers]
    assert ups and "the trainer waited on" in ups[0].reason
    assert max(d.settings.workers for d in decided) > 1
    assert len({e.worker for e in h.events(ev.WorkerStarted)}) > 1
    h.buf.shutdown("done")
    assert h.verify().ok


def test_resume_after_workers_were_added_and_removed_restores_settings_and_budget(
    tmp_path: Path,
):
    path = tmp_path / "ledger.sqlite"
    over = ["rollout.workers=2", "control.interval_s=5", "control.mode=adaptive",
            "run.max_staleness=2"]
    first = AsyncHarness(tmp_path, ledger_path=path, overrides=[*over, "run.steps=40"],
                         controller=Scripted([Settings(10, 6, 3), Settings(9, 6, 2)]))
    assert first.run() is None
    buf = first.buf
    before = buf.capacity()
    assert buf.accepted + buf.running > 0 and buf.admission_limit == 9
    last = first.events(ev.ControllerDecided)[-1]
    assert (last.settings.workers, last.settings.concurrency) == (2, 6)
    fence_reasons = {(f.worker, f.reason) for f in first.events(ev.WorkerFenced)}
    assert fence_reasons == {("w2", "retired")}
    buf.ledger.flush()
    buf.ledger.close()  # no shutdown: the process died here
    end = last.ts

    again = AsyncHarness(tmp_path, ledger_path=path, overrides=[*over, "run.steps=50"],
                         start=end + 1.0)
    restored: dict[str, Any] = {}

    async def during(pipe: Pipeline) -> None:
        while not hasattr(pipe, "pool"):
            await asyncio.sleep(0)
        s = pipe.steering
        restored.update(settings=s.settings, state=s.state, limit=pipe.buf.admission_limit,
                        capacity=pipe.buf.capacity(), names=list(pipe.pool.active))

    assert again.run(during=during) is None
    assert restored["settings"] == Settings(9, 6, 2)
    assert restored["state"] == ControllerState.from_record(last.state)
    assert restored["limit"] == 9
    assert restored["capacity"] == before  # recomputed from the replayed buffer, not reset
    assert restored["names"] == ["w0", "w1"]  # the live workers come back; w2 was retired
    started = [(e.worker, e.epoch) for e in again.events(ev.WorkerStarted)]
    assert ("w0", 1) in started and ("w1", 1) in started and ("w2", 1) not in started
    assert again.buf.counts["steps"] == 50
    again.buf.shutdown("done")
    report = again.verify()
    assert report.ok, report.render()


def test_a_resume_restores_the_tail_levers_of_the_last_decision(tmp_path: Path):
    """Issue 26 item 4: adaptive + tail.overprovision auto; the process dies after a decision
    set 2 extras and deadlines; the resumed run starts from them (its first admissions carry
    the 2 extras, the deadline watch is on) and verify passes at the end."""
    path = tmp_path / "ledger.sqlite"
    over = ["rollout.workers=2", "control.interval_s=5", "control.mode=adaptive",
            "run.max_staleness=2", "tail.overprovision=auto", "tail.max_extra=3"]
    first = AsyncHarness(tmp_path, ledger_path=path, overrides=[*over, "run.steps=20"],
                         controller=Scripted([Settings(10, 6, 2, extra=2, deadline=True)]))
    assert first.run() is None
    last = first.events(ev.ControllerDecided)[-1]
    assert (last.settings.extra, last.settings.deadline) == (2, True)
    first.buf.ledger.flush()
    first.buf.ledger.close()  # no shutdown: the process died here
    again = AsyncHarness(tmp_path, ledger_path=path, overrides=[*over, "run.steps=30"],
                         start=last.ts + 1.0, controller=Scripted([]))
    seen: dict[str, Any] = {}

    async def during(pipe: Pipeline) -> None:
        while not hasattr(pipe, "pool"):
            await asyncio.sleep(0)
        seen.update(settings=pipe.steering.settings, live=pipe.overprov.live,
                    deadline=pipe.tailing is not None and pipe.tailing.watch.enabled)

    assert again.run(during=during) is None
    assert (seen["settings"].extra, seen["settings"].deadline, seen["live"]) == (2, True, 2)
    assert seen["deadline"]
    resumed = [e for e in again.events(ev.Requested) if e.ts > last.ts]
    assert resumed and all(e.size == 4 + 2 and e.target == 4 for e in resumed)
    again.buf.shutdown("done")
    report = verify_ledger(again.buf.ledger, dict(again.buf.counts))
    assert report.ok, report.render()
