"""Long-tail rules: over-provisioning with stop-at-target, group deadlines (pure, virtual time)."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from freshroll.control.tail import (
    GroupProgress,
    TailPolicy,
    at_least,
    extra_requests,
    group_deadline,
    on_time_share,
    tail_action,
)
from freshroll.errors import ConfigError


def brute_at_least(n: int, k: int, p: float) -> float:
    """P[Binomial(n, p) >= k] by enumerating every outcome (an independent oracle)."""
    total = 0.0
    for outcome in itertools.product((0, 1), repeat=n):
        if sum(outcome) >= k:
            total += math.prod(p if o else 1 - p for o in outcome)
    return total


@pytest.mark.parametrize(("n", "k", "p"), [(8, 8, 0.9), (9, 8, 0.9), (10, 8, 0.7), (6, 2, 0.3),
                                           (5, 0, 0.5), (4, 5, 0.99)])
def test_binomial_tail_matches_enumeration(n, k, p):
    assert at_least(n, k, p) == pytest.approx(brute_at_least(n, k, p), abs=1e-12)


def test_extra_requests_hand_computed():
    policy = TailPolicy(target_prob=0.95, max_extra=8)
    assert extra_requests(8, 1.0, policy) == 0
    # P[Bin(8+m, .9) >= 8]: m=0 .430, m=1 .775, m=2 .930, m=3 .981
    assert extra_requests(8, 0.9, policy) == 3
    assert extra_requests(8, 0.9, TailPolicy(target_prob=0.9, max_extra=8)) == 2
    assert extra_requests(8, 0.0, policy) == 8  # unreachable: best effort at the cap
    assert extra_requests(8, 0.5, TailPolicy(max_extra=2)) == 2


@given(g=st.integers(1, 16), p=st.floats(0.0, 1.0), q=st.floats(0.0, 1.0), cap=st.integers(0, 8))
def test_extra_requests_is_monotone_and_capped(g, p, q, cap):
    policy = TailPolicy(max_extra=cap)
    m = extra_requests(g, p, policy)
    assert 0 <= m <= cap
    assert extra_requests(g, p * q, policy) >= m  # a worse on-time share never asks for fewer


def test_on_time_share():
    assert on_time_share([], 1.0) == 1.0
    assert on_time_share([0.5, 1.0, 2.0, 3.0], 1.0) == 0.5


def test_stop_at_target_cancels_the_rest():
    a = tail_action(1.0, GroupProgress(started_at=0.0, target=8, done=8, open=3), 1.0, TailPolicy())
    assert (a.action, a.cancel) == ("stop_at_target", 3)


def test_deadline_cuts_stragglers_only_with_enough_members():
    policy = TailPolicy(deadline_factor=3.0, drop_factor=6.0, min_keep=2)
    assert group_deadline(10.0, 2.0, policy) == 16.0
    g = GroupProgress(started_at=10.0, target=8, done=5, open=3)
    assert tail_action(15.9, g, 2.0, policy).action == "wait"
    cut = tail_action(16.0, g, 2.0, policy)
    assert (cut.action, cut.cancel) == ("cut_stragglers", 3)
    few = GroupProgress(started_at=10.0, target=8, done=1, open=7)
    assert tail_action(16.0, few, 2.0, policy).action == "wait"  # a group of one is useless
    drop = tail_action(22.0, few, 2.0, policy)
    assert (drop.action, drop.cancel) == ("drop_group", 7)
    assert tail_action(99.0, GroupProgress(10.0, 8, 0, 0), 2.0, policy).cancel == 0


def test_bad_policy_is_a_config_error():
    for bad in ({"deadline_factor": 0.0}, {"deadline_factor": 7.0}, {"min_keep": 0},
                {"target_prob": 1.0}, {"max_extra": -1}):
        with pytest.raises(ConfigError, match="tail"):
            TailPolicy(**bad)  # type: ignore[arg-type]


def test_one_slow_request_no_longer_holds_its_group():
    """Seeded lognormal latencies (sigma 1.0, a P2-like tail): the time a group holds its
    admission place, without handling vs with over-provisioning + stop-at-target + deadline."""
    rng = random.Random(7)
    g, policy, p50 = 8, TailPolicy(deadline_factor=3.0, max_extra=4), 1.0
    lat = [rng.lognormvariate(0.0, 1.0) for _ in range(4000)]
    m = extra_requests(g, on_time_share(lat, policy.deadline_factor * p50), policy)
    assert 1 <= m <= policy.max_extra
    plain, handled = [], []
    for _ in range(500):
        raw = [rng.lognormvariate(0.0, 1.0) for _ in range(g + m)]
        plain.append(max(raw[:g]))  # no handling: the group waits for its slowest member
        draws = sorted(raw)
        # handled: the g-th finisher of g + m, or the deadline if min_keep are done by then
        t = draws[g - 1]
        deadline = group_deadline(0.0, p50, policy)
        if t > deadline:
            done = sum(1 for d in draws if d <= deadline)
            action = tail_action(deadline, GroupProgress(0.0, g, done, g + m - done), p50, policy)
            assert action.action in ("cut_stragglers", "wait")
            t = deadline if action.action == "cut_stragglers" else t
        handled.append(t)
    plain.sort()
    handled.sort()
    p99 = int(0.99 * len(plain))
    assert handled[p99] <= group_deadline(0.0, p50, policy) < plain[p99]
    assert sum(handled) < 0.6 * sum(plain)


def test_the_tail_section_maps_onto_the_policy_in_one_place():
    from freshroll.config.run import TailSection

    # the defaults are the rule's own (written once), and every key that sets the rule reaches it
    assert TailPolicy.from_section(TailSection()) == TailPolicy()
    sec = TailSection(deadline_factor=2.0, drop_factor=5.0, min_keep=3, max_extra=7)
    assert TailPolicy.from_section(sec) == TailPolicy(deadline_factor=2.0, drop_factor=5.0,
                                                      min_keep=3, max_extra=7)
