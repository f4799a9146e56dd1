"""Stage capacities in isolation, on fake parts that sleep on a virtual clock: exact rates."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from freshroll.bench.capacity import Plan, Workload, measure, measure_generation
from freshroll.clock import VirtualClock
from freshroll.engines.base import Completion
from freshroll.engines.seams import Emit, GenRequest, SamplingParams
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.results import KernelConfig
from freshroll.kernel.state import Lease
from freshroll.ledger.lineage import PolicyVersion
from freshroll.ledger.store import open_ledger
from freshroll.rewards.calling import RewardState
from freshroll.rewards.scoring import Score
from freshroll.rewards.tasks import Prompt


def _completion(tokens: int) -> Completion:
    return Completion((), (), (), "", "length", 1.0, n_tokens=tokens)


class FakeEngine:
    """Continuous: each request takes ``latency`` s, any number at once. Lock-step: a call
    takes ``latency`` s whatever its size."""

    def __init__(self, continuous: bool, latency: float) -> None:
        self.continuous, self.latency, self.loads, self.closed = continuous, latency, 0, False

    async def generate(self, requests: Sequence[GenRequest], params: SamplingParams, seed: int,
                       emit: Emit) -> None:
        await asyncio.sleep(self.latency)
        for i, _ in enumerate(requests):
            emit(i, _completion(10))

    async def load_weights(self, weights: Any) -> float:
        await asyncio.sleep(0.25)
        self.loads += 1
        return 0.25

    async def cancel(self, samples: Sequence[str]) -> None:
        return None

    async def close(self) -> None:
        self.closed = True


class FakeScorer:
    version, names = "r-fake", ("fake",)
    concurrency, max_batch = 1, 16

    async def score(self, prompts: Sequence[Prompt], completions: Sequence[Completion],
                    state: RewardState) -> list[Score]:
        await asyncio.sleep(0.1)  # per call
        return [Score(float(i), None, {}) for i, _ in enumerate(completions)]


class FakeTrainer:
    settings_digest = "fake-settings"

    def __init__(self, buf: SampleBuffer) -> None:
        self.buf, self.steps, self.seen = buf, 0, 0

    async def step(self, lease: Lease) -> tuple[dict[str, float], str]:
        await asyncio.sleep(2.0)
        self.steps += 1
        self.seen += len(lease.samples)
        return {"train_s": 2.0}, f"{self.steps:032x}"

    async def before_commit(self, version: PolicyVersion) -> None:
        return None

    def weights(self) -> Any:
        return self.steps


PROMPTS = [Prompt(f"p{i}", f"prompt {i}") for i in range(5)]


def _workload(**kw: Any) -> Workload:
    base = dict(prompts=PROMPTS, group_size=4, batch_groups=2, workers=2, concurrency=4,
                params=SamplingParams(max_new_tokens=16), reward_timeout_s=5.0)
    return Workload(**{**base, **kw})


def test_continuous_pool_capacity() -> None:
    engines: list[FakeEngine] = []

    async def factory(name: str) -> FakeEngine:
        engines.append(FakeEngine(True, 1.0))
        return engines[-1]

    gen, _ = VirtualClock().run(measure_generation(factory, _workload(), 80))
    # 2 workers x 4 in flight, 1 s each: 8 completions per second
    assert gen.per_s == pytest.approx(8.0)
    assert sum(len(g) for g in gen.groups.values()) >= 80  # the calls in flight finish
    assert len(gen.complete_groups(4)) >= 20


def test_lock_step_pool_capacity() -> None:
    async def factory(name: str) -> FakeEngine:
        return FakeEngine(False, 2.0)

    gen, _ = VirtualClock().run(measure_generation(factory, _workload(workers=3), 48))
    assert gen.per_s == pytest.approx(3 * 4 / 2.0)  # calls of 4 requests, 2 s each


class HangingScorer(FakeScorer):
    """Every other call hangs past the timeout."""

    calls = 0

    async def score(self, prompts: Sequence[Prompt], completions: Sequence[Completion],
                    state: RewardState) -> list[Score]:
        self.calls += 1
        if self.calls % 2 == 0:
            await asyncio.sleep(1e6)
        return await super().score(prompts, completions, state)


def test_a_reward_call_that_times_out_scores_nothing() -> None:
    from freshroll.bench.capacity import measure_reward

    async def go() -> float:
        async def factory(name: str) -> FakeEngine:
            return FakeEngine(True, 1.0)

        gen, _ = await measure_generation(factory, _workload(), 64)
        per_s, rewards = await measure_reward(HangingScorer(), gen, _workload(),
                                              {p.prompt_id: p for p in PROMPTS})
        assert len(rewards) == 32  # the scored half (the rest: reward 0 for the trainer)
        return per_s

    # 4 calls of 16: two answer in 0.1 s, two time out at 5 s: 32 samples in 10.2 s
    assert VirtualClock().run(go()) == pytest.approx(32 / 10.2)


class ParallelScorer(FakeScorer):
    concurrency = 4


def test_reward_calls_in_flight_follow_the_scorer() -> None:
    from freshroll.bench.capacity import measure_reward

    async def go() -> float:
        async def factory(name: str) -> FakeEngine:
            return FakeEngine(True, 1.0)

        gen, _ = await measure_generation(factory, _workload(), 64)
        per_s, _ = await measure_reward(ParallelScorer(), gen, _workload(),
                                        {p.prompt_id: p for p in PROMPTS})
        return per_s

    # 4 calls of 16 at once, 0.1 s each: 64 samples in 0.1 s
    assert VirtualClock().run(go()) == pytest.approx(640.0)


def test_every_stage_in_isolation(tmp_path: Path) -> None:
    clock = VirtualClock()
    w = _workload()
    buf = SampleBuffer.open(open_ledger(tmp_path), KernelConfig(1, w.batch_groups, w.group_size),
                            clock, run_id="scratch",
                            initial_version=PolicyVersion.initial("fake"))
    engines: list[FakeEngine] = []

    async def factory(name: str) -> FakeEngine:
        engines.append(FakeEngine(True, 1.0))
        return engines[-1]

    trainer = FakeTrainer(buf)
    caps = clock.run(measure(factory, FakeScorer(), trainer, buf, w,
                             Plan(gen_samples=64, train_steps=3, transfers=4),
                             payload=lambda c: None))
    assert caps.batch == 8
    assert caps.gen_per_s == pytest.approx(8.0)
    assert caps.gen_per_worker_per_s == pytest.approx(4.0)
    assert caps.reward_per_s == pytest.approx(16 / 0.1)  # calls of 16 (max_batch), 0.1 s
    assert caps.train_per_s == pytest.approx(8 / 2.0)  # B = 8 per 2 s step
    assert caps.transfer_s == pytest.approx(0.25)
    assert (trainer.steps, trainer.seen) == (3, 24)
    assert buf.counts["steps"] == 3  # every step committed on the scratch ledger
    assert engines[0].loads == 4 and all(e.closed for e in engines)
    buf.ledger.close()
