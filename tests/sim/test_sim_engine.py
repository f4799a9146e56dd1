"""The simulated engine in virtual time: the calibration contract (the same timelines as
simulate_batch / simulate_rollouts), group-shared lengths, drift, cancel, multi-turn tool
calls with timeouts, determinism, close."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from freshroll.clock import VirtualClock
from freshroll.engines.base import Completion
from freshroll.engines.seams import AsyncEngine, GenRequest, SamplingParams
from freshroll.errors import WorkerLost
from freshroll.sim.engine import SimEngine
from freshroll.sim.keyed import KeyedDraws
from freshroll.sim.profiles import P2, P3, LengthModel, Profile, ServerModel, ToolModel
from freshroll.sim.timelines import Rollout, simulate_batch, simulate_rollouts

PARAMS = SamplingParams(max_new_tokens=1)


def small(profile: Profile = P2, **tools: float) -> Profile:
    """A small, busy server (4 slots, per-sequence cost, prefill) so that queueing matters."""
    return replace(
        profile,
        lengths=replace(profile.lengths, median_tokens=20.0),
        server=ServerModel(
            step_s=0.02, step_s_per_seq=0.005, prefill_s_per_token=1e-3, max_concurrent=4
        ),
        tools=replace(profile.tools, **tools),
    )


def req(group: int, member: int, attempt: int = 0, step: int = 0) -> GenRequest:
    return GenRequest(f"g{group}.{member}#{attempt}", f"g{group}", f"p{group}", "", step)


Arrivals = Sequence[tuple[float, Sequence[GenRequest]]]


def run(
    engine: SimEngine, arrivals: Arrivals, cancels: Sequence[tuple[float, list[str]]] = (),
) -> dict[str, Completion]:
    """Drive ``engine`` in virtual time: each ``(t, requests)`` is one generate call at t."""
    out: dict[str, Completion] = {}

    async def call(t: float, requests: Sequence[GenRequest]) -> None:
        await asyncio.sleep(t)

        def emit(i: int, c: Completion) -> None:
            assert requests[i].sample not in out
            out[requests[i].sample] = c

        await engine.generate(requests, PARAMS, 0, emit)

    async def cancel(t: float, samples: list[str]) -> None:
        await asyncio.sleep(t)
        await engine.cancel(samples)

    async def main() -> None:
        async with asyncio.TaskGroup() as tg:
            for t, requests in arrivals:
                tg.create_task(call(t, requests))
            for t, samples in cancels:
                tg.create_task(cancel(t, samples))
        await engine.close()

    VirtualClock().run(main())
    return out


def random_arrivals(n: int, seed: int = 3, horizon: float = 5.0) -> Arrivals:
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(0, horizon, n))
    return [(float(t), [req(i // 4, i % 4)]) for i, t in enumerate(times)]


def test_single_turn_timelines_equal_simulate_batch_exactly():
    profile = small()
    engine = SimEngine("w0", KeyedDraws(profile, seed=5))
    engine.timeline = {}
    arrivals = random_arrivals(60)
    out = run(engine, arrivals)
    assert len(out) == 60
    samples = [r[0].sample for _, r in arrivals]
    arrival = [engine.timeline[s][0] for s in samples]
    shapes = [engine.draws.shape(f"g{i // 4}", s, 0) for i, s in enumerate(samples)]
    expected = simulate_batch(
        profile.server, arrival, [x.prompt_tokens for x in shapes], [x.length for x in shapes]
    )
    assert [engine.timeline[s][1] for s in samples] == expected.start.tolist()
    assert [engine.timeline[s][2] for s in samples] == expected.finish.tolist()
    assert arrival == pytest.approx([t for t, _ in arrivals], abs=1e-9)
    for s, x in zip(samples, shapes, strict=True):
        a, _, finish = engine.timeline[s]
        assert out[s].n_tokens == out[s].tokens == x.length
        assert out[s].gen_s == finish - a
        assert out[s].text == s and out[s].token_ids == ()


def test_multi_turn_timelines_equal_simulate_rollouts_exactly():
    profile = small(P3, median_s=0.05, timeout_p=0.2, timeout_s=0.3, output_tokens=7)
    engine = SimEngine("w0", KeyedDraws(profile, seed=2))
    engine.timeline = {}
    arrivals = random_arrivals(40, seed=8, horizon=3.0)
    out = run(engine, arrivals)
    samples = [r[0].sample for _, r in arrivals]
    rollouts = []
    for i, s in enumerate(samples):
        x = engine.draws.shape(f"g{i // 4}", s, 0)
        assert len(x.segments) == min(4, x.length) and sum(x.segments) == x.length
        turns = tuple(
            (x.prompt_tokens if k == 0 else 7, seg) for k, seg in enumerate(x.segments)
        )
        rollouts.append(Rollout(engine.timeline[s][0], turns, x.tool_s))
    expected = simulate_rollouts(profile.server, rollouts)
    assert [engine.timeline[s][1] for s in samples] == expected.start.tolist()
    assert [engine.timeline[s][2] for s in samples] == expected.finish.tolist()
    assert len(out) == 40


def test_tool_timeouts_hang_until_timeout_then_the_turn_goes_on():
    # every tool call hangs (timeout_p = 1): alone on an idle server, a sample of k turns takes
    # its service time plus (k - 1) x timeout_s
    profile = small(P3, timeout_p=1.0, timeout_s=2.5, output_tokens=10)
    draws = KeyedDraws(profile, seed=0)
    engine = SimEngine("w0", draws)
    r = req(0, 0)
    out = run(engine, [(0.0, [r])])
    x = draws.shape("g0", r.sample, 0)
    s = profile.server
    per_token = s.step_s + s.step_s_per_seq
    service = (x.prompt_tokens + 10 * (len(x.segments) - 1)) * s.prefill_s_per_token
    service += x.length * per_token
    assert x.tool_s == (2.5,) * (len(x.segments) - 1) and len(x.segments) == 4
    assert out[r.sample].gen_s == pytest.approx(service + 3 * 2.5, rel=1e-12)
    # and with no timeouts the tool calls take their lognormal latency, below timeout_s
    quick = KeyedDraws(small(P3, timeout_p=0.0, timeout_s=30.0), seed=0)
    assert all(0 < t < 30.0 for t in quick.shape("g0", r.sample, 0).tool_s)


def test_tool_timeout_rate_follows_timeout_p():
    draws = KeyedDraws(P3, seed=1)
    hung = [draws.tool_s(f"g{i}.0#0", 0) == P3.tools.timeout_s for i in range(4000)]
    assert 0.04 <= np.mean(hung) <= 0.06


def test_lengths_are_shared_by_a_group_and_its_reissued_attempts():
    shared = replace(P2, lengths=replace(P2.lengths, prompt_share=1.0))  # all of sigma per group
    engine = SimEngine("w0", KeyedDraws(shared, seed=4))
    group = [req(7, m) for m in range(8)] + [req(7, 2, attempt=1), req(7, 5, attempt=3)]
    out = run(engine, [(0.0, group[:5]), (1.0, group[5:])])
    assert len({c.n_tokens for c in out.values()}) == 1
    other = run(SimEngine("w1", KeyedDraws(shared, seed=4)), [(0.0, [req(8, 0)])])
    assert other["g8.0#0"].n_tokens != out["g7.0#0"].n_tokens

    # P2 (half the variance per group): the group component is shared by re-issued attempts,
    # so the correlation of attempts of one request is about prompt_share
    draws = KeyedDraws(P2, seed=4)
    first = np.log([draws.length(f"g{g}", f"g{g}.0#0", 0) for g in range(3000)])
    again = np.log([draws.length(f"g{g}", f"g{g}.0#1", 0) for g in range(3000)])
    assert 0.42 <= np.corrcoef(first, again)[0, 1] <= 0.58
    assert np.std(first) == pytest.approx(P2.lengths.sigma, rel=0.1)


def test_keyed_lengths_follow_the_documented_formula():
    draws = KeyedDraws(P2, seed=9)
    from freshroll.sim.draws import lengths_from_normals
    from freshroll.sim.keyed import normal

    for step in (0, 40, 100):
        z_g = np.array([normal(9, "len-g", f"g{g}") for g in range(200)])
        z_gi = np.array([[normal(9, "len-s", f"g{g}.{m}#0") for m in range(4)]
                         for g in range(200)])
        vector = lengths_from_normals(P2.lengths, z_g, z_gi, step)
        scalar = [[draws.length(f"g{g}", f"g{g}.{m}#0", step) for m in range(4)]
                  for g in range(200)]
        assert vector.tolist() == scalar


def test_length_drift_raises_lengths_with_the_policy_step():
    draws = KeyedDraws(P2, seed=0)
    early = np.array([draws.length(f"g{i // 8}", f"g{i // 8}.{i % 8}#0", 0) for i in range(4000)])
    late = np.array([draws.length(f"g{i // 8}", f"g{i // 8}.{i % 8}#0", 100) for i in range(4000)])
    mid = np.array([draws.length(f"g{i // 8}", f"g{i // 8}.{i % 8}#0", 50) for i in range(4000)])
    assert (late >= mid).all() and (mid >= early).all()
    assert np.median(late) / np.median(early) == pytest.approx(1.5, abs=0.05)
    assert (late == draws.cap).mean() > (early == draws.cap).mean()  # the cap stays put
    # through the engine: policy_step of the request is the step that generates it
    def tokens(step: int) -> np.ndarray:
        out = run(SimEngine("w0", KeyedDraws(P2, seed=0)), [(0.0, [req(g, 0, step=step)
                                                                   for g in range(50)])])
        return np.array([out[f"g{g}.0#0"].tokens for g in range(50)])

    assert (tokens(100) >= tokens(0)).all()
    assert tokens(100).sum() / tokens(0).sum() == pytest.approx(1.5, abs=0.05)


def test_capped_completions_finish_with_length():
    capped = replace(P2, lengths=replace(P2.lengths, cap_multiple=1.0))  # half hit the cap
    out = run(SimEngine("w0", KeyedDraws(capped, seed=1)), [(0.0, [req(g, 0) for g in range(64)])])
    reasons = {c.finish_reason for c in out.values() if c.tokens == 1000}
    assert reasons == {"length"}
    assert {c.finish_reason for c in out.values() if c.tokens < 1000} == {"stop"}
    assert max(c.tokens for c in out.values()) == 1000


def test_cancel_frees_the_slot_at_once_and_never_emits():
    one_slot = replace(small(), server=replace(small().server, max_concurrent=1))
    engine = SimEngine("w0", KeyedDraws(one_slot, seed=0))
    engine.timeline = {}
    a, b, c = req(0, 0), req(1, 0), req(2, 0)
    out = run(engine, [(0.0, [a]), (0.0, [b]), (0.0, [c])],
              cancels=[(0.01, [a.sample]), (0.011, [c.sample, "g99.0#0"])])
    assert set(out) == {b.sample}  # a cancelled while decoding, c while waiting
    arrival, start, _ = engine.timeline[b.sample]
    assert arrival == 0.0 and start == pytest.approx(0.01, abs=1e-12)  # a's slot, at once
    stats = engine.counters()
    assert stats["cancelled"] == 2 and stats["emitted"] == 1 and stats["open"] == 0


def test_cancel_during_a_tool_call_never_submits_the_next_turn():
    profile = small(P3, median_s=5.0, sigma=0.0, timeout_p=0.0)
    engine = SimEngine("w0", KeyedDraws(profile, seed=0))
    r = req(0, 0)
    x = engine.draws.shape("g0", r.sample, 0)
    first_turn = x.prompt_tokens * 1e-3 + x.segments[0] * 0.025
    out = run(engine, [(0.0, [r])], cancels=[(first_turn + 1.0, [r.sample])])
    assert out == {}
    assert engine.counters()["server"]["submitted"] == 1


def test_same_seed_same_completions_and_timings():
    def once(seed: int) -> tuple[dict[str, Completion], dict[str, tuple[float, float, float]]]:
        engine = SimEngine("w0", KeyedDraws(small(P3, median_s=0.1), seed=seed))
        engine.timeline = {}
        return run(engine, random_arrivals(30, seed=1)), engine.timeline

    assert once(11) == once(11)
    assert once(11)[0] != once(12)[0]


def test_load_weights_sleeps_transfer_s_times_time_scale_while_generation_goes_on():
    engine = SimEngine("w0", KeyedDraws(small(), seed=0), time_scale=0.5, transfer_s=3.0)
    clock = VirtualClock()

    async def main() -> tuple[float, float]:
        seconds = await engine.load_weights(7)
        return seconds, clock.now()

    assert clock.run(main()) == (1.5, 1.5)
    assert engine.loaded == 7
    assert isinstance(engine, AsyncEngine) and engine.continuous


def test_time_scale_scales_every_duration():
    def gen_s(scale: float) -> float:
        engine = SimEngine("w0", KeyedDraws(small(), seed=0), time_scale=scale)
        return run(engine, [(0.0, [req(0, 0)])])["g0.0#0"].gen_s

    assert gen_s(0.25) == pytest.approx(gen_s(1.0) * 0.25, rel=1e-9)


def test_close_fails_open_calls_with_worker_lost_and_refuses_new_ones():
    engine = SimEngine("w0", KeyedDraws(small(), seed=0))

    async def main() -> None:
        task = asyncio.create_task(engine.generate([req(0, 0)], PARAMS, 0, lambda i, c: None))
        await asyncio.sleep(0.001)
        await engine.close()
        await engine.close()  # idempotent
        with pytest.raises(WorkerLost):
            await task
        with pytest.raises(WorkerLost):
            await engine.generate([req(1, 0)], PARAMS, 0, lambda i, c: None)

    VirtualClock().run(main())


def test_an_emit_that_raises_fails_its_call_and_the_engine_goes_on():
    engine = SimEngine("w0", KeyedDraws(small(), seed=0))
    good: list[int] = []

    def bad(i: int, c: Completion) -> None:
        raise RuntimeError("pipeline bug")

    async def main() -> None:
        async with asyncio.TaskGroup() as tg:
            ok = tg.create_task(engine.generate(
                [req(1, 0), req(1, 1)], PARAMS, 0, lambda i, c: good.append(i)))
            with pytest.raises(RuntimeError, match="pipeline bug"):
                await engine.generate([req(0, 0)], PARAMS, 0, bad)
            await ok

    VirtualClock().run(main())
    assert sorted(good) == [0, 1]


def test_a_sample_already_in_generation_is_refused():
    engine = SimEngine("w0", KeyedDraws(small(), seed=0))

    async def main() -> None:
        task = asyncio.create_task(engine.generate([req(0, 0)], PARAMS, 0, lambda i, c: None))
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="already in generation"):
            await engine.generate([req(0, 0)], PARAMS, 0, lambda i, c: None)
        await task

    VirtualClock().run(main())


def test_many_engines_many_samples_all_emitted_once():
    draws = KeyedDraws(small(), seed=0)
    engines = [SimEngine(f"w{i}", draws) for i in range(8)]
    seen: set[str] = set()

    async def lane(engine: SimEngine, w: int) -> None:
        for g in range(20):
            group = [req(w * 100 + g, m) for m in range(4)]
            await engine.generate(group, PARAMS, 0, lambda i, c: seen.add(c.text))

    async def main() -> None:
        async with asyncio.TaskGroup() as tg:
            for w, e in enumerate(engines):
                for k in range(3):
                    tg.create_task(lane(e, w * 10 + k))

    VirtualClock().run(main())
    assert len(seen) == 8 * 3 * 20 * 4
    assert all(e.counters()["open"] == 0 for e in engines)
    assert not math.isnan(sum(e.counters()["server"]["now"] for e in engines))


def test_length_model_bounds_hold_for_keyed_draws():
    lm = LengthModel(median_tokens=3.0, sigma=3.0, cap_multiple=2.0)
    draws = KeyedDraws(Profile("tiny", lengths=lm, tools=ToolModel(turns=4)), seed=0)
    for i in range(500):
        x = draws.shape("g0", f"g0.{i}#0", 0)
        assert 1 <= x.length <= 6 and sum(x.segments) == x.length
        assert len(x.tool_s) == len(x.segments) - 1


@pytest.mark.parametrize("turns", [1, 4])
def test_engines_sharing_a_loop_emit_on_time_and_keep_exact_timelines(turns):
    """Callers that submit a group when the previous one is emitted: each next group arrives
    exactly when the last member of the previous one finished (no wakeup is late or lost
    among engines sharing the loop, and skipping the wakeups of joins, earlier turns and tool
    returns never delays an emission), and every engine's timeline is simulate_batch's or
    simulate_rollouts'."""
    profile = small() if turns == 1 else small(
        P3, median_s=0.02, sigma=1.5, timeout_p=0.1, timeout_s=0.2, output_tokens=5,
    )
    draws = KeyedDraws(profile, seed=3)
    engines = [SimEngine(f"w{i}", draws) for i in range(5)]
    for e in engines:
        e.timeline = {}
    lanes: dict[str, list[list[str]]] = {}

    async def lane(engine: SimEngine, name: str) -> None:
        lanes[name] = []
        for k in range(6):
            group = [GenRequest(f"g{name}{k}.{m}#0", f"g{name}{k}", "p", "", 0) for m in range(3)]
            lanes[name].append([r.sample for r in group])
            await engine.generate(group, PARAMS, 0, lambda i, c: None)

    async def main() -> None:
        async with asyncio.TaskGroup() as tg:
            for w, e in enumerate(engines):
                for j in range(2):
                    tg.create_task(lane(e, f"{w}0{j}"))

    VirtualClock().run(main())
    timeline = {k: v for e in engines for k, v in e.timeline.items()}
    assert len(timeline) == 5 * 2 * 6 * 3
    for groups in lanes.values():
        for before, after in itertools.pairwise(groups):
            last = max(timeline[s][2] for s in before)
            assert all(timeline[s][0] == last for s in after)
    for e in engines:
        samples = sorted(e.timeline, key=lambda s: (e.timeline[s][0], s))
        arrival = [e.timeline[s][0] for s in samples]
        shapes = [draws.shape(s.partition(".")[0], s, 0) for s in samples]
        if turns == 1:
            finish = simulate_batch(
                profile.server, arrival, [x.prompt_tokens for x in shapes],
                [x.length for x in shapes],
            ).finish
        else:
            finish = simulate_rollouts(profile.server, [
                Rollout(a, tuple((x.prompt_tokens if k == 0 else 5, seg)
                                 for k, seg in enumerate(x.segments)), x.tool_s)
                for a, x in zip(arrival, shapes, strict=True)
            ]).finish
        assert [e.timeline[s][2] for s in samples] == finish.tolist()


def test_the_same_engine_runs_on_the_real_clock():
    """asyncio.run (wall time) with a small time_scale: every request is emitted, in the
    order the virtual run finishes them, and gen_s is the simulated time x time_scale (the
    simulated timeline does not depend on how late the loop wakes the engine)."""
    import time

    profile = small(P3, median_s=0.05, timeout_p=0.0)
    arrivals = [(0.0, [req(g, m) for g in range(3) for m in range(4)])]  # one call: one arrival
    virtual = run(SimEngine("w0", KeyedDraws(profile, seed=1)), arrivals)
    scale = 0.01
    engine = SimEngine("w0", KeyedDraws(profile, seed=1), time_scale=scale)
    order: list[str] = []
    out: dict[str, Completion] = {}

    async def main() -> None:
        async def call(requests: Sequence[GenRequest]) -> None:
            def emit(i: int, c: Completion) -> None:
                order.append(requests[i].sample)
                out[requests[i].sample] = c

            await engine.generate(requests, PARAMS, 0, emit)

        async with asyncio.TaskGroup() as tg:
            for _, requests in arrivals:
                tg.create_task(call(requests))
        await engine.close()

    t = time.perf_counter()
    asyncio.run(main())
    wall = time.perf_counter() - t
    expected = sorted(virtual, key=lambda s: (virtual[s].gen_s, s))
    assert order == expected
    longest = max(c.gen_s for c in virtual.values())
    assert longest * scale <= wall < longest * scale + 2.0
    for s, c in out.items():
        assert c.n_tokens == virtual[s].n_tokens
        assert c.gen_s == pytest.approx(virtual[s].gen_s * scale, abs=1e-6)
