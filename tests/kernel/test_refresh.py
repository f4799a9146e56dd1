"""Refreshing stale finished members (``tail.refresh``, freshroll/kernel/refresh.py): the reducer's
transition, the rule as a pure function, the buffer applying it at a commit, on arrival and at
lease, bounded by ``max_refreshes``; verify accepts a refresh as a retry and flags a refresh of
a fresh member or a refreshed attempt trained on; a crash right after a refresh resumes with
every invariant."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_buffer import (
    REWARD,
    SETTINGS,
    V0,
    assert_verified,
    drain,
    events,
    members,
    new_buffer,
    of_kind,
    run_group,
)

from freshroll.errors import ConfigError, StateError
from freshroll.harness.verify import verify_ledger
from freshroll.kernel.freshness import is_stale, refresh_due
from freshroll.kernel.results import KernelConfig
from freshroll.kernel.state import G_READY, G_RUNNING, BufferState
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import GroupId, PolicyVersion
from freshroll.ledger.store import Ledger


# == the rule ========================================================================
@given(v=st.integers(0, 50), step=st.integers(0, 50), eta=st.integers(0, 8),
       r=st.integers(0, 6), limit=st.integers(1, 6))
def test_the_rule_is_stale_and_under_the_limit(v: int, step: int, eta: int, r: int,
                                               limit: int) -> None:
    due = refresh_due(v, step, eta, r, limit)
    assert due == (v - step > eta and r < limit)
    assert not due or is_stale(v, step, eta)  # never a member that could still be consumed
    if due:  # one version later it is still due (a lag only grows), until the limit
        assert refresh_due(v + 1, step, eta, r, limit)
        assert not refresh_due(v, step, eta, limit, limit)


def test_the_setting_is_checked() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError, match="max_refreshes"):
            KernelConfig(max_refreshes=bad)  # type: ignore[arg-type]
    assert KernelConfig(max_refreshes=3).max_refreshes == 3


# == the reducer =====================================================================
def _ready_group_events() -> list[ev.Event]:
    v1 = PolicyVersion.initial("m").child(["x#1"], "s")
    out: list[ev.Event] = [
        ev.Opened(ts=0, run_id="r", incarnation=0, max_staleness=1, batch_groups=1,
                  group_size=2),
        ev.PolicyPublished(ts=0, version=str(V0)),
        ev.Requested(ts=0, group="g0", prompt_id="p", size=2, version=str(V0)),
        ev.WorkerStarted(ts=0, worker="w0", epoch=0),
    ]
    for m in range(2):
        out.append(ev.Started(ts=0, sample=f"g0.{m}#1", worker="w0", epoch=0, version=str(V0)))
    out.append(ev.Generated(ts=1, sample="g0.0#1", tokens=2, gen_s=1.0))
    out.append(ev.Generated(ts=2, sample="g0.1#1", tokens=2, gen_s=2.0, last_version=str(v1)))
    return out


def test_the_reducer_re_queues_a_generated_member() -> None:
    state = BufferState()
    for e in _ready_group_events():
        state.apply(e)
    state.apply(ev.Discarded(ts=3, request="g0.0", sample="g0.0#1", reason="refreshed"))
    req = state._request("g0.0")
    assert req.state == 0 and req.refreshes == 1 and state._queue[0] is req
    assert req.group.open == 2 and req.group.samples == []  # a generated member was open
    assert state.counts["discarded_refreshed"] == 1


def test_the_reducer_sends_a_ready_group_back_to_running() -> None:
    state = BufferState()
    for e in _ready_group_events():
        state.apply(e)
    state.apply(ev.Rewarded(ts=3, sample="g0.0#1", reward=1.0, reward_version=REWARD))
    state.apply(ev.Rewarded(ts=3, sample="g0.1#1", reward=0.0, reward_version=REWARD))
    state.apply(ev.Ready(ts=3, group="g0", samples=["g0.0#1", "g0.1#1"]))
    group = state._groups[GroupId("g0")]
    assert (group.state, state.accepted, state.running, group.oldest, group.newest) \
        == (G_READY, 1, 0, 0, 0)
    state.apply(ev.Discarded(ts=4, request="g0.0", sample="g0.0#1", reason="refreshed"))
    assert group.state == G_RUNNING and group not in state._ready and "g0" in state._live
    assert (state.accepted, state.running, group.open) == (0, 1, 1)
    assert group.samples == ["g0.1#1"]
    assert (group.oldest, group.newest) == (0, 1)  # the kept member's: started v0, newest v1


# == the buffer ======================================================================
def _advance(buf, steps: int) -> None:
    """Commit ``steps`` steps on groups of their own (one each)."""
    for _ in range(steps):
        run_group(buf, buf.admit("filler"))
        lease = buf.lease()
        assert lease is not None
        buf.commit(lease.id, SETTINGS)


def test_a_generated_member_past_the_bound_is_refreshed_at_commit_and_on_arrival(
        tmp_path: Path) -> None:
    buf = new_buffer(tmp_path / "l.sqlite", max_staleness=1, batch_groups=1, group_size=2,
                     max_refreshes=2, admission_window=3)
    buf.register_worker("w0")
    gid = buf.admit("long")
    short, long_ = members(buf, gid)
    s1 = buf.start(short, "w0", 0, V0)
    buf.complete(s1, tokens=2, gen_s=0.1)  # done on v0, waits for its sibling
    l1 = buf.start(long_, "w0", 0, V0)
    _advance(buf, 1)
    assert buf.request_state(short) == "generated"  # lag 1 == η: kept
    _advance(buf, 1)  # v2: lag 2 > 1, refreshed by the commit
    assert buf.request_state(short) == "queued" and buf.refreshed == [s1]
    (refresh,) = [d for d in of_kind(buf, ev.Discarded) if d.reason == "refreshed"]
    assert refresh.sample == s1 and refresh.detail == "refresh 1 of 2: lag 2 > 1 (oldest_token)"
    assert buf.reward(s1, 1.0, REWARD).value == "rejected"  # its reward, late: never applied
    buf.refreshed.clear()
    buf.complete(l1, tokens=50, gen_s=9.0)  # started on v0: past the bound on arrival
    assert buf.request_state(long_) == "queued" and buf.refreshed == [l1]
    for rid in (short, long_):
        sid = buf.start(rid, "w0", 0, buf.version)  # type: ignore[arg-type]
        buf.complete(sid, tokens=3, gen_s=0.1)
        buf.reward(sid, 0.5, REWARD)
    lease = buf.lease()
    assert lease is not None and sorted(lease.samples) == [f"{short}#2", f"{long_}#2"]
    buf.commit(lease.id, SETTINGS)
    buf.shutdown()
    assert buf.counts["discarded_refreshed"] == 2 and not buf.counts["discarded_stale"]
    assert_verified(buf, closed=True)


def test_a_refreshed_attempt_still_being_scored_is_superseded(tmp_path: Path) -> None:
    """The reward stage may hold a generated attempt that is refreshed, re-issued and
    generated again meanwhile: ``attempt_state`` tells the old attempt apart (its reward is
    rejected, and it is never discarded in the new one's place)."""
    buf = new_buffer(tmp_path / "l.sqlite", max_staleness=0, batch_groups=1, group_size=2,
                     max_refreshes=2, admission_window=3)
    buf.register_worker("w0")
    first = members(buf, buf.admit("p"))[0]
    s1 = buf.start(first, "w0", 0, V0)
    buf.complete(s1, tokens=2, gen_s=0.1)
    _advance(buf, 1)
    s2 = buf.start(first, "w0", 0, buf.version)  # type: ignore[arg-type]
    buf.complete(s2, tokens=2, gen_s=0.1)
    assert buf.request_state(s1) == "generated"  # the request's: the new attempt's state
    assert (buf.attempt_state(s1), buf.attempt_state(s2)) == ("superseded", "generated")
    assert buf.reward(s1, 1.0, REWARD).value == "rejected"
    with pytest.raises(StateError, match="not the current attempt"):
        buf.discard(s1, "reward_error")


def test_a_ready_group_loses_only_its_stale_member(tmp_path: Path) -> None:
    """newest_token: a ready group whose short member aged while two groups ahead of it were
    trained goes back to running without it; its fresh member is kept and trained."""
    buf = new_buffer(tmp_path / "l.sqlite", max_staleness=1, batch_groups=1, group_size=2,
                     staleness_basis="newest_token", max_refreshes=3, admission_window=3)
    buf.register_worker("w0")
    gid = buf.admit("p")
    first, second = members(buf, gid)
    a = buf.start(first, "w0", 0, V0)
    b = buf.start(second, "w0", 0, V0)
    ahead = [buf.admit("ahead"), buf.admit("ahead")]
    for g in ahead:
        run_group(buf, g)
    buf.complete(a, tokens=2, gen_s=0.1)
    buf.reward(a, 1.0, REWARD)
    lease = buf.lease()
    assert lease is not None and lease.groups == (ahead[0],)
    v1 = buf.commit(lease.id, SETTINGS)
    buf.complete(b, tokens=40, gen_s=5.0, last_version=v1)  # its newest token on v1
    buf.reward(b, 0.0, REWARD)
    assert buf._groups[gid].state == G_READY
    lease = buf.lease()
    assert lease is not None and lease.groups == (ahead[1],)
    running = buf.running
    buf.commit(lease.id, SETTINGS)  # v2: a (newest v0) lag 2 > 1; b (v1) lag 1 kept
    assert buf._groups[gid].state == G_RUNNING and buf.running == running + 1
    assert buf.request_state(first) == "queued" and buf.request_state(second) == "rewarded"
    sid = buf.start(first, "w0", 0, buf.version)  # type: ignore[arg-type]
    buf.complete(sid, tokens=2, gen_s=0.1)
    buf.reward(sid, 1.0, REWARD)
    lease = buf.lease()
    assert lease is not None and sorted(lease.samples) == sorted([sid, b])
    buf.commit(lease.id, SETTINGS)
    buf.shutdown()
    assert_verified(buf, closed=True)


def test_past_max_refreshes_the_group_ends_stale_as_without_the_lever(tmp_path: Path) -> None:
    buf = new_buffer(tmp_path / "l.sqlite", max_staleness=0, batch_groups=1, group_size=2,
                     max_refreshes=1, admission_window=3)
    buf.register_worker("w0")
    gid = buf.admit("p")
    first, second = members(buf, gid)
    a = buf.start(first, "w0", 0, V0)
    buf.complete(a, tokens=2, gen_s=0.1)
    buf.reward(a, 1.0, REWARD)
    _advance(buf, 1)  # lag 1 > 0: refreshed (1 of 1)
    assert buf.request_state(first) == "queued"
    a2 = buf.start(first, "w0", 0, buf.version)  # type: ignore[arg-type]
    buf.complete(a2, tokens=2, gen_s=0.1)
    buf.reward(a2, 1.0, REWARD)
    _advance(buf, 1)  # stale again, but refreshed once already: left alone
    assert buf.request_state(first) == "rewarded"
    b = buf.start(second, "w0", 0, buf.version)  # type: ignore[arg-type]
    buf.complete(b, tokens=2, gen_s=0.1)
    buf.reward(b, 1.0, REWARD)
    assert buf.lease() is None  # the group is discarded stale, whole
    assert buf.request_state(first) == buf.request_state(second) == "discarded"
    assert buf.counts["discarded_refreshed"] == 1 and buf.counts["discarded_stale"] == 2
    drain(buf)
    assert_verified(buf, closed=True)


def test_off_by_default_and_never_by_hand(tmp_path: Path) -> None:
    buf = new_buffer(tmp_path / "l.sqlite", max_staleness=0, batch_groups=1, group_size=2,
                     admission_window=3)
    buf.register_worker("w0")
    gid = buf.admit("p")
    a = buf.start(members(buf, gid)[0], "w0", 0, V0)
    buf.complete(a, tokens=2, gen_s=0.1)
    with pytest.raises(StateError, match="refresh rule"):
        buf.discard(a, "refreshed")
    _advance(buf, 1)
    assert buf.refresh_stale() == 0 and buf.request_state(a) == "generated"


def test_a_crash_right_after_a_refresh_resumes_with_every_invariant(tmp_path: Path) -> None:
    """The ledger cut right after each ``refreshed`` event (and right before it): the resumed
    buffer replays the re-queued request, re-issues its attempt, completes the run; verify
    passes at the end and no refreshed attempt is trained on."""
    full = new_buffer(tmp_path / "full.sqlite", max_staleness=1, batch_groups=1, group_size=2,
                      max_refreshes=2, admission_window=3)
    full.register_worker("w0")
    gid = full.admit("long")
    short, long_ = members(full, gid)
    s1 = full.start(short, "w0", 0, V0)
    full.complete(s1, tokens=2, gen_s=0.1)
    full.reward(s1, 1.0, REWARD)
    full.start(long_, "w0", 0, V0)
    _advance(full, 2)
    history = events(full)
    cut = [i for i, e in enumerate(history)
           if isinstance(e, ev.Discarded) and e.reason == "refreshed"]
    assert cut
    for n in (cut[0], cut[0] + 1):
        path = tmp_path / f"cut{n}.sqlite"
        with Ledger(path, sync="off") as led:
            for e in history[:n]:
                led.append(e)
        buf = new_buffer(path, max_staleness=1, batch_groups=1, group_size=2,
                         max_refreshes=2, admission_window=3)
        assert buf.request_state(short) == "queued"  # replayed, or refreshed on recovery
        drain(buf)
        assert_verified(buf, closed=True)
        evs = [e for _, e in buf.ledger.events()]
        trained = {s for e in evs if isinstance(e, ev.Committed) for s in e.samples}
        assert s1 not in trained


# == verify ==========================================================================
def _ledger(path: Path, tail: list[ev.Event]) -> list[str]:
    """``tail`` after one group of two generated on v0, at η = 1; verify's violations."""
    with Ledger(path, sync="off") as led:
        for e in _ready_group_events()[:-1]:
            led.append(e)
        led.append(ev.Generated(ts=2, sample="g0.1#1", tokens=2, gen_s=2.0))
        for e in tail:
            led.append(e)
    with Ledger(path, sync="off") as led:
        report = verify_ledger(led, allow_open=True)
    return [m for v in report.violations.values() for m in v]


def test_verify_flags_a_refresh_of_a_fresh_member(tmp_path: Path) -> None:
    bad = _ledger(tmp_path / "l.sqlite", [
        ev.Discarded(ts=3, request="g0.0", sample="g0.0#1", reason="refreshed")])
    assert any("refreshed but its lag is 0 <= 1" in m for m in bad), bad


def test_verify_flags_a_refreshed_attempt_trained_on(tmp_path: Path) -> None:
    rewarded = [ev.Rewarded(ts=3, sample=f"g0.{m}#1", reward=1.0, reward_version=REWARD)
                for m in range(2)]
    ready = ev.Ready(ts=3, group="g0", samples=["g0.0#1", "g0.1#1"])
    lease = ev.Leased(ts=4, lease="l0", version=str(V0), groups=["g0"])
    v1 = V0.child(["g0.0#1", "g0.1#1"], SETTINGS)
    commit = ev.Committed(ts=5, lease="l0", version=str(v1), parent=str(V0),
                          settings_digest=SETTINGS, samples=["g0.0#1", "g0.1#1"])
    fine = _ledger(tmp_path / "ok.sqlite", [*rewarded, ready, lease, commit])
    assert fine == []
    # the same history with g0.0's attempt refreshed (at lag 0) before the lease
    refreshed = ev.Discarded(ts=3, request="g0.0", sample="g0.0#1", reason="refreshed")
    bad = _ledger(tmp_path / "bad.sqlite", [*rewarded, ready, refreshed, lease, commit])
    assert any("never trained on" in m for m in bad), bad
    late = _ledger(tmp_path / "late.sqlite", [refreshed, *rewarded])
    assert any("rewarded after it was discarded" in m for m in late), late


@pytest.mark.parametrize(("override", "said"), [
    ("tail.max_refreshes=0", "tail.max_refreshes: Input should be greater than or equal to 1"),
    ("tail.max_refreshes=65", "tail.max_refreshes: Input should be less than or equal to 64"),
    ("tail.max_refreshes=true", "tail.max_refreshes: expected a number, got a boolean"),
    ("tail.refresh=maybe", "tail.refresh: Input should be a valid boolean"),
])
def test_the_config_keys_are_checked_with_clear_errors(override: str, said: str) -> None:
    from freshroll.config import load_config

    with pytest.raises(ConfigError, match=said):
        load_config(None, [override])
    cfg = load_config(None, ["tail.refresh=true", "tail.max_refreshes=2"])
    assert (cfg.tail.refresh, cfg.tail.max_refreshes) == (True, 2)
    assert load_config(None, []).tail.refresh is False  # off by default
