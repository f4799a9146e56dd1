"""run.staleness_policy: pace (issue 51, item 3): the trainer consumes in admission order,
waiting for a group still running ahead of the ready ones, so that with the default admission
window no admitted group is ever discarded stale.

The rule (pure), the kernel against the ``discard`` policy on the same completions, a property
over random completion orders, the config, and simulated runs on P2's long tails that pass
``verify`` with no stale discard.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_buffer import REWARD, SETTINGS, V0, assert_verified, members, new_buffer

from freshroll.config import load_config
from freshroll.errors import ConfigError
from freshroll.harness.verify import verify_run
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.freshness import paced_lease
from freshroll.kernel.results import KernelConfig
from freshroll.ledger.lineage import GroupId
from freshroll.ledger.store import Ledger
from freshroll.runtime import run as run_mod


# -- the rule ------------------------------------------------------------------------------
@pytest.mark.parametrize(("ready", "running", "n", "version", "eta", "picked"), [
    ([(2, 3), (0, 1), (1, 2)], [], 2, 2, 1, [1, 2]),   # the two nearest the bound
    ([(1, 3), (1, 1)], [], 2, 2, 1, [1, 0]),           # a tie: admission order
    ([(2, 3), (1, 1)], [2], 2, 2, 1, [1, 0]),          # the running group can afford v3
    ([(2, 3), (1, 1)], [1], 2, 2, 1, None),            # it cannot (lag 2 at v3): wait
    ([(2, 3), (1, 1)], [1], 2, 2, 2, [1, 0]),          # at η 2 it can
    ([(2, 0)], [2], 1, 2, 0, None),                    # sync: every started group blocks
    ([(1, 0)], [], 2, 2, 1, None),                     # too few ready
    ([(0, 0), (0, 1)], [0], 1, 1, 1, [0]),             # waiting would not save group 1
])
def test_the_paced_lease_waits_only_for_a_group_at_the_bound(ready, running, n, version, eta,
                                                             picked) -> None:
    assert paced_lease(ready, running, n, version=version, max_staleness=eta) == picked


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 50)), unique_by=lambda t: t[1],
                max_size=12),
       st.lists(st.integers(0, 9), max_size=6), st.integers(1, 4), st.integers(0, 9),
       st.integers(0, 3))
def test_a_paced_lease_takes_the_earliest_deadlines_and_leaves_the_rest_in_time(
        ready, running, n, version, eta) -> None:
    got = paced_lease(ready, running, n, version=version, max_staleness=eta)

    def in_time(steps: list[int]) -> bool:
        return all(version + 1 + k // n <= s + eta for k, s in enumerate(sorted(steps)))

    left = [g[0] for i, g in enumerate(ready) if got is None or i not in got]
    if got is None:  # it waits only for a running group that could otherwise miss its bound
        assert len(ready) < n or (running and not in_time([*left, *running]))
        return
    assert len(got) == n
    assert all(g >= max(ready[i] for i in got) for i, g in enumerate(ready) if i not in got)
    if in_time(left):  # what the lease leaves behind can all still be leased in time
        assert in_time([*left, *running])


# -- the kernel ----------------------------------------------------------------------------
def _finish(buf: SampleBuffer, gid: GroupId, worker: str = "w0") -> None:
    for rid in members(buf, gid):
        sid = buf.start(rid, worker, 0, buf.version)  # type: ignore[arg-type]
        buf.complete(sid, tokens=4, gen_s=0.1)
        buf.reward(sid, 0.5, REWARD)


@pytest.mark.parametrize("policy", ["discard", "pace"])
def test_a_long_group_is_overtaken_while_it_can_afford_it(tmp_path: Path, policy: str) -> None:
    """η 1, one group a step: a group started on v0 is overtaken once (it can afford v1), then
    waited for under pace; without pacing it is overtaken again and ends stale."""
    buf = new_buffer(tmp_path / "l.sqlite", max_staleness=1, batch_groups=1, group_size=2,
                     staleness_policy=policy)  # type: ignore[arg-type]
    buf.register_worker("w0")
    long_, short = buf.admit("long"), buf.admit("short")
    first = buf.start(members(buf, long_)[0], "w0", 0, V0)  # started on v0, not finished
    _finish(buf, short)
    lease = buf.lease()  # v0 -> v1: the long group's lag would be 1, within η
    assert lease is not None and lease.groups == (short,)
    buf.commit(lease.id, SETTINGS)
    _finish(buf, buf.admit("short2"))
    lease = buf.lease()
    if policy == "pace":  # v1 -> v2 would leave it at lag 2: wait for it
        assert lease is None
        for sid in [first, buf.start(members(buf, long_)[1], "w0", 0, V0)]:
            buf.complete(sid, tokens=40, gen_s=9.0)
            buf.reward(sid, 1.0, REWARD)
        lease = buf.lease()
        assert lease is not None and lease.groups == (long_,)  # at lag 1
    else:
        assert lease is not None and lease.groups[0] != long_
    buf.commit(lease.id, SETTINGS)
    if policy == "discard":  # the long group, finished now at v2, is past the bound
        for sid in [first, buf.start(members(buf, long_)[1], "w0", 0, V0)]:
            buf.complete(sid, tokens=40, gen_s=9.0)
            buf.reward(sid, 1.0, REWARD)
        assert buf.lease() is None  # discarded stale at the lease, nothing left to take
    buf.shutdown()
    assert bool(buf.counts["discarded_stale"]) is (policy == "discard")
    assert_verified(buf, closed=True)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), eta=st.integers(0, 2), b=st.integers(1, 3))
def test_pacing_never_discards_a_group_stale(tmp_path_factory, seed: int, eta: int,
                                             b: int) -> None:
    """Random completion orders under the default window: no group is ever discarded stale
    (verify re-checks every lease's lag)."""
    path = tmp_path_factory.mktemp("pace") / "l.sqlite"
    buf = SampleBuffer.open(Ledger(path, sync="off"), KernelConfig(
        max_staleness=eta, batch_groups=b, group_size=2, staleness_policy="pace"),
        _clock(), run_id="unit", initial_version=V0)
    buf.register_worker("w0")
    rng, pending = random.Random(seed), []
    for _ in range(12):
        for _ in range(buf.capacity()):
            gid = buf.admit("p")
            pending += [buf.start(r, "w0", 0, buf.version) for r in members(buf, gid)]  # type: ignore[arg-type]
        rng.shuffle(pending)  # any order of completion
        for sid in pending[:rng.randint(1, len(pending))]:
            buf.complete(sid, tokens=4, gen_s=0.1)
            buf.reward(sid, 0.5, REWARD)
            pending.remove(sid)
            if (lease := buf.lease()) is not None:
                buf.commit(lease.id, SETTINGS)
    buf.shutdown()
    assert not buf.counts["discarded_stale"]
    assert_verified(buf, closed=True)


def _clock():
    from freshroll.clock import VirtualClock

    return VirtualClock()


# -- the config ----------------------------------------------------------------------------
def test_the_config_takes_discard_or_pace_and_refuses_others() -> None:
    assert load_config(None, []).run.staleness_policy == "discard"
    assert load_config(None, ["run.staleness_policy=pace"]).run.staleness_policy == "pace"
    with pytest.raises(ConfigError, match=r"run\.staleness_policy"):
        load_config(None, ["run.staleness_policy=drop"])
    with pytest.raises(ConfigError, match="staleness_policy"):
        KernelConfig(staleness_policy="drop")


# -- simulated runs ------------------------------------------------------------------------
P2 = ["rollout.engine=sim", "sim.clock=virtual", "sim.profile=P2", "run.progress=false",
      "run.max_staleness=1", "rollout.group_size=4", "rollout.batch_groups=4",
      "rollout.workers=2", "rollout.worker_batch=16", "task.n_prompts=256", "run.steps=12"]


def test_a_paced_run_on_long_tails_discards_nothing_stale_and_verifies(tmp_path: Path) -> None:
    stale = {}
    for policy in ("discard", "pace"):
        out = tmp_path / policy
        run_mod.run(load_config(None, [*P2, f"run.staleness_policy={policy}"]), out,
                    stream=io.StringIO())
        report = verify_run(out)
        assert report.ok, report.violations
        counts = json.loads((out / "counts.json").read_text())
        stale[policy] = counts.get("discarded_stale", 0)
    assert stale["pace"] == 0
    assert stale["discard"] > 0  # the same tails overtake and age groups without pacing
