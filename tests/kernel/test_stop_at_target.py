"""Over-provisioning's stop at target (freshroll/kernel/stop_at_target.py) on a real buffer and
ledger:
the first ``group_size`` members done are kept, the rest discarded ``cancelled`` (never trained
on, never lost), also across a crash and a resume, in virtual time."""

from __future__ import annotations

from pathlib import Path

import pytest

from freshroll.clock import VirtualClock
from freshroll.errors import StateError
from freshroll.figures.bias import SampleBias
from freshroll.harness.verify import verify_ledger
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.results import KernelConfig, Outcome
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import GroupId, PolicyVersion, RewardVersion, SampleId
from freshroll.ledger.store import Ledger

V0 = PolicyVersion.initial("stop-model")
REWARD = str(RewardVersion.of("stop", config={}))
KERNEL = KernelConfig(max_staleness=1, batch_groups=1, group_size=4)


def open_buffer(path: Path, clock: VirtualClock) -> SampleBuffer:
    return SampleBuffer.open(Ledger(path, sync="off"), KERNEL, clock, run_id="stop",
                             initial_version=V0)


def start_all(buf: SampleBuffer, extra: int, worker: str = "w0"
              ) -> tuple[GroupId, list[SampleId]]:
    gid = buf.admit("prompt", extra)
    epoch = buf.register_worker(worker)
    sids = [buf.start(r, worker, epoch, V0) for r in buf.take_requests(4 + extra)]
    return gid, sids


def events(buf: SampleBuffer) -> list[ev.Event]:
    buf.ledger.flush()
    return [e for _, e in buf.ledger.events()]


def test_the_first_g_done_are_kept_and_the_rest_cancelled(tmp_path: Path) -> None:
    clock = VirtualClock()
    buf = open_buffer(tmp_path / "l.sqlite", clock)
    _, sids = start_all(buf, extra=2)
    assert len(sids) == 6
    requested = [e for e in events(buf) if isinstance(e, ev.Requested)]
    assert (requested[0].size, requested[0].target) == (6, 4)
    order = [sids[5], sids[1], sids[3], sids[0]]  # the first four done, in any member order
    for i, sid in enumerate(order):
        clock.advance(1.0)
        assert buf.complete(sid, tokens=10 + i, gen_s=1.0) is Outcome.ACCEPTED
    # the fourth result stopped the group: the two still running are cancelled at once
    assert [buf.request_state(s) for s in (sids[2], sids[4])] == ["discarded"] * 2
    assert sorted(s for s, _, _ in buf.stopped) == [sids[2], sids[4]]
    assert buf.counts["discarded_cancelled"] == 2
    assert buf.complete(sids[2], tokens=99, gen_s=9.0) is Outcome.REJECTED  # a late result
    for sid in order:
        assert buf.reward(sid, 1.0, REWARD) is Outcome.ACCEPTED
    lease = buf.lease()
    assert lease is not None and sorted(lease.samples) == sorted(order)  # exactly G trained
    buf.commit(lease.id, "s")
    buf.shutdown()
    report = verify_ledger(buf.ledger, dict(buf.counts))
    assert report.ok, report.render()
    cancelled = [e for e in events(buf) if isinstance(e, ev.Discarded)]
    assert {e.reason for e in cancelled} == {"cancelled"}
    assert all("stop at target: 4 of 6" in e.detail for e in cancelled)


def test_extras_not_yet_started_are_cancelled_too(tmp_path: Path) -> None:
    clock = VirtualClock()
    buf = open_buffer(tmp_path / "l.sqlite", clock)
    gid = buf.admit("prompt", 3)
    epoch = buf.register_worker("w0")
    sids = [buf.start(r, "w0", epoch, V0) for r in buf.take_requests(4)]  # 3 stay queued
    for sid in sids:
        buf.complete(sid, tokens=5, gen_s=1.0)
    assert buf.next_request() is None  # the queued extras ended: nothing left to start
    assert buf.stopped == []  # none was running: no engine to tell
    discards = [e for e in events(buf) if isinstance(e, ev.Discarded)]
    assert [(e.reason, e.sample) for e in discards] == [("cancelled", None)] * 3
    for sid in sids:
        buf.reward(sid, 0.5, REWARD)
    assert buf.ready_groups() == 1 and gid in buf._groups


def test_a_failed_member_is_not_replaced_and_no_group_grows_past_g(tmp_path: Path) -> None:
    clock = VirtualClock()
    buf = open_buffer(tmp_path / "l.sqlite", clock)
    _, sids = start_all(buf, extra=1)
    for sid in sids[:4]:
        buf.complete(sid, tokens=5, gen_s=1.0)
    buf.discard(sids[0], "reward_error", "boom")  # after the stop: the group keeps three
    for sid in sids[1:4]:
        buf.reward(sid, 1.0, REWARD)
    lease = buf.lease()
    assert lease is not None and len(lease.samples) == 3
    buf.commit(lease.id, "s")
    buf.shutdown()
    assert verify_ledger(buf.ledger, dict(buf.counts)).ok


def test_no_extra_keeps_the_ledger_as_before(tmp_path: Path) -> None:
    buf = open_buffer(tmp_path / "l.sqlite", VirtualClock())
    buf.admit("prompt")
    requested = [e for e in events(buf) if isinstance(e, ev.Requested)]
    assert (requested[0].size, requested[0].target) == (4, None)
    with pytest.raises(StateError, match="extra"):
        buf.admit("prompt", -1)


def test_resume_with_an_over_provisioned_group_in_flight_keeps_every_invariant(
    tmp_path: Path,
) -> None:
    """Crash cut right after the G-th ``generated`` (before the cancels reached the ledger),
    and a crash with the group half done: the resumed buffer keeps the target (replay),
    re-issues the running attempts, and the stop completes; verify passes at the end."""
    clock = VirtualClock()
    full = open_buffer(tmp_path / "full.sqlite", clock)
    _, sids = start_all(full, extra=2)
    for sid in sids[:4]:
        clock.advance(1.0)
        full.complete(sid, tokens=7, gen_s=1.0)
    history = events(full)
    last_generated = max(i for i, e in enumerate(history) if isinstance(e, ev.Generated))
    for n in (last_generated + 1, last_generated - 1):  # the stop cut off; half done
        path = tmp_path / f"cut{n}.sqlite"
        with Ledger(path, sync="off") as led:
            for e in history[:n]:
                led.append(e)
        buf = open_buffer(path, VirtualClock(clock.now() + 1))
        group = buf._groups[GroupId("g0")]
        assert (len(group.members), group.target) == (6, 4)
        epoch = buf.register_worker("w1")
        while (rid := buf.next_request()) is not None:  # the re-issued attempts run again
            sid = buf.start(rid, "w1", epoch, V0)
            if buf.request_state(sid) == "running":
                buf.complete(sid, tokens=9, gen_s=1.0)
        for sid in buf.unrewarded():
            buf.reward(sid, 1.0, REWARD)
        lease = buf.lease()
        assert lease is not None and len(lease.samples) == 4
        buf.commit(lease.id, "s")
        buf.shutdown()
        assert buf.counts["discarded_cancelled"] == 2
        report = verify_ledger(buf.ledger, dict(buf.counts))
        assert report.ok, report.render()


def test_cancelled_running_members_count_in_the_length_bias(tmp_path: Path) -> None:
    clock = VirtualClock()
    buf = open_buffer(tmp_path / "l.sqlite", clock)
    _, sids = start_all(buf, extra=2)
    for i, sid in enumerate(sids[:4]):
        buf.complete(sid, tokens=10 * (i + 1), gen_s=1.0)
        buf.reward(sid, 1.0, REWARD)
    lease = buf.lease()
    assert lease is not None
    buf.commit(lease.id, "s")
    fold = SampleBias()
    for e in events(buf):
        fold.feed(e)
    out = fold.result()
    # accepted 10..40 (mean 25); two cancelled censored at the group's longest, 40
    assert out["generated"] == 6 and out["accepted"] == 4
    assert out["length_bias"] == pytest.approx(25 / ((100 + 80) / 6) - 1)
    assert fold.by_outcome()["cancelled"]["n"] == 2


def test_verify_flags_a_group_ready_past_its_target(tmp_path: Path) -> None:
    """The oracle is load-bearing: a ledger whose over-provisioned group was made ready with
    every member (no stop at target) fails ``verify``."""
    path = tmp_path / "l.sqlite"
    with Ledger(path, sync="off") as led:
        led.append(ev.Opened(ts=0, run_id="r", incarnation=0, max_staleness=1,
                             batch_groups=1, group_size=2))
        led.append(ev.PolicyPublished(ts=0, version=str(V0)))
        led.append(ev.Requested(ts=0, group="g0", prompt_id="p", size=3, version=str(V0),
                                target=2))
        led.append(ev.WorkerStarted(ts=0, worker="w0", epoch=0))
        for m in range(3):
            sid = f"g0.{m}#1"
            led.append(ev.Started(ts=0, sample=sid, worker="w0", epoch=0, version=str(V0)))
            led.append(ev.Generated(ts=1, sample=sid, tokens=3, gen_s=1.0))
            led.append(ev.Rewarded(ts=1, sample=sid, reward=1.0, reward_version=REWARD))
        led.append(ev.Ready(ts=1, group="g0", samples=[f"g0.{m}#1" for m in range(3)]))
    with Ledger(path, sync="off") as led:
        report = verify_ledger(led, allow_open=True)
    assert any("over its target 2" in v for v in report.violations["unexpected"])
