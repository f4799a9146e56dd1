"""``rollout.workflow: calc_harness``: the calculator task played by a harness through the
OpenAI-compatible gateway (docs/agents.md).

A built-in :class:`~freshroll.envs.harnessed.Harnessed` workflow whose agent is a plain HTTP
client of the gateway (``aiohttp``, the ``gateway`` extra), as a user's harness would be: it
asks ``/v1/completions`` for the call the ``calc`` prompt opens, runs the calculator
(:func:`freshroll.envs.calc.evaluate`) on the answer, and asks again with the context as token
ids (the ids the gateway returned plus the tool's text, encoded once with the policy's
tokenizer: token-in). The sample is rebuilt from the gateway's record of the episode's two
calls: model, environment (no loss), model. A failed call, a lost connection or a run past
``tools.timeout_s`` ends the sample ``tool_error`` (the Harnessed contract).
"""

from __future__ import annotations

from typing import Any

from freshroll.engines.episodes import WorkflowSetup
from freshroll.engines.seams import AsyncEngine, SamplingParams
from freshroll.envs.calc import evaluate
from freshroll.envs.gateway import Gateway, _aiohttp
from freshroll.envs.harnessed import Harnessed


class CalcHarness(Harnessed):
    """The workflow of the module docstring."""

    def __init__(self, setup: WorkflowSetup) -> None:
        super().__init__(setup, self.play)
        self.max_tokens = setup.rollout.max_new_tokens
        self._tokenizer: Any = None

    async def _gateway(self, engine: AsyncEngine, params: SamplingParams) -> Gateway:
        gw = await super()._gateway(engine, params)
        self._tokenizer = gw.tokenizer
        return gw

    async def play(self, url: str, prompt: str, episode: str) -> str:
        """One episode: ask, run the calculator, ask again (token-in)."""
        _aiohttp()  # the ConfigError naming the extra, when aiohttp is missing
        import aiohttp

        async with aiohttp.ClientSession() as session:
            first = await _complete(session, url, prompt, episode, self.max_tokens)
            value = evaluate(first["choices"][0]["text"])
            tool = "=err|" if value is None else f"={value}|"
            ids = [*first["prompt_token_ids"], *first["choices"][0]["token_ids"],
                   *self._tokenizer.encode(tool, add_special_tokens=False)]
            second = await _complete(session, url, ids, episode, self.max_tokens)
            return str(second["choices"][0]["text"])


async def _complete(session: Any, url: str, prompt: str | list[int], episode: str,
                    max_tokens: int) -> dict[str, Any]:
    body = {"model": "freshroll", "prompt": prompt, "max_tokens": max_tokens,
            "episode": episode}
    async with session.post(f"{url}/completions", json=body) as r:
        got: dict[str, Any] = await r.json()
        if r.status != 200:
            raise RuntimeError(f"the gateway answered {r.status}: {got.get('error')}")
        return got


__all__ = ["CalcHarness"]
