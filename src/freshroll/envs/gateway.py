"""An OpenAI-compatible gateway in front of an engine (issue 49): ``/v1/completions`` and
``/v1/chat/completions`` on 127.0.0.1, answering with token ids and log-probabilities
stamped with the policy version.

A harness that speaks the OpenAI API (its own agent loop, a verifiers environment) points
its client at ``http://127.0.0.1:<port>/v1``; each call it makes is one ``generate`` call of
the engine (:class:`~freshroll.engines.seams.AsyncEngine`, on the gateway's event loop), and
the answer carries what training needs beside the OpenAI fields:

* ``choices[0].token_ids`` and ``prompt_token_ids``: the tokens sampled and the context they
  were sampled after (token-out); a ``/v1/completions`` prompt given as a list of token ids is
  used as it is (token-in), never re-tokenised;
* ``choices[0].logprobs``: each sampled token's behaviour log-prob (``tokens`` /
  ``token_logprobs`` on completions, ``content`` on chat), whether or not the client asked;
* ``policy_version``: the version whose weights the call started under (``version()``), and
  ``episode``: the client's ``episode`` field (``extra_body``) or ``X-Freshroll-Episode``
  header, so a harness's calls can be tied to its episodes.

Every answered call is kept in :attr:`Gateway.calls` (:class:`GatewayCall`). Guarantees: the
listener binds 127.0.0.1 unless told otherwise; JSON only (no pickle); a malformed body is a
400 with an OpenAI-style error, an engine failure a 500, never a hang beyond the engine's own
limits; one choice per call (``n`` > 1 is refused). Needs ``aiohttp`` (the ``gateway`` extra;
it comes with ``datasets``): a ConfigError naming the extra when it is missing.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from freshroll.engines.base import Completion, encode_prompt
from freshroll.engines.seams import AsyncEngine, GenRequest, SamplingParams
from freshroll.errors import ConfigError
from freshroll.rewards.data import chat_renderer

EXTRA = "gateway"  # pip install 'freshroll[gateway]'


@dataclass(frozen=True, slots=True)
class GatewayCall:
    """One call the gateway answered."""

    endpoint: str  # "completions" or "chat.completions"
    episode: str | None
    text: str  # the completion's text (special tokens stripped)
    finish_reason: str
    policy_version: str
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    seconds: float


class BadRequest(ValueError):
    """A request body the gateway refuses (a 400)."""


def _aiohttp() -> Any:
    try:
        from aiohttp import web
    except ImportError as exc:  # pragma: no cover - aiohttp comes with datasets
        raise ConfigError(f"the OpenAI-compatible gateway needs aiohttp: pip install "
                          f"'freshroll[{EXTRA}]'") from exc
    return web


@dataclass
class Gateway:
    """The gateway of the module docstring over ``engine`` and its ``tokenizer``."""

    engine: AsyncEngine
    tokenizer: Any
    version: Callable[[], str]
    params: SamplingParams = field(default_factory=lambda: SamplingParams(16))
    model: str = "freshroll"
    host: str = "127.0.0.1"
    port: int = 0
    calls: list[GatewayCall] = field(default_factory=list)
    #: the episodes whose calls are kept (a workflow opens each before its harness runs and
    #: :meth:`take` closes it): a call of an episode not open, such as the late call of a
    #: client that disconnected mid-call after its episode ended, is answered (to nobody) and
    #: counted in :attr:`dropped`, never kept. None: every call is kept (a bare gateway)
    open_episodes: set[str] | None = None
    dropped: int = 0
    #: the seed of an episode's ``k``-th call when the client names an episode and no seed
    #: (a run's workflow derives it from its call's seed: replayable); None: a counter
    seed_for: Callable[[str, int], int] | None = None
    _runner: Any = None
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    async def start(self) -> str:
        """Listen; returns the base URL (``http://127.0.0.1:<port>/v1``)."""
        web = _aiohttp()
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])  # the bound port when 0 was asked
        return f"http://{self.host}:{self.port}/v1"

    def take(self, episode: str) -> list[GatewayCall]:
        """The calls of ``episode``, in the order they were answered, removed from
        :attr:`calls`."""
        mine = [c for c in self.calls if c.episode == episode]
        self.calls[:] = [c for c in self.calls if c.episode != episode]
        if self.open_episodes is not None:
            self.open_episodes.discard(episode)
        return mine

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- endpoints ------------------------------------------------------------------------
    async def _models(self, request: Any) -> Any:
        web = _aiohttp()
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "freshroll"}]})

    async def _completions(self, request: Any) -> Any:
        return await self._answer(request, "completions")

    async def _chat(self, request: Any) -> Any:
        return await self._answer(request, "chat.completions")

    async def _answer(self, request: Any, endpoint: str) -> Any:
        web = _aiohttp()
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            ids = self._context(body, endpoint)
            params, seed = self._sampling(body)
        except (BadRequest, ValueError) as exc:
            return web.json_response(_error(str(exc), "invalid_request_error"), status=400)
        episode = body.get("episode", request.headers.get("X-Freshroll-Episode"))
        if episode is not None and self.seed_for is not None and "seed" not in body:
            seed = self.seed_for(str(episode), sum(c.episode == str(episode)
                                                   for c in self.calls))
        version = self.version()
        start = time.perf_counter()
        try:
            comp = await self._generate(ids, params, seed)
        except Exception as exc:  # the engine's failure: this call's, answered as a 500
            return web.json_response(_error(f"{type(exc).__name__}: {exc}", "engine_error"),
                                     status=500)
        call = GatewayCall(endpoint, None if episode is None else str(episode), comp.text,
                           comp.finish_reason, version, comp.prompt_token_ids, comp.token_ids,
                           comp.logprobs, time.perf_counter() - start)
        if (self.open_episodes is not None and call.episode is not None
                and call.episode not in self.open_episodes):
            self.dropped += 1  # its episode ended (its client went away): nobody takes it
        else:
            self.calls.append(call)
        return web.json_response(self._body(endpoint, comp, call))

    # -- pieces ---------------------------------------------------------------------------
    def _context(self, body: dict[str, Any], endpoint: str) -> list[int]:
        """The call's context as token ids: a prompt's ids as given, else its text encoded."""
        if endpoint == "chat.completions":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
                raise BadRequest("messages: a non-empty list of {role, content} is needed")
            render = chat_renderer(self.tokenizer, model=self.model, plain_fallback=True)
            return encode_prompt(self.tokenizer, render(messages))
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # one prompt in a batch of one
        if isinstance(prompt, str):
            return encode_prompt(self.tokenizer, prompt)
        if isinstance(prompt, list) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            return [int(t) for t in prompt]
        raise BadRequest("prompt: one string or one list of token ids is needed")

    def _sampling(self, body: dict[str, Any]) -> tuple[SamplingParams, int]:
        if body.get("n", 1) != 1:
            raise BadRequest("n: the gateway answers one choice per call")
        p = self.params
        most = body.get("max_completion_tokens", body.get("max_tokens", p.max_new_tokens))
        temperature = body.get("temperature", p.temperature)
        top_p = body.get("top_p", p.top_p)
        seed = body.get("seed", next(self._ids))
        for name, value in (("max_tokens", most), ("seed", seed)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise BadRequest(f"{name}: an integer is needed, got {value!r}")
        for name, value in (("temperature", temperature), ("top_p", top_p)):
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise BadRequest(f"{name}: a number is needed, got {value!r}")
        if most < 1 or temperature < 0 or not 0 < top_p <= 1:
            raise BadRequest("max_tokens >= 1, temperature >= 0 and 0 < top_p <= 1 are needed")
        return SamplingParams(int(most), float(temperature), float(top_p), p.top_k, p.min_p,
                              p.repetition_penalty), int(seed)

    async def _generate(self, ids: Sequence[int], params: SamplingParams,
                        seed: int) -> Completion:
        k = next(self._ids)
        req = GenRequest(f"gw{k}", "gw", "gateway", "", 0, prompt_ids=tuple(ids))
        got: dict[int, Completion] = {}
        await self.engine.generate([req], params, seed, got.__setitem__)
        if 0 not in got:
            raise RuntimeError("the engine returned no completion (cancelled)")
        return got[0]

    def _body(self, endpoint: str, comp: Completion, call: GatewayCall) -> dict[str, Any]:
        pieces = [self.tokenizer.decode([t]) for t in comp.token_ids]
        choice: dict[str, Any] = {"index": 0, "finish_reason": comp.finish_reason,
                                  "token_ids": list(comp.token_ids)}
        if endpoint == "chat.completions":
            choice["message"] = {"role": "assistant", "content": comp.text}
            choice["logprobs"] = {"content": [
                {"token": s, "logprob": lp, "bytes": list(s.encode()), "top_logprobs": []}
                for s, lp in zip(pieces, comp.logprobs, strict=True)]}
        else:
            choice["text"] = comp.text
            choice["logprobs"] = {"tokens": pieces, "token_logprobs": list(comp.logprobs),
                                  "top_logprobs": None, "text_offset": None}
        n_prompt, n_out = len(comp.prompt_token_ids), len(comp.token_ids)
        return {
            "id": f"{'chatcmpl' if endpoint.startswith('chat') else 'cmpl'}-{len(self.calls)}",
            "object": "chat.completion" if endpoint.startswith("chat") else "text_completion",
            "created": int(time.time()), "model": self.model, "choices": [choice],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                      "total_tokens": n_prompt + n_out},
            "prompt_token_ids": list(comp.prompt_token_ids),
            "policy_version": call.policy_version, "episode": call.episode,
        }


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


__all__ = ["EXTRA", "BadRequest", "Gateway", "GatewayCall"]
