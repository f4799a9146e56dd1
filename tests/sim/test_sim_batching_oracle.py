"""The event-skipping server against a naive oracle that runs one decode step at a time.

The oracle shares no code with :mod:`freshroll.sim.batching`: no heaps, no step
counting, no jumps; it walks the timeline step by step, following the rules as
docs/simulation.md states them. Times are multiples of 1/8 so that both sides
compute in exact binary arithmetic and ties (a prefill ending exactly on a step
boundary, an arrival at the instant a slot frees) are decided the same way.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from freshroll.sim.profiles import ServerModel
from freshroll.sim.timelines import simulate_batch


def oracle(t0, t1, prefill, cap, arrivals, prompts, lengths):
    n = len(arrivals)
    order = sorted(range(n), key=lambda i: (arrivals[i], i))
    start, dstart, finish = [math.nan] * n, [math.nan] * n, [math.nan] * n
    left = list(lengths)
    future = list(order)  # not yet arrived (or not yet looked at), in arrival order
    queue: list[int] = []  # arrived, waiting for a slot
    prefilling: dict[int, float] = {}  # request -> ready time
    decoding: list[int] = []

    def free() -> int:
        return cap - len(prefilling) - len(decoding)

    def take(i: int, t: float) -> None:
        start[i] = t
        prefilling[i] = t + prefill * prompts[i]

    def arrive_until(t: float, inclusive: bool) -> None:
        """Arrivals up to t: those finding a free slot take it at their arrival time."""
        while future and (arrivals[future[0]] <= t if inclusive else arrivals[future[0]] < t):
            i = future.pop(0)
            if free() > 0 and not queue:
                take(i, arrivals[i])
            else:
                queue.append(i)

    def join(t: float) -> None:
        for i in sorted(prefilling, key=lambda i: (prefilling[i], i)):
            if prefilling[i] <= t:
                del prefilling[i]
                dstart[i] = t
                decoding.append(i)

    t = -math.inf
    while any(math.isnan(f) for f in finish):
        if not decoding:
            # idle decoder: the next step starts when the first prefill ends; arrivals before
            # then may take free slots (and may be ready sooner)
            while True:
                nxt = min(prefilling.values(), default=math.inf)
                if future and arrivals[future[0]] < nxt and free() > 0:
                    arrive_until(arrivals[future[0]], inclusive=True)
                    continue
                break
            if not prefilling:
                i = future.pop(0)  # every slot is free: this one starts at its arrival
                take(i, arrivals[i])
                continue
            t = min(prefilling.values())
            arrive_until(t, inclusive=True)
            join(t)
            continue
        d = t0 + t1 * len(decoding)
        arrive_until(t + d, inclusive=False)  # mid-step arrivals
        t = t + d
        for i in list(decoding):
            left[i] -= 1
            if left[i] == 0:
                decoding.remove(i)
                finish[i] = t
        while queue and free() > 0:  # freed slots go to whoever waits, first come first served
            take(queue.pop(0), t)
        arrive_until(t, inclusive=True)
        join(t)
    return start, dstart, finish


eighths = st.integers(0, 80).map(lambda k: k / 8)


@settings(max_examples=300, deadline=None)
@given(
    reqs=st.lists(st.tuples(eighths, st.integers(0, 6), st.integers(1, 12)), min_size=1,
                  max_size=10),
    t0=st.integers(1, 16).map(lambda k: k / 8), t1=st.integers(0, 8).map(lambda k: k / 8),
    prefill=st.integers(0, 4).map(lambda k: k / 8), cap=st.integers(1, 5),
)
def test_matches_the_step_by_step_oracle(reqs, t0, t1, prefill, cap):
    arr, prompts, lens = (list(x) for x in zip(*reqs, strict=True))
    s = ServerModel(step_s=t0, step_s_per_seq=t1, prefill_s_per_token=prefill, max_concurrent=cap)
    got = simulate_batch(s, arr, prompts, lens)
    want = oracle(t0, t1, prefill, cap, arr, prompts, lens)
    assert got.start.tolist() == want[0]
    assert got.decode_start.tolist() == want[1]
    assert got.finish.tolist() == want[2]


def test_oracle_agrees_on_the_hand_computed_examples():
    assert oracle(1.0, 0.5, 0.0, 2, [0, 0, 0], [0, 0, 0], [2, 3, 1])[2] == [4, 6, 6]
    assert oracle(1.0, 1.0, 0.0, 3, [0, 1], [0, 0], [3, 2])[1:] == ([0, 2], [8, 8])
    assert np.isfinite(oracle(0.5, 0.0, 0.25, 1, [0, 0.5], [2, 2], [1, 1])[2]).all()
