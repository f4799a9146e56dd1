"""OpenEnv-style environments (``reset()`` / ``step(action)``) as episode workflows (issue 49).

An OpenEnv environment (``openenv-core``, the ``openenv`` extra: ``pip install
'freshroll[openenv]'``) is a class with ``reset(seed, episode_id, **kw) -> Observation`` and
``step(action) -> Observation``, each observation carrying ``done`` and ``reward``.
:class:`OpenEnvWorkflow` plays one in-process instance per request (no Docker, no network):

1. ``reset(seed=<the call's seed + request index>, episode_id=<the sample id>, row=<the
   request's dataset row>)``; the first model turn answers the request's prompt;
2. each model turn's text becomes an action (``action_of(text)``), ``step`` answers with an
   observation whose text (``text_of(obs)``) is appended as an environment turn (encoded once
   with the policy's tokenizer, no loss), its call recorded as ``<env>.step reward=<the
   observation's reward>`` (the ledger's turn; ``freshroll lineage`` shows it);
3. the episode ends when an observation says ``done`` or after ``tools.max_calls`` steps (the
   next model turn is the last); the sample's text, which the rewards score, is the last
   model turn's.

Token-in as :mod:`freshroll.envs.tool_use`. The turns of a worker's call run in lock-step (one
``generate`` per turn for the requests still playing). An environment that raises, returns
something that is not an observation, or takes longer than ``tools.timeout_s`` for one
``reset`` or ``step`` ends its sample ``tool_error``: never a reward of 0, never a hang.

Adding an OpenEnv environment is this module's :class:`OpenEnvWorkflow` over the
environment's class plus one registration (:func:`freshroll.envs.registry.register_builtins`);
the built-in one is ``openenv_guess`` (:func:`guess_env`: the guess game of
:mod:`freshroll.envs.guess` as an OpenEnv environment). Without ``openenv-core`` the workflow is
a ConfigError naming the extra, raised before the run starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from freshroll.engines.base import Completion
from freshroll.engines.episodes import EpisodeEmit, EpisodeFailed, WorkflowSetup
from freshroll.engines.seams import AsyncEngine, GenRequest, SamplingParams, Tokenizes
from freshroll.engines.trajectory import Segment, assemble, env_segment, model_segment
from freshroll.envs.guess import reply
from freshroll.envs.tool_use import TOKENIZER_RUNTIMES
from freshroll.errors import ConfigError

EXTRA: Final = "openenv"  # pip install 'freshroll[openenv]' (openenv-core)
TURN_SEED: Final = 7919


def openenv_core() -> Any:
    """``openenv.core.env_server`` (Environment, Action, Observation, State), or a ConfigError
    naming the extra."""
    try:
        from openenv.core import env_server
    except ImportError as exc:
        raise ConfigError(f"an OpenEnv environment needs openenv-core: pip install "
                          f"'freshroll[{EXTRA}]' ({exc})") from exc
    return env_server


@dataclass
class _Play:
    """One request's episode so far."""

    env: Any
    prompt: tuple[int, ...] = ()
    context: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)


class OpenEnvWorkflow:
    """Plays ``make_env()`` environments (module docstring)."""

    def __init__(self, setup: WorkflowSetup, make_env: Callable[[], Any],
                 action_of: Callable[[str], Any], text_of: Callable[[Any], str],
                 name: str = "env") -> None:
        core = openenv_core()
        if setup.runtime not in TOKENIZER_RUNTIMES:
            raise ConfigError(f"rollout.workflow: {setup.rollout.workflow} needs run.runtime: "
                              f"inline or process (the model's tokenizer in the run's "
                              f"process, token ids to the worker), not {setup.runtime}")
        self.observation = core.Observation
        self.make_env, self.action_of, self.text_of = make_env, action_of, text_of
        self.name, self.tools = name, setup.tools

    async def run_episode(
        self, engine: AsyncEngine, requests: Sequence[GenRequest], params: SamplingParams,
        seed: int, emit: EpisodeEmit,
    ) -> None:
        if not isinstance(engine, Tokenizes):
            raise TypeError(f"engine {type(engine).__name__} cannot encode an environment's "
                            "observations: an OpenEnv episode needs the hf engine")
        plays: dict[int, _Play] = {}
        for i, req in enumerate(requests):
            env = self.make_env()
            got = await self._env_call(env.reset, seed=seed + i, episode_id=req.sample,
                                       row=dict(req.row))
            if isinstance(got, str):
                emit(i, EpisodeFailed("tool_error", f"{self.name}.reset: {got}", 0.0))
            else:
                plays[i] = _Play(env)
        live, turn = sorted(plays), 0
        while live:
            reqs = [requests[i] if turn == 0 else
                    replace(requests[i], prompt_ids=tuple(plays[i].context)) for i in live]
            done: dict[int, Completion] = {}
            await engine.generate(reqs, params, seed + TURN_SEED * turn, done.__setitem__)
            going = []
            for j, i in enumerate(live):
                comp = done.get(j)
                if comp is not None and await self._turn(engine, plays[i], comp, turn, i, emit):
                    going.append(i)
            live, turn = going, turn + 1

    async def _turn(self, engine: Tokenizes, play: _Play, comp: Completion, turn: int, i: int,
                    emit: EpisodeEmit) -> bool:
        """Record a model turn and step the environment with it; True: the episode goes on."""
        if turn == 0:
            play.prompt, play.context = comp.prompt_token_ids, list(comp.prompt_token_ids)
        play.segments.append(model_segment(comp))
        play.context.extend(comp.token_ids)
        if turn >= self.tools.max_calls:
            emit(i, assemble(play.prompt, play.segments, comp.text, comp.finish_reason))
            return False
        loop = asyncio.get_running_loop()
        start = loop.time()
        obs = await self._env_call(play.env.step, self.action_of(comp.text))
        seconds = loop.time() - start
        if isinstance(obs, str):
            model_s = sum(s.seconds for s in play.segments)
            emit(i, EpisodeFailed("tool_error", f"{self.name}.step: {obs}", model_s + seconds))
            return False
        ids = engine.encode_text(self.text_of(obs))
        reward = obs.reward
        play.segments.append(env_segment(ids, seconds, f"{self.name}.step reward={reward}",
                                         "ok"))
        play.context.extend(ids)
        if obs.done:
            emit(i, assemble(play.prompt, play.segments, comp.text, comp.finish_reason))
            return False
        return True

    async def _env_call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)`` within ``tools.timeout_s`` (on a thread: an environment's code
        may block); its observation, or why it is none (a string)."""
        limit = self.tools.timeout_s
        try:
            async with asyncio.timeout(limit):
                obs = await asyncio.to_thread(fn, *args, **kw)
        except TimeoutError:
            return f"did not answer within tools.timeout_s={limit:g}"
        except Exception as exc:  # the environment's failure: this sample's, not the worker's
            return f"raised {type(exc).__name__}: {exc}"[:240]
        if not isinstance(obs, self.observation):
            return f"returned {type(obs).__name__}, not an Observation"
        return obs


def guess_env() -> Any:
    """The guess game (:mod:`freshroll.envs.guess`) as an OpenEnv ``Environment`` class: the
    secret from ``reset``'s ``row`` (its ``answer``), each ``step`` answers ``>`` ``<`` ``=``
    or ``?`` with reward 1 on ``=`` (and done)."""
    core = openenv_core()

    class GuessAction(core.Action):  # type: ignore[misc,name-defined]  # openenv's pydantic base
        guess: str

    class GuessObservation(core.Observation):  # type: ignore[misc,name-defined]  # as above
        feedback: str = ""

    class GuessEnv(core.Environment):  # type: ignore[misc,name-defined]  # as above
        SUPPORTS_CONCURRENT_SESSIONS = True
        Action = GuessAction

        def __init__(self) -> None:
            super().__init__()
            self._state = core.State(episode_id=None, step_count=0)
            self.secret = 0

        def reset(self, seed: int | None = None, episode_id: str | None = None,
                  **kw: Any) -> Any:
            self.secret = int(str(kw.get("row", {}).get("answer", 0)))
            self._state = core.State(episode_id=episode_id, step_count=0)
            return GuessObservation(feedback="")

        def step(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
            self._state.step_count += 1
            answer = reply(action.guess, self.secret)
            return GuessObservation(feedback=answer, done=answer == "=",
                                    reward=1.0 if answer == "=" else 0.0)

        @property
        def state(self) -> Any:
            return self._state

    return GuessEnv


class OpenEnvGuess(OpenEnvWorkflow):
    """``rollout.workflow: openenv_guess``: :func:`guess_env` played through the adapter
    (``task.name: guess``)."""

    def __init__(self, setup: WorkflowSetup) -> None:
        env = guess_env()
        super().__init__(setup, env, lambda text: env.Action(guess=text),
                         lambda obs: str(obs.feedback), name="guess")


__all__ = ["EXTRA", "OpenEnvGuess", "OpenEnvWorkflow", "guess_env", "openenv_core"]
