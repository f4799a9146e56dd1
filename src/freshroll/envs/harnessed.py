"""Episodes driven by a harness through the OpenAI-compatible gateway (issue 49, item 2).

The harness owns the loop; freshroll intercepts its model calls. :class:`Harnessed` is an
episode workflow over an :data:`Agent`: an async function given the gateway's base URL, the
request's prompt text and an episode id, that runs its own agent loop with any OpenAI client
(sending ``extra_body={"episode": episode}`` on each call) and returns when the episode is over.
The workflow then rebuilds the sample from the gateway's record of that episode's calls, token
for token (:func:`trajectory_of`):

* each call's sampled tokens are a ``model`` segment (behaviour log-probs as sampled);
* what the harness put between two calls (a tool's output, an environment's observation) is the
  next call's context minus the previous call's context and tokens: an ``env`` segment (no loss).

So a harness must grow one context: each call's prompt token ids start with the previous call's
prompt and sampled ids (token-in: it sends ``prompt`` as the ids the gateway returned plus its
own). A harness that re-renders or re-tokenises text breaks that and its episode is discarded
``tool_error`` naming the call, never trained on re-tokenised text. A harness that raises, or runs
past ``tools.timeout_s`` for the whole episode, is discarded ``tool_error`` too; the sample's
text (what the rewards score) is the last call's.

Each worker's engine gets one gateway (127.0.0.1, an OS-chosen port), started on its first
call; every call of an episode is seeded from the workflow call's seed, the request and the
call's index, so a harness that makes the same calls gets the same tokens. The gateway keeps
the calls of open episodes only: a call that lands after its episode ended (a client that
disconnected mid-call, its harness failed) is answered to nobody and dropped, never left
behind (``Gateway.dropped`` counts them).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable, Sequence

from freshroll.engines.episodes import EpisodeEmit, EpisodeFailed, WorkflowSetup
from freshroll.engines.seams import AsyncEngine, GenRequest, SamplingParams
from freshroll.engines.trajectory import Segment, assemble, env_segment
from freshroll.envs.gateway import Gateway, GatewayCall
from freshroll.errors import ConfigError

#: ``await agent(base_url, prompt_text, episode)``: one episode of the harness's own loop
Agent = Callable[[str, str, str], Awaitable[object]]


def trajectory_of(calls: Sequence[GatewayCall]) -> list[Segment] | str:
    """The segments of an episode's calls (module docstring), or why they are not one context."""
    if not calls:
        return "the harness made no model call"
    segments: list[Segment] = []
    context = list(calls[0].prompt_ids)
    for k, c in enumerate(calls):
        if k:
            if list(c.prompt_ids[:len(context)]) != context:
                return (f"call {k + 1}'s context does not start with the tokens before it (a "
                        "re-rendered or re-tokenised history): send the returned token ids")
            between = c.prompt_ids[len(context):]
            segments.append(env_segment(between, 0.0, "harness", "ok"))
            context.extend(between)
        segments.append(Segment("model", c.token_ids, c.logprobs, (), c.seconds))
        context.extend(c.token_ids)
    return [s for s in segments if s.token_ids or s.kind == "model"]


class Harnessed:
    """The workflow of the module docstring over ``agent``."""

    def __init__(self, setup: WorkflowSetup, agent: Agent) -> None:
        if setup.runtime != "inline":
            raise ConfigError(f"rollout.workflow: {setup.rollout.workflow} needs run.runtime: "
                              f"inline (the gateway serves this process's engines), not "
                              f"{setup.runtime}")
        self.agent, self.tools = agent, setup.tools
        self.gateways: dict[int, Gateway] = {}
        self._seeds: dict[str, int] = {}

    async def _gateway(self, engine: AsyncEngine, params: SamplingParams) -> Gateway:
        gw = self.gateways.get(id(engine))
        if gw is None:
            tokenizer = getattr(engine, "tokenizer", None)
            if tokenizer is None:
                raise TypeError(f"engine {type(engine).__name__} has no tokenizer here: a "
                                "harness's episodes need the hf engine, run.runtime: inline")
            gw = Gateway(engine, tokenizer, version=lambda: "", params=params,
                         seed_for=lambda ep, k: self._seeds.get(ep, 0) + 7919 * k,
                         open_episodes=set())
            await gw.start()
            self.gateways[id(engine)] = gw
        return gw

    async def run_episode(
        self, engine: AsyncEngine, requests: Sequence[GenRequest], params: SamplingParams,
        seed: int, emit: EpisodeEmit,
    ) -> None:
        gw = await self._gateway(engine, params)
        url = f"http://{gw.host}:{gw.port}/v1"
        gw.version = lambda: f"step {requests[0].policy_step}"
        await asyncio.gather(*(self._one(gw, url, i, r, seed, emit)
                               for i, r in enumerate(requests)))

    async def _one(self, gw: Gateway, url: str, i: int, req: GenRequest, seed: int,
                   emit: EpisodeEmit) -> None:
        episode = req.sample
        self._seeds[episode] = seed ^ zlib.crc32(episode.encode())
        if gw.open_episodes is not None:
            gw.open_episodes.add(episode)  # take() closes it: a late call is not kept
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            async with asyncio.timeout(self.tools.timeout_s):
                await self.agent(url, req.text, episode)
        except TimeoutError:
            gw.take(episode)
            emit(i, EpisodeFailed("tool_error", f"harness episode {episode} ran past "
                                  f"tools.timeout_s={self.tools.timeout_s:g}",
                                  loop.time() - start))
            return
        except Exception as exc:  # the harness's failure: this sample's, not the worker's
            gw.take(episode)
            emit(i, EpisodeFailed("tool_error", f"harness raised {type(exc).__name__}: "
                                  f"{exc}"[:240], loop.time() - start))
            return
        finally:
            self._seeds.pop(episode, None)
        calls = gw.take(episode)
        segments = trajectory_of(calls)
        if isinstance(segments, str):
            emit(i, EpisodeFailed("tool_error", f"harness episode {episode}: {segments}",
                                  loop.time() - start))
            return
        last = calls[-1]
        emit(i, assemble(calls[0].prompt_ids, segments, last.text, last.finish_reason))

    async def release(self, engine: AsyncEngine) -> None:
        """Close the gateway in front of ``engine`` (the pool closes the engine next)."""
        gw = self.gateways.pop(id(engine), None)
        if gw is not None:
            await gw.close()

    async def close(self) -> None:
        """Close every gateway (a caller that drives the workflow itself)."""
        for gw in self.gateways.values():
            await gw.close()
        self.gateways.clear()


__all__ = ["Agent", "Harnessed", "trajectory_of"]
