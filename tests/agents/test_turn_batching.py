"""Asynchrony where agents need it (issue 49, item 5): the episodes of a call are tasks of
their own, their model turns batched by whichever are ready (freshroll.engines.turns), so an
episode waiting on its tool holds no other up; on a scripted engine and event-driven tools
(order and completion asserted, never times)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from freshroll.engines.base import Completion
from freshroll.engines.episodes import EpisodeFailed, WorkflowSetup, overlaps_calls
from freshroll.engines.seams import Emit, GenRequest, SamplingParams
from freshroll.engines.tiny import CHARS
from freshroll.engines.turns import TurnBatcher, first_error
from freshroll.envs.calc import Calculator, ToolResult
from freshroll.envs.tool_use import TURN_SEED, ToolUse
from freshroll.errors import Superseded, WorkerLost

ENC = {ch: i + 4 for i, ch in enumerate(CHARS)}
EOS = 2
GUARD_S = 60.0  # a hang guard only: every wait below ends on an event, not on time


def enc(text: str) -> tuple[int, ...]:
    return tuple(ENC[c] for c in text)


@dataclass
class Echo:
    """A lock-step engine: request ``calc <a>*<b> c:``'s first turn writes ``<a>*<b>``, every
    later turn the product (the answer); each batch's rows and seed are recorded. ``hold``:
    the first generate call waits on it (a leader's batch in flight); ``fail``: raised."""

    continuous: bool = False
    batches: list[list[str]] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    hold: asyncio.Event | None = None
    fail: BaseException | None = None

    def encode_text(self, text: str) -> tuple[int, ...]:
        return enc(text)

    async def generate(self, requests: Sequence[GenRequest], params: SamplingParams,
                       seed: int, emit: Emit) -> None:
        self.batches.append([r.sample for r in requests])
        self.seeds.append(seed)
        if self.fail is not None:
            raise self.fail
        if self.hold is not None and len(self.batches) == 1:
            await self.hold.wait()
        for i, r in enumerate(requests):
            expr = r.text.split()[1]
            a, b = expr.split("*")
            out = expr if r.prompt_ids is None else str(int(a) * int(b))
            prompt = r.prompt_ids if r.prompt_ids is not None else enc(r.text)
            toks = (*enc(out), EOS)
            emit(i, Completion(prompt, toks, (-0.5,) * len(toks), out, "stop", 0.01))

    async def load_weights(self, weights: object) -> float:
        return 0.0

    async def cancel(self, samples: Sequence[str]) -> None:
        return None

    async def close(self) -> None:
        return None


class Gated:
    """The calculator, except that a call whose argument is in ``gates`` waits on its event."""

    name = "calc"

    def __init__(self, **gates: asyncio.Event) -> None:
        self.gates = {k.replace("x", "*"): v for k, v in gates.items()}
        self.calc = Calculator()

    async def __call__(self, arg: str) -> ToolResult:
        gate = self.gates.get(arg)
        if gate is not None:
            await gate.wait()
        return await self.calc(arg)


def reqs(call: str, n: int) -> list[GenRequest]:
    return [GenRequest(f"{call}.{i}#1", call, "p", f"calc {i + 1}*{ord(call[-1])} c:", 0)
            for i in range(n)]


def test_the_other_episodes_finish_while_one_waits_on_its_tool() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        wf = ToolUse(WorkflowSetup(), tool=Gated(**{"1x48": gate}))  # request 0 of call "g0"
        engine = Echo()
        order: list[int] = []
        three = asyncio.Event()

        def emit(i: int, c: Completion | EpisodeFailed) -> None:
            assert isinstance(c, Completion), c
            order.append(i)
            if len(order) == 3:
                three.set()

        call = asyncio.ensure_future(wf.run_episode(engine, reqs("g0", 4), SamplingParams(8), 5,  # type: ignore[arg-type]  # a scripted engine
                                                    emit))
        await asyncio.wait_for(three.wait(), GUARD_S)
        assert sorted(order) == [1, 2, 3] and not call.done()  # 0 still waits on its tool
        gate.set()
        await asyncio.wait_for(call, GUARD_S)
        assert order[-1] == 0 and len(order) == 4
        # turn 1 of all four together, turn 2 of the three that were ready, then 0's alone
        assert [len(b) for b in engine.batches] == [4, 3, 1]
        assert engine.seeds == [5, 5 + TURN_SEED, 5 + TURN_SEED]
        assert engine.batches[2] == ["g0.0#1"]

    asyncio.run(main())


def test_a_call_started_later_shares_the_engines_batches() -> None:
    """One batcher per engine: a second call's first turns join the next batch, and its
    episodes finish while the first call's gated episode still waits (per-sample refill)."""

    async def main() -> None:
        gate = asyncio.Event()
        wf = ToolUse(WorkflowSetup(), tool=Gated(**{"1x48": gate}))
        engine = Echo()
        done: dict[str, int] = {"g0": 0, "g1": 0}
        b_done = asyncio.Event()

        def emitter(call: str, n: int) -> Emit:
            def emit(i: int, c: object) -> None:
                done[call] += 1
                if call == "g1" and done[call] == n:
                    b_done.set()
            return emit  # type: ignore[return-value]  # EpisodeEmit, widened

        params = SamplingParams(8)
        a = asyncio.ensure_future(wf.run_episode(engine, reqs("g0", 2), params, 5,  # type: ignore[arg-type]  # a scripted engine
                                                 emitter("g0", 2)))
        b = asyncio.ensure_future(wf.run_episode(engine, reqs("g1", 2), params, 9,  # type: ignore[arg-type]  # a scripted engine
                                                 emitter("g1", 2)))
        await asyncio.wait_for(b_done.wait(), GUARD_S)
        assert done["g0"] == 1  # g0.1 finished too; g0.0 waits on its tool
        assert engine.batches[0] == ["g0.0#1", "g0.1#1", "g1.0#1", "g1.1#1"]
        gate.set()
        await asyncio.wait_for(asyncio.gather(a, b), GUARD_S)
        assert done == {"g0": 2, "g1": 2}
        assert wf.batches_turns and overlaps_calls(wf)

    asyncio.run(main())


def test_a_leader_cancelled_mid_batch_hands_the_other_turns_on() -> None:
    async def main() -> None:
        engine = Echo(hold=asyncio.Event())  # the first batch never returns
        batcher = TurnBatcher(engine)  # type: ignore[arg-type]  # a scripted engine
        params = SamplingParams(8)
        a_req, b_req = reqs("g0", 1)[0], reqs("g1", 1)[0]
        a = asyncio.ensure_future(batcher.turn(a_req, params, 1))
        b = asyncio.ensure_future(batcher.turn(b_req, params, 2))
        while not engine.batches:
            await asyncio.sleep(0)
        assert engine.batches == [["g0.0#1", "g1.0#1"]]  # a leads, b rides along
        a.cancel()
        got = await asyncio.wait_for(b, GUARD_S)
        assert isinstance(got, Completion) and got.text == "1*49"
        assert engine.batches[1] == ["g1.0#1"] and engine.seeds[1] == 2
        assert a.cancelled()

    asyncio.run(main())


@pytest.mark.parametrize("exc", [WorkerLost("gone"), Superseded("v2")])
def test_an_engine_failure_reaches_the_pool_as_itself(exc: BaseException) -> None:
    wf = ToolUse(WorkflowSetup())
    with pytest.raises(type(exc)):
        asyncio.run(wf.run_episode(Echo(fail=exc), reqs("g0", 3), SamplingParams(8), 1,  # type: ignore[arg-type]  # a scripted engine
                                   lambda i, c: None))


def test_first_error_prefers_the_workers_failure() -> None:
    lost, sup, other = WorkerLost("w"), Superseded("v"), ValueError("x")
    group = BaseExceptionGroup("g", [other, ExceptionGroup("h", [sup, lost])])
    assert first_error(group) is lost
    assert first_error(BaseExceptionGroup("g", [other, sup])) is sup
    assert first_error(BaseExceptionGroup("g", [other])) is other
