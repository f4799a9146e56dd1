"""The simulated server's KV cache: usage, KV-blocked admission, preemption and recompute,
hand-computed; the engine's stats() (the ReportsStats seam) and its exactness under
preemption (the same timelines as simulate_batch / simulate_rollouts)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from test_sim_engine import Arrivals, random_arrivals, req, run, small

from freshroll.engines.seams import EngineStats, ReportsStats
from freshroll.errors import ConfigError
from freshroll.sim.batching import ContinuousBatcher
from freshroll.sim.engine import SimEngine
from freshroll.sim.keyed import KeyedDraws
from freshroll.sim.profiles import KV_CAPACITY_DEFAULT, P2, P3, Profile, ServerModel
from freshroll.sim.timelines import Rollout, simulate_batch, simulate_rollouts


def server(kv: int, prefill: float = 0.0) -> ServerModel:
    """t0 = 1 s, t1 = 0: step k ends at (prefill end) + k."""
    return ServerModel(step_s=1.0, step_s_per_seq=0.0, prefill_s_per_token=prefill,
                       max_concurrent=4, kv_capacity_tokens=kv)


def test_default_capacity_is_far_above_every_profile_and_bounded():
    assert ServerModel().kv_capacity_tokens == KV_CAPACITY_DEFAULT == 10**9
    with pytest.raises(ConfigError, match=r"server\.kv_capacity_tokens"):
        ServerModel(kv_capacity_tokens=0)


def test_usage_grows_one_token_per_sequence_per_step():
    b = ContinuousBatcher(server(100))
    b.submit(0.0, 2, 5)
    b.submit(0.0, 3, 5)
    b.advance(0.0)
    assert (b.running, b.waiting, b.kv_tokens) == (2, 0, 5)  # prompts, no token yet
    b.advance(2.5)  # two steps: 2 tokens each
    assert b.kv_tokens == 5 + 2 * 2 and b.preemptions == 0
    done = b.advance(5.0)
    assert [f.finish for f in done] == [5.0, 5.0] and b.kv_tokens == 0 and b.running == 0


def test_preemption_of_the_newest_and_its_recompute_by_hand():
    # K = 10; A, B: prompt 2 (prefill 0.2 s), 5 tokens each; step k ends at 0.2 + k. Usage
    # after step k: 4 + 2k > 10 at k = 4 (4.2): B (newest) is preempted with 4 tokens
    # produced; back at the queue's head it needs 2 + 4 = 6, usage is 6 (A): 12 > 10, so it
    # waits. A ends at 5.2; B is readmitted then, prefills 6 tokens until 5.8 (recompute)
    # and decodes its last token: ends at 6.8.
    b = ContinuousBatcher(server(10, prefill=0.1))
    a_id, b_id = b.submit(0.0, 2, 5), b.submit(0.0, 2, 5)
    assert b.advance(4.1) == [] and (b.kv_tokens, b.preemptions) == (4 + 2 * 3, 0)
    assert b.advance(4.3) == []
    assert (b.running, b.waiting, b.kv_tokens, b.preemptions) == (1, 1, 2 + 4, 1)
    done = {f.request: f for f in b.advance(math.inf)}
    assert done[a_id].finish == pytest.approx(5.2)
    assert done[b_id].finish == pytest.approx(5.2 + 0.6 + 1.0)
    assert done[b_id].start == 0.0 and done[b_id].decode_start == pytest.approx(0.2)  # first
    assert done[b_id].tokens == 5 and b.preemptions == 1 and b.kv_tokens == 0


def test_no_preemption_when_the_capacity_holds_everything():
    # K = 14 = 2 x (2 + 5): usage reaches exactly K, never above
    times = simulate_batch(server(14, prefill=0.1), [0.0, 0.0], [2, 2], [5, 5])
    assert times.finish.tolist() == pytest.approx([5.2, 5.2])
    b = ContinuousBatcher(server(14, prefill=0.1))
    b.submit(0.0, 2, 5)
    b.submit(0.0, 2, 5)
    b.advance(math.inf)
    assert b.preemptions == 0


def test_a_head_whose_kv_does_not_fit_waits_with_a_slot_free():
    b = ContinuousBatcher(server(10))
    first, second = b.submit(0.0, 5, 5), b.submit(0.0, 6, 1)  # 5 + 6 > 10
    b.advance(0.5)
    assert (b.running, b.waiting) == (1, 1)
    done = {f.request: f for f in b.advance(math.inf)}
    assert done[first].finish == 5.0
    assert done[second].start == 5.0 and done[second].finish == 6.0
    assert b.preemptions == 0


def test_a_request_larger_than_the_cache_is_refused():
    b = ContinuousBatcher(server(10))
    with pytest.raises(ValueError, match="KV capacity of 10"):
        b.submit(0.0, 6, 5)


def test_default_capacity_timelines_are_unchanged():
    # the same arrivals with a capacity just above everything ever held: identical floats
    profile = small()
    arrivals, prompts, lengths = [0.01 * i for i in range(40)], [30] * 40, [7 + i % 9 for i in
                                                                            range(40)]
    base = simulate_batch(profile.server, arrivals, prompts, lengths)
    tight = replace(profile.server, kv_capacity_tokens=sum(prompts) + sum(lengths))
    other = simulate_batch(tight, arrivals, prompts, lengths)
    assert other.finish.tolist() == base.finish.tolist()
    assert other.start.tolist() == base.start.tolist()


def kv_small(profile: Profile = P2, kv: int = 120, **tools: float) -> Profile:
    p = small(profile, **tools)
    return replace(p, server=replace(p.server, kv_capacity_tokens=kv))


def peak(profile: Profile, seed: int, arrivals: Arrivals) -> int:
    """The most KV tokens one turn of these requests holds."""
    draws, out = KeyedDraws(profile, seed), profile.tools.output_tokens
    shapes = [draws.shape(r.group, r.sample, 0) for _, rs in arrivals for r in rs]
    return max(max([x.prompt_tokens + x.segments[0], *(out + n for n in x.segments[1:])])
               for x in shapes)


def test_engine_reports_stats_and_is_exact_under_preemption():
    arrivals = random_arrivals(60)
    kv = 2 * peak(small(), 5, arrivals)  # 4 slots, room for about two
    profile = kv_small(kv=kv)
    engine = SimEngine("w0", KeyedDraws(profile, seed=5))
    assert isinstance(engine, ReportsStats)
    assert engine.stats() == EngineStats(running=0, waiting=0, kv_cache_usage=0.0, preemptions=0)
    engine.timeline = {}
    out = run(engine, arrivals)
    assert len(out) == 60
    samples = [r[0].sample for _, r in arrivals]
    arrival = [engine.timeline[s][0] for s in samples]
    shapes = [engine.draws.shape(f"g{i // 4}", s, 0) for i, s in enumerate(samples)]
    prompts, lengths = [x.prompt_tokens for x in shapes], [x.length for x in shapes]
    expected = simulate_batch(profile.server, arrival, prompts, lengths)
    assert [engine.timeline[s][2] for s in samples] == expected.finish.tolist()
    stats = engine.stats()
    assert stats.preemptions > 0 and stats.running == stats.waiting == 0
    assert stats.kv_cache_usage == 0.0
    # without the small cache: no preemption, other (earlier) finishes
    free = simulate_batch(small().server, arrival, prompts, lengths)
    assert free.finish.tolist() != expected.finish.tolist()


def test_engine_multi_turn_is_exact_under_preemption():
    tools = {"median_s": 0.05, "timeout_p": 0.2, "timeout_s": 0.3, "output_tokens": 7}
    arrivals = random_arrivals(40, seed=8, horizon=3.0)
    short = replace(P3, lengths=replace(P3.lengths, prompt_tokens=8.0))  # decode dominates KV
    profile = kv_small(short, kv=2 * peak(small(short, **tools), 2, arrivals), **tools)
    engine = SimEngine("w0", KeyedDraws(profile, seed=2))
    engine.timeline = {}
    out = run(engine, arrivals)
    samples = [r[0].sample for _, r in arrivals]
    rollouts = []
    for i, s in enumerate(samples):
        x = engine.draws.shape(f"g{i // 4}", s, 0)
        turns = tuple((x.prompt_tokens if k == 0 else 7, seg) for k, seg in enumerate(x.segments))
        rollouts.append(Rollout(engine.timeline[s][0], turns, x.tool_s))
    expected = simulate_rollouts(profile.server, rollouts)
    assert [engine.timeline[s][2] for s in samples] == expected.finish.tolist()
    assert len(out) == 40 and engine.stats().preemptions > 0


def test_engine_refuses_a_request_the_cache_cannot_hold():
    engine = SimEngine("w0", KeyedDraws(kv_small(kv=10), seed=0))
    with pytest.raises(ExceptionGroup) as info:  # the run's task group
        run(engine, [(0.0, [req(0, 0)])])
    (exc,) = info.value.exceptions
    assert isinstance(exc, ValueError) and "kv_capacity_tokens 10" in str(exc)
    assert engine.counters()["open"] == 0  # nothing was registered


def test_cancel_frees_kv_at_once_and_a_preempted_request_can_be_cancelled():
    b = ContinuousBatcher(server(10, prefill=0.1))
    a_id, b_id = b.submit(0.0, 2, 5), b.submit(0.0, 2, 5)
    assert b.cancel(b_id, 2.5) and b.kv_tokens == 2 + 2  # B's KV gone mid-step
    done = b.advance(math.inf)
    assert [(f.request, f.finish) for f in done] == [(a_id, pytest.approx(5.2))]
    assert b.preemptions == 0
    c = ContinuousBatcher(server(10, prefill=0.1))
    a_id, b_id = c.submit(0.0, 2, 5), c.submit(0.0, 2, 5)
    c.advance(4.5)
    assert c.preemptions == 1 and c.waiting == 1
    assert c.cancel(b_id, 4.5) and c.waiting == 0
    assert [f.request for f in c.advance(math.inf)] == [a_id] and c.kv_tokens == 0
