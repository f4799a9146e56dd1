"""The continuous-batching server: hand-computed timelines, the slot cap, properties, and
the same timeline when an engine drives it on a virtual clock."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from freshroll.clock import VirtualClock
from freshroll.sim.batching import ContinuousBatcher
from freshroll.sim.profiles import ServerModel
from freshroll.sim.timelines import Rollout, simulate_batch, simulate_rollouts


def server(t0: float = 1.0, t1: float = 0.0, prefill: float = 0.0, cap: int = 1) -> ServerModel:
    return ServerModel(
        step_s=t0, step_s_per_seq=t1, prefill_s_per_token=prefill, max_concurrent=cap
    )


def test_cap_1_runs_one_after_another():
    r = simulate_batch(server(cap=1), [0, 0, 0], [0, 0, 0], [2, 3, 1])
    assert r.start.tolist() == [0, 2, 5]
    assert r.finish.tolist() == [2, 5, 6]


def test_cap_2_shares_steps_and_refills_a_freed_slot():
    # step = 1 + 0.5 x 2 = 2 s while two decode: A (2 tokens) ends at 4, C takes its slot at 4
    # and joins that same step; B (3) and C (1) then share steps of 2 s: both end at 6.
    r = simulate_batch(server(t1=0.5, cap=2), [0, 0, 0], [0, 0, 0], [2, 3, 1])
    assert r.start.tolist() == [0, 0, 4]
    assert r.decode_start.tolist() == [0, 0, 4]
    assert r.finish.tolist() == [4, 6, 6]


def test_mid_step_arrival_joins_at_the_next_step():
    # A alone: steps of 2 s. B arrives at 1 (mid-step), joins at 2; then steps of 3 s:
    # [2,5) A#2 B#1, [5,8) A#3 B#2: both end at 8.
    r = simulate_batch(server(t0=1.0, t1=1.0, cap=3), [0, 1], [0, 0], [3, 2])
    assert r.start.tolist() == [0, 1]
    assert r.decode_start.tolist() == [0, 2]
    assert r.finish.tolist() == [8, 8]


def test_prefill_and_waiting_for_a_slot():
    # prefill 0.25 s/token. A decodes [0,4). B arrives 0.5 with 2 prompt tokens: ready at 1.0,
    # a boundary, joins, ends at 3. C arrives 1.2, both slots held: waits for B's slot at 3,
    # no prefill, joins the step at 3, ends at 4.
    r = simulate_batch(server(prefill=0.25, cap=2), [0, 0.5, 1.2], [0, 2, 0], [4, 2, 1])
    assert r.start.tolist() == [0, 0.5, 3]
    assert r.decode_start.tolist() == [0, 1, 3]
    assert r.finish.tolist() == [4, 3, 4]


def test_alone_on_the_server_takes_prefill_plus_len_steps():
    s = server(t0=0.02, t1=1e-3, prefill=1e-4, cap=8)
    r = simulate_batch(s, [3.0], [500], [1000])
    assert r.finish[0] - 3.0 == pytest.approx(500 * 1e-4 + 1000 * (0.02 + 1e-3))


def test_concurrency_cap_is_never_exceeded_and_slots_are_not_left_idle():
    rng = np.random.default_rng(3)
    n, cap = 400, 16
    arr = np.sort(rng.uniform(0, 200, n))
    r = simulate_batch(server(t0=0.05, t1=0.01, prefill=1e-3, cap=cap), arr,
                       rng.integers(0, 100, n), rng.integers(1, 200, n))
    held = _held(r.start, r.finish)
    assert max(held(t) for t in r.start) == cap  # saturated at some point, never above
    for i in np.flatnonzero(r.start > arr):  # whoever waited found every slot held
        assert held(arr[i]) == cap


def _held(start, finish):
    return lambda t: int(np.sum((start <= t) & (t < finish)))


def test_input_order_is_kept_and_ties_are_fifo():
    r = simulate_batch(server(cap=1), [5, 0, 0], [0, 0, 0], [1, 2, 3])
    assert r.start.tolist() == [5, 0, 2] and r.finish.tolist() == [6, 2, 5]


def test_submissions_must_come_in_arrival_order():
    b = ContinuousBatcher(server())
    b.submit(2.0, 0, 1)
    with pytest.raises(ValueError, match="arrival order"):
        b.submit(1.0, 0, 1)
    b.advance(10.0)
    with pytest.raises(ValueError, match="arrival order"):
        b.submit(5.0, 0, 1)
    with pytest.raises(ValueError, match="completion_tokens"):
        b.submit(10.0, 0, 0)


requests = st.lists(
    st.tuples(
        st.floats(0, 50, allow_nan=False), st.integers(0, 40), st.integers(1, 30)
    ),
    min_size=1, max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(
    reqs=requests,
    t0=st.floats(0.01, 2.0), t1=st.floats(0.0, 1.0), prefill=st.floats(0.0, 0.1),
    cap=st.integers(1, 6),
)
def test_property_timeline_is_causal_capped_and_fifo(reqs, t0, t1, prefill, cap):
    arr, prompts, lens = (np.array(x) for x in zip(*reqs, strict=True))
    r = simulate_batch(server(t0, t1, prefill, cap), arr, prompts, lens)
    eps = 1e-9 * (1 + r.finish.max())
    assert (r.start >= arr).all()
    assert (r.decode_start >= r.start + prefill * prompts - eps).all()
    assert (r.finish >= r.decode_start + lens * t0 - eps).all()  # a step takes >= t0
    assert (r.finish <= r.decode_start + lens * (t0 + t1 * cap) + eps).all()
    order = np.argsort(arr, kind="stable")
    assert (np.diff(r.start[order]) >= 0).all()  # slots are granted first come, first served
    held = _held(r.start, r.finish)
    assert all(held(t) <= cap for t in r.start)


@settings(max_examples=200, deadline=None)
@given(reqs=requests, t0=st.floats(0.01, 2.0), prefill=st.floats(0.0, 0.1))
def test_property_no_queueing_and_no_interaction_when_cap_covers_all_and_t1_is_zero(
    reqs, t0, prefill
):
    arr, prompts, lens = (np.array(x) for x in zip(*reqs, strict=True))
    r = simulate_batch(server(t0, 0.0, prefill, len(reqs)), arr, prompts, lens)
    eps = 1e-9 * (1 + r.finish.max())
    assert np.array_equal(r.start, arr)
    assert np.allclose(r.finish - r.decode_start, lens * t0, rtol=0, atol=eps)
    # prefill + len x t0, plus less than one step of waiting for the next step boundary
    extra = (r.finish - r.start) - (prefill * prompts + lens * t0)
    assert (extra >= -eps).all() and (extra < t0 + eps).all()


def test_a_lone_request_on_an_idle_server_has_no_boundary_wait():
    r = simulate_batch(server(t0=0.5, prefill=0.1, cap=4), [0.0, 100.0], [3, 7], [4, 2])
    assert r.finish.tolist() == pytest.approx([0.3 + 2.0, 100.0 + 0.7 + 1.0])


def test_deterministic():
    rng = np.random.default_rng(11)
    args = (np.sort(rng.uniform(0, 10, 300)), rng.integers(0, 50, 300), rng.integers(1, 90, 300))
    s = server(t0=0.01, t1=0.001, prefill=1e-3, cap=32)
    a, b = simulate_batch(s, *args), simulate_batch(s, *args)
    assert np.array_equal(a.finish, b.finish) and np.array_equal(a.start, b.start)


def test_multi_turn_rollouts_release_the_slot_during_tool_calls():
    s = server(cap=1)
    # A: 2 tokens, a 5 s tool call, 1 token. B: 3 tokens. B uses the slot during A's tool call.
    r = simulate_rollouts(s, [Rollout(0.0, ((0, 2), (0, 1)), (5.0,)), Rollout(0.0, ((0, 3),))])
    assert r.start.tolist() == [0, 2]
    assert r.finish.tolist() == [8, 5]  # A's second turn arrives at 7, ends at 8


def test_single_turn_rollouts_equal_simulate_batch():
    rng = np.random.default_rng(5)
    n = 200
    arr, p, L = np.sort(rng.uniform(0, 30, n)), rng.integers(0, 60, n), rng.integers(1, 80, n)
    s = server(t0=0.02, t1=0.003, prefill=2e-3, cap=24)
    rollouts = [Rollout(float(a), ((int(q), int(k)),)) for a, q, k in zip(arr, p, L, strict=True)]
    ro = simulate_rollouts(s, rollouts)
    assert np.array_equal(ro.finish, simulate_batch(s, arr, p, L).finish)


def test_an_engine_on_a_virtual_clock_sees_the_same_timeline():
    """The pattern a simulated engine follows: submit at clock.now(), sleep until the next
    event or the next arrival, advance, hand out what finished."""
    rng = np.random.default_rng(9)
    n = 120
    arr, p, L = np.sort(rng.uniform(0, 20, n)), rng.integers(0, 60, n), rng.integers(1, 80, n)
    s = server(t0=0.02, t1=0.002, prefill=1e-3, cap=16)
    clock = VirtualClock()

    async def engine() -> dict[int, float]:
        batcher = ContinuousBatcher(s)
        arrived = asyncio.Event()
        done: dict[int, float] = {}

        async def requests() -> None:
            for i in range(n):
                await asyncio.sleep(max(0.0, arr[i] - clock.now()))
                batcher.advance(clock.now())
                assert batcher.submit(max(clock.now(), batcher.now), int(p[i]), int(L[i])) == i
                arrived.set()

        async def serve() -> None:
            while len(done) < n:
                t = batcher.next_event_time()
                timeout = None if t is None else max(0.0, t - clock.now())
                try:
                    await asyncio.wait_for(arrived.wait(), timeout)
                    arrived.clear()
                    until = clock.now()
                except TimeoutError:
                    until = max(clock.now(), t)  # type: ignore[type-var]
                for f in batcher.advance(until):
                    done[f.request] = f.finish

        async with asyncio.TaskGroup() as tg:
            tg.create_task(requests())
            tg.create_task(serve())
        return done

    done = clock.run(engine())
    expected = simulate_batch(s, arr, p, L).finish
    assert np.allclose([done[i] for i in range(n)], expected, rtol=1e-9, atol=1e-9)
    assert clock.now() == pytest.approx(expected.max(), abs=1e-6)
    assert math.isfinite(clock.now())


def test_stats_snapshot_and_incremental_advance():
    b = ContinuousBatcher(server(t0=1.0, prefill=0.5, cap=1))
    b.submit(0.0, 2, 3)  # prefill [0, 1), decode [1, 4)
    b.submit(0.5, 0, 1)  # waits for the slot, decodes [4, 5)
    assert b.advance(0.9) == [] and b.stats() == {
        "submitted": 2, "finished": 0, "cancelled": 0, "decoding": 0, "prefilling": 1, "waiting": 1,
        "slots": 1, "decode_steps": 0, "now": 0.9,
    }
    assert b.next_event_time() == 1.0
    assert b.advance(3.99) == [] and b.decoding == 1 and b.waiting == 1
    (first,) = b.advance(4.0)
    assert (first.request, first.start, first.decode_start, first.finish) == (0, 0.0, 1.0, 4.0)
    assert b.decoding == 1 and b.waiting == 0 and b.busy
    (second,) = b.advance(10.0)
    assert (second.start, second.finish) == (4.0, 5.0) and not b.busy
    assert b.next_event_time() is None and b.stats()["finished"] == 2


@settings(max_examples=50, deadline=None)
@given(
    rollouts=st.lists(
        st.tuples(
            st.floats(0, 20), st.lists(st.tuples(st.integers(0, 20), st.integers(1, 15)),
                                       min_size=1, max_size=4),
            st.floats(0, 5),
        ),
        min_size=1, max_size=8,
    ),
    t0=st.floats(0.01, 1.0), prefill=st.floats(0.0, 0.05), cap=st.integers(1, 40),
)
def test_property_multi_turn(rollouts, t0, prefill, cap):
    rs = [Rollout(a, tuple(turns), (tool,) * (len(turns) - 1)) for a, turns, tool in rollouts]
    r = simulate_rollouts(server(t0, 0.0, prefill, cap), rs)
    eps = 1e-9 * (1 + r.finish.max())
    for x, s, f in zip(rs, r.start, r.finish, strict=True):
        alone = sum(prefill * p + k * t0 for p, k in x.turns) + sum(x.tool_s)
        assert s >= x.arrival and f - x.arrival >= alone - eps
        if cap >= len(rs):  # never a wait for a slot: at most one boundary wait per turn
            assert s == x.arrival and f - x.arrival < alone + len(x.turns) * t0 + eps


def test_cancel_a_decoding_request_frees_its_slot_at_once_and_leaves_at_the_next_boundary():
    # t0 = 1, t1 = 1: A alone decodes in steps of 2 s. B waits for the single slot.
    b = ContinuousBatcher(server(t0=1.0, t1=1.0, cap=1))
    a, w = b.submit(0.0, 0, 10), b.submit(0.0, 0, 1)
    assert b.cancel(a, 3.0)  # mid-step: the slot frees at 3, B takes it and prefills (none)
    assert b.stats()["cancelled"] == 1 and b.waiting == 0
    # the step under way [2, 4) was computed with A: B joins at 4, alone: 2 s per step
    (f,) = b.advance(100.0)
    assert (f.request, f.start, f.decode_start, f.finish) == (w, 3.0, 4.0, 6.0)
    assert not b.busy and b.stats()["finished"] == 1
    assert not b.cancel(a, 100.0) and not b.cancel(w, 100.0)  # already gone: nothing changes


def test_cancel_at_a_boundary_takes_effect_in_the_next_step():
    # A (3 tokens) and B (1) share 2 s steps; B ends at 2. Cancelling A at 2 (a boundary):
    # C, waiting, takes a slot at 2 and steps are 1 s with C alone.
    b = ContinuousBatcher(server(t0=1.0, t1=0.5, cap=2))
    a, _, c = b.submit(0.0, 0, 3), b.submit(0.0, 0, 1), b.submit(0.0, 0, 2)
    finished = b.advance(2.0)
    assert [f.request for f in finished] == [1]
    assert b.stats()["decoding"] == 2  # C took B's slot at 2
    assert b.cancel(a, 2.0)
    rest = b.advance(math.inf)
    assert [(f.request, f.finish) for f in rest] == [(c, 2.0 + 2 * 1.5)]


def test_cancel_waiting_and_prefilling_requests():
    b = ContinuousBatcher(server(t0=1.0, prefill=1.0, cap=1))
    a, w = b.submit(0.0, 5, 1), b.submit(0.0, 0, 1)  # A prefills [0, 5); W waits
    assert b.cancel(w, 1.0) and b.waiting == 0
    assert b.cancel(a, 2.0) and b.prefilling == 0 and not b.busy
    assert b.advance(math.inf) == [] and b.next_event_time() is None
    with pytest.raises(ValueError):
        b.cancel(a, 1.0)  # before the simulated time


@settings(max_examples=40, deadline=None)
@given(
    reqs=st.lists(st.tuples(st.floats(0, 10), st.integers(0, 5), st.integers(1, 8)),
                  min_size=1, max_size=25),
    cancels=st.lists(st.tuples(st.integers(0, 24), st.floats(0, 12)), max_size=6),
    cap=st.integers(1, 4),
)
def test_property_cancelled_requests_never_finish_and_slots_stay_capped(reqs, cancels, cap):
    b = ContinuousBatcher(server(t0=0.5, t1=0.25, prefill=0.1, cap=cap))
    events = sorted(
        [(a, 0, i) for i, a in enumerate(sorted(r[0] for r in reqs))]
        + [(t, 1, i) for i, t in cancels if i < len(reqs)]
    )
    ordered = sorted(reqs)
    finished, cancelled = [], set()
    for t, kind, i in events:
        finished += b.advance(t)
        if kind == 0:
            assert b.submit(t, ordered[i][1], ordered[i][2]) == i
        elif i < b.stats()["submitted"] and b.cancel(i, t):
            cancelled.add(i)
        s = b.stats()
        assert s["decoding"] + s["prefilling"] <= cap + len(cancelled)
    finished += b.advance(math.inf)
    done = {f.request for f in finished}
    assert not done & cancelled
    assert len(done) + len(cancelled) == len(reqs)
    assert all(f.finish >= f.decode_start >= f.start >= f.arrival for f in finished)
