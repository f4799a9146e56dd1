"""A tiny stand-in Injector (step triggers; interrupt, kill_process, trainer_crash and
fail_reward only), for the runner's tests of its own machinery (the real one: chaos/inject.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from freshroll.chaos.plan import Scenario
from freshroll.errors import Interrupted
from freshroll.ledger import events as ev
from freshroll.pipeline.hooks import Hooks


class _Hooks(Hooks):
    def __init__(self, owner: Injector) -> None:
        self.owner = owner

    def committed(self, version: Any) -> None:
        self.owner.step(version.step)

    def scored(self, sids: Sequence[Any], scores: list[Any]) -> list[Any]:
        return self.owner.scored(sids, scores)


class Injector:
    def __init__(self, scenario: Scenario, seed: int, *, skip: frozenset[int] = frozenset(),
                 on_kill: Callable[[str], None] | None = None) -> None:
        self.scenario, self.seed, self.skip, self.on_kill = scenario, seed, skip, on_kill
        self.hooks = _Hooks(self)
        self.buf: Any = None
        self.failing: int | None = None

    def wrap(self, parts: Any, buf: Any) -> Any:
        self.buf = buf
        self.stalled = False
        parts.trainer = _StallingTrainer(parts.trainer, self)
        return parts

    def _record(self, i: int, kind: str, target: str, detail: str) -> None:
        self.buf.record(ev.FaultInjected(ts=self.buf.clock.now(), fault=kind, target=target,
                                         detail=f"#{i} {detail}"))
        self.buf.ledger.flush()

    def step(self, step: int) -> None:
        for i, f in enumerate(self.scenario.faults):
            if i in self.skip or f.at.step is None or step < f.at.step:
                continue
            self.skip = self.skip | {i}
            if f.kind == "stall_trainer":
                self.stalled = True
                self._record(i, f.kind, "trainer", "the trainer never steps again")
                continue
            if f.kind == "fail_reward":
                self.failing = i
                self._record(i, f.kind, "reward", "fail the next reward call")
                continue
            self._record(i, f.kind, "process", f"after step {step}")
            if f.kind == "interrupt":
                raise Interrupted("chaos: interrupt")
            if self.on_kill is not None:
                self.on_kill(f.kind)

    def scored(self, sids: Sequence[Any], scores: list[Any]) -> list[Any]:
        if self.failing is None:
            return scores
        i, self.failing = self.failing, None
        self._record(i, "fail_reward", "reward", "failed " + " ".join(sids))
        from freshroll.rewards.scoring import Score
        return [Score(None, "chaos: injected", {}) for _ in scores]


class _StallingTrainer:
    def __init__(self, inner: Any, owner: Injector) -> None:
        self.inner, self.owner = inner, owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def step(self, lease: Any) -> Any:
        import asyncio

        if self.owner.stalled:
            await asyncio.sleep(1e12)
        return await self.inner.step(lease)
