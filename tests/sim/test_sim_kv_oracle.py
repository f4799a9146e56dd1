"""The event-skipping server's KV cache against a naive oracle that runs one decode step at
a time (KV-blocked admission, preemption of the newest, recompute), sharing no code with
:mod:`freshroll.sim.batching`: it follows docs/simulation.md's rules step by step. Times
are multiples of 1/8 (exact binary arithmetic, ties decided the same way)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from freshroll.sim.batching import ContinuousBatcher
from freshroll.sim.profiles import ServerModel


def oracle(t0, t1, prefill, cap, kv, arrivals, prompts, lengths):
    n = len(arrivals)
    order = sorted(range(n), key=lambda i: (arrivals[i], i))
    start, finish = [math.nan] * n, [math.nan] * n
    made = [0] * n  # tokens produced so far (kept across a preemption)
    admitted = [0] * n  # admission counter of the last admission
    counter = [0]
    preempted = [0]
    future = list(order)
    queue: list[int] = []
    prefilling: dict[int, float] = {}
    decoding: list[int] = []

    def usage() -> int:
        return sum(prompts[i] + made[i] for i in [*prefilling, *decoding])

    def free() -> int:
        return cap - len(prefilling) - len(decoding)

    def fits(i: int) -> bool:
        return usage() + prompts[i] + made[i] <= kv

    def take(i: int, t: float) -> None:
        if math.isnan(start[i]):
            start[i] = t
        counter[0] += 1
        admitted[i] = counter[0]
        prefilling[i] = t + prefill * (prompts[i] + made[i])

    def arrive_until(t: float, inclusive: bool) -> None:
        while future and (arrivals[future[0]] <= t if inclusive else arrivals[future[0]] < t):
            i = future.pop(0)
            if free() > 0 and not queue and fits(i):
                take(i, arrivals[i])
            else:
                queue.append(i)

    def join(t: float) -> None:
        for i in sorted(prefilling, key=lambda i: (prefilling[i], i)):
            if prefilling[i] <= t:
                del prefilling[i]
                decoding.append(i)

    def serve(t: float) -> None:
        while queue and free() > 0 and fits(queue[0]):
            take(queue.pop(0), t)

    t = -math.inf
    while any(math.isnan(f) for f in finish):
        if not decoding:
            while True:
                nxt = min(prefilling.values(), default=math.inf)
                if future and arrivals[future[0]] < nxt and free() > 0:
                    arrive_until(arrivals[future[0]], inclusive=True)
                    continue
                break
            if not prefilling:
                serve(t)  # (nothing held: the queue's head fits; none waits in practice)
                if not prefilling:
                    i = future.pop(0)
                    take(i, arrivals[i])
                continue
            t = min(prefilling.values())
            arrive_until(t, inclusive=True)
            join(t)
            continue
        d = t0 + t1 * len(decoding)
        arrive_until(t + d, inclusive=False)
        t = t + d
        for i in list(decoding):
            made[i] += 1
            if made[i] == lengths[i]:
                decoding.remove(i)
                finish[i] = t
        while usage() > kv:
            i = max([*prefilling, *decoding], key=lambda i: admitted[i])
            if i in prefilling:
                del prefilling[i]
            else:
                decoding.remove(i)
            queue.insert(0, i)
            preempted[0] += 1
        serve(t)
        arrive_until(t, inclusive=True)
        join(t)
    return start, finish, preempted[0]


eighths = st.integers(0, 80).map(lambda k: k / 8)


@settings(max_examples=300, deadline=None)
@given(
    reqs=st.lists(st.tuples(eighths, st.integers(0, 6), st.integers(1, 12)), min_size=1,
                  max_size=10),
    t0=st.integers(1, 16).map(lambda k: k / 8), t1=st.integers(0, 8).map(lambda k: k / 8),
    prefill=st.integers(0, 4).map(lambda k: k / 8), cap=st.integers(1, 5),
    slack=st.integers(0, 30),
)
def test_matches_the_step_by_step_oracle(reqs, t0, t1, prefill, cap, slack):
    arr, prompts, lens = (list(x) for x in zip(*reqs, strict=True))
    kv = max(p + n for p, n in zip(prompts, lens, strict=True)) + slack
    s = ServerModel(step_s=t0, step_s_per_seq=t1, prefill_s_per_token=prefill,
                    max_concurrent=cap, kv_capacity_tokens=kv)
    b = ContinuousBatcher(s)
    order = sorted(range(len(arr)), key=lambda i: (arr[i], i))
    rid = {b.submit(arr[i], prompts[i], lens[i]): i for i in order}
    start, finish = [math.nan] * len(arr), [math.nan] * len(arr)
    for f in b.advance(math.inf):
        start[rid[f.request]], finish[rid[f.request]] = f.start, f.finish
    want = oracle(t0, t1, prefill, cap, kv, arr, prompts, lens)
    assert start == want[0]
    assert finish == want[1]
    assert b.preemptions == want[2] and b.kv_tokens == 0


def test_the_oracle_preempts_on_the_hand_computed_example():
    # docs: A, B prompt 2, 5 tokens, K = 10, prefill 0.1/token: B preempted at 4.2, ends 6.8
    start, finish, preempted = oracle(1.0, 0.0, 0.125, 4, 10, [0, 0], [2, 2], [5, 5])
    assert preempted == 1 and finish == [5.25, 5.25 + 0.75 + 1.0] and start == [0, 0]
