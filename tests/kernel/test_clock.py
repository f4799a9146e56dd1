"""Clocks: the virtual clock makes asyncio waits instant and exact; the real clock is wall time."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from freshroll.clock import Clock, RealClock, VirtualClock


def test_virtual_sleep_an_hour_is_instant_and_exact():
    clock = VirtualClock()
    t0 = time.perf_counter()
    clock.run(asyncio.sleep(3600))
    assert time.perf_counter() - t0 < 1.0
    assert clock.now() == 3600.0


def test_virtual_time_starts_where_told():
    clock = VirtualClock(start=1000.0)
    assert clock.now() == 1000.0

    async def main() -> float:
        loop = asyncio.get_running_loop()
        assert loop.time() == clock.now()
        await asyncio.sleep(24.5)
        return loop.time()

    assert clock.run(main()) == 1024.5
    assert clock.now() == 1024.5


def test_virtual_timeout_fires_instantly_at_exact_time():
    clock = VirtualClock()

    async def main() -> None:
        async with asyncio.timeout(30):
            await asyncio.sleep(3600)

    t0 = time.perf_counter()
    with pytest.raises(TimeoutError):
        clock.run(main())
    assert time.perf_counter() - t0 < 1.0
    assert clock.now() == 30.0


def test_virtual_wait_for_and_work_that_beats_the_timeout():
    clock = VirtualClock()

    async def main() -> str:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(100), timeout=7)
        assert clock.now() == 7.0
        async with asyncio.timeout(30):
            await asyncio.sleep(12)  # finishes first: no timeout
        return "ok"

    t0 = time.perf_counter()
    assert clock.run(main()) == "ok"
    assert time.perf_counter() - t0 < 1.0
    assert clock.now() == 19.0


def test_concurrent_sleepers_wake_in_deadline_order_at_their_times():
    clock = VirtualClock()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        woke.append((name, clock.now()))

    async def main() -> None:
        async with asyncio.TaskGroup() as tg:
            for name, seconds in [("c", 30.0), ("a", 1.0), ("d", 600.0), ("b", 2.5)]:
                tg.create_task(sleeper(name, seconds))

    t0 = time.perf_counter()
    clock.run(main())
    assert time.perf_counter() - t0 < 1.0
    assert woke == [("a", 1.0), ("b", 2.5), ("c", 30.0), ("d", 600.0)]
    assert clock.now() == 600.0


def test_equal_deadlines_are_deterministic():
    # asyncio's timer heap does not promise FIFO for equal deadlines, and in virtual time
    # equal sleeps really do share one deadline: the order is not scheduling order, but it
    # is the same on every run (virtual time is deterministic).
    def once() -> tuple[list[int], list[float]]:
        clock = VirtualClock()
        woke: list[int] = []
        at: list[float] = []

        async def sleeper(i: int) -> None:
            await asyncio.sleep(5)
            woke.append(i)
            at.append(clock.now())

        async def main() -> None:
            await asyncio.gather(*(sleeper(i) for i in range(7)))

        clock.run(main())
        return woke, at

    first = once()
    assert sorted(first[0]) == list(range(7))
    assert first[1] == [5.0] * 7
    assert all(once() == first for _ in range(3))


def test_many_short_sleeps_add_up():
    clock = VirtualClock()

    async def main() -> None:
        for _ in range(1000):
            await asyncio.sleep(1.0)

    t0 = time.perf_counter()
    clock.run(main())
    assert time.perf_counter() - t0 < 1.0
    assert clock.now() == 1000.0


def test_zero_sleep_and_ready_callbacks_do_not_move_the_clock():
    clock = VirtualClock(start=5.0)

    async def main() -> None:
        for _ in range(10):
            await asyncio.sleep(0)
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.set_result, 1)
        assert await fut == 1

    clock.run(main())
    assert clock.now() == 5.0


def test_threads_still_work_under_the_virtual_loop():
    clock = VirtualClock()

    async def main() -> int:
        return await asyncio.to_thread(lambda: 41 + 1)

    assert clock.run(main()) == 42
    assert clock.now() == 0.0


def test_run_returns_the_result_and_propagates_errors():
    clock = VirtualClock()

    async def boom() -> None:
        await asyncio.sleep(1)
        raise KeyError("x")

    with pytest.raises(KeyError):
        clock.run(boom())
    assert clock.now() == 1.0

    async def value() -> int:
        await asyncio.sleep(2)
        return 7

    assert clock.run(value()) == 7  # a second run continues from where the clock is
    assert clock.now() == 3.0


def test_advance():
    clock = VirtualClock(start=2.0)
    clock.advance(0)
    assert clock.now() == 2.0
    clock.advance(1.5)
    assert clock.now() == 3.5
    with pytest.raises(ValueError):
        clock.advance(-0.001)
    assert clock.now() == 3.5  # a rejected advance changes nothing


def test_virtual_clock_does_not_move_by_itself():
    clock = VirtualClock()
    a = clock.now()
    time.sleep(0.01)
    assert clock.now() == a == 0.0


def test_real_clock_is_wall_time_and_monotone_ish():
    clock: Clock = RealClock()
    before = time.time()
    samples = [clock.now() for _ in range(1000)]
    after = time.time()
    assert before <= samples[0] <= samples[-1] <= after
    assert all(b >= a for a, b in itertools.pairwise(samples))
    t0 = clock.now()
    time.sleep(0.02)
    assert clock.now() - t0 >= 0.015


def test_both_clocks_satisfy_the_protocol():
    clocks: list[Clock] = [RealClock(), VirtualClock()]
    assert all(isinstance(c.now(), float) for c in clocks)
