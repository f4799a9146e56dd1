"""Group deadlines (pipeline/tails.py) on a real buffer and ledger, in virtual time."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import torch

from freshroll.clock import VirtualClock
from freshroll.config.run import TailSection
from freshroll.errors import ConfigError, StateError
from freshroll.figures import metrics
from freshroll.harness.verify import verify_ledger
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.queries import GroupStatus
from freshroll.kernel.results import KernelConfig, Outcome
from freshroll.ledger.lineage import GroupId, PolicyVersion, RewardVersion, SampleId, request_of
from freshroll.ledger.store import Ledger
from freshroll.pipeline.tails import Cut, TailWatch, apply_cut
from freshroll.trainer.losses import group_advantages

V0 = PolicyVersion.initial("tail-model")
REWARD = str(RewardVersion.of("tail", config={}))
ON = TailSection(deadline=True, deadline_factor=3.0, drop_factor=6.0, min_keep=2)


def new_buffer(path: Path, clock: VirtualClock, group_size: int = 4) -> SampleBuffer:
    return SampleBuffer.open(
        Ledger(path, sync="off"), KernelConfig(max_staleness=1, batch_groups=1,
                                               group_size=group_size),
        clock, run_id="tails", initial_version=V0,
    )


def start_group(buf: SampleBuffer, worker: str = "w0") -> tuple[GroupId, list[SampleId]]:
    gid = buf.admit("prompt")
    epoch = buf.register_worker(worker) if worker not in buf._epochs else buf._epochs[worker]
    sids = [buf.start(r, worker, epoch, buf.version) for r in buf.take_requests(  # type: ignore[arg-type]
        buf.config.group_size)]
    return gid, sids


def finish(buf: SampleBuffer, sid: SampleId, reward: float = 1.0) -> None:
    assert buf.complete(sid, tokens=10, gen_s=1.0) is Outcome.ACCEPTED
    assert buf.reward(sid, reward, REWARD) is Outcome.ACCEPTED


def test_stragglers_are_cut_at_the_deadline_once_min_keep_are_done(tmp_path: Path) -> None:
    clock = VirtualClock()
    buf = new_buffer(tmp_path / "l.sqlite", clock)
    watch = TailWatch(ON, group_size=4, min_latencies=2)
    gid, sids = start_group(buf)
    clock.advance(1.0)
    finish(buf, sids[0], 1.0)
    finish(buf, sids[1], 0.0)  # two done after 1 s each: p50 = 1 s, deadline at 3 s
    assert watch.p50(buf) == pytest.approx(1.0)
    clock.advance(1.99)
    assert watch.due(clock.now(), buf) == []  # before the deadline: nothing is cut
    clock.advance(0.01)
    (cut,) = watch.due(clock.now(), buf)
    assert (cut.group, cut.reason, cut.drop) == (gid, "deadline", False)
    assert cut.samples == tuple(sids[2:]) and cut.queued == ()
    assert cut.by_worker() == {("w0", 0): sids[2:]}
    assert "deadline_factor 3" in cut.detail and "2/4" in cut.detail and "p50 1 s" in cut.detail
    assert watch.due(clock.now(), buf) == []  # a group is named once
    assert apply_cut(buf, cut) == 2
    assert [buf.request_state(s) for s in sids] == ["rewarded"] * 2 + ["discarded"] * 2
    assert buf.running_groups() == [] and buf.ready_groups() == 1
    # a straggler's result that arrives after the cut is rejected, never applied
    assert buf.complete(sids[2], tokens=99, gen_s=9.0) is Outcome.REJECTED
    lease = buf.lease()
    assert lease is not None and lease.samples == tuple(sids[:2])  # the kept members
    buf.commit(lease.id, "s")
    buf.shutdown()
    report = verify_ledger(buf.ledger)
    assert report.ok, report.render()
    tally = metrics.tally(e for _, e in buf.ledger.events())
    assert metrics.discards_by_reason(tally) == {"deadline": 2}
    assert metrics.counted_discards(tally) == 2  # deadline discards count in the discard rate
    assert buf.counts["discarded_deadline"] == 2


def test_a_group_below_min_keep_is_dropped_at_drop_time(tmp_path: Path) -> None:
    clock = VirtualClock()
    buf = new_buffer(tmp_path / "l.sqlite", clock)
    watch = TailWatch(ON, group_size=4)
    for _ in range(8):
        watch.observe(1.0)  # the orchestrator's own latencies: p50 = 1 s
    _gid, sids = start_group(buf)
    clock.advance(1.0)
    finish(buf, sids[0])  # one done: below min_keep
    capacity = buf.capacity()
    clock.advance(2.5)  # t = 3.5: past the deadline, but min_keep is not reached: wait
    assert watch.due(clock.now(), buf) == []
    clock.advance(2.5)  # t = 6.0 = drop time
    (cut,) = watch.due(clock.now(), buf)
    assert (cut.reason, cut.drop, cut.samples) == ("cancelled", True, tuple(sids[1:]))
    assert "min_keep 2" in cut.detail and "drop" in cut.detail
    assert apply_cut(buf, cut) == 4  # three open members and the finished one
    assert [buf.request_state(s) for s in sids] == ["discarded"] * 4
    assert buf.running_groups() == [] and buf.ready_groups() == 0
    assert buf.capacity() == capacity + 1  # the dropped group freed its admission place
    assert buf.counts["discarded_cancelled"] == 4
    buf.shutdown()
    report = verify_ledger(buf.ledger)
    assert report.ok, report.render()


def test_nothing_is_cut_without_latencies_or_when_off(tmp_path: Path) -> None:
    clock = VirtualClock()
    buf = new_buffer(tmp_path / "l.sqlite", clock)
    _gid, sids = start_group(buf)
    finish(buf, sids[0])
    finish(buf, sids[1])  # latencies 0 s: two of them
    clock.advance(100.0)
    assert TailWatch(ON, group_size=4, min_latencies=3).due(clock.now(), buf) == []
    off = TailSection(deadline=False)
    assert TailWatch(off, group_size=4, min_latencies=1).due(clock.now(), buf) == []
    assert TailWatch(ON, group_size=4, min_latencies=2).p50(buf) == 0.0


def test_queued_members_are_cut_too_and_running_groups_is_what_the_rules_need(
    tmp_path: Path,
) -> None:
    clock = VirtualClock(10.0)
    buf = new_buffer(tmp_path / "l.sqlite", clock)
    gid = buf.admit("p")
    epoch = buf.register_worker("w0")
    rids = buf.take_requests(4)
    assert buf.running_groups() == [GroupStatus(gid, 4, None, 0, (), tuple(rids))]
    s0 = buf.start(rids[0], "w0", epoch, V0)
    clock.advance(2.0)
    s1 = buf.start(rids[1], "w0", epoch, V0)
    (g,) = buf.running_groups()
    assert (g.started_at, g.done, g.open) == (10.0, 0, 4)  # the first attempt's start
    assert g.running == ((s0, "w0", 0), (s1, "w0", 0)) and g.queued == tuple(rids[2:])
    finish(buf, s0)
    finish(buf, s1)
    watch = TailWatch(ON, group_size=4, min_latencies=1)
    for _ in range(3):
        watch.observe(1.0)
    clock.advance(1.0)  # t = 13 = 10 + 3 x 1
    (cut,) = watch.due(clock.now(), buf)
    assert cut.samples == () and cut.queued == tuple(rids[2:])
    assert apply_cut(buf, cut) == 2
    assert buf.ready_groups() == 1


def test_a_deadline_cut_skips_members_that_finished_meanwhile(tmp_path: Path) -> None:
    clock = VirtualClock()
    buf = new_buffer(tmp_path / "l.sqlite", clock)
    watch = TailWatch(ON, group_size=4, min_latencies=1)
    watch.observe(1.0)
    _gid, sids = start_group(buf)
    finish(buf, sids[0])
    finish(buf, sids[1])
    clock.advance(3.0)
    (cut,) = watch.due(clock.now(), buf)
    assert buf.complete(sids[2], tokens=3, gen_s=3.0) is Outcome.ACCEPTED  # just in time
    assert apply_cut(buf, cut) == 1
    assert buf.request_state(sids[2]) == "generated"
    buf.reward(sids[2], 0.0, REWARD)
    lease = buf.lease()
    assert lease is not None and len(lease.samples) == 3


def test_drop_group_refuses_retry_and_stale_and_non_running_groups(tmp_path: Path) -> None:
    clock = VirtualClock()
    buf = new_buffer(tmp_path / "l.sqlite", clock)
    gid, sids = start_group(buf)
    with pytest.raises(StateError):
        buf.drop_group(gid, "fenced")
    with pytest.raises(StateError):
        buf.drop_group(gid, "stale")
    for s in sids:
        finish(buf, s)
    with pytest.raises(StateError, match="not running"):
        buf.drop_group(gid, "cancelled")
    stale_cut = Cut(gid, "cancelled", "x", (), (), ())
    assert apply_cut(buf, stale_cut) == 0  # ready meanwhile: nothing to drop


def test_min_keep_above_group_size_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="min_keep"):
        TailWatch(TailSection(deadline=True, min_keep=4), group_size=2)
    TailWatch(TailSection(deadline=False, min_keep=4), group_size=2)  # off: not checked


def test_a_crash_inside_a_drop_is_completed_on_recovery(tmp_path: Path) -> None:
    clock = VirtualClock()
    path = tmp_path / "l.sqlite"
    buf = new_buffer(path, clock)
    gid, sids = start_group(buf)
    finish(buf, sids[0])
    finish(buf, sids[1])
    buf.ledger.flush()
    for s in sids[2:]:
        buf.discard(s, "cancelled", "drop")  # the group is now ready with two members ...
    buf._discard_group(buf._groups[gid], "cancelled", "drop")  # ... then dropped whole
    buf.ledger.flush()
    rows = list(buf.ledger.rows())
    buf.ledger._db.execute("DELETE FROM events WHERE seq = ?", (rows[-1][0],))  # cut short
    buf.ledger._db.close()
    again = SampleBuffer.open(Ledger(path, sync="off"), buf.config, clock, run_id="tails",
                              initial_version=V0)
    assert [again.request_state(s) for s in sids] == ["discarded"] * 4
    assert again.ready_groups() == 0


def test_grpo_advantages_over_a_short_group() -> None:
    """A group cut to 2 of 4 members: its advantages use the 2 it has, unaffected by the
    full group next to it."""
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 1, 1])
    adv = group_advantages(rewards, groups)
    short = (rewards[:2] - rewards[:2].mean()) / (rewards[:2].std() + 1e-6)
    full = (rewards[2:] - rewards[2:].mean()) / (rewards[2:].std() + 1e-6)
    assert torch.allclose(adv, torch.cat([short, full]))
    assert adv[0] > 0 > adv[1]


async def _run_long_tail(buf: SampleBuffer, clock: VirtualClock, watch: TailWatch,
                         steps: int, seed: int) -> None:
    """A tiny orchestrator: long-tailed latencies, a tick that applies the cuts."""
    rng = random.Random(seed)
    epoch = buf.register_worker("w0")
    tasks: dict[SampleId, asyncio.Task[None]] = {}

    async def generate(sid: SampleId) -> None:
        await asyncio.sleep(rng.lognormvariate(0.0, 1.2))
        if buf.complete(sid, tokens=1, gen_s=0.0) is Outcome.ACCEPTED:
            buf.reward(sid, rng.random(), REWARD)

    while buf.counts["steps"] < steps:
        for _ in range(buf.capacity()):
            buf.admit("p")
        for rid in buf.take_requests(1 << 20):
            sid = buf.start(rid, "w0", epoch, buf.version)  # type: ignore[arg-type]
            tasks[sid] = asyncio.ensure_future(generate(sid))
        for cut in watch.due(clock.now(), buf):
            apply_cut(buf, cut)
            for sids in cut.by_worker().values():
                for sid in sids:
                    tasks.pop(sid).cancel()
        while (lease := buf.lease()) is not None:
            buf.commit(lease.id, "s")
        await asyncio.sleep(0.05)
        tasks = {s: t for s, t in tasks.items() if not t.done()}
    for t in tasks.values():
        t.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)


def test_long_tailed_run_in_virtual_time_keeps_the_invariants(tmp_path: Path) -> None:
    clock = VirtualClock()
    buf = SampleBuffer.open(
        Ledger(tmp_path / "l.sqlite", sync="off"),
        KernelConfig(max_staleness=1, batch_groups=2, group_size=4), clock,
        run_id="tails", initial_version=V0,
    )
    watch = TailWatch(TailSection(deadline=True, deadline_factor=2.0, drop_factor=4.0,
                                  min_keep=2), group_size=4)
    clock.run(_run_long_tail(buf, clock, watch, steps=30, seed=7))
    buf.shutdown()
    assert watch.cuts["deadline"] > 0 and watch.cuts["cancelled"] > 0
    report = verify_ledger(buf.ledger)
    assert report.ok, report.render()
    events = [e for _, e in buf.ledger.events()]
    committed = [s for e in events if type(e).__name__ == "Committed" for s in e.samples]
    per_group: dict[str, int] = {}
    for s in committed:
        per_group[request_of(s).partition(".")[0]] = per_group.get(
            request_of(s).partition(".")[0], 0) + 1
    assert min(per_group.values()) >= 2  # no group trained below min_keep
    assert any(n < 4 for n in per_group.values())  # and some were cut short
