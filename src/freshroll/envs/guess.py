"""A small multi-turn game: guess the secret number (docs/agents.md).

``rollout.workflow: guess_game`` with ``task.name: guess``. The prompt (``guess 0-9:``) hides
a secret, the request's ``answer`` column (``GenRequest.row``), which the environment reads
and the policy never sees. Each model turn is a guess; the environment answers with one
character, an environment turn (no loss): ``>`` (the secret is larger), ``<`` (smaller), or
``=`` (found, the episode ends), and a turn that holds no number gets ``?``. After
``tools.max_calls`` answers the next model turn is the last. The sample's text, which the
rewards score (``numeric`` against the secret), is the last guess.

Token-in as :mod:`freshroll.envs.tool_use`: every turn after the first is generated from the
token ids of the turns before it; each answer is encoded once by the engine's tokenizer; every
turn's seed derives from the call's seed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from freshroll.engines.base import Completion
from freshroll.engines.episodes import EpisodeEmit, WorkflowSetup
from freshroll.engines.seams import AsyncEngine, GenRequest, SamplingParams, Tokenizes
from freshroll.engines.trajectory import Segment, assemble, env_segment, model_segment
from freshroll.envs.tool_use import TOKENIZER_RUNTIMES
from freshroll.errors import ConfigError

TURN_SEED: Final = 7919
_NUMBER: Final = re.compile(r"\d+")


def reply(guess_text: str, secret: int) -> str:
    """The environment's answer to one guess: ``>``, ``<``, ``=`` or ``?`` (no number)."""
    found = _NUMBER.search(guess_text)
    if found is None:
        return "?"
    guess = int(found.group())
    return "=" if guess == secret else (">" if secret > guess else "<")


class GuessGame:
    """The game of the module docstring."""

    def __init__(self, setup: WorkflowSetup) -> None:
        if setup.runtime not in TOKENIZER_RUNTIMES:
            raise ConfigError(f"rollout.workflow: {setup.rollout.workflow} needs run.runtime: "
                              f"inline or process (the model's tokenizer in the run's "
                              f"process, token ids to the worker), not {setup.runtime}")
        self.max_answers = setup.tools.max_calls

    async def run_episode(
        self, engine: AsyncEngine, requests: Sequence[GenRequest], params: SamplingParams,
        seed: int, emit: EpisodeEmit,
    ) -> None:
        if not isinstance(engine, Tokenizes):
            raise TypeError(f"engine {type(engine).__name__} cannot encode the game's answers: "
                            "the guess game needs the hf engine, run.runtime: inline")
        secrets = [_secret(r) for r in requests]
        prompt: dict[int, tuple[int, ...]] = {}
        context: dict[int, list[int]] = {}
        segments: dict[int, list[Segment]] = {i: [] for i in range(len(requests))}
        live, turn = list(range(len(requests))), 0
        while live:
            reqs = [requests[i] if turn == 0 else
                    replace(requests[i], prompt_ids=tuple(context[i])) for i in live]
            got: dict[int, Completion] = {}
            await engine.generate(reqs, params, seed + TURN_SEED * turn, got.__setitem__)
            going = []
            for j, i in enumerate(live):
                comp = got.get(j)
                if comp is None:  # cancelled: no further turn
                    continue
                if turn == 0:
                    prompt[i], context[i] = comp.prompt_token_ids, list(comp.prompt_token_ids)
                segments[i].append(model_segment(comp))
                context[i].extend(comp.token_ids)
                answer = reply(comp.text, secrets[i])
                if answer == "=" or turn >= self.max_answers:
                    emit(i, assemble(prompt[i], segments[i], comp.text, comp.finish_reason))
                    continue
                ids = engine.encode_text(answer)
                segments[i].append(env_segment(ids, 0.0, f"guess:{comp.text.strip()}",
                                               "ok" if answer != "?" else "error"))
                context[i].extend(ids)
                going.append(i)
            live, turn = going, turn + 1


def _secret(req: GenRequest) -> int:
    try:
        return int(str(req.row["answer"]))
    except (KeyError, ValueError) as exc:
        raise ValueError(f"request {req.sample}: the guess game needs an integer 'answer' "
                         "column (task.name: guess)") from exc


__all__ = ["GuessGame", "reply"]
