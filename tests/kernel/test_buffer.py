"""Unit tests of the sample buffer state machine on a real ledger and a virtual clock."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from freshroll.clock import VirtualClock
from freshroll.errors import ConfigError, LeaseError, StateError, UnknownSampleError
from freshroll.harness.verify import verify_ledger
from freshroll.kernel.buffer import SampleBuffer, replay_ledger
from freshroll.kernel.results import KernelConfig, Outcome
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import (
    GroupId,
    PolicyVersion,
    RequestId,
    RewardVersion,
    SampleId,
    request_id,
    sample_id,
)
from freshroll.ledger.store import Ledger

V0 = PolicyVersion.initial("unit-model")
REWARD = str(RewardVersion.of("unit", config={"k": 1}))
SETTINGS = "unit-settings"


# == helpers ==========================================================================
def new_buffer(path: Path, clock: VirtualClock | None = None, **cfg: int | None) -> SampleBuffer:
    return SampleBuffer.open(
        Ledger(path, sync="off"), KernelConfig(**cfg), clock or VirtualClock(),  # type: ignore[arg-type]
        run_id="unit", initial_version=V0,
    )


@pytest.fixture
def path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "ledger.sqlite"


def members(buf: SampleBuffer, gid: GroupId) -> list[RequestId]:
    return [request_id(gid, m) for m in range(buf.config.group_size)]


def run_group(
    buf: SampleBuffer, gid: GroupId, worker: str = "w0", epoch: int = 0,
    version: PolicyVersion | None = None, reward: float = 0.5,
) -> list[SampleId]:
    """Start, complete and reward every member of ``gid``; returns the samples."""
    sids = [buf.start(rid, worker, epoch, version or buf.version) for rid in members(buf, gid)]  # type: ignore[arg-type]
    for sid in sids:
        assert buf.complete(sid, tokens=4, gen_s=0.1) is Outcome.ACCEPTED
        assert buf.reward(sid, reward, REWARD) is Outcome.ACCEPTED
    return sids


def events(buf: SampleBuffer) -> list[ev.Event]:
    buf.ledger.flush()
    return [e for _, e in buf.ledger.events()]


def of_kind(buf: SampleBuffer, kind: type[ev.Event]) -> list:
    return [e for e in events(buf) if isinstance(e, kind)]


def states(buf: SampleBuffer) -> dict[str, int]:
    return dict(buf.stats()["requests"])


def crash_and_reopen(buf: SampleBuffer, **cfg: int | None) -> SampleBuffer:
    """Drop ``buf`` and its ledger WITHOUT flushing, and recover from the same file."""
    buf.ledger._db.close()  # the process dies: buffered (unflushed) events are lost
    config = {
        "max_staleness": buf.config.max_staleness, "batch_groups": buf.config.batch_groups,
        "group_size": buf.config.group_size, "max_inflight_groups": buf.config.max_inflight_groups,
    }
    config.update(cfg)
    return new_buffer(buf.ledger.path, buf.clock, **config)  # type: ignore[arg-type]


def drain(buf: SampleBuffer, settings: str = SETTINGS) -> None:
    """Finish everything that can finish (no new admissions), then shut down cleanly."""
    for sid in buf.unrewarded():
        buf.reward(sid, 0.25, REWARD)
    epoch = buf.register_worker("drain")
    for rid in buf.take_requests(10**9):
        sid = buf.start(rid, "drain", epoch, buf.version)  # type: ignore[arg-type]
        buf.complete(sid, tokens=1, gen_s=0.0)
        buf.reward(sid, 0.75, REWARD)
    while (lease := buf.lease(1)) is not None:
        buf.commit(lease.id, settings)
    buf.shutdown("drained")


def assert_verified(buf: SampleBuffer, *, closed: bool | None = None) -> None:
    """Verify the buffer's ledger; mid-run (``closed`` not True) an open ledger is expected."""
    buf.ledger.flush()
    report = verify_ledger(buf.ledger, counts=dict(buf.counts), allow_open=closed is not True)
    assert report.ok, report.render()
    if closed is not None:
        assert report.closed is closed


# == config =============================================================================
@pytest.mark.parametrize(
    "bad",
    [{"max_staleness": -1}, {"batch_groups": 0}, {"group_size": 0}, {"max_inflight_groups": 0},
     {"group_size": 1.5}],
)
def test_kernel_config_rejects_bad_values(bad):
    with pytest.raises(ConfigError):
        KernelConfig(**bad)


def test_fresh_open_publishes_initial_version(path):
    buf = new_buffer(path)
    assert buf.version == V0
    assert buf.incarnation == 0
    evs = events(buf)
    assert [type(e) for e in evs] == [ev.Opened, ev.PolicyPublished]
    assert evs[1].version == str(V0)


# == admission ==========================================================================
def test_eta0_admits_exactly_one_batch(path):
    buf = new_buffer(path, max_staleness=0, batch_groups=3, group_size=2)
    assert buf.capacity() == 3
    gids = [buf.admit(f"p{i}") for i in range(3)]
    assert gids == ["g0", "g1", "g2"]
    assert buf.capacity() == 0
    with pytest.raises(StateError):
        buf.admit("one-too-many")
    assert buf.take_requests(100) == [f"g{g}.{m}" for g in range(3) for m in range(2)]
    assert buf.in_flight() == 6


def test_eta1_admits_two_batches(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=3, group_size=1)
    for i in range(6):
        assert buf.capacity() == 6 - i
        buf.admit(f"p{i}")
    assert buf.capacity() == 0


def test_capacity_grows_by_one_batch_per_commit(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=2, group_size=2)
    buf.register_worker("w0")
    for step in range(3):
        while buf.capacity():
            buf.admit("p")
        assert buf.stats()["groups_admitted"] == (1 + step + 1) * 2
        for gid in [g for g in buf._groups if buf._groups[g].state == 0]:
            run_group(buf, gid)
        lease = buf.lease()
        assert lease is not None
        buf.commit(lease.id, SETTINGS)
        assert buf.version.step == step + 1
        assert buf.capacity() == 2  # exactly B more per commit


def test_discarded_groups_free_capacity(path):
    buf = new_buffer(path, max_staleness=0, batch_groups=2, group_size=2)
    buf.admit("a")
    buf.admit("b")
    assert buf.capacity() == 0
    buf.discard("g0.0", "filtered")
    assert buf.capacity() == 0  # one member left: the group still runs
    buf.discard("g0.1", "invalid")
    assert buf.capacity() == 1  # the whole group ended without a sample
    assert buf.stats()["groups_running"] == 1
    gid = buf.admit("c")
    assert gid == "g2"
    assert buf.capacity() == 0


def test_stale_discarded_ready_group_frees_capacity(path):
    buf = new_buffer(path, max_staleness=0, batch_groups=1, group_size=1)
    buf.register_worker("w0")
    run_group(buf, buf.admit("a"))
    buf.commit(buf.lease().id, SETTINGS)  # v1
    gid = buf.admit("b")
    run_group(buf, gid, version=V0)  # a worker that still runs v0: lag 1 > 0
    assert buf.capacity() == 0
    assert buf.lease() is None
    assert buf.capacity() == 1


def test_max_inflight_groups_caps_admission(path):
    buf = new_buffer(path, max_staleness=4, batch_groups=2, group_size=1, max_inflight_groups=3)
    assert buf.capacity() == 3
    for _ in range(3):
        buf.admit("p")
    assert buf.capacity() == 0
    buf.register_worker("w0")
    run_group(buf, GroupId("g0"))  # ready: no longer running
    assert buf.capacity() == 1


# == happy path and lineage ==============================================================
def test_happy_path_and_policy_version_chain(path):
    clock = VirtualClock(start=100.0)
    buf = new_buffer(path, clock, max_staleness=0, batch_groups=2, group_size=2)
    epoch = buf.register_worker("w0")
    assert epoch == 0
    g0, g1 = buf.admit("prompt-a"), buf.admit("prompt-b")
    assert buf.prompt_of("g1.0") == "prompt-b"

    sids = {}
    for rid in buf.take_requests(10):
        clock.advance(1)
        sids[rid] = buf.start(rid, "w0", epoch, V0)
    assert sids[RequestId("g0.0")] == "g0.0#1"
    assert buf.group_of_sample("g1.1#1") == ("g1", "prompt-b")
    assert buf.in_flight() == 4 and buf.stats()["requests"] == {"running": 4}

    for sid in sids.values():
        assert buf.complete(sid, tokens=7, gen_s=0.5, payload=sid.encode()) is Outcome.ACCEPTED
        assert buf.payload(sid) == sid.encode()
    assert sorted(buf.unrewarded()) == sorted(sids.values())
    assert buf.ready_groups() == 0

    for i, sid in enumerate(sids.values()):
        assert buf.reward(sid, float(i), REWARD, reward_s=0.01) is Outcome.ACCEPTED
    assert buf.ready_groups() == 2 and buf.in_flight() == 0

    lease = buf.lease(wait_s=0.3)
    assert lease is not None
    assert lease.id == "l0" and lease.version == 0 and lease.groups == (g0, g1)
    assert lease.samples == ("g0.0#1", "g0.1#1", "g1.0#1", "g1.1#1")
    assert buf.open_leases() == [lease]

    child = buf.commit(lease.id, SETTINGS, train_s=2.0)
    assert child == V0.child(sorted(lease.samples), SETTINGS)
    assert child == V0.child(reversed(lease.samples), SETTINGS)  # order-free digest
    assert child.step == 1 and buf.version == child
    assert buf.open_leases() == []
    assert buf.stats()["requests"] == {"committed": 4}
    assert buf.counts["committed"] == 4 and buf.counts["steps"] == 1

    # second step: chained from the first
    run_group(buf, buf.admit("c"))
    run_group(buf, buf.admit("d"))
    lease2 = buf.lease()
    weights = "ab" * 8
    child2 = buf.commit(lease2.id, SETTINGS, weights_digest=weights)
    assert child2 == child.child(sorted(lease2.samples), SETTINGS, weights)
    assert str(child2).endswith("+w" + weights)

    committed = of_kind(buf, ev.Committed)
    assert [c.version for c in committed] == [str(child), str(child2)]
    assert [c.parent for c in committed] == [str(V0), str(child)]
    assert committed[0].samples == list(lease.samples)
    # the kinds, in order, for the first step
    kinds = [type(e).__name__ for e in events(buf)][:20]
    assert kinds[:5] == ["Opened", "PolicyPublished", "WorkerStarted", "Requested", "Requested"]
    assert buf.ledger.payload("g0.0#1") == b"g0.0#1"  # durable after commit
    assert_verified(buf, closed=False)
    buf.shutdown()
    assert_verified(buf, closed=True)


def test_commit_is_durable_when_it_returns(path):
    buf = new_buffer(path, max_staleness=0, batch_groups=1, group_size=1)
    buf.register_worker("w0")
    run_group(buf, buf.admit("a"))
    buf.commit(buf.lease().id, SETTINGS)
    assert not buf.ledger._pending
    with Ledger(path, readonly=True) as other:
        assert any(isinstance(e, ev.Committed) for _, e in other.events())


# == groups ============================================================================
def test_group_ready_only_when_every_member_rewarded_or_discarded(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=3)
    buf.register_worker("w0")
    gid = buf.admit("p")
    a, b, c = (buf.start(r, "w0", 0, V0) for r in members(buf, gid))
    for sid in (a, b, c):
        buf.complete(sid, tokens=1, gen_s=0.0)
    buf.reward(a, 1.0, REWARD)
    buf.reward(b, 0.0, REWARD)
    assert buf.ready_groups() == 0  # c is generated but not rewarded
    assert buf.lease() is None
    buf.discard(c, "invalid", "empty completion")
    assert buf.ready_groups() == 1
    ready = of_kind(buf, ev.Ready)
    assert [(r.group, r.samples) for r in ready] == [("g0", [a, b])]
    lease = buf.lease()
    assert lease.samples == (a, b)
    buf.commit(lease.id, SETTINGS)
    st = states(buf)
    assert st == {"committed": 2, "discarded": 1}
    assert_verified(buf)


def test_discard_before_start_counts_toward_readiness(path):
    buf = new_buffer(path, max_staleness=0, batch_groups=1, group_size=2)
    buf.register_worker("w0")
    gid = buf.admit("p")
    buf.discard("g0.1", "filtered")
    assert buf.take_requests(5) == ["g0.0"]
    assert of_kind(buf, ev.Discarded)[-1].sample is None  # never started: no sample
    sid = buf.start("g0.0", "w0", 0, V0)
    buf.complete(sid, tokens=1, gen_s=0)
    assert buf.ready_groups() == 0
    buf.reward(sid, 1.0, REWARD)
    assert buf.ready_groups() == 1
    assert buf.lease().groups == (gid,)


def test_group_with_every_member_discarded_never_becomes_ready(path):
    buf = new_buffer(path, max_staleness=0, batch_groups=1, group_size=2)
    buf.register_worker("w0")
    buf.admit("p")
    sid = buf.start("g0.0", "w0", 0, V0)
    buf.discard(sid, "generation_error")
    buf.discard("g0.1", "filtered")
    assert buf.ready_groups() == 0
    assert not of_kind(buf, ev.Ready)
    assert buf.stats()["groups_running"] == 0 and buf.stats()["groups_accepted"] == 0
    assert buf.capacity() == 1


def test_reward_nan_discards_as_reward_error_and_group_still_ready(path):
    buf = new_buffer(path, max_staleness=0, batch_groups=1, group_size=3)
    buf.register_worker("w0")
    buf.admit("p")
    sids = [buf.start(r, "w0", 0, V0) for r in buf.take_requests(3)]
    for sid in sids:
        buf.complete(sid, tokens=1, gen_s=0)
    assert buf.reward(sids[0], math.nan, REWARD) is Outcome.ACCEPTED
    assert buf.reward(sids[1], math.inf, REWARD) is Outcome.ACCEPTED
    assert buf.ready_groups() == 0
    assert buf.reward(sids[2], 0.5, REWARD) is Outcome.ACCEPTED
    discards = of_kind(buf, ev.Discarded)
    assert [(d.sample, d.reason) for d in discards] == [
        (sids[0], "reward_error"), (sids[1], "reward_error"),
    ]
    assert "nan" in discards[0].detail
    assert buf.counts["discarded_reward_error"] == 2
    lease = buf.lease()
    assert lease.samples == (sids[2],)
    # a NaN for an already-discarded sample is rejected, not applied twice
    assert buf.reward(sids[0], math.nan, REWARD) is Outcome.REJECTED
    buf.commit(lease.id, SETTINGS)
    assert_verified(buf)


# == fencing and rejections =================================================================
def test_fenced_worker_attempts_reissued_and_late_results_rejected(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=3)
    e0 = buf.register_worker("w0")
    buf.register_worker("w1")
    buf.admit("p")
    a = buf.start("g0.0", "w0", e0, V0)
    b = buf.start("g0.1", "w0", e0, V0)
    c = buf.start("g0.2", "w1", 0, V0)
    assert buf.complete(a, tokens=1, gen_s=0) is Outcome.ACCEPTED  # before the fence: kept

    reissued = buf.fence_worker("w0", e0, "lost")
    assert reissued == ["g0.1"]
    assert buf.next_request() == "g0.1"  # re-issued requests go first
    fenced = of_kind(buf, ev.Discarded)[-1]
    assert (fenced.request, fenced.sample, fenced.reason) == ("g0.1", b, "fenced")

    # the late completion of the fenced attempt is rejected and recorded, never applied
    assert buf.complete(b, tokens=1, gen_s=0) is Outcome.REJECTED
    rejected = of_kind(buf, ev.Rejected)
    assert [(r.sample, r.reason) for r in rejected] == [(b, "fenced")]
    assert buf.counts["rejected_fenced"] == 1

    with pytest.raises(StateError):  # nothing starts on a fenced epoch
        buf.start("g0.1", "w0", e0, V0)
    e1 = buf.register_worker("w0")
    assert e1 == e0 + 1
    b2 = buf.start("g0.1", "w0", e1, V0)
    assert b2 == sample_id(RequestId("g0.1"), 2)  # attempt + 1
    assert buf.complete(b, tokens=1, gen_s=0) is Outcome.REJECTED  # superseded attempt
    assert buf.complete(b2, tokens=1, gen_s=0) is Outcome.ACCEPTED
    assert buf.complete(c, tokens=1, gen_s=0) is Outcome.ACCEPTED
    for sid in (a, b2, c):
        assert buf.reward(sid, 1.0, REWARD) is Outcome.ACCEPTED
    # reward for the fenced attempt: rejected too
    assert buf.reward(b, 1.0, REWARD) is Outcome.REJECTED
    lease = buf.lease()
    assert lease.samples == (a, b2, c)
    buf.commit(lease.id, SETTINGS)
    assert_verified(buf)


def test_register_worker_fences_the_previous_epoch(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=2)
    buf.register_worker("w0")
    buf.admit("p")
    a = buf.start("g0.0", "w0", 0, V0)
    assert buf.register_worker("w0") == 1
    assert [(f.worker, f.epoch, f.reason) for f in of_kind(buf, ev.WorkerFenced)] == [
        ("w0", 0, "restart"),
    ]
    assert buf.complete(a, tokens=1, gen_s=0) is Outcome.REJECTED
    assert buf.take_requests(5) == ["g0.0", "g0.1"]


def test_fence_reissue_order_and_double_fence(path):
    buf = new_buffer(path, max_staleness=5, batch_groups=2, group_size=1)
    buf.register_worker("w0")
    for _ in range(12):
        buf.admit("p")
    for rid in buf.take_requests(12):
        buf.start(rid, "w0", 0, V0)
    reissued = buf.fence_worker("w0", 0, "timeout")
    assert sorted(reissued) == sorted(f"g{i}.0" for i in range(12))
    assert len(buf.take_requests(100)) == 12
    assert buf.fence_worker("w0", 0, "timeout") == []  # nothing left to re-issue
    with pytest.raises(UnknownSampleError):
        buf.fence_worker("w0", 1, "lost")
    with pytest.raises(UnknownSampleError):
        buf.fence_worker("nobody", 0, "lost")


def test_discard_fenced_directly_reissues_and_late_result_is_rejected(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=1)
    buf.register_worker("w0")
    buf.admit("p")
    a = buf.start("g0.0", "w0", 0, V0)
    buf.discard(a, "fenced", "timed out")
    assert buf.next_request() == "g0.0"
    assert buf.complete(a, tokens=1, gen_s=0) is Outcome.REJECTED
    a2 = buf.start("g0.0", "w0", 0, V0)
    assert a2.endswith("#2")
    assert buf.complete(a, tokens=1, gen_s=0) is Outcome.REJECTED
    assert buf.complete(a2, tokens=1, gen_s=0) is Outcome.ACCEPTED
    assert_verified(buf)


def test_duplicate_results_rejected(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=1)
    buf.register_worker("w0")
    buf.admit("p")
    a = buf.start("g0.0", "w0", 0, V0)
    assert buf.complete(a, tokens=1, gen_s=0) is Outcome.ACCEPTED
    assert buf.complete(a, tokens=2, gen_s=0) is Outcome.REJECTED
    assert buf.reward(a, 1.0, REWARD) is Outcome.ACCEPTED
    assert buf.reward(a, 0.0, REWARD) is Outcome.REJECTED
    assert buf.complete(a, tokens=2, gen_s=0) is Outcome.REJECTED
    assert [r.reason for r in of_kind(buf, ev.Rejected)] == ["duplicate"] * 3
    assert buf.counts["generated"] == 1 and buf.counts["rewarded"] == 1
    lease = buf.lease()
    buf.commit(lease.id, SETTINGS)
    assert buf.complete(a, tokens=2, gen_s=0) is Outcome.REJECTED  # after commit too
    assert buf.counts["committed"] == 1
    assert_verified(buf)


def test_reward_before_completion_is_rejected(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=1)
    buf.register_worker("w0")
    buf.admit("p")
    a = buf.start("g0.0", "w0", 0, V0)
    assert buf.reward(a, 1.0, REWARD) is Outcome.REJECTED
    assert of_kind(buf, ev.Rejected)[-1].reason == "not_running"


def test_start_refusals(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=2)
    buf.admit("p")
    with pytest.raises(StateError):
        buf.start("g0.0", "w0", 0, V0)  # unregistered worker
    buf.register_worker("w0")
    buf.register_worker("w0")  # epoch 0 fenced, epoch 1 live
    with pytest.raises(StateError):
        buf.start("g0.0", "w0", 0, V0)  # fenced epoch
    with pytest.raises(StateError):
        buf.start("g0.0", "w0", 2, V0)  # future epoch
    buf.start("g0.0", "w0", 1, V0)
    with pytest.raises(StateError):
        buf.start("g0.0", "w0", 1, V0)  # already running


def test_start_with_an_unpublished_version_is_refused(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=1)
    buf.register_worker("w0")
    buf.admit("p")
    before = buf.ledger.last_seq
    for bad in (PolicyVersion.initial("other-model"), V0.child(["x"], "y"), "not-a-version"):
        with pytest.raises(StateError):
            buf.start("g0.0", "w0", 0, bad)
    assert buf.ledger.last_seq == before  # nothing was recorded
    assert buf.start("g0.0", "w0", 0, str(V0)) == "g0.0#1"  # a string form is fine


def test_unknown_ids_raise(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=1)
    buf.register_worker("w0")
    buf.admit("p")
    for call in (
        lambda: buf.start("g9.0", "w0", 0, V0),
        lambda: buf.complete("g9.0#1", tokens=1, gen_s=0),
        lambda: buf.reward("g0.7#1", 1.0, REWARD),
        lambda: buf.discard("g9.0", "filtered"),
        lambda: buf.prompt_of("g3.0"),
        lambda: buf.group_of_sample("g3.0#1"),
    ):
        with pytest.raises(UnknownSampleError):
            call()


def test_discard_refusals(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=2)
    buf.register_worker("w0")
    buf.admit("p")
    with pytest.raises(StateError):
        buf.discard("g0.0", "bogus")  # type: ignore[arg-type]
    with pytest.raises(StateError):
        buf.discard("g0.0", "fenced")  # only a running attempt can be fenced
    with pytest.raises(StateError):
        buf.discard("g0.0", "stale")  # stale is decided at lease time only
    a = buf.start("g0.0", "w0", 0, V0)
    with pytest.raises(StateError):
        buf.discard("g0.0#2", "invalid")  # not the current attempt
    buf.complete(a, tokens=1, gen_s=0)
    buf.reward(a, 1.0, REWARD)
    with pytest.raises(StateError):
        buf.discard(a, "filtered")  # rewarded: its group is discarded at lease time
    buf.discard("g0.1", "filtered")
    with pytest.raises(StateError):
        buf.discard("g0.1", "filtered")  # already discarded
    lease = buf.lease()
    with pytest.raises(StateError):
        buf.discard("g0.0", "invalid")  # leased
    buf.commit(lease.id, SETTINGS)
    with pytest.raises(StateError):
        buf.discard("g0.0", "invalid")  # committed


# == leases ===============================================================================
def test_stale_groups_discarded_at_lease_group_lag_is_oldest_member(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=2)
    buf.register_worker("w0")
    run_group(buf, buf.admit("a"))
    v1 = buf.commit(buf.lease().id, SETTINGS)
    run_group(buf, buf.admit("b"))
    v2 = buf.commit(buf.lease().id, SETTINGS)
    assert v2.step == 2
    # g2: one member at v2, one at v0 (lag 2 > 1): the whole group is stale
    g2 = buf.admit("c")
    fresh = buf.start("g2.0", "w0", 0, v2)
    old = buf.start("g2.1", "w0", 0, V0)
    # g3: one member at v1 (lag 1 == eta): fine
    g3 = buf.admit("d")
    edge = [buf.start(r, "w0", 0, v1) for r in members(buf, g3)]
    for sid in [fresh, old, *edge]:
        buf.complete(sid, tokens=1, gen_s=0)
        buf.reward(sid, 1.0, REWARD)
    assert buf.ready_groups() == 2
    lease = buf.lease()
    assert lease.groups == (g3,)
    stale = [d for d in of_kind(buf, ev.Discarded) if d.reason == "stale"]
    assert sorted(d.sample for d in stale) == sorted([fresh, old])
    assert all(d.request.startswith(f"{g2}.") for d in stale)
    assert "lag 2 > 1" in stale[0].detail
    buf.commit(lease.id, SETTINGS)
    assert_verified(buf)


def test_eta0_every_lagging_group_is_stale(path):
    buf = new_buffer(path, max_staleness=0, batch_groups=1, group_size=1)
    buf.register_worker("w0")
    run_group(buf, buf.admit("a"))
    buf.commit(buf.lease().id, SETTINGS)
    run_group(buf, buf.admit("b"), version=V0)
    assert buf.ready_groups() == 1
    assert buf.lease() is None
    assert buf.ready_groups() == 0
    assert buf.counts["discarded_stale"] == 1
    assert_verified(buf)


def test_lease_waits_for_a_full_batch(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=2, group_size=1)
    buf.register_worker("w0")
    run_group(buf, buf.admit("a"))
    assert buf.lease() is None  # 1 of 2 groups
    assert buf.lease(1) is not None  # an explicit smaller batch


def test_lease_of_no_groups_is_refused(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=2, group_size=1)
    with pytest.raises(StateError):
        buf.lease(0)
    assert buf.open_leases() == []


def test_release_puts_groups_back_in_front(path):
    buf = new_buffer(path, max_staleness=3, batch_groups=2, group_size=1)
    buf.register_worker("w0")
    gids = [buf.admit(f"p{i}") for i in range(5)]
    for gid in gids:
        run_group(buf, gid)
    lease = buf.lease()
    assert lease.groups == (gids[0], gids[1])
    buf.release(lease.id, "trainer_error")
    assert of_kind(buf, ev.LeaseReleased)[-1].reason == "trainer_error"
    assert buf.ready_groups() == 5
    again = buf.lease()
    assert again.groups == (gids[0], gids[1]) and again.id == "l1"
    with pytest.raises(LeaseError):
        buf.commit(lease.id, SETTINGS)  # the released lease is gone
    buf.commit(again.id, SETTINGS)
    assert buf.lease().groups == (gids[2], gids[3])


def test_only_one_open_lease(path):
    buf = new_buffer(path, max_staleness=3, batch_groups=1, group_size=1)
    buf.register_worker("w0")
    run_group(buf, buf.admit("a"))
    run_group(buf, buf.admit("b"))
    lease = buf.lease()
    with pytest.raises(LeaseError):
        buf.lease()
    buf.commit(lease.id, SETTINGS)
    assert buf.lease() is not None


def test_lease_errors(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=1)
    with pytest.raises(LeaseError):
        buf.commit("l0", SETTINGS)
    with pytest.raises(LeaseError):
        buf.release("l7", "x")
    buf.register_worker("w0")
    run_group(buf, buf.admit("a"))
    lease = buf.lease()
    buf.commit(lease.id, SETTINGS)
    with pytest.raises(LeaseError):
        buf.commit(lease.id, SETTINGS)  # committed once only
    assert buf.counts["steps"] == 1


# == shutdown and stats ============================================================================
def test_shutdown_discards_everything_unfinished(path):
    buf = new_buffer(path, max_staleness=4, batch_groups=1, group_size=2)
    buf.register_worker("w0")
    run_group(buf, buf.admit("committed"))
    buf.commit(buf.lease().id, SETTINGS)
    run_group(buf, buf.admit("leased"))
    run_group(buf, buf.admit("ready"))
    buf.admit("queued")
    g4 = buf.admit("mixed")  # one rewarded, one running
    a = buf.start("g4.0", "w0", 0, buf.version)
    buf.complete(a, tokens=1, gen_s=0)
    buf.reward(a, 1.0, REWARD)
    buf.start("g4.1", "w0", 0, buf.version)
    buf.admit("generated")
    b = buf.start("g5.0", "w0", 0, buf.version)
    buf.complete(b, tokens=1, gen_s=0)
    assert buf.lease().groups == ("g1",)
    assert g4 == "g4"

    buf.shutdown("test over")
    assert buf.open_leases() == [] and buf.ready_groups() == 0 and buf.in_flight() == 0
    assert states(buf) == {"committed": 2, "discarded": 10}
    evs = events(buf)
    assert isinstance(evs[-1], ev.Closed) and evs[-1].reason == "test over"
    shut = [e for e in evs if isinstance(e, ev.Discarded) and e.reason == "shutdown"]
    assert len(shut) == 10 and len({e.request for e in shut}) == 10
    assert not buf.ledger._pending  # durable
    assert_verified(buf, closed=True)


def test_stats_snapshot(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=2, group_size=2)
    s = buf.stats()
    assert s == {
        "version": 0, "groups_admitted": 0, "groups_running": 0, "groups_accepted": 0,
        "groups_ready": 0, "capacity": 4, "requests": {}, "open_leases": 0, "counts": {},
    }
    buf.register_worker("w0")
    run_group(buf, buf.admit("a"))
    buf.admit("b")
    buf.start("g1.0", "w0", 0, V0)
    s = buf.stats()
    assert s["groups_admitted"] == 2 and s["groups_running"] == 1 and s["groups_accepted"] == 1
    assert s["groups_ready"] == 1 and s["capacity"] == 2
    assert s["requests"] == {"rewarded": 2, "running": 1, "queued": 1}
    assert s["counts"] == {"requests": 4, "started": 3, "generated": 2, "rewarded": 2}
    lease = buf.lease(1)
    assert buf.stats()["open_leases"] == 1
    buf.commit(lease.id, SETTINGS)
    s = buf.stats()
    assert s["version"] == 1 and s["counts"]["committed"] == 2 and s["counts"]["steps"] == 1
    json.dumps(s)  # JSON-ready


def test_replay_reproduces_the_live_state(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=2)
    buf.register_worker("w0")
    run_group(buf, buf.admit("a"))
    buf.admit("b")
    buf.start("g1.0", "w0", 0, V0)
    buf.ledger.flush()
    replayed = replay_ledger(buf.ledger, buf.config, buf.clock)
    assert replayed.stats() == buf.stats()
    assert replayed.take_requests(9) == buf.take_requests(9)


# == recovery =============================================================================
def test_recovery_after_crash(path):
    clock = VirtualClock()
    buf = new_buffer(path, clock, max_staleness=3, batch_groups=1, group_size=2)
    buf.register_worker("w0")
    buf.register_worker("w1")
    committed = run_group(buf, buf.admit("a"))
    v1 = buf.commit(buf.lease().id, SETTINGS)  # durable
    run_group(buf, buf.admit("leased"))
    lease = buf.lease()
    buf.admit("c")
    gen = buf.start("g2.0", "w0", 0, v1)
    buf.complete(gen, tokens=3, gen_s=0.1, payload=b"tokens")
    run = buf.start("g2.1", "w1", 0, v1)
    buf.admit("d")
    buf.start("g3.0", "w1", 0, v1)
    buf.ledger.flush()
    # after the flush: lost in the crash
    lost_gid = buf.admit("lost")
    assert lost_gid == "g4"
    buf.complete(run, tokens=1, gen_s=0)

    buf2 = crash_and_reopen(buf)
    assert buf2.incarnation == 1
    assert buf2.version == v1
    assert buf2.open_leases() == []
    rel = of_kind(buf2, ev.LeaseReleased)
    assert [(r.lease, r.reason) for r in rel] == [(lease.id, "trainer_lost")]
    assert buf2.ready_groups() == 1
    fenced = {(f.worker, f.epoch) for f in of_kind(buf2, ev.WorkerFenced)}
    assert fenced == {("w0", 0), ("w1", 0)}
    # running attempts re-issued (new attempts), generated-not-rewarded listed for scoring
    assert set(buf2.take_requests(9)) == {"g2.1", "g3.0", "g3.1"}
    assert buf2.unrewarded() == [gen]
    assert buf2.payload(gen) == b"tokens"
    assert buf2.stats()["groups_admitted"] == 4  # g4 was lost
    assert buf2.counts["committed"] == 2 and buf2.counts["steps"] == 1
    # late results from the dead incarnation's workers are rejected
    assert buf2.complete(run, tokens=1, gen_s=0) is Outcome.REJECTED
    with pytest.raises(StateError):
        buf2.start("g2.1", "w1", 0, v1)
    # the committed samples cannot be committed again
    for sid in committed:
        assert buf2.complete(sid, tokens=1, gen_s=0) is Outcome.REJECTED

    drain(buf2)
    assert buf2.counts["committed"] >= 2
    assert_verified(buf2, closed=True)
    all_committed = [s for c in of_kind(buf2, ev.Committed) for s in c.samples]
    assert len(all_committed) == len(set(all_committed))
    assert {s.partition("#")[0] for s in committed} <= {s.partition("#")[0] for s in all_committed}


def test_recovery_from_a_second_ledger_while_the_first_is_still_open(path):
    buf = new_buffer(path, max_staleness=2, batch_groups=1, group_size=1)
    buf.register_worker("w0")
    run_group(buf, buf.admit("a"))
    buf.admit("b")
    buf.start("g1.0", "w0", 0, V0)
    buf.ledger.flush()
    buf.admit("unflushed")
    # the first object is simply dropped (never closed, never flushed again)
    buf2 = new_buffer(path, max_staleness=2, batch_groups=1, group_size=1)
    assert buf2.incarnation == 1
    assert buf2.take_requests(9) == ["g1.0"]
    assert buf2.unrewarded() == []
    assert buf2.ready_groups() == 1
    drain(buf2)
    assert_verified(buf2, closed=True)
    buf.ledger._pending.clear()
    buf.ledger.close()


def test_resume_after_clean_shutdown(path):
    buf = new_buffer(path, max_staleness=0, batch_groups=1, group_size=1)
    buf.register_worker("w0")
    run_group(buf, buf.admit("a"))
    buf.commit(buf.lease().id, SETTINGS)
    buf.admit("b")
    buf.shutdown()
    buf.ledger.close()
    buf2 = new_buffer(path, max_staleness=0, batch_groups=1, group_size=1)
    assert buf2.incarnation == 1 and buf2.version.step == 1
    assert buf2.capacity() == 1  # the discarded group freed its place
    assert buf2.register_worker("w0") == 1  # epoch 0 was fenced on resume
    run_group(buf2, buf2.admit("c"), epoch=1)
    buf2.commit(buf2.lease().id, SETTINGS)
    buf2.shutdown()
    assert_verified(buf2, closed=True)


def test_resume_with_a_smaller_eta_discards_what_became_stale(path):
    buf = new_buffer(path, max_staleness=2, batch_groups=1, group_size=1)
    buf.register_worker("w0")
    run_group(buf, buf.admit("a"))
    buf.commit(buf.lease().id, SETTINGS)
    run_group(buf, buf.admit("b"), version=V0)  # lag 1 <= 2 now
    buf.ledger.flush()
    buf2 = crash_and_reopen(buf, max_staleness=0)
    assert buf2.capacity() == 0  # over-admitted for eta 0: never negative
    assert buf2.lease() is None  # lag 1 > 0
    assert buf2.counts["discarded_stale"] == 1
    drain(buf2)
    assert_verified(buf2, closed=True)


def _scenario(path: Path, flush_every: int) -> SampleBuffer:
    """A run with every kind of event, including faults, on an auto-flushing ledger."""
    ledger = Ledger(path, sync="off", flush_every=flush_every)
    clock = VirtualClock()
    buf = SampleBuffer.open(
        ledger, KernelConfig(max_staleness=1, batch_groups=2, group_size=2), clock,
        run_id="prefix", initial_version=V0,
    )
    buf.register_worker("w0")
    buf.register_worker("w1")
    for round_ in range(3):
        while buf.capacity():
            buf.admit(f"p{round_}")
        sids = []
        for i, rid in enumerate(buf.take_requests(100)):
            w = f"w{i % 2}"
            sids.append(buf.start(rid, w, buf._epochs[w], buf.version))  # type: ignore[arg-type]
        # a worker with two running attempts is lost
        buf.fence_worker("w1", buf._epochs["w1"], "lost")
        buf.register_worker("w1")
        for sid in sids:
            clock.advance(0.1)
            if buf.complete(sid, tokens=2, gen_s=0.1) is Outcome.ACCEPTED:
                buf.reward(sid, math.nan if sid.startswith("g1.") else 0.5, REWARD)
        for rid in buf.take_requests(100):
            sid = buf.start(rid, "w0", buf._epochs["w0"], V0)  # an old policy: may go stale
            buf.complete(sid, tokens=2, gen_s=0.1)
            buf.reward(sid, 0.5, REWARD)
        lease = buf.lease()
        if lease is not None and round_ == 1:
            buf.release(lease.id, "trainer_error")
            lease = buf.lease()
        if lease is not None:
            buf.commit(lease.id, SETTINGS)
    buf.admit("tail")
    buf.start("g" + str(len(buf._groups) - 1) + ".0", "w0", buf._epochs["w0"], buf.version)  # type: ignore[arg-type]
    buf.shutdown()
    return buf


def test_every_prefix_of_the_history_recovers(tmp_path):
    """The ledger keeps a prefix on a crash: EVERY prefix must reopen, drain and verify."""
    full = _scenario(tmp_path / "full.sqlite", flush_every=8192)
    assert_verified(full, closed=True)
    history = events(full)
    assert len(history) > 100
    kinds = {type(e) for e in history}
    assert {ev.Rejected, ev.LeaseReleased, ev.WorkerFenced, ev.Closed} <= kinds
    assert {d.reason for d in history if isinstance(d, ev.Discarded)} >= {
        "fenced", "reward_error", "stale", "shutdown",
    }
    for k in range(1, len(history) + 1):
        path = tmp_path / f"prefix{k}.sqlite"
        with Ledger(path, sync="off") as ledger:
            for e in history[:k]:
                ledger.append(e)
        buf = new_buffer(path, max_staleness=1, batch_groups=2, group_size=2)
        committed_before = sum(len(e.samples) for e in history[:k] if isinstance(e, ev.Committed))
        assert buf.counts["committed"] == committed_before, k
        assert buf.version is not None, k
        assert all(r.state != 1 for r in buf._requests.values()), f"prefix {k}: still running"
        drain(buf)
        buf.ledger.flush()
        report = verify_ledger(buf.ledger, counts=dict(buf.counts))
        assert report.ok, f"prefix {k} ({type(history[k - 1]).__name__}):\n{report.render()}"
        assert report.closed
        buf.ledger.close()
        path.unlink()


class _Crash(Exception):
    pass


class _CrashingLedger(Ledger):
    """Flushes every event at once (flush_every=1) and "dies" after ``crash_after`` events."""

    def __init__(self, path: Path, crash_after: int) -> None:
        super().__init__(path, sync="off", flush_every=1)
        self.crash_after = crash_after

    def append(self, event: ev.Event) -> int:
        if self.last_seq >= self.crash_after:
            raise _Crash
        return super().append(event)


def test_auto_flush_mid_operation_then_crash(tmp_path):
    """flush_every=1: the durable prefix can end inside any operation."""
    for cut in range(3, 200, 3):
        path = tmp_path / f"cut{cut}.sqlite"
        ledger = _CrashingLedger(path, cut)
        with contextlib.suppress(_Crash):
            _scenario_on(ledger)
        ledger._db.close()
        buf = new_buffer(path, max_staleness=1, batch_groups=2, group_size=2)
        assert all(r.state != 1 for r in buf._requests.values()), f"cut {cut}: still running"
        drain(buf)
        assert_verified(buf, closed=True)
        buf.ledger.close()


def _scenario_on(ledger: Ledger) -> None:
    buf = SampleBuffer.open(
        ledger, KernelConfig(max_staleness=1, batch_groups=2, group_size=2), VirtualClock(),
        run_id="cut", initial_version=V0,
    )
    buf.register_worker("w0")
    for _ in range(3):
        while buf.capacity():
            buf.admit("p")
        sids = [buf.start(r, "w0", buf._epochs["w0"], V0) for r in buf.take_requests(100)]
        buf.register_worker("w0")  # fences everything running
        for r in buf.take_requests(100):
            sids.append(buf.start(r, "w0", buf._epochs["w0"], V0))
        for sid in sids:
            if buf.complete(sid, tokens=1, gen_s=0) is Outcome.ACCEPTED:
                buf.reward(sid, 0.5, REWARD)
        lease = buf.lease()
        if lease is not None:
            buf.commit(lease.id, SETTINGS)
    buf.shutdown()


def _prefix_copy(src: list[ev.Event], dst: Path) -> None:
    with Ledger(dst, sync="off") as ledger:
        for e in src:
            ledger.append(e)


@pytest.mark.parametrize("reason", ["stale", "shutdown"])
def test_group_discard_cut_by_a_crash_is_completed_on_recovery(tmp_path, reason):
    """A ready group is discarded whole; a crash between its members' discards must not
    leave a partial group that a later lease would consume."""
    buf = new_buffer(tmp_path / "full.sqlite", max_staleness=1, batch_groups=1, group_size=2)
    buf.register_worker("w0")
    run_group(buf, buf.admit("a"))
    buf.commit(buf.lease().id, SETTINGS)
    run_group(buf, buf.admit("b"))
    v2 = buf.commit(buf.lease().id, SETTINGS)
    gid = buf.admit("c")
    old = buf.start("g2.0", "w0", 0, V0)  # lag 2 > 1: the group is stale
    new = buf.start("g2.1", "w0", 0, v2)
    for sid in (old, new):
        buf.complete(sid, tokens=1, gen_s=0)
        buf.reward(sid, 1.0, REWARD)
    if reason == "stale":
        assert buf.lease() is None
    else:
        buf.shutdown()
    history = events(buf)
    cut = next(i for i, e in enumerate(history) if isinstance(e, ev.Discarded)
               and e.reason == reason) + 1  # after the first member's discard only
    _prefix_copy(history[:cut], tmp_path / "cut.sqlite")
    rec = new_buffer(tmp_path / "cut.sqlite", max_staleness=1, batch_groups=1, group_size=2)
    assert rec.ready_groups() == 0, "a partially discarded group is still ready"
    assert states(rec) == {"committed": 4, "discarded": 2}
    ends = [e for e in events(rec) if isinstance(e, ev.Discarded) and e.request.startswith(gid)]
    assert [e.reason for e in ends] == [reason, reason]
    drain(rec)
    assert_verified(rec, closed=True)


def test_commands_after_shutdown_are_refused(path):
    buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=1)
    buf.register_worker("w0")
    buf.shutdown()
    n = buf.ledger.last_seq
    with pytest.raises(StateError):
        buf.admit("late")
    with pytest.raises(StateError):
        buf.register_worker("w1")
    buf.shutdown()  # idempotent
    assert buf.ledger.last_seq == n
    assert buf.stats()["groups_admitted"] == 0
    assert_verified(buf, closed=True)


def test_result_from_another_worker_epoch_is_rejected(path):
    """A re-issued sample id must not be completed by a worker that outlived a crash."""
    buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=1)
    e0, e1 = buf.register_worker("w0"), buf.register_worker("w1")
    buf.admit("p")
    sid = buf.start(buf.next_request(), "w0", e0, buf.version)
    assert buf.complete(sid, tokens=1, gen_s=0.0, worker=("w1", e1)) is Outcome.REJECTED
    assert buf.counts["rejected_fenced"] == 1
    assert buf.complete(sid, tokens=1, gen_s=0.0, worker=("w0", e0)) is Outcome.ACCEPTED
