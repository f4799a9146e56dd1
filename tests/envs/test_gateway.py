"""The OpenAI-compatible gateway (freshroll.envs.gateway) under the real ``openai`` client, in
front of the real HF engine (the embedded tiny model): token ids and behaviour log-probs
come back stamped with the policy version and the episode, and equal the engine's own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from freshroll.config.ops import LimitsSection
from freshroll.engines.hf import HFEngine
from freshroll.engines.tiny import build_tiny
from freshroll.envs.gateway import Gateway
from freshroll.placement.adapters import ThreadEngine

openai = pytest.importorskip("openai")


class Served:
    """A gateway on an event loop of its own thread (the harness's side is synchronous)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway, self.loop = gateway, asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(gateway.start(), self.loop).result(30)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.gateway.close(), self.loop).result(30)
        asyncio.run_coroutine_threadsafe(self.gateway.engine.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@pytest.fixture
def served() -> Iterator[tuple[Served, HFEngine, Any]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model, tok = build_tiny(seed=3)
    hf = HFEngine(model, tok)
    gw = Gateway(ThreadEngine(hf, "gw", LimitsSection()), tok, version=lambda: "p0-abc")
    s = Served(gw)
    try:
        yield s, hf, tok
    finally:
        s.close()
        torch.set_num_threads(threads)


def _client(s: Served) -> Any:
    return openai.OpenAI(base_url=s.url, api_key="local", max_retries=0, timeout=60)


def test_it_listens_on_loopback_only(served: tuple[Served, HFEngine, Any]) -> None:
    s, _, _ = served
    assert s.url.startswith("http://127.0.0.1:")
    assert [m.id for m in _client(s).models.list().data] == ["freshroll"]


def test_a_completion_carries_the_engines_tokens_logprobs_and_the_version(
    served: tuple[Served, HFEngine, Any],
) -> None:
    s, hf, _ = served
    r = _client(s).completions.create(model="freshroll", prompt="rev 123=", max_tokens=6,
                                      temperature=1.0, seed=7, logprobs=1,
                                      extra_body={"episode": "ep-1"})
    extra = r.model_extra
    choice = r.choices[0]
    direct = hf.generate(["rev 123="], max_new_tokens=6, temperature=1.0, seed=7)[0]
    assert choice.model_extra["token_ids"] == list(direct.token_ids)
    assert extra["prompt_token_ids"] == list(direct.prompt_token_ids)
    assert choice.logprobs.token_logprobs == pytest.approx(list(direct.logprobs))
    assert choice.text == direct.text and choice.finish_reason == direct.finish_reason
    assert extra["policy_version"] == "p0-abc" and extra["episode"] == "ep-1"
    call = s.gateway.calls[-1]
    assert (call.episode, call.policy_version, call.token_ids) == (
        "ep-1", "p0-abc", direct.token_ids)


def test_token_in_a_prompt_of_token_ids_is_used_as_given(
    served: tuple[Served, HFEngine, Any],
) -> None:
    s, hf, tok = served
    ids = [int(t) for t in tok.encode("sort 31=")] + [int(t) for t in tok.encode("13")]
    r = _client(s).completions.create(model="freshroll", prompt=ids, max_tokens=4, seed=3)
    assert r.model_extra["prompt_token_ids"] == ids
    direct = hf.generate(["x"], max_new_tokens=4, seed=3, prompt_ids=[ids])[0]
    assert r.choices[0].model_extra["token_ids"] == list(direct.token_ids)


def test_a_chat_completion_through_the_client(served: tuple[Served, HFEngine, Any]) -> None:
    s, _, _ = served
    r = _client(s).chat.completions.create(
        model="freshroll", messages=[{"role": "user", "content": "rev 123="}], max_tokens=5,
        seed=1, logprobs=True, extra_headers={"X-Freshroll-Episode": "ep-9"})
    choice = r.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert len(choice.logprobs.content) == len(choice.model_extra["token_ids"]) > 0
    assert all(c.logprob <= 0.0 for c in choice.logprobs.content)
    assert r.model_extra["episode"] == "ep-9"
    assert r.usage.completion_tokens == len(choice.model_extra["token_ids"])


def test_a_bad_request_is_a_400_not_a_hang(served: tuple[Served, HFEngine, Any]) -> None:
    s, _, _ = served
    with pytest.raises(openai.BadRequestError, match="one choice per call"):
        _client(s).completions.create(model="freshroll", prompt="x", n=2)
    with pytest.raises(openai.BadRequestError, match="prompt"):
        _client(s).completions.create(model="freshroll", prompt=[])


def test_a_client_that_disconnects_mid_call_leaves_the_gateway_serving(
    served: tuple[Served, HFEngine, Any],
) -> None:
    import json
    import socket
    from urllib.parse import urlparse

    s, _, _ = served
    url = urlparse(s.url)
    body = json.dumps({"model": "freshroll", "prompt": "rev 12=", "max_tokens": 6}).encode()
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: " + str(len(body)).encode() +
                     b"\r\n\r\n" + body)
    # gone before its answer; the next client is answered
    r = _client(s).completions.create(model="freshroll", prompt="rev 1=", max_tokens=3, seed=2)
    assert r.choices[0].model_extra["token_ids"]
