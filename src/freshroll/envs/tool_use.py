"""A tool-using episode workflow: model turns and tool turns until an answer (docs/agents.md).

``rollout.workflow: calc_tool`` (registered by :mod:`freshroll.envs.registry`). For each
request of a worker's call:

1. The first model turn writes the argument of the call the prompt opens (a built-in
   ``calc`` prompt ends in ``c:``); the tool answers, and its text is appended as an
   environment turn (its token ids from the engine's tokenizer, encoded once; no loss).
2. Each later model turn is a new call when its text starts with :data:`CALL` and fewer than
   ``tools.max_calls`` calls were made; otherwise it is the answer, and the episode ends.
3. The sample is the whole trajectory (:func:`freshroll.engines.trajectory.assemble`): the
   prompt, every turn's tokens, a loss mask that trains the model's tokens only, and its
   turns (kind, tokens, seconds, call, outcome) for the ledger; its text, which the rewards
   score, is the last model turn's.

Token-in / token-out: every turn after the first is generated from the token ids of the turns
before it (``GenRequest.prompt_ids``), never from re-tokenised text, so the trainer scores
exactly the tokens that were sampled.

Each request's episode is a task of its own: its model turns go to the engine through a
:class:`~freshroll.engines.turns.TurnBatcher` (one per engine, shared by the calls running on
it: the turns of whichever episodes are ready are generated together), and its tool call
starts as soon as its turn is back, so an episode waiting on a slow tool holds no other
episode up and a finished one is emitted (its slot freed) at once. Tools run on the event
loop, each call within ``tools.timeout_s``; ``tools.latency`` adds a delay per call drawn
from a distribution (:mod:`freshroll.envs.latency`: lognormal by its median and 99th
percentile, seeded by the request's sample id and turn; a slow tool, for benchmarks), an
asyncio sleep. A tool that raises or does not answer in time ends its request as
:class:`~freshroll.engines.episodes.EpisodeFailed` (``tool_error``): discarded by reason,
never a reward of 0, never a hang; the other requests go on. So does an answer that is not a
well-formed :class:`~freshroll.envs.calc.ToolResult` (:func:`malformed`: its text not a
string, an unknown outcome), checked before it is encoded. Engine failures are the
engine's (the episode contract, :mod:`freshroll.engines.episodes`), and every turn's seed
derives from the call's seed.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from freshroll.engines.base import Completion
from freshroll.engines.episodes import EpisodeEmit, EpisodeFailed, WorkflowSetup
from freshroll.engines.seams import AsyncEngine, GenRequest, SamplingParams, Tokenizes
from freshroll.engines.trajectory import Segment, assemble, env_segment, model_segment
from freshroll.engines.turns import TurnBatcher, first_error
from freshroll.envs.calc import Calculator, Tool, ToolResult
from freshroll.envs.latency import call_rng, latency_of
from freshroll.errors import ConfigError

#: what opens a tool call in a model turn after the first
CALL: Final = "c:"
#: each turn's seed: the call's seed plus this prime times the turn
TURN_SEED: Final = 7919
#: the request whose episode the current task runs: what a tool wrapper reads to name the
#: sample a call belongs to (tracing, the chaos library's tool faults); unset outside an episode
EPISODE_REQUEST: contextvars.ContextVar[GenRequest] = contextvars.ContextVar("episode_request")
#: the outcomes a tool's result may carry (:data:`~freshroll.engines.trajectory.ToolOutcome`)
OUTCOMES: Final = ("ok", "error")
#: the runtimes whose workers a multi-turn workflow can drive: the tokenizer in the run's
#: process (inline: the engine's; process: loaded beside the worker's proxy), token ids sent
#: to the engine as a later turn's context (auto resolves to one of the two for hf)
TOKENIZER_RUNTIMES: Final = ("inline", "process", "auto")


@dataclass
class _Episode:
    """One request's episode so far."""

    prompt: tuple[int, ...] = ()
    context: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    calls: int = 0


@dataclass(frozen=True, slots=True)
class _Answer:
    """A tool call's answer (its text, outcome, seconds) or None with why it failed."""

    result: ToolResult | None
    seconds: float
    failure: str = ""


class ToolUse:
    """The workflow of the module docstring, over one :class:`~freshroll.envs.calc.Tool`."""

    batches_turns = True  # the pool may overlap its calls (BatchesTurns)

    def __init__(self, setup: WorkflowSetup, tool: Tool | None = None) -> None:
        if setup.runtime not in TOKENIZER_RUNTIMES:
            raise ConfigError(f"rollout.workflow: {setup.rollout.workflow} needs run.runtime: "
                              f"inline or process (the model's tokenizer in the run's "
                              f"process, token ids to the worker), not {setup.runtime}")
        self.tools = setup.tools
        self.latency = latency_of(setup.tools)
        self._batchers: dict[int, TurnBatcher] = {}  # by id(engine), one per worker's engine
        self.tool: Tool = tool if tool is not None else Calculator()

    async def run_episode(
        self, engine: AsyncEngine, requests: Sequence[GenRequest], params: SamplingParams,
        seed: int, emit: EpisodeEmit,
    ) -> None:
        if not isinstance(engine, Tokenizes):
            raise TypeError(f"engine {type(engine).__name__} cannot encode a tool's output: "
                            "a tool-using episode needs the hf engine, run.runtime: inline "
                            "or process")
        batcher = self._batcher(engine)
        try:
            async with asyncio.TaskGroup() as tg:
                for i, req in enumerate(requests):
                    tg.create_task(self._episode(batcher, engine, req, i, params, seed, emit))
        except BaseExceptionGroup as group:  # the engine's failure, as the pool expects it
            raise first_error(group) from None

    async def release(self, engine: AsyncEngine) -> None:
        """Forget ``engine``'s batcher (the pool closes the engine: HoldsEngines)."""
        held = self._batchers.get(id(engine))
        if held is not None and held.engine is engine:
            del self._batchers[id(engine)]

    def _batcher(self, engine: AsyncEngine) -> TurnBatcher:
        held = self._batchers.get(id(engine))
        if held is None or held.engine is not engine:
            held = self._batchers[id(engine)] = TurnBatcher(engine)
        return held

    async def _episode(self, batcher: TurnBatcher, engine: Tokenizes, req: GenRequest, i: int,
                       params: SamplingParams, seed: int, emit: EpisodeEmit) -> None:
        """Request ``i``'s episode, a task of its own: model turns through the batcher, each
        tool call as soon as its turn is back."""
        ep, turn = _Episode(), 0
        EPISODE_REQUEST.set(req)  # this task's own context (one task per episode)
        while True:
            asked = req if turn == 0 else replace(req, prompt_ids=tuple(ep.context))
            comp = await batcher.turn(asked, params, seed + TURN_SEED * turn)
            if comp is None:  # cancelled in this turn: no further turn, no emit
                return
            arg = self._model_turn(ep, comp, turn)
            if arg is None:
                emit(i, assemble(ep.prompt, ep.segments, comp.text, comp.finish_reason))
                return
            answer = await self._call(arg, call_rng(seed, req.sample, turn))
            if not self._tool_turn(engine, ep, arg, answer, i, emit):
                return
            turn += 1

    def _model_turn(self, ep: _Episode, comp: Completion, turn: int) -> str | None:
        """Record a model turn; the argument of the call it makes, or None (the answer)."""
        if turn == 0:
            ep.prompt = comp.prompt_token_ids
            ep.context = list(comp.prompt_token_ids)
        ep.segments.append(model_segment(comp))
        ep.context.extend(comp.token_ids)
        if ep.calls >= self.tools.max_calls:
            return None
        if turn == 0:  # the prompt opened the call: the whole turn is its argument
            return comp.text
        text = comp.text.lstrip()
        return text[len(CALL):] if text.startswith(CALL) else None

    def _tool_turn(self, engine: Tokenizes, ep: _Episode, arg: str, answer: _Answer, i: int,
                   emit: EpisodeEmit) -> bool:
        """Record a tool's answer as an environment turn (True: the episode goes on), or emit
        the request's failure (False)."""
        call = f"{self.tool.name}:{arg}"
        if answer.result is None:
            model_s = sum(s.seconds for s in ep.segments)
            emit(i, EpisodeFailed("tool_error", f"{call!r}: {answer.failure}",
                                  model_s + answer.seconds))
            return False
        ids = engine.encode_text(answer.result.text)
        ep.segments.append(env_segment(ids, answer.seconds, call, answer.result.outcome))
        ep.context.extend(ids)
        ep.calls += 1
        return True

    async def _call(self, arg: str, rng: random.Random) -> _Answer:
        """One tool call within ``tools.timeout_s`` (after its simulated latency, if any)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        limit = self.tools.timeout_s
        try:
            async with asyncio.timeout(limit):
                delay = self.latency.draw(rng)
                if delay > 0:
                    await asyncio.sleep(delay)
                result = await self.tool(arg)
        except TimeoutError:
            return _Answer(None, loop.time() - start,
                           f"tool {self.tool.name} did not answer within tools.timeout_s={limit:g}")
        except Exception as exc:  # the tool's own failure: this sample, not the worker
            return _Answer(None, loop.time() - start,
                           f"tool {self.tool.name} raised {type(exc).__name__}: {exc}"[:240])
        why = malformed(result)
        if why is not None:
            return _Answer(None, loop.time() - start, f"tool {self.tool.name} returned {why}")
        return _Answer(result, loop.time() - start)


def malformed(result: object) -> str | None:
    """Why ``result`` is not a tool's answer the episode can append (None: it is one): a
    :class:`ToolResult` whose text is a string and whose outcome is one of :data:`OUTCOMES`.
    Checked before the text is encoded, so a malformed answer fails its own sample
    (``tool_error``), never the worker's call (an encoder's TypeError would)."""
    if not isinstance(result, ToolResult):
        return f"{type(result).__name__}, not a ToolResult"
    if not isinstance(result.text, str):
        return f"a ToolResult whose text is {type(result.text).__name__}, not str"
    if result.outcome not in OUTCOMES:
        return f"a ToolResult with outcome {result.outcome!r}, not one of {', '.join(OUTCOMES)}"
    return None


__all__ = ["CALL", "EPISODE_REQUEST", "OUTCOMES", "TOKENIZER_RUNTIMES", "TURN_SEED", "ToolUse",
           "malformed"]
