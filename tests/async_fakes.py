"""Fully-async fakes: the real Pipeline, buffer and ledger with engines, a scorer and a trainer
that only ``asyncio.sleep``, so a run takes minutes of virtual time and milliseconds of wall.

:class:`AsyncHarness` runs the pipeline under a :class:`~freshroll.clock.VirtualClock`
(``clock.run``) or, with ``real=True``, under the real clock (``asyncio.run``), same fakes.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from freshroll.clock import Clock, RealClock, VirtualClock
from freshroll.config import Config, load_config
from freshroll.control.controller import Controller
from freshroll.engines.base import Completion
from freshroll.engines.seams import Emit, GenRequest, SamplingParams
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.results import KernelConfig
from freshroll.kernel.state import Lease
from freshroll.ledger.lineage import PolicyVersion, RewardVersion
from freshroll.ledger.store import Ledger
from freshroll.pipeline.observers import Callbacks, default_observers
from freshroll.pipeline.pipeline import Pipeline, StepReport
from freshroll.rewards.calling import RewardState
from freshroll.rewards.scoring import Score
from freshroll.rewards.tasks import Prompt, make_prompts
from pipeline_fakes import LedgerChecks

BASE = ["run.progress=false", "task.n_prompts=64", "rollout.group_size=4",
        "rollout.batch_groups=4", "rollout.worker_batch=8", "run.steps=20",
        "control.fallback=false"]  # the sync fallback is tested on its own (test_fallback.py)
REWARD = str(RewardVersion.of("fake", config={"v": 1}))


def latency(sample: str, base: float) -> float:
    """A deterministic, varied latency per sample: base x (0.5 .. 2.0)."""
    h = int(hashlib.blake2b(sample.encode(), digest_size=4).hexdigest(), 16)
    return base * (0.5 + 1.5 * (h % 1000) / 1000)


class AsyncEngine:
    """Sleeps per request; continuous: each request is emitted at its own finish time."""

    def __init__(self, name: str, continuous: bool, base_s: float,
                 transfer_s: float = 0.01) -> None:
        self.name, self.continuous, self.base_s, self.transfer_s = name, continuous, base_s, \
            transfer_s
        self.calls = self.loads = 0
        self.active = self.peak = 0
        self.closed = False

    async def generate(self, requests: Sequence[GenRequest], params: SamplingParams, seed: int,
                       emit: Emit) -> None:
        assert not self.closed
        self.calls += 1
        self.active += len(requests)
        self.peak = max(self.peak, self.active)
        try:
            done = sorted((latency(r.sample, self.base_s), i) for i, r in enumerate(requests))
            if not self.continuous:
                await asyncio.sleep(done[-1][0])
            t = 0.0
            for lat, i in done:
                if self.continuous:
                    await asyncio.sleep(lat - t)
                    t = lat
                self.active -= 1
                emit(i, Completion((), (), (), "ab", "length", lat, n_tokens=8))
        finally:
            self.active = 0 if self.active < 0 else self.active

    async def load_weights(self, weights: Any) -> float:
        self.loads += 1
        await asyncio.sleep(self.transfer_s)
        return self.transfer_s

    async def cancel(self, samples: Sequence[str]) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


class Factory:
    """Makes :class:`AsyncEngine` s after ``startup_s``; remembers every one it made."""

    def __init__(self, continuous: bool = True, base_s: float = 0.5, startup_s: float = 2.0,
                 make: Callable[[str], Any] | None = None) -> None:
        self.continuous, self.base_s, self.startup_s = continuous, base_s, startup_s
        self.made: list[Any] = []
        self.make = make

    async def __call__(self, name: str) -> Any:
        await asyncio.sleep(self.startup_s)
        engine = (self.make(name) if self.make is not None
                  else AsyncEngine(name, self.continuous, self.base_s))
        self.made.append(engine)
        return engine


class Scorer:
    version = REWARD
    names = ("fake",)
    concurrency, max_batch = 1, 256

    def __init__(self, per_call_s: float = 0.05) -> None:
        self.per_call_s, self.calls = per_call_s, 0

    async def score(self, prompts: Sequence[Prompt], completions: Sequence[Completion],
                    state: RewardState) -> list[Score]:
        self.calls += 1
        await asyncio.sleep(self.per_call_s)
        return [Score(float(i % 2), None, {}) for i in range(len(completions))]


class Trainer:
    """Step time c0 + c1 x samples (virtual seconds)."""

    settings_digest = "fake-settings"

    def __init__(self, c0: float = 0.5, c1: float = 0.0) -> None:
        self.c0, self.c1, self.steps = c0, c1, 0

    async def step(self, lease: Lease) -> tuple[dict[str, float], str]:
        t = self.c0 + self.c1 * len(lease.samples)
        await asyncio.sleep(t)
        self.steps += 1
        return {"train_s": t, "loss": 0.0}, hashlib.sha256(b"%d" % self.steps).hexdigest()[:32]

    async def before_commit(self, version: PolicyVersion) -> None:
        pass

    def weights(self) -> Any:
        return self.steps


class AsyncHarness(LedgerChecks):
    """One pipeline of async fakes on a ledger in ``tmp``."""

    def __init__(self, tmp: Path, *, overrides: Sequence[str] = (), factory: Any = None,
                 scorer: Any = None, trainer: Any = None, real: bool = False,
                 controller: Controller | None = None, ledger_path: Path | None = None,
                 sync: str = "off", start: float = 0.0) -> None:
        self.cfg: Config = load_config(None, [*BASE, *overrides])
        c = self.cfg
        self.kernel = KernelConfig(c.run.max_staleness, c.rollout.batch_groups,
                                   c.rollout.group_size, c.rollout.max_inflight_groups)
        self.ledger_path = ledger_path or tmp / "ledger.sqlite"
        self.clock: Clock = RealClock() if real else VirtualClock(start)
        self.buf = SampleBuffer.open(
            Ledger(self.ledger_path, sync=sync), self.kernel, self.clock,  # type: ignore[arg-type]
            run_id="t", initial_version=PolicyVersion.initial("fake-model"),
        )
        self.factory = factory or Factory()
        self.scorer = scorer or Scorer()
        self.trainer = trainer or Trainer()
        prompts = make_prompts("reverse", c.task.n_prompts, 0, min_len=3, max_len=3)
        self.steps: list[StepReport] = []
        self.pipe = Pipeline(
            self.buf, self.factory, self.scorer, self.trainer,
            {p.prompt_id: p for p in prompts}, [p.prompt_id for p in prompts], c,
            observers=[Callbacks(on_step=self.steps.append), *default_observers()],
            controller=controller,
        )

    def run(self, timeout_s: float = 3600.0, during: Any = None) -> BaseException | None:
        """Run the pipeline (``during``: a coroutine function of the pipeline run alongside);
        a run that does not end within ``timeout_s`` (of its clock) fails the test."""
        async def main() -> None:
            async with asyncio.timeout(timeout_s):
                if during is None:
                    await self.pipe.run()
                    return
                run = asyncio.ensure_future(self.pipe.run())
                await during(self.pipe)
                await run

        try:
            if isinstance(self.clock, VirtualClock):
                self.clock.run(main())
            else:
                asyncio.run(main())
        except TimeoutError as exc:
            raise AssertionError(f"the pipeline did not end within {timeout_s} s") from exc
        except BaseException as exc:
            return exc
        return None
