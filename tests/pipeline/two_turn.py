"""The example episode workflow of docs/architecture.md ("Adding an episode workflow"): each
request gets a second turn, its first answer and a follow-up appended to its prompt; the
second answer is the sample (the trainer trains on it, the first turn its context)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from freshroll.engines.base import Completion
from freshroll.engines.seams import AsyncEngine, Emit, GenRequest, SamplingParams


class TwoTurn:
    follow_up = "\nOnce more:"

    def __init__(self) -> None:
        self.episodes = 0  # calls run (what the tests read)

    async def run_episode(
        self, engine: AsyncEngine, requests: Sequence[GenRequest], params: SamplingParams,
        seed: int, emit: Emit,
    ) -> None:
        self.episodes += 1
        first: dict[int, Completion] = {}
        await engine.generate(requests, params, seed, first.__setitem__)
        asked = sorted(first)  # a request cancelled in its first turn gets no second
        again = [replace(requests[i], text=requests[i].text + first[i].text + self.follow_up)
                 for i in asked]

        def answer(j: int, comp: Completion) -> None:
            i = asked[j]
            emit(i, replace(comp, gen_s=first[i].gen_s + comp.gen_s))  # both turns' time

        await engine.generate(again, params, seed + 7919, answer)  # a seed of `seed` alone
