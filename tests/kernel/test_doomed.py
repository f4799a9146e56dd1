"""A running group that can no longer be consumed fresh is discarded stale at once
(freshroll.kernel.freshness.doomed, SampleBuffer.drop_doomed), freeing its admission place; a group
that could still be fresh is never touched; verify rechecks every such discard."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_buffer import (
    REWARD,
    SETTINGS,
    V0,
    assert_verified,
    members,
    new_buffer,
    of_kind,
    run_group,
)

from freshroll.kernel.freshness import doomed
from freshroll.ledger import events as ev


def test_the_rule_counts_only_members_certain_to_be_in_the_group():
    assert not doomed(5, [], 2)  # nothing certain yet (only queued members)
    assert not doomed(5, [3, 4], 2)  # lag 2 == η: may still be consumed
    assert doomed(5, [2, 4], 2)  # lag 3 > η, and a lag only grows


def _advance(buf, steps: int) -> None:
    """Commit ``steps`` steps on groups of their own (one each)."""
    for _ in range(steps):
        run_group(buf, buf.admit("filler"))
        buf.commit(buf.lease().id, SETTINGS)


@pytest.mark.parametrize("basis", ["oldest_token", "newest_token"])
def test_a_group_held_by_an_old_member_ends_stale_before_it_is_ready(tmp_path: Path, basis: str):
    buf = new_buffer(tmp_path / "l.sqlite", max_staleness=1, batch_groups=1, group_size=3,
                     staleness_basis=basis)  # type: ignore[arg-type]
    buf.register_worker("w0")
    gid = buf.admit("long")
    a, b, c = members(buf, gid)
    done = buf.start(a, "w0", 0, V0)  # finished on v0, waits for the group's tail
    buf.complete(done, tokens=2, gen_s=0.1)
    buf.reward(done, 1.0, REWARD)
    running = buf.start(b, "w0", 0, V0)  # the tail, still running
    _advance(buf, 1)  # v1: lag 1 == η, nothing doomed
    assert buf.drop_doomed() == 0 and buf.doomed_groups(basis, 1) == []
    _advance(buf, 1)  # v2: the finished member's lag is 2 > 1 on either basis
    assert buf.doomed_groups(basis, 1) == [(gid, 2)]
    running_before = buf.running
    assert buf.drop_doomed() == 3  # c queued, b running, the rewarded sample
    stale = [d for d in of_kind(buf, ev.Discarded) if d.reason == "stale"]
    assert sorted(d.request for d in stale) == sorted([a, b, c])
    assert "doomed before it was ready: lag 2 > 1" in stale[0].detail
    assert buf.stopped == [(running, "w0", 0)]  # cancelled on its engine by the pipeline
    assert buf.running == running_before - 1  # its admission place freed
    assert buf.request_state(c) == "discarded" and buf.request_state(b) == "discarded"
    assert_verified(buf)


def test_a_fresh_tail_is_not_doomed_on_the_newest_basis_nor_an_extra_on_the_oldest(
        tmp_path: Path):
    # newest_token: a running member's newest token moves with in-flight updates: only the
    # members done count
    buf = new_buffer(tmp_path / "n.sqlite", max_staleness=1, batch_groups=1, group_size=2,
                     staleness_basis="newest_token")  # type: ignore[arg-type]
    buf.register_worker("w0")
    gid = buf.admit("long")
    buf.start(members(buf, gid)[0], "w0", 0, V0)  # running since v0
    _advance(buf, 3)
    assert buf.doomed_groups("newest_token", 1) == []
    assert buf.doomed_groups("oldest_token", 1) == [(gid, 3)]  # its oldest token is fixed
    # oldest_token with extras: a running member may yet be cancelled at target
    over = new_buffer(tmp_path / "o.sqlite", max_staleness=1, batch_groups=1, group_size=2)
    over.register_worker("w0")
    g = over.admit("long", 1)  # 3 requests, 2 kept
    over.start(members(over, g)[0], "w0", 0, V0)
    _advance(over, 3)
    assert over.doomed_groups("oldest_token", 1) == []
    assert over.drop_doomed() == 0
    assert_verified(over)


def test_verify_refuses_a_stale_discard_of_a_running_group_that_was_fresh(tmp_path: Path):
    from freshroll.harness.verify import verify_ledger

    buf = new_buffer(tmp_path / "f.sqlite", max_staleness=2, batch_groups=1, group_size=2)
    buf.register_worker("w0")
    gid = buf.admit("p")
    rid = members(buf, gid)[0]
    sid = buf.start(rid, "w0", 0, buf.version)
    buf._emit(ev.Discarded(ts=buf.clock.now(), request=rid, sample=sid, reason="stale",
                           detail="forged"))  # lag 0: not stale
    buf.ledger.flush()
    report = verify_ledger(buf.ledger, counts=dict(buf.counts), allow_open=True)
    assert not report.ok and "discarded stale but its group's lag is 0 <= 2" in report.render()


def test_a_simulated_long_tail_run_drops_doomed_groups_and_verifies(tmp_path: Path):
    """P2 on the virtual clock with ``tail.drop_doomed``: groups held by an old member end
    stale before they are ready (their running attempts cancelled), and verify passes."""
    import io

    from freshroll.config import load_config
    from freshroll.ledger.store import Ledger
    from freshroll.runtime.run import run

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "configs" / "sim-p2.yaml",
                      ["run.steps=8", "run.progress=false", "tail.drop_doomed=true"])
    result = run(cfg, tmp_path / "r", stream=io.StringIO(), report=False)
    assert result.ok
    with Ledger(tmp_path / "r" / "ledger.sqlite", readonly=True) as ledger:
        early = [e for _, e in ledger.events() if isinstance(e, ev.Discarded)
                 and e.reason == "stale" and e.detail.startswith("doomed")]
    assert early, "no group was doomed on P2 at max_staleness 2"
    assert {e.request.partition(".")[0] for e in early}  # whole groups, ended early
