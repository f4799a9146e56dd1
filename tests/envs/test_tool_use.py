"""The tool-using workflow (freshroll.envs.tool_use): turns, token-in, the loss mask, tool
failures as typed discards; on a scripted engine, and on the real HF engine (the tiny model)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from freshroll.config.ops import LimitsSection
from freshroll.config.rollout import ToolsSection
from freshroll.engines.base import Completion
from freshroll.engines.episodes import EpisodeFailed, WorkflowSetup
from freshroll.engines.seams import Emit, GenRequest, SamplingParams
from freshroll.engines.tiny import CHARS, build_tiny
from freshroll.engines.trajectory import expand_mask
from freshroll.envs.calc import ToolResult
from freshroll.envs.tool_use import TURN_SEED, ToolUse
from freshroll.errors import ConfigError

ENC = {ch: i + 4 for i, ch in enumerate(CHARS)}  # the tiny tokenizer's ids
EOS = 2


def enc(text: str) -> tuple[int, ...]:
    return tuple(ENC[c] for c in text)


@dataclass
class Scripted:
    """An engine that answers each turn from a script: turn k of every request writes
    ``script[k]`` (then eos); it records every request and seed it was given."""

    script: list[str]
    continuous: bool = False
    asked: list[list[GenRequest]] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)

    def encode_text(self, text: str) -> tuple[int, ...]:
        return enc(text)

    async def generate(self, requests: Sequence[GenRequest], params: SamplingParams,
                       seed: int, emit: Emit) -> None:
        turn = len(self.asked)
        self.asked.append(list(requests))
        self.seeds.append(seed)
        for i, r in enumerate(requests):
            prompt = r.prompt_ids if r.prompt_ids is not None else enc(r.text)
            toks = (*enc(self.script[turn]), EOS)
            emit(i, Completion(prompt, toks, tuple(-0.1 * (j + 1) for j in range(len(toks))),
                               self.script[turn], "stop", 0.01))

    async def load_weights(self, weights: object) -> float:
        return 0.0

    async def cancel(self, samples: Sequence[str]) -> None:
        return None

    async def close(self) -> None:
        return None


def run(wf: ToolUse, engine: object, n: int = 2, seed: int = 5) -> dict[int, object]:
    out: dict[int, object] = {}
    reqs = [GenRequest(f"g0.{i}#1", "g0", "p", "calc 3*4 c:", 0) for i in range(n)]
    asyncio.run(wf.run_episode(engine, reqs, SamplingParams(8), seed,  # type: ignore[arg-type]  # a scripted engine
                               out.__setitem__))
    return out


def setup(**tools: float) -> WorkflowSetup:
    return WorkflowSetup(tools=ToolsSection(**tools))


def test_a_call_its_result_and_the_answer_make_one_trajectory() -> None:
    engine = Scripted(["3*4", "12"])
    out = run(ToolUse(setup()), engine)
    assert sorted(out) == [0, 1]
    c = out[0]
    assert isinstance(c, Completion)
    # model "3*4"+eos (trained), env "=12|" (not), model "12"+eos (trained)
    assert c.token_ids == (*enc("3*4"), EOS, *enc("=12|"), *enc("12"), EOS)
    assert c.loss_mask == ((1, 4), (0, 4), (1, 3))
    assert c.text == "12" and c.finish_reason == "stop"
    assert [t[0] for t in c.turns] == ["model", "env", "model"]
    assert c.turns[1][3:] == ("calc:3*4", "ok")
    assert all(lp == 0.0 for lp, m in zip(c.logprobs, expand_mask(c.loss_mask, 11),
                                          strict=True) if m == 0)
    # token-in: the second turn's context is the first's ids, the call and the result
    second = engine.asked[1][0]
    assert second.prompt_ids == (*enc("calc 3*4 c:"), *enc("3*4"), EOS, *enc("=12|"))
    assert second.sample == "g0.0#1"  # a group deadline still cancels it by sample id
    assert engine.seeds == [5, 5 + TURN_SEED]


def test_a_later_turn_calls_again_until_max_calls() -> None:
    engine = Scripted(["1+1", "c:2*3", "c:9", "6"])
    c = run(ToolUse(setup(max_calls=2)), engine, n=1)[0]
    assert isinstance(c, Completion)
    assert [t[3] for t in c.turns if t[0] == "env"] == ["calc:1+1", "calc:2*3"]
    assert c.text == "c:9"  # the turn after the last allowed call is the answer
    assert len(engine.asked) == 3


def test_a_malformed_call_is_a_turn_the_model_reads() -> None:
    c = run(ToolUse(setup()), Scripted(["3*", "0"]), n=1)[0]
    assert isinstance(c, Completion) and c.turns[1][4] == "error"
    assert enc("=err|") == c.token_ids[3:8]


class Hangs:
    name = "calc"

    async def __call__(self, arg: str) -> ToolResult:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


class Crashes:
    name = "calc"

    async def __call__(self, arg: str) -> ToolResult:
        raise RuntimeError("tool process died")


@pytest.mark.parametrize(("tool", "why"), [(Hangs(), "did not answer within tools.timeout_s"),
                                           (Crashes(), "raised RuntimeError: tool process died")])
def test_a_tool_that_hangs_or_crashes_ends_its_request_as_a_tool_error(
    tool: object, why: str,
) -> None:
    engine = Scripted(["3*4", "12"])
    out = run(ToolUse(setup(timeout_s=0.05), tool=tool), engine)  # type: ignore[arg-type]  # a test tool
    for i in (0, 1):
        failed = out[i]
        assert isinstance(failed, EpisodeFailed) and failed.reason == "tool_error"
        assert why in failed.detail and "'calc:3*4'" in failed.detail
    assert len(engine.asked) == 1  # no further turn: never a hang, never a reward of 0


def test_it_needs_the_inline_or_process_runtime() -> None:
    with pytest.raises(ConfigError, match=r"run\.runtime: inline or process"):
        ToolUse(WorkflowSetup(runtime="ray"))
    ToolUse(WorkflowSetup(runtime="process"))  # the tokenizer beside the worker's proxy


def test_on_the_real_hf_engine_every_turn_is_token_in() -> None:
    """The HF engine through its thread adapter: each later turn is generated from the token
    ids of the turns before it; replaying the second turn from the recorded context with the
    turn's seed gives the stored tokens and log-probs; the same seed gives the same episode."""
    import torch


    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _real_episodes()
    finally:
        torch.set_num_threads(threads)


def _real_episodes() -> None:
    from freshroll.engines.hf import HFEngine
    from freshroll.placement.adapters import ThreadEngine

    model, tok = build_tiny(seed=3)
    hf = HFEngine(model, tok)
    engine = ThreadEngine(hf, "w0", LimitsSection())
    wf = ToolUse(setup(max_calls=1))
    first = run(wf, engine, n=3, seed=11)
    again = run(wf, engine, n=3, seed=11)
    def tokens(out: dict[int, object]) -> list[tuple[object, ...]]:
        return [(c.token_ids, c.logprobs, c.loss_mask, c.text)  # type: ignore[attr-defined]  # Completions
                for c in out.values()]

    assert tokens(first) == tokens(again)
    for i in range(3):
        c = first[i]
        assert isinstance(c, Completion)
        assert [t[0] for t in c.turns] == ["model", "env", "model"]
        n1, n_env = c.turns[0][1], c.turns[1][1]
        env = c.token_ids[n1:n1 + n_env]
        shown = tok.decode(list(env))
        assert shown.startswith("=") and shown.endswith("|")
        context = [*c.prompt_token_ids, *c.token_ids[:n1 + n_env]]
        rows = [[*first[j].prompt_token_ids,  # type: ignore[union-attr]  # a Completion
                 *first[j].token_ids[:first[j].turns[0][1] + first[j].turns[1][1]]]  # type: ignore[union-attr]  # a Completion
                for j in range(3)]
        replay = hf.generate(["x"] * 3, max_new_tokens=8, seed=11 + TURN_SEED,
                             prompt_ids=rows)[i]
        assert replay.prompt_token_ids == tuple(context)
        assert c.token_ids[n1 + n_env:] == replay.token_ids
        assert c.logprobs[n1 + n_env:] == pytest.approx(replay.logprobs)
    asyncio.run(engine.close())
